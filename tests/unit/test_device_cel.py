"""DRA device selectors in CEL (`quorum.core.device_cel`): the Kubernetes DRA docs' examples, the
device as Kubernetes shows it (missing domains and ids), the quantity and semver libraries,
errors, bounds against hostile expressions, and the cache."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from quorum.core.device_cel import (
    MAX_EXPRESSION_BYTES,
    DeviceView,
    Selector,
    SelectorCache,
    SelectorError,
    Version,
    compile_selector,
)
from quorum.core.quantity import parse_quantity

DRIVER = "gpu.example.com"
OWN = f'device.attributes["{DRIVER}"]'  # the driver's domain
H100 = DeviceView(
    DRIVER,
    {
        "model": "H100",  # unqualified: the driver's domain
        f"{DRIVER}/driverVersion": Version("1.2.3"),
        "index": 3,
        "mig": False,
        "resource.kubernetes.io/pcieRoot": "pci0000:01",
    },
    {"memory": "80Gi", "cores": "132"},
)


def matches(expression: str, device: DeviceView = H100) -> bool:
    return compile_selector(expression).matches(device)


def error_of(expression: str, device: DeviceView = H100) -> str:
    with pytest.raises(SelectorError) as raised:
        matches(expression, device)
    return str(raised.value)


@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        # https://kubernetes.io/docs/concepts/scheduling-eviction/dynamic-resource-allocation/
        ('device.driver == "gpu.example.com" && device.attributes["gpu.example.com"].model == "H100"', True),
        ('device.driver == "gpu.example.com" && device.attributes["gpu.example.com"].model == "A100"', False),
        ('device.capacity["gpu.example.com"].memory.compareTo(quantity("40Gi")) >= 0', True),
        ('device.capacity["gpu.example.com"].memory.compareTo(quantity("100Gi")) >= 0', False),
        ('device.attributes["gpu.example.com"].driverVersion.isGreaterThan(semver("1.0.0"))', True),
        ('device.attributes["gpu.example.com"].driverVersion.isGreaterThan(semver("1.2.3"))', False),
        # The same attributes by index, a qualified name of another domain, the other fields.
        (f'{OWN}["model"] == "H100"', True),
        ('device.attributes["resource.kubernetes.io"].pcieRoot == "pci0000:01"', True),
        (f"{OWN}.index > 2 && !{OWN}.mig", True),
        (f'device.capacity["{DRIVER}"].cores.asInteger() == 132', True),
        ("device.allowMultipleAllocations", False),
        (f'cel.bind(gpu, {OWN}, gpu.model == "H100" && gpu.index == 3)', True),
        (f'{OWN}.exists(id, id == "mig")', True),
        (f'{OWN}.model.matches("^H[0-9]+$")', True),
        (f'{OWN}.model.lowerAscii().startsWith("h1")', True),
    ],
)
def test_selectors_on_a_device(expression: str, expected: bool) -> None:
    assert matches(expression) is expected


def test_a_domain_the_device_lacks_reads_as_an_empty_map() -> None:
    # As Kubernetes' newStringInterfaceMapWithDefault: the lookup gives {}, `in` sees only real domains.
    assert matches('"other.example.com" in device.attributes') is False
    assert matches(f'"{DRIVER}" in device.attributes') is True
    assert matches('device.attributes["other.example.com"].size() == 0') is True
    assert matches('!("memory" in device.capacity["other.example.com"])') is True
    assert matches("has(device.attributes.other)") is True  # cel-go's has() finds the default too
    assert error_of('device.attributes["other.example.com"].model == "H100"') == "CEL: no such key: model"
    assert error_of('device.capacity["other.example.com"]["memory"].isGreaterThan(quantity("0"))') == (
        "CEL: no such key: memory"
    )


def test_an_id_the_device_lacks_is_an_error_not_false() -> None:
    assert error_of(f'{OWN}.family == "hopper"') == "CEL: no such key: family"
    assert error_of(f'{OWN}["family"] == "hopper"') == "CEL: no such key: family"
    # ...unless the expression asks first, as Kubernetes' error message advises.
    assert matches(f'"family" in {OWN} && {OWN}.family == 1') is False
    assert matches(f"has({OWN}.family)") is False


def test_errors_are_absorbed_only_where_cel_says() -> None:
    assert matches(f"false && {OWN}.family == 1") is False
    assert matches(f"{OWN}.family == 1 || true") is True
    assert "no such key" in error_of(f"true && {OWN}.family == 1")
    assert error_of("1 / 0 == 1").startswith("CEL:")


@pytest.mark.parametrize(
    ("expression", "result_type"),
    [
        ("1", "int"),
        ("device.driver", "string"),
        (OWN, "map"),
        ('quantity("1")', "Quantity"),
    ],
)
def test_a_result_that_is_not_a_bool_is_an_error(expression: str, result_type: str) -> None:
    assert error_of(expression) == f"CEL result of type {result_type} is not a bool"


@pytest.mark.parametrize(
    ("expression", "message"),
    [
        ("?!", "syntax error at line 1, column 1"),
        ("device.driver ==", "syntax error"),
        ("device.attributes.?x", "syntax error"),  # optional syntax: not in cel-python's grammar
        ('device.driver.startswith("gpu")', "undeclared reference to 'startswith'"),
        ("gpu.model == 1", "undeclared reference to 'gpu'"),
        ("[1].all(1, true)", "takes a variable name"),
        ("(" * 300 + "true" + ")" * 300, "nested deeper than"),
    ],
)
def test_compile_errors(expression: str, message: str) -> None:
    with pytest.raises(SelectorError, match="CEL compile error") as raised:
        compile_selector(expression)
    assert message in str(raised.value)


def test_the_length_limit_is_kubernetes_10_kib_in_bytes() -> None:
    padding = "x" * (MAX_EXPRESSION_BYTES - len('"" == ""'))
    assert compile_selector(f'"{padding}" == ""').expression.startswith('"x')
    with pytest.raises(SelectorError, match="over the limit of 10240"):
        compile_selector(f'"{padding}é" == ""')  # é is two bytes


def test_a_long_chain_of_conditions_stays_shallow() -> None:
    conditions = [f'device.driver != "d{i}"' for i in range(350)]  # a level of nesting each
    assert matches(" && ".join(conditions)) is True
    assert matches(" || ".join(reversed(conditions))) is True


@pytest.mark.parametrize(
    "expression",
    [
        # quantity.go's examples
        'quantity("200M").compareTo(quantity("0.2G")) == 0',
        'quantity("50M").compareTo(quantity("50Mi")) == -1',
        'quantity("50Mi").compareTo(quantity("50M")) == 1',
        'quantity("150Mi").isGreaterThan(quantity("100Mi"))',
        '!quantity("50Mi").isGreaterThan(quantity("100Mi"))',
        'quantity("50M").isLessThan(quantity("100M"))',
        'quantity("50000000G").isInteger()',
        'quantity("50k").asInteger() == 50000',
        '!quantity("9999999999999999999999999999999999999G").isInteger()',
        'quantity("50k").sub(20000).asApproximateFloat() == 30000.0',
        'quantity("50k").add(20) == quantity("50020")',
        'quantity("50k").sub(quantity("20k")) == quantity("30k")',
        'quantity("50k").add(20).sub(quantity("100k")).sub(-50000) == quantity("20")',
        'isQuantity("1.3Gi") && isQuantity("10000k") && !isQuantity("1,3G") && !isQuantity("Mi")',
        'sign(quantity("-1m")) == -1 && sign(quantity("0")) == 0',
        # semverlib.go's examples
        'semver("1.2.3").major() == 1 && semver("1.2.3").minor() == 2 && semver("1.2.3").patch() == 3',
        'semver("1.2.3").compareTo(semver("1.2.3")) == 0',
        'semver("1.2.3").compareTo(semver("2.0.0")) == -1',
        'semver("1.2.3").compareTo(semver("0.1.2")) == 1',
        'semver("1.0.0-alpha").isLessThan(semver("1.0.0-alpha.1"))',
        'semver("1.0.0-alpha.1").isLessThan(semver("1.0.0-beta"))',
        'semver("1.0.0-rc.1").isLessThan(semver("1.0.0"))',
        'semver("1.0.0+build.1") == semver("1.0.0+build.2")',
        'semver("v1.0", true) == semver("1.0.0") && semver("01.01.01", true) == semver("1.1.1")',
        'isSemver("1.0.0") && !isSemver("hello") && !isSemver("v1.0") && isSemver("v1.0", true)',
        # strings, regex, lists and sets of the Kubernetes environment
        '"a,b,c".split(",") == ["a", "b", "c"] && ["a", "b"].join("-") == "a-b"',
        '"hello".charAt(1) == "e" && "hello".indexOf("l") == 2 && "hello".lastIndexOf("l") == 3',
        '"hello".substring(1, 3) == "el" && " x ".trim() == "x" && "aXa".replace("a", "b") == "bXb"',
        '"abc 123".find("[0-9]+") == "123" && "a1b2".findAll("[0-9]") == ["1", "2"]',
        "[1, 2, 3].isSorted() && [1, 2, 3].sum() == 6 && [1, 3, 2].max() == 3 && [3, 1].min() == 1",
        "[1, 2, 3].indexOf(2) == 1 && [1, 2].includes(2) && [3, 1, 2].sort() == [1, 2, 3]",
        "[1, 2, 2].distinct() == [1, 2] && [[1], [2]].flatten() == [1, 2] && lists.range(3) == [0, 1, 2]",
        "sets.contains([1, 2, 3], [2]) && sets.intersects([1], [1, 2]) && sets.equivalent([1, 2], [2, 1])",
    ],
)
def test_kubernetes_libraries(expression: str) -> None:
    assert matches(expression) is True


def test_library_errors() -> None:
    assert error_of('quantity("1.5").asInteger() == 1') == "CEL: cannot convert value to integer"
    assert "invalid quantity" in error_of('quantity("200K").isInteger()')
    assert "invalid semantic version" in error_of('semver("1.0").major() == 1')
    assert "no such overload" in error_of('quantity("1").isGreaterThan(semver("1.0.0"))')


def test_list_type_attributes_and_includes() -> None:
    device = DeviceView(DRIVER, {"links": (1, 2, 3), "name": "fish"})
    assert matches(f"{OWN}.links.includes(2)", device) is True
    assert matches(f'{OWN}.name.includes("fish")', device) is True
    assert matches(f"{OWN}.links.exists(x, x > 2)", device) is True


def test_a_version_that_does_not_parse_fails_every_selector_of_the_device() -> None:
    device = DeviceView(DRIVER, {"driverVersion": Version("1.0")})
    assert error_of("true", device).startswith("attribute driverVersion: parse semantic version")


def test_allow_multiple_allocations() -> None:
    assert matches("device.allowMultipleAllocations", DeviceView(DRIVER, allow_multiple_allocations=True))


@given(
    st.integers(0, 10**6),
    st.sampled_from(["", "m", "k", "M", "G", "Ki", "Mi", "Gi"]),
    st.sampled_from(["0", "1500m", "40Gi", "1e9", "123456789", "0.5Ki"]),
)
def test_quantity_comparisons_agree_with_parse_quantity(n: int, suffix: str, other: str) -> None:
    difference = parse_quantity(f"{n}{suffix}") - parse_quantity(other)
    device = DeviceView(DRIVER, capacity={"memory": f"{n}{suffix}"})
    memory = f'device.capacity["{DRIVER}"].memory'
    assert matches(f'{memory}.isGreaterThan(quantity("{other}"))', device) is (difference > 0)
    assert matches(f'{memory}.isLessThan(quantity("{other}"))', device) is (difference < 0)
    sign = (difference > 0) - (difference < 0)
    assert matches(f'{memory}.compareTo(quantity("{other}")) == {sign}', device)


versions = st.tuples(st.integers(0, 30), st.integers(0, 30), st.integers(0, 30))


@given(versions, versions)
def test_semver_ordering_agrees_with_tuples(a: tuple[int, int, int], b: tuple[int, int, int]) -> None:
    device = DeviceView(DRIVER, {"driverVersion": Version(".".join(map(str, a)))})
    version, other = f"{OWN}.driverVersion", f'semver("{".".join(map(str, b))}")'
    assert matches(f"{version}.isGreaterThan({other})", device) is (a > b)
    assert matches(f"{version}.isLessThan({other})", device) is (a < b)
    assert matches(f"{version}.compareTo({other}) == {(a > b) - (a < b)}", device)


LIST = "[1, 2, 3, 4, 5, 6, 7, 8, 9, 10]"


def nested(depth: int, macro: str, body: str) -> str:
    for level in range(depth):
        body = f"{LIST}.{macro}(x{level}, {body})"
    return body


@pytest.mark.parametrize(
    "expression",
    [
        # Kubernetes' own "expensive" test case: 10^7 steps, over its cost limit too.
        nested(7, "all", "int('1'.find('[0-9]*')) < 100"),
        nested(6, "map", "1") + ".size() > 0",
        nested(8, "exists", "false"),
        # Doubling a string 60 times, a step at a time.
        '"ab"' + "".join(f".split(',').map(s{i}, s{i} + s{i})[0]" for i in range(60)) + ".size() > 0",
        "lists.range(1000000).size() > 0",
        'lists.range(15000).map(x, "aaaaaaaaaa").join("").replace("a", "aaaaaaaaaa").size() > 0',
        "cel.bind(r, lists.range(4000), r.all(x, x in r))",
        # Work inside one function, many times over.
        "cel.bind(r, lists.range(500), lists.range(100).all(i, r.distinct().size() > 0))",
        '[1, 2, 3].all(x, "a+b+c+d+e+f+g+h+i+j".split("+").map(p, "(" + p + "|x)*").join("").size() > 0)'
        ' && lists.range(500).all(i, "abc".matches(string(i) + "(a|b|c|d|e|f|g|h)*(a|b|c)*"))',
    ],
)
def test_hostile_expressions_stop_at_the_cost_limit_quickly(expression: str) -> None:
    selector = compile_selector(expression)
    started = time.perf_counter()
    with pytest.raises(SelectorError, match="cost limit"):
        selector.matches(H100)
    assert time.perf_counter() - started < 1.0  # measured: about 0.1 s at most


def test_the_cache_keeps_results_and_errors() -> None:
    cache = SelectorCache()
    model = f'{OWN}.model == "H100"'
    assert cache.matches(model, "gpu-0", H100) is True
    assert cache.matches(model, "gpu-1", H100) is True
    missing = f'{OWN}.family == "hopper"'
    for _ in range(2):
        with pytest.raises(SelectorError, match="no such key: family"):
            cache.matches(missing, "gpu-0", H100)
    for _ in range(2):
        with pytest.raises(SelectorError, match="CEL compile error"):
            cache.matches("?!", "gpu-0", H100)


def test_a_device_changed_under_the_same_key_is_evaluated_again() -> None:
    # A ResourceSlice update changes a device in place: same driver, pool and name.
    cache = SelectorCache()
    a100, with_family = DeviceView(DRIVER, {"model": "A100"}), DeviceView(DRIVER, {"family": "hopper"})
    model, missing = f'{OWN}.model == "H100"', f'{OWN}.family == "hopper"'
    whole = f'{OWN}.exists(id, id == "model") && {OWN}.model == "H100"'  # not projected
    for expression in (model, whole):
        assert cache.matches(expression, "gpu-0", H100) is True
        assert cache.matches(expression, "gpu-0", a100) is False
    with pytest.raises(SelectorError, match="no such key: family"):
        cache.matches(missing, "gpu-0", H100)
    assert cache.matches(missing, "gpu-0", with_family) is True
    first = 'device.attributes.map(d, d)[0] == "acme"'  # CEL maps keep their order here
    two_domains = DeviceView(DRIVER, {"model": "H100", "acme/model": "H100"})
    assert cache.matches(first, "gpu-0", two_domains) is False
    assert cache.matches(first, "gpu-0", reordered(two_domains)) is True
    bad_version = DeviceView(DRIVER, {"model": "H100", "driverVersion": Version("1.0")})
    with pytest.raises(SelectorError, match="parse semantic version"):
        cache.matches(model, "gpu-0", bad_version)
    assert cache.matches(model, "gpu-0", H100) is True


@pytest.mark.parametrize(
    ("expression", "reads"),
    [
        (
            'device.driver == "x" && device.allowMultipleAllocations',
            [("driver", "", None), ("allowMultipleAllocations", "", None)],
        ),
        (f'{OWN}.model == "H100" && {OWN}["model"] != ""', [("attributes", DRIVER, "model")]),
        ("device.attributes.acme.model == 1", [("attributes", "acme", "model")]),
        (
            f'device.capacity["{DRIVER}"].memory.compareTo(quantity("1")) > 0',
            [("capacity", DRIVER, "memory")],
        ),
        (
            f'has({OWN}.mig) && "index" in {OWN}',
            [("attributes", DRIVER, "mig"), ("attributes", DRIVER, "index")],
        ),
        ('"acme" in device.capacity', [("capacity", "acme", None)]),
        (
            f"cel.bind(m, {OWN}.model, m == m) && [1].all(x, {OWN}.index > x)",
            [("attributes", DRIVER, "model"), ("attributes", DRIVER, "index")],
        ),
        ("true", []),
        # Uses whose value may depend on more of the device: the whole device is the key.
        (f"{OWN}.exists(id, id == 'mig')", None),
        (f"size({OWN}) > 0", None),
        (f"{OWN}.size() > 0", None),
        (f'cel.bind(m, {OWN}, m.model == "H100")', None),
        (f'{OWN}["mo" + "del"] == "H100"', None),
        ('device.attributes[device.driver].model == "H100"', None),
        (f'({OWN}).model == "H100"', None),
        ('(device).driver == "x"', None),
        ('.device.driver == "x"', None),
        ("[1].exists(device, device == 1)", None),
        ('"driver" in device', None),
        ("device.other == 1", None),
        ("has(device.attributes.acme)", None),
        (f"{OWN} == {{}}", None),
        (
            f'{OWN}.model in [{OWN}.model] && "x" in device.attributes["a"]["b"]',
            [("attributes", DRIVER, "model"), ("attributes", "a", "b")],
        ),
    ],
)
def test_what_a_selector_reads_of_the_device(
    expression: str, reads: list[tuple[str, str, str | None]] | None
) -> None:
    found = compile_selector(expression).reads
    assert (found if found is None else set(found)) == (reads if reads is None else set(reads))


def evaluations(monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    counted: Counter[str] = Counter()
    evaluate = Selector.matches

    def counting(self: Selector, device: DeviceView) -> bool:
        counted[self.expression] += 1
        return evaluate(self, device)

    monkeypatch.setattr(Selector, "matches", counting)
    return counted


def test_devices_that_differ_only_in_what_a_selector_does_not_read_share_one_evaluation(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    counted = evaluations(monkeypatch)
    typical = [
        f'device.driver == "{DRIVER}" && {OWN}.model == "H100"',
        f'device.capacity["{DRIVER}"].memory.compareTo(quantity("40Gi")) >= 0',
        f'{OWN}.driverVersion.isGreaterThan(semver("1.0.0"))',
    ]
    cache = SelectorCache()
    matched = Counter[str]()
    for i in range(40_000):
        attributes = {
            **H100.attributes,
            "uuid": f"GPU-{i:08x}",
            "index": i % 8,
            "model": ("H100", "A100")[i % 2],
        }
        device = DeviceView(DRIVER, attributes, H100.capacity)
        for expression in typical:
            matched[expression] += cache.matches(expression, ("pool", f"gpu-{i}"), device)
    assert counted == {typical[0]: 2, typical[1]: 1, typical[2]: 1}  # H100 and A100; the rest alike
    assert matched == {typical[0]: 20_000, typical[1]: 40_000, typical[2]: 40_000}

    counted.clear()
    whole = f"{OWN}.exists(id, id == 'uuid')"  # reads every attribute's name: one per device
    for i in range(100):
        cache.matches(whole, ("pool", "gpu-0"), DeviceView(DRIVER, {**H100.attributes, "uuid": f"GPU-{i}"}))
    cache.matches(whole, ("pool", "gpu-1"), DeviceView(DRIVER, {**H100.attributes, "uuid": "GPU-0"}))
    assert counted == {whole: 100}


# Devices from small pools of names and values, so that many share what a selector reads; some
# invalid (a version or quantity that does not parse, an int out of range), some types alike in
# Python but not in CEL (True and 1), attributes in the driver's domain named both ways.
ATTRIBUTE_NAMES = ["model", f"{DRIVER}/model", "index", "mig", "uuid", "links", "driverVersion"]
ATTRIBUTE_NAMES += ["acme/model", "other.example.com/model"]
valid_values = st.one_of(
    st.sampled_from(["H100", "A100", "1.2.3", ""]),
    st.booleans(),
    st.integers(-1, 2),
    st.sampled_from([Version("1.2.3"), Version("0.9.0")]),
    st.lists(st.one_of(st.booleans(), st.integers(0, 1)), max_size=2).map(tuple),
)
invalid_values = st.sampled_from([2**63, Version("1.0")])
attribute_values = st.one_of(*[valid_values] * 5, invalid_values)
quantities = st.sampled_from(["40Gi", "80Gi", "42949672960", "1.5", "40Gi", "80Gi", "bad"])
devices = st.builds(
    DeviceView,
    st.sampled_from([DRIVER, "acme"]),
    st.dictionaries(st.sampled_from(ATTRIBUTE_NAMES), attribute_values, max_size=5),
    st.dictionaries(
        st.sampled_from(["memory", f"{DRIVER}/memory", "acme/memory", "cores"]), quantities, max_size=3
    ),
    st.booleans(),
)
PROPERTY_SELECTORS = [
    f'device.driver == "{DRIVER}" && {OWN}.model == "H100"',
    f'{OWN}["model"] == "H100"',
    f"{OWN}.index == 1",
    f"{OWN}.mig",
    f'has({OWN}.model) && {OWN}.model.startsWith("H")',
    f'"model" in {OWN} || "acme" in device.attributes',
    'device.attributes.acme.model == "H100"',
    'device.attributes["other.example.com"].model == "A100"',
    f'{OWN}.driverVersion.isGreaterThan(semver("1.0.0"))',
    f'device.capacity["{DRIVER}"].memory.compareTo(quantity("40Gi")) >= 0',
    '"memory" in device.capacity["acme"]',
    f"{OWN}.links.exists(x, x == true)",
    "device.allowMultipleAllocations || true",
    f"{OWN}.index",
    # not projected
    f'{OWN}.exists(id, id == "mig")',
    f"size({OWN}) > 2",
    f'{OWN}.map(id, id)[0] == "model"',  # the order of the map
    'device.attributes.map(d, d)[0] == "acme"',  # the order of the domains
    'device.capacity.all(d, d != "acme") || device.capacity.map(d, d)[0] == "acme"',
    f'(device).driver == "{DRIVER}"',
    ".device.allowMultipleAllocations",
]
COMPILED = [compile_selector(e) for e in PROPERTY_SELECTORS]
SHARED = SelectorCache()  # across examples too


def outcome(run: Callable[[], bool]) -> bool | str:
    try:
        return run()
    except SelectorError as err:
        return str(err)


def reordered(device: DeviceView) -> DeviceView:
    attributes, capacity = [*device.attributes.items()][::-1], [*device.capacity.items()][::-1]
    return DeviceView(device.driver, dict(attributes), dict(capacity), device.allow_multiple_allocations)


@settings(max_examples=100, deadline=None)
@given(st.lists(devices, min_size=1, max_size=8))
def test_a_cached_result_is_the_selectors_own(views: list[DeviceView]) -> None:
    assert any(s.reads is None for s in COMPILED) and any(s.reads for s in COMPILED)
    cache = SelectorCache()
    for view in views + [reordered(v) for v in views] + views:
        for selector in COMPILED:
            expected = outcome(lambda: selector.matches(view))  # noqa: B023
            for each in (cache, SHARED):
                assert outcome(lambda: each.matches(selector.expression, "gpu-0", view)) == expected  # noqa: B023


def test_the_cache_is_bounded() -> None:
    cache = SelectorCache(max_results=3, max_devices=2)
    devices = [DeviceView(DRIVER, {"index": i}) for i in range(5)]
    for device in devices:
        cache.matches(f"{OWN}.index == 0", "gpu", device)
    assert len(cache) == 3
    whole = f"{OWN}.exists(id, {OWN}[id] == 0)"
    for device in devices + devices:  # contents forgotten are numbered afresh, never taken for others
        assert cache.matches(whole, "gpu", device) is (device is devices[0])
    assert len(cache) == 3


@pytest.mark.parametrize(
    "hostile",
    [nested(7, "all", "true"), f"{OWN}.size() > 0 && " + nested(7, "all", "true")],  # projected or not
)
def test_an_expression_over_the_cost_limit_fails_on_every_device_after_the_first(hostile: str) -> None:
    cache = SelectorCache()
    started = time.perf_counter()
    for i in range(50):
        with pytest.raises(SelectorError, match="cost limit"):
            cache.matches(hostile, f"gpu-{i}", DeviceView(DRIVER, {"index": i}))
    assert time.perf_counter() - started < 1.0
