"""DRA device selectors in CEL (`quorum.core.device_cel`): the Kubernetes DRA docs' examples, the
device as Kubernetes shows it (missing domains and ids), the quantity and semver libraries,
errors, bounds against hostile expressions, and the cache."""

from __future__ import annotations

import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from quorum.core.device_cel import (
    MAX_EXPRESSION_BYTES,
    DeviceView,
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
    a100 = DeviceView(DRIVER, {"model": "A100"})
    assert cache.matches(model, "gpu-0", a100) is True  # cached by key: a changed device needs a new key
    assert cache.matches(model, "gpu-1", a100) is False

    missing = f'{OWN}.family == "hopper"'
    for _ in range(2):
        with pytest.raises(SelectorError, match="no such key: family"):
            cache.matches(missing, "gpu-0", H100)
    with_family = DeviceView(DRIVER, {"family": "hopper"})
    with pytest.raises(SelectorError, match="no such key: family"):
        cache.matches(missing, "gpu-0", with_family)  # the cached error
    assert cache.matches(missing, "gpu-2", with_family) is True

    for _ in range(2):
        with pytest.raises(SelectorError, match="CEL compile error"):
            cache.matches("?!", "gpu-0", H100)


def test_the_cache_is_bounded() -> None:
    cache = SelectorCache(max_results=3)
    for i in range(5):
        cache.matches("true", f"gpu-{i}", H100)
    assert len(cache) == 3


def test_an_expression_over_the_cost_limit_fails_on_every_device_after_the_first() -> None:
    cache = SelectorCache()
    hostile = nested(7, "all", "true")
    started = time.perf_counter()
    for i in range(50):
        with pytest.raises(SelectorError, match="cost limit"):
            cache.matches(hostile, f"gpu-{i}", H100)
    assert time.perf_counter() - started < 1.0
