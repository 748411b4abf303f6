"""DRA device selectors: the CEL expressions of DeviceClasses and ResourceClaim requests, evaluated
against one device the way kube-scheduler does (k8s.io/dynamic-resource-allocation/cel).

What a selector sees is `device`: `driver`, `allowMultipleAllocations`, `attributes` and
`capacity`, the last two maps of domain -> map of id -> value. An attribute named without a domain
("model") is in the driver's domain. Looking up a domain that the device lacks gives an empty map
(so `device.attributes["other.com"].model` fails with "no such key: model", and
`"other.com" in device.attributes` is false); looking up an id that the device lacks is an error.
A runtime error or a result that is not a bool is a `SelectorError`, never a quiet false.

The functions are those of the Kubernetes CEL environment that concern devices: the quantity and
semver libraries, the strings extension, regex `find`/`findAll`, the lists library and extension,
`sets.*` and `cel.bind`. Not here: optional syntax (`.?`, `orValue`), the two-variable
comprehensions and the 3-argument `map`, which cel-python lacks, and the URL, IP, CIDR
and format libraries, which have nothing to say about devices.

Bounded, as Kubernetes bounds selectors, since tenants write them: an expression is at most
10 KiB (as the API) and nests at most `MAX_DEPTH`; an evaluation is metered (`_Meter`: a unit a
step, plus the size of the lists, maps and strings made, plus the work of the functions that do
more than one step's) and stops with an error past `MAX_COST` units: 0.03-0.05 s measured for the
worst expressions found, up to 0.15 s when Python's frame stack is unlucky. Ordinary selectors
cost 10 to 100 units. The limit is far below Kubernetes' 1,000,000 (0.1 s of cel-go), so an
expression Kubernetes runs may fail here, which holds its claims rather than guessing;
`SelectorCache` also fails an expression on every device once it has gone over on one.
"""

# cel-python, not the Rust (common-expression-language) or cel-cpp (cel-expr-python) bindings: only
# it takes custom values (Quantity, Semver) and lazy maps, and lets each step be metered; its price
# is speed (~45 us an evaluation against their 2-20 us), paid by SelectorCache once per distinct
# device as far as the selector reads it (devices that differ only in uuid and index share one).

from __future__ import annotations

import functools
import itertools
import math
import operator
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable, Mapping
from contextvars import ContextVar
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, cast

import lark
import re2  # type: ignore[import-untyped]  # RE2, as in Kubernetes: linear time whatever the pattern
from celpy import Environment, celtypes
from celpy.celparser import CELParseError
from celpy.evaluation import (
    Activation,
    CELEvalError,
    Evaluator,
    NameContainer,
    Result,
    base_functions,
    boolean,
    operator_in,
)

from quorum.core.quantity import QuantityError, parse_quantity

MAX_EXPRESSION_BYTES = 10 * 1024  # resourceapi.CELSelectorExpressionMaxLength
MAX_DEPTH = 250  # levels of the parse tree once pass-through rules are dropped (cel-go stops at 250 too)
MAX_COST = 10_000  # metered units for one evaluation; see the module docstring
INT64 = (-(2**63), 2**63 - 1)


class SelectorError(Exception):
    """A selector that does not compile, or fails or yields a non-bool on a device; str() is for
    a person, e.g. "CEL: no such key: model"."""


@dataclass(frozen=True, slots=True)
class Version:
    """A semantic-version attribute value as the API gives it ({"version": "1.2.3"}); it is parsed
    when a selector reads it, and a device whose version does not parse fails every selector, as
    in Kubernetes."""

    text: str

    def __str__(self) -> str:
        return self.text


AttributeValue = bool | int | str | Version


@dataclass(frozen=True, slots=True)
class DeviceView:
    """What a selector sees of one device; names are qualified ("gpu.example.com/model") or in
    the driver's domain ("model")."""

    driver: str
    # A tuple is a list-type attribute (DRAListTypeAttributes, alpha in 1.36).
    attributes: Mapping[str, AttributeValue | tuple[AttributeValue, ...]] = field(default_factory=dict)
    capacity: Mapping[str, str] = field(default_factory=dict)  # quantities, as in the API
    allow_multiple_allocations: bool = False


# --- Values of the Kubernetes libraries -------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Quantity:
    value: Fraction

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, _Quantity):
            raise TypeError(f"no such overload: Quantity == {type(other).__name__}")
        return self.value == other.value

    def __hash__(self) -> int:
        return hash(self.value)


@dataclass(frozen=True, slots=True)
class _Semver:
    """blang/semver's Version, which Kubernetes uses: prerelease parts are ints or strings, build
    metadata is kept but ignored by comparisons."""

    major: int
    minor: int
    patch: int
    pre: tuple[int | str, ...] = ()
    build: tuple[str, ...] = ()

    def compare(self, other: _Semver) -> int:
        mine, theirs = (self.major, self.minor, self.patch), (other.major, other.minor, other.patch)
        if mine != theirs:
            return 1 if mine > theirs else -1
        if not self.pre or not other.pre:
            return (not self.pre) - (not other.pre)
        for a, b in zip(self.pre, other.pre, strict=False):
            if a != b:
                if isinstance(a, int) != isinstance(b, int):
                    return -1 if isinstance(a, int) else 1  # numeric parts sort first
                return 1 if a > b else -1  # type: ignore[operator]
        return (len(self.pre) > len(other.pre)) - (len(self.pre) < len(other.pre))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, _Semver):
            raise TypeError(f"no such overload: Semver == {type(other).__name__}")
        return self.compare(other) == 0

    def __hash__(self) -> int:
        return hash((self.major, self.minor, self.patch, self.pre))


_DIGITS = frozenset("0123456789")
_ALPHANUMERIC = _DIGITS | frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ-")


def _semver_number(part: str, what: str) -> int:
    if not part or not set(part) <= _DIGITS:
        raise ValueError(f"invalid character(s) found in {what} number {part!r}")
    if len(part) > 1 and part[0] == "0":
        raise ValueError(f"{what} number must not contain leading zeroes {part!r}")
    number = int(part)
    if number >= 2**64:
        raise ValueError(f"{what} number {part!r} is out of range")
    return number


def _trim_zeros(part: str) -> str:
    if len(part) <= 1:
        return part
    trimmed = part.lstrip("0")
    return trimmed if trimmed and trimmed[0] in _DIGITS else "0" + trimmed


@functools.lru_cache(maxsize=4096)
def _parse_semver(text: str, normalize: bool = False) -> _Semver:
    """blang/semver's Parse; `normalize` first does what Kubernetes' normalizeAndParse does
    (strip a leading "v", drop leading zeros, fill in a missing minor and patch)."""
    if normalize:
        parts = [_trim_zeros(p) for p in text.removeprefix("v").split(".", 2)]
        if len(parts) < 3:
            if any(c in parts[-1] for c in "+-"):
                raise ValueError("short version cannot contain PreRelease/Build meta data")
            parts += ["0"] * (3 - len(parts))
        text = ".".join(parts)
    if not text:
        raise ValueError("version string empty")
    parts = text.split(".", 2)
    if len(parts) != 3:
        raise ValueError("no Major.Minor.Patch elements found")
    major, minor = _semver_number(parts[0], "major"), _semver_number(parts[1], "minor")
    rest, build = parts[2], ""
    if "+" in rest:
        rest, build = rest.split("+", 1)
        if any(not b or not set(b) <= _ALPHANUMERIC for b in build.split(".")):
            raise ValueError(f"invalid build meta data {build!r}")
    rest, dash, prerelease = rest.partition("-")
    patch = _semver_number(rest, "patch")
    pre: list[int | str] = []
    for item in prerelease.split(".") if dash else []:
        if item and set(item) <= _DIGITS:
            pre.append(_semver_number(item, "prerelease"))
        elif item and set(item) <= _ALPHANUMERIC:
            pre.append(item)
        else:
            raise ValueError(f"invalid prerelease {item!r}")
    return _Semver(major, minor, patch, tuple(pre), tuple(build.split(".")) if build else ())


@functools.lru_cache(maxsize=4096)
def _parse_cel_quantity(text: str) -> _Quantity:
    return _Quantity(parse_quantity(text))


# --- Functions ----------------------------------------------------------------------------------

_Value = Result | _Quantity | _Semver  # what a CEL step yields here (an error is a CELEvalError)


def _error(message: str) -> CELEvalError:
    return CELEvalError(message, ValueError, (message,))


def _string(value: Any) -> str:
    if not isinstance(value, str):
        raise TypeError(f"expected a string, got {type(value).__name__}")
    return value


def _int(value: Any) -> int:
    if isinstance(value, bool | celtypes.BoolType) or not isinstance(value, int):
        raise TypeError(f"expected an int, got {type(value).__name__}")
    return value


def _quantity_of(value: Any) -> _Quantity:
    if not isinstance(value, _Quantity):
        raise TypeError(f"expected a Quantity, got {type(value).__name__}")
    return value


def _spend(units: int) -> None:
    """Charge the evaluation for work that a function is about to do: the meter sees only values,
    and a function can make a large one, or do more than linear work, in one step."""
    _meter.get().charge_units(max(units, 0))


def _quantity(text: Any) -> _Value:
    try:
        return _parse_cel_quantity(_string(text))
    except QuantityError as err:
        return _error(f"invalid quantity: {err}")


def _is_quantity(text: Any) -> _Value:
    return celtypes.BoolType(not isinstance(_quantity(text), CELEvalError))


def _semver(text: Any, normalize: Any = False) -> _Value:
    if not isinstance(normalize, bool | celtypes.BoolType):
        raise TypeError("expected a bool")
    try:
        return _parse_semver(_string(text), bool(normalize))
    except ValueError as err:
        return _error(f"invalid semantic version {text!r}: {err}")


def _is_semver(text: Any, normalize: Any = False) -> _Value:
    return celtypes.BoolType(not isinstance(_semver(text, normalize), CELEvalError))


def _compare(a: Any, b: Any) -> int:
    if isinstance(a, _Quantity) and isinstance(b, _Quantity):
        return (a.value > b.value) - (a.value < b.value)
    if isinstance(a, _Semver) and isinstance(b, _Semver):
        return a.compare(b)
    raise TypeError(f"no such overload: {type(a).__name__}.compareTo({type(b).__name__})")


def _quantity_int(q: Any) -> int | None:
    value = _quantity_of(q).value
    return int(value) if value.denominator == 1 and INT64[0] <= value <= INT64[1] else None


def _as_integer(q: Any) -> _Value:
    value = _quantity_int(q)
    return _error("cannot convert value to integer") if value is None else celtypes.IntType(value)


def _as_approximate_float(q: Any) -> _Value:
    value = _quantity_of(q).value
    try:
        return celtypes.DoubleType(float(value))
    except OverflowError:
        return celtypes.DoubleType(math.copysign(math.inf, value))


def _add(q: Any, other: Any) -> _Value:
    step = _quantity_of(other).value if isinstance(other, _Quantity) else Fraction(_int(other))
    return _Quantity(_quantity_of(q).value + step)


def _sub(q: Any, other: Any) -> _Value:
    step = _quantity_of(other).value if isinstance(other, _Quantity) else Fraction(_int(other))
    return _Quantity(_quantity_of(q).value - step)


def _semver_part(index: int) -> Callable[[Any], _Value]:
    def part(v: Any) -> _Value:
        if not isinstance(v, _Semver):
            raise TypeError(f"expected a Semver, got {type(v).__name__}")
        return celtypes.IntType((v.major, v.minor, v.patch)[index])

    return part


def _char_at(s: Any, index: Any) -> _Value:
    text, i = _string(s), _int(index)
    if not 0 <= i <= len(text):
        return _error(f"index out of range: {i}")
    return celtypes.StringType(text[i : i + 1])


def _index_of(target: Any, item: Any, offset: Any = None) -> _Value:
    if isinstance(target, list):
        return celtypes.IntType(next((i for i, x in enumerate(target) if _equal(x, item)), -1))
    text, sub = _string(target), _string(item)
    start = 0 if offset is None else _int(offset)
    if not 0 <= start <= len(text):
        return _error(f"index out of range: {start}")
    return celtypes.IntType(text.find(sub, start))


def _last_index_of(target: Any, item: Any, offset: Any = None) -> _Value:
    if isinstance(target, list):
        found = [i for i, x in enumerate(target) if _equal(x, item)]
        return celtypes.IntType(found[-1] if found else -1)
    text, sub = _string(target), _string(item)
    end = len(text) if offset is None else _int(offset)
    if not 0 <= end <= len(text):
        return _error(f"index out of range: {end}")
    return celtypes.IntType(text.rfind(sub, 0, end + len(sub)))


def _replace(s: Any, old: Any, new: Any, limit: Any = -1) -> _Value:
    text, before, after, n = _string(s), _string(old), _string(new), _int(limit)
    count = text.count(before) if before else len(text) + 1
    count = count if n < 0 else min(n, count)
    _spend((len(text) + count * (len(after) - len(before))) >> 4)
    return celtypes.StringType(text.replace(before, after, count))


def _split(s: Any, separator: Any, limit: Any = -1) -> _Value:
    text, sep, n = _string(s), _string(separator), _int(limit)
    if n == 0:
        return celtypes.ListType()
    if not sep:
        parts = list(text) if n < 0 or n > len(text) else [*text[: n - 1], text[n - 1 :]]
    else:
        parts = text.split(sep, -1 if n < 0 else n - 1)
    return celtypes.ListType(celtypes.StringType(p) for p in parts)


def _substring(s: Any, start: Any, end: Any = None) -> _Value:
    text, i = _string(s), _int(start)
    j = len(text) if end is None else _int(end)
    if not 0 <= i <= j <= len(text):
        return _error(f"substring out of range: [{i}:{j}] of {len(text)}")
    return celtypes.StringType(text[i:j])


def _join(items: Any, separator: Any = "") -> _Value:
    parts, sep = [_string(x) for x in _list(items)], _string(separator)
    _spend((sum(map(len, parts)) + len(sep) * len(parts)) >> 4)
    return celtypes.StringType(sep.join(parts))


def _quote(s: Any) -> _Value:
    escapes = {"\a": "\\a", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t"}
    escapes |= {"\v": "\\v", "\\": "\\\\", '"': '\\"'}
    return celtypes.StringType('"' + "".join(escapes.get(c, c) for c in _string(s)) + '"')


_REGEX_OPTIONS = re2.Options()
_REGEX_OPTIONS.log_errors = False  # an invalid pattern is the selector's error, not a log line
_regexes: OrderedDict[str, Any] = OrderedDict()  # compiled patterns, the oldest first
MAX_REGEXES = 512


def _regex(pattern: Any) -> Any:
    """The compiled pattern (RE2: linear time whatever the pattern); compiling is charged by the
    pattern's length, as a long one takes milliseconds, and done once per pattern."""
    text = _string(pattern)
    compiled = _regexes.get(text)
    if compiled is None:
        _spend(len(text))
        try:
            compiled = re2.compile(text, _REGEX_OPTIONS)
        except re2.error as err:
            raise ValueError(f"invalid regular expression {text!r}: {err}") from None
        _regexes[text] = compiled
        if len(_regexes) > MAX_REGEXES:
            _regexes.popitem(last=False)
    return compiled


def _matches(s: Any, pattern: Any) -> _Value:
    return celtypes.BoolType(_regex(pattern).search(_string(s)) is not None)


def _find(s: Any, pattern: Any) -> _Value:
    found = _regex(pattern).search(_string(s))
    return celtypes.StringType(found.group(0) if found else "")


def _find_all(s: Any, pattern: Any, limit: Any = -1) -> _Value:
    n = _int(limit)
    found = [m.group(0) for m in _regex(pattern).finditer(_string(s))]
    return celtypes.ListType(celtypes.StringType(f) for f in (found if n < 0 else found[:n]))


def _equal(a: Any, b: Any) -> bool:
    try:
        return bool(a == b)
    except TypeError:
        return False


def _list(value: Any) -> list[Any]:
    if not isinstance(value, list):
        raise TypeError(f"expected a list, got {type(value).__name__}")
    return value


def _is_sorted(items: Any) -> _Value:
    values = _list(items)
    return celtypes.BoolType(all(not a > b for a, b in itertools.pairwise(values)))


def _sum(items: Any) -> _Value:
    values = _list(items)
    if not values:
        return celtypes.IntType(0)
    if any(isinstance(v, str | bytes | list | dict) for v in values):
        raise TypeError("sum() takes numbers")
    total = values[0]
    for value in values[1:]:
        total = total + value
    return cast(_Value, total)


def _max(items: Any) -> _Value:
    values = _list(items)
    return _error("max of an empty list") if not values else cast(_Value, max(values))


def _includes(target: Any, item: Any) -> _Value:
    if isinstance(target, list):
        return celtypes.BoolType(any(_equal(x, item) for x in target))
    return celtypes.BoolType(_equal(target, item))


def _slice(items: Any, start: Any, end: Any) -> _Value:
    values, i, j = _list(items), _int(start), _int(end)
    if not 0 <= i <= j <= len(values):
        return _error(f"slice out of range: [{i}:{j}] of {len(values)}")
    return celtypes.ListType(values[i:j])


def _flatten(items: Any, depth: Any = 1) -> _Value:
    values, levels = _list(items), _int(depth)
    if levels < 0:
        return _error("level must be non-negative")
    for _ in range(levels):
        if not any(isinstance(x, list) for x in values):
            break
        values = [y for x in values for y in (x if isinstance(x, list) else [x])]
    return celtypes.ListType(values)


def _distinct(items: Any) -> _Value:
    values, unique = _list(items), list[Any]()
    _spend(len(values) ** 2 >> 4)
    for x in values:
        if not any(_equal(x, y) for y in unique):
            unique.append(x)
    return celtypes.ListType(unique)


def _reverse(value: Any) -> _Value:
    if isinstance(value, str):
        return celtypes.StringType(value[::-1])
    return celtypes.ListType(reversed(_list(value)))


def _sort(items: Any) -> _Value:
    values = _list(items)
    _spend(len(values) * len(values).bit_length() >> 4)
    return celtypes.ListType(sorted(values))


def _range(n: Any) -> _Value:
    count = _int(n)
    _spend(count * 4)  # an IntType costs as much as a few steps
    return celtypes.ListType(celtypes.IntType(i) for i in range(max(count, 0)))


def _sets_contains(items: Any, sub: Any) -> _Value:
    values = _list(items)
    _spend(len(values) * len(_list(sub)) >> 4)
    return celtypes.BoolType(all(any(_equal(x, y) for y in values) for x in _list(sub)))


def _sets_equivalent(a: Any, b: Any) -> _Value:
    return celtypes.BoolType(bool(_sets_contains(a, b)) and bool(_sets_contains(b, a)))


def _sets_intersects(a: Any, b: Any) -> _Value:
    values = _list(a)
    _spend(len(values) * len(_list(b)) >> 4)
    return celtypes.BoolType(any(any(_equal(x, y) for y in values) for x in _list(b)))


_FUNCTIONS: dict[str, Callable[..., _Value]] = {
    # k8s.io/apiserver/pkg/cel/library/quantity.go
    "quantity": _quantity,
    "isQuantity": _is_quantity,
    "sign": lambda q: celtypes.IntType((_quantity_of(q).value > 0) - (_quantity_of(q).value < 0)),
    "isInteger": lambda q: celtypes.BoolType(_quantity_int(q) is not None),
    "asInteger": _as_integer,
    "asApproximateFloat": _as_approximate_float,
    "add": _add,
    "sub": _sub,
    "isGreaterThan": lambda a, b: celtypes.BoolType(_compare(a, b) > 0),
    "isLessThan": lambda a, b: celtypes.BoolType(_compare(a, b) < 0),
    "compareTo": lambda a, b: celtypes.IntType(_compare(a, b)),
    # semverlib.go
    "semver": _semver,
    "isSemver": _is_semver,
    "major": _semver_part(0),
    "minor": _semver_part(1),
    "patch": _semver_part(2),
    # cel-go ext.Strings (version 2)
    "charAt": _char_at,
    "indexOf": _index_of,
    "lastIndexOf": _last_index_of,
    "lowerAscii": lambda s: celtypes.StringType("".join(c.lower() if c.isascii() else c for c in _string(s))),
    "upperAscii": lambda s: celtypes.StringType("".join(c.upper() if c.isascii() else c for c in _string(s))),
    "replace": _replace,
    "split": _split,
    "substring": _substring,
    "trim": lambda s: celtypes.StringType(_string(s).strip()),
    "join": _join,
    "strings.quote": _quote,
    # regex.go, and matches() with compiled patterns kept
    "matches": _matches,
    "find": _find,
    "findAll": _find_all,
    # lists.go (min is cel-python's own)
    "isSorted": _is_sorted,
    "sum": _sum,
    "max": _max,
    "includes": _includes,
    # cel-go ext.Lists (first and last return optionals, which cel-python lacks)
    "slice": _slice,
    "flatten": _flatten,
    "distinct": _distinct,
    "reverse": _reverse,
    "sort": _sort,
    "lists.range": _range,
    # cel-go ext.Sets
    "sets.contains": _sets_contains,
    "sets.equivalent": _sets_equivalent,
    "sets.intersects": _sets_intersects,
}
_NAMESPACED = frozenset(name for name in _FUNCTIONS if "." in name) | {"cel.bind"}
_MACROS = frozenset({"has", "dyn", "all", "exists", "exists_one", "map", "filter", "min"})
_KNOWN_FUNCTIONS = frozenset(_FUNCTIONS) | frozenset(base_functions) | _MACROS
_TYPE_NAMES = frozenset(
    {"bool", "bytes", "double", "int", "uint", "string", "list", "map", "null_type", "type"}
)


# --- The device ---------------------------------------------------------------------------------


class _DeviceMap(celtypes.MapType):
    """A map of the device, bounded in size by the API."""

    def __init__(self, items: Mapping[Any, Any] | None = None) -> None:
        dict.__init__(self, items or {})  # keys are distinct strings already: skip MapType's checks


class _DomainMap(_DeviceMap):
    """device.attributes and device.capacity: a domain the device lacks reads as an empty map, as
    Kubernetes' newStringInterfaceMapWithDefault does, while `in`, size() and iteration see only
    the device's own domains."""

    def __getitem__(self, key: Any) -> Any:
        try:
            return super().__getitem__(key)
        except KeyError:
            return _EMPTY


_EMPTY = _DeviceMap()


def _split_name(name: str, driver: str) -> tuple[str, str]:
    domain, slash, ident = name.partition("/")
    return (domain, ident) if slash else (driver, name)


def _cel_attribute(name: str, value: AttributeValue | tuple[AttributeValue, ...]) -> Any:
    if isinstance(value, bool):
        return celtypes.BoolType(value)
    if isinstance(value, int):
        if not INT64[0] <= value <= INT64[1]:
            raise SelectorError(f"attribute {name}: {value} is out of the int64 range")
        return celtypes.IntType(value)
    if isinstance(value, str):
        return celtypes.StringType(value)
    if isinstance(value, Version):
        try:
            return _parse_semver(value.text)
        except ValueError as err:
            raise SelectorError(f"attribute {name}: parse semantic version: {err}") from None
    if isinstance(value, tuple | list):
        return celtypes.ListType(_cel_attribute(name, v) for v in value)
    raise SelectorError(f"attribute {name}: unsupported value {value!r}")


def _cel_capacity(name: str, text: str) -> _Quantity:
    try:
        return _parse_cel_quantity(text)
    except QuantityError as err:
        raise SelectorError(f"capacity {name}: {err}") from None


_last_converted: tuple[DeviceView | None, celtypes.MapType] = (None, _EMPTY)


def _converted(device: DeviceView) -> celtypes.MapType:
    """The device as CEL sees it; the last one is kept, as a device is tried against its selectors
    one after the other (a DeviceView is not changed once made)."""
    global _last_converted
    last, value = _last_converted
    if last is not device:
        value = _cel_device(device)
        _last_converted = (device, value)
    return value


def _cel_device(device: DeviceView) -> celtypes.MapType:
    attributes: dict[str, dict[str, Any]] = {}
    for name, value in device.attributes.items():
        domain, ident = _split_name(name, device.driver)
        attributes.setdefault(domain, {})[ident] = _cel_attribute(name, value)
    capacity: dict[str, dict[str, Any]] = {}
    for name, text in device.capacity.items():
        domain, ident = _split_name(name, device.driver)
        capacity.setdefault(domain, {})[ident] = _cel_capacity(name, text)
    return _DeviceMap(
        {
            celtypes.StringType("driver"): celtypes.StringType(device.driver),
            celtypes.StringType("allowMultipleAllocations"): celtypes.BoolType(
                device.allow_multiple_allocations
            ),
            celtypes.StringType("attributes"): _DomainMap(
                {celtypes.StringType(d): _DeviceMap(m) for d, m in attributes.items()}
            ),
            celtypes.StringType("capacity"): _DomainMap(
                {celtypes.StringType(d): _DeviceMap(m) for d, m in capacity.items()}
            ),
        }
    )


# --- Compiling and evaluating -------------------------------------------------------------------


class _CostExceeded(Exception):
    pass


class _CostLimitError(SelectorError):
    pass


class _Meter:
    """Units of work: one a step, one per element of a list or map a step yields (but not for the
    device's own maps, which the API bounds), one per 16 characters of a string, `ITERATION_COST`
    for each pass of a macro (whose Python cost is a new activation), and what functions `_spend`."""

    __slots__ = ("spent",)
    ITERATION_COST = 4

    def __init__(self) -> None:
        self.spent = 0

    def charge(self, value: object) -> None:
        if isinstance(value, str | bytes):
            self.spent += 1 + (len(value) >> 4)
        elif isinstance(value, list | dict) and not isinstance(value, _DeviceMap):
            self.spent += 1 + len(value)
        else:
            self.spent += 1
        if self.spent > MAX_COST:
            raise _CostExceeded

    def charge_units(self, units: int) -> None:
        self.spent += units
        if self.spent > MAX_COST:
            raise _CostExceeded


_meter: ContextVar[_Meter] = ContextVar("selector_meter")  # the evaluation's, for functions


# Rules that, with one child, only pass its value on: dropping them at compile time makes the tree
# (and every evaluation) about half as deep; Evaluator dispatches on each node's own rule.
_PASS_THROUGH = frozenset(
    {"expr", "conditionalor", "conditionaland", "relation", "addition", "multiplication", "unary", "member"}
)
_LOGICAL = frozenset({"conditionaland", "conditionalor"})


def _skip(node: Any) -> Any:
    while isinstance(node, lark.Tree) and node.data in _PASS_THROUGH and len(node.children) == 1:
        if not isinstance(node.children[0], lark.Tree):
            break
        node = node.children[0]
    return node


def _balanced(rule: str, operands: list[Any], made: set[int]) -> Any:
    if len(operands) == 1:
        return operands[0]
    middle = len(operands) // 2
    node = lark.Tree(
        rule, [_balanced(rule, operands[:middle], made), _balanced(rule, operands[middle:], made)]
    )
    made.add(id(node))
    return node


def _collapse(tree: lark.Tree[Any]) -> lark.Tree[Any]:
    """The parse tree without pass-through nodes, and with chains of `&&` or `||` (which the
    grammar nests one level a term) balanced, as cel-go's parser does: a long chain stays shallow."""
    root = _skip(tree)
    stack, made = [root], set[int]()
    while stack:
        node = stack.pop()
        if node.data in _LOGICAL and len(node.children) == 2 and id(node) not in made:
            operands, spine = [], node
            while isinstance(spine, lark.Tree) and spine.data == node.data and len(spine.children) == 2:
                operands.append(spine.children[1])
                spine = spine.children[0]
            node.children = _balanced(node.data, [spine, *reversed(operands)], made).children
        node.children = [_skip(child) for child in node.children]
        stack.extend(child for child in node.children if isinstance(child, lark.Tree))
    return cast(lark.Tree[Any], root)


def _depth(tree: lark.Tree[Any]) -> int:
    deepest, stack = 0, [(tree, 1)]
    while stack:
        node, depth = stack.pop()
        deepest = max(deepest, depth)
        stack.extend((c, depth + 1) for c in node.children if isinstance(c, lark.Tree))
    return deepest


def _bare_ident(tree: Any) -> str | None:
    """NAME for a subtree that is just the identifier NAME."""
    if isinstance(tree, lark.Tree) and tree.data == "primary" and len(tree.children) == 1:
        child = tree.children[0]
        if isinstance(child, lark.Tree) and child.data == "ident":
            return str(child.children[0])
    return None


def _check_names(tree: lark.Tree[Any]) -> None:
    """Kubernetes type-checks at compile time; cel-python would find an unknown name only when it
    is reached, so names are checked here: variables, functions and macros."""
    bound = {"device"}
    for node in tree.iter_subtrees():
        if node.data == "member_dot_arg" and len(node.children) == 3:
            method = str(node.children[1])
            namespace = _bare_ident(node.children[0])
            args = cast(lark.Tree[Any], node.children[2]).children
            binds = f"{namespace}.{method}" == "cel.bind"
            if binds or method in {"all", "exists", "exists_one", "map", "filter"}:
                variable = _bare_ident(args[0]) if args else None
                wanted = 3 if binds else 2
                if variable is None or len(args) != wanted:
                    then = "two expressions" if binds else "an expression"
                    raise SelectorError(f"CEL compile error: {method}() takes a variable name and {then}")
                bound.add(variable)
    for node in tree.iter_subtrees():
        if node.data == "member_object":
            raise SelectorError("CEL compile error: message construction is not supported")
        if node.data == "member_dot_arg":
            method, namespace = str(node.children[1]), _bare_ident(node.children[0])
            if f"{namespace}.{method}" not in _NAMESPACED and method not in _KNOWN_FUNCTIONS:
                raise SelectorError(f"CEL compile error: undeclared reference to '{method}'")
        elif node.data == "ident_arg" and str(node.children[0]) not in _KNOWN_FUNCTIONS:
            raise SelectorError(f"CEL compile error: undeclared reference to '{node.children[0]}'")
        elif node.data in ("ident", "dot_ident"):
            name = str(node.children[0])
            if name not in bound and name not in _TYPE_NAMES and not _is_namespace(name):
                raise SelectorError(f"CEL compile error: undeclared reference to '{name}'")


# A read of the device: ("driver", "", None), ("allowMultipleAllocations", "", None), or
# (map, domain, id) for one attribute or capacity, or (map, domain, None) for `"domain" in device.<map>`.
_Read = tuple[str, str, str | None]


def _device_reads(tree: lark.Tree[Any], literals: dict[int, Result]) -> tuple[_Read, ...] | None:
    """What the expression reads of the device, when every use of `device` is `device.driver`,
    `device.allowMultipleAllocations`, `device.<map>[<domain>].<id>` or `[<id>]` (names constant),
    `"<id>" in device.<map>[<domain>]` or `"<domain>" in device.<map>`; then its result (error,
    cost) is a function of those values alone, as device maps are charged one unit whatever their
    size. None for any other use: a map used whole, a computed name, `device` rebound or in
    parentheses."""
    parents: dict[int, lark.Tree[Any]] = {}
    uses: list[lark.Tree[Any]] = []
    for node in tree.iter_subtrees():
        for child in node.children:
            if isinstance(child, lark.Tree):
                parents[id(child)] = node
        if node.data in ("ident", "dot_ident") and str(node.children[0]) == "device":
            uses.append(node)
    reads: dict[_Read, None] = {}
    for use in uses:
        primary = parents.get(id(use))
        if use.data != "ident" or primary is None:
            return None
        field_node = parents.get(id(primary))
        if field_node is None or field_node.data != "member_dot" or field_node.children[0] is not primary:
            return None
        field = str(field_node.children[1])
        if field in ("driver", "allowMultipleAllocations"):
            reads[field, "", None] = None
            continue
        if field not in ("attributes", "capacity"):
            return None
        domain_node = parents.get(id(field_node))
        if domain_node is None:
            return None
        domain = _name_after(domain_node, field_node, literals)
        if domain is None:
            domain = _in_left(domain_node, field_node, literals)
            if domain is None:
                return None
            reads[field, domain, None] = None
            continue
        id_node = parents.get(id(domain_node))
        ident = _name_after(id_node, domain_node, literals)
        if ident is None:
            ident = _in_left(id_node, domain_node, literals)
        if ident is None:
            return None
        reads[field, domain, ident] = None
    return tuple(reads)


def _const_string(node: Any, literals: dict[int, Result]) -> str | None:
    if isinstance(node, lark.Tree) and node.data == "primary" and len(node.children) == 1:
        literal = node.children[0]
        if isinstance(literal, lark.Tree) and literal.data == "literal":
            value = literals.get(id(literal))
            return str(value) if isinstance(value, celtypes.StringType) else None
    return None


def _name_after(
    node: lark.Tree[Any] | None, target: lark.Tree[Any], literals: dict[int, Result]
) -> str | None:
    """NAME when `node` is `target.NAME` or `target["NAME"]`."""
    if node is None or not node.children or node.children[0] is not target:
        return None
    if node.data == "member_dot":
        return str(node.children[1])
    if node.data == "member_index":
        return _const_string(node.children[1], literals)
    return None


def _in_left(node: lark.Tree[Any] | None, target: lark.Tree[Any], literals: dict[int, Result]) -> str | None:
    """NAME when `node` is `"NAME" in target`."""
    if node is None or node.data != "relation" or len(node.children) != 2 or node.children[1] is not target:
        return None
    operation = node.children[0]
    if isinstance(operation, lark.Tree) and operation.data == "relation_in":
        return _const_string(operation.children[0], literals)
    return None


@functools.cache
def _namespaces() -> frozenset[str]:
    return frozenset(name.split(".", 1)[0] for name in _NAMESPACED)


def _is_namespace(name: str) -> bool:
    return name in _namespaces()


# The relations as cel-python's Evaluator.relation applies them, wrapped once instead of per call.
_RELATIONS: dict[str, tuple[str, Callable[[Any, Any], Any]]] = {
    "relation_lt": ("<", boolean(operator.lt)),
    "relation_le": ("<=", boolean(operator.le)),
    "relation_gt": (">", boolean(operator.gt)),
    "relation_ge": (">=", boolean(operator.ge)),
    "relation_eq": ("==", boolean(operator.eq)),
    "relation_ne": ("!=", boolean(operator.ne)),
    "relation_in": ("in", operator_in),
}


class _MeteredEvaluator(Evaluator):
    """cel-python's interpreter, metered per step, with literals computed once, `&&`/`||` that
    skip their right side when the left decides, and `cel.bind` and namespaced functions."""

    def __init__(
        self, ast: lark.Tree[Any], activation: Activation, meter: _Meter, literals: dict[int, Result]
    ) -> None:
        super().__init__(ast, activation)
        self.meter = meter
        self.literals = literals

    def sub_evaluator(self, ast: lark.Tree[Any]) -> Evaluator:
        return _MeteredEvaluator(ast, self.activation, self.meter, self.literals)

    def evaluate(self, context: Mapping[str, Any] | None = None) -> celtypes.Value:
        if context:  # a pass of a macro, or cel.bind
            self.meter.charge_units(_Meter.ITERATION_COST)
        return super().evaluate(context)

    def visit(self, tree: lark.Tree[Any]) -> Result:
        value = cast(Result, super().visit(tree))
        self.meter.charge(value)
        return value

    def visit_children(self, tree: lark.Tree[Any]) -> list[Result]:
        return [self.visit(child) if isinstance(child, lark.Tree) else child for child in tree.children]

    def literal(self, tree: lark.Tree[Any]) -> Result:
        return self.literals[id(tree)]

    def ident_value(self, name: str, root_scope: bool = False) -> Any:
        # The nearest binding, as Activation.resolve_variable finds it for a name without a package.
        names: NameContainer | None = self.activation.identifiers
        while names is not None:
            referent = dict.get(names, name)
            if referent is not None:
                return referent.value
            names = names.parent
        return super().ident_value(name, root_scope)

    def function_eval(self, name_token: lark.Token, exprlist: Any = None) -> Result:
        function = _FUNCTIONS.get(name_token.value) or base_functions.get(name_token.value)
        if function is None or isinstance(exprlist, CELEvalError):
            return super().function_eval(name_token, exprlist)
        return _call(name_token.value, function, list(exprlist or []))

    def conditionaland(self, tree: lark.Tree[Any]) -> Result:
        return self._logical(tree, "&&", celtypes.logical_and, decided_by=False)

    def conditionalor(self, tree: lark.Tree[Any]) -> Result:
        return self._logical(tree, "||", celtypes.logical_or, decided_by=True)

    def _logical(
        self, tree: lark.Tree[Any], symbol: str, operator: Callable[[Any, Any], Any], decided_by: bool
    ) -> Result:
        left = self.visit(tree.children[0])
        if isinstance(left, celtypes.BoolType) and bool(left) is decided_by:
            return left
        right = self.visit(tree.children[1])
        try:
            return cast(Result, operator(left, right))
        except TypeError:
            return _error(f"no such overload: {_type_name(left)} {symbol} {_type_name(right)}")

    def relation(self, tree: lark.Tree[Any]) -> Result:
        if len(tree.children) != 2:
            return cast(Result, super().relation(tree))
        operation, right_tree = cast(tuple[lark.Tree[Any], lark.Tree[Any]], tree.children)
        symbol, function = _RELATIONS[operation.data]
        left, right = self.visit(operation.children[0]), self.visit(right_tree)
        try:
            return cast(Result, function(left, right))
        except TypeError:
            return _error(f"no such overload: {_type_name(left)} {symbol} {_type_name(right)}")

    def member_dot_arg(self, tree: lark.Tree[Any]) -> Result:
        method = str(tree.children[1])
        args = cast(lark.Tree[Any], tree.children[2]).children if len(tree.children) > 2 else []
        namespace = _bare_ident(tree.children[0])
        qualified = f"{namespace}.{method}"
        if namespace is not None and qualified in _NAMESPACED:
            return self._namespaced(qualified, args)
        if method in _MACROS:
            try:
                return cast(Result, super().member_dot_arg(tree))
            except TypeError:  # cel-python iterates the target without checking it: `true.exists(...)`
                return _error(f"no such overload: {method}() on a value that is not a list or map")
        target = self.visit(tree.children[0])
        values = [self.visit(arg) for arg in args]
        return _call(method, _FUNCTIONS.get(method) or base_functions[method], [target, *values])

    def _namespaced(self, qualified: str, args: list[Any]) -> Result:
        if qualified == "cel.bind":
            variable = cast(str, _bare_ident(args[0]))
            value = self.visit(args[1])
            try:
                return self.sub_evaluator(args[2]).evaluate({variable: value})
            except CELEvalError as err:
                return err
        return _call(qualified, _FUNCTIONS[qualified], [self.visit(arg) for arg in args])


def _call(name: str, function: Callable[..., Any], args: list[Any]) -> Result:
    """A function on evaluated arguments, as cel-python's Evaluator.method_eval calls it."""
    for arg in args:
        if isinstance(arg, CELEvalError):
            return arg
    try:
        return cast(Result, function(*args))
    except (TypeError, AttributeError):
        return _error(f"no such overload: {name}({', '.join(_type_name(a) for a in args)})")
    except ValueError as err:
        return _error(f"{name}: {err}")


# cel-python passes values it does not know (_Quantity, _Semver) through untouched.
_ENVIRONMENT = Environment()
_BASE_ACTIVATION = Activation(
    annotations=_ENVIRONMENT.annotations, functions=cast(dict[str, Callable[..., Result]], _FUNCTIONS)
)


def _describe(err: CELEvalError) -> str:
    message, kind, details = [*err.args, None, None, None][:3]
    if kind is KeyError and details:
        return f"no such key: {details[0]}"
    text = str(message)
    if text.startswith("no such member in mapping: "):
        return "no such key: " + text.removeprefix("no such member in mapping: ").strip("'\"")
    if text == "no such overload" and details:
        return f"no such overload: {details[0]}"
    if text == "return error for overflow":
        return "integer overflow"
    if kind is IndexError:
        return "index out of range"
    return text.split(" (in activation")[0]


class Selector:
    """One compiled selector expression; `reads` is what it reads of a device (`_device_reads`),
    or None when its result may depend on all of the device."""

    __slots__ = ("_ast", "_literals", "expression", "reads")

    def __init__(
        self,
        expression: str,
        ast: lark.Tree[Any],
        literals: dict[int, Result],
        reads: tuple[_Read, ...] | None = None,
    ) -> None:
        self.expression = expression
        self._ast = ast
        self._literals = literals
        self.reads = reads

    def __repr__(self) -> str:
        return f"Selector({self.expression!r})"

    def matches(self, device: DeviceView) -> bool:
        """Whether the device matches; SelectorError on a runtime error or a non-bool result."""
        activation = _BASE_ACTIVATION.nested_activation(vars={"device": _converted(device)})
        meter = _Meter()
        evaluator = _MeteredEvaluator(self._ast, activation, meter, self._literals)
        metering = _meter.set(meter)
        try:
            result = evaluator.evaluate()
        except CELEvalError as err:
            raise SelectorError(f"CEL: {_describe(err)}") from None
        except _CostExceeded:
            raise _CostLimitError(
                f"CEL: evaluation exceeded the cost limit of {MAX_COST} units (too much work for a selector)"
            ) from None
        except RecursionError:
            raise SelectorError("CEL: expression nested too deeply to evaluate") from None
        finally:
            _meter.reset(metering)
        if not isinstance(result, celtypes.BoolType):
            raise SelectorError(f"CEL result of type {_type_name(result)} is not a bool")
        return bool(result)


def _type_name(value: object) -> str:
    names = {
        celtypes.IntType: "int",
        celtypes.UintType: "uint",
        celtypes.DoubleType: "double",
        celtypes.StringType: "string",
        celtypes.BytesType: "bytes",
        celtypes.ListType: "list",
        celtypes.MapType: "map",
        _DeviceMap: "map",
        _DomainMap: "map",
        _Quantity: "Quantity",
        _Semver: "Semver",
    }
    return names.get(type(value), type(value).__name__)


def compile_selector(expression: str) -> Selector:
    """The selector, or SelectorError for an expression too long, too deep or that does not
    compile."""
    size = len(expression.encode())
    if size > MAX_EXPRESSION_BYTES:
        raise SelectorError(f"CEL expression is {size} bytes, over the limit of {MAX_EXPRESSION_BYTES}")
    try:
        ast = _collapse(_ENVIRONMENT.compile(expression))
    except CELParseError as err:
        where = f" at line {err.line}, column {err.column}" if err.line else ""
        raise SelectorError(
            f"CEL compile error: syntax error{where}: {str(err.args[0]).splitlines()[0]}"
        ) from None
    except RecursionError:
        raise SelectorError("CEL compile error: expression nested too deeply") from None
    if _depth(ast) > MAX_DEPTH:
        raise SelectorError(f"CEL compile error: expression nested deeper than {MAX_DEPTH}")
    _check_names(ast)
    literals: dict[int, Result] = {}
    plain = Evaluator(ast, _BASE_ACTIVATION)
    for node in ast.iter_subtrees():
        if node.data == "literal":
            value = plain.literal(node)
            if isinstance(value, CELEvalError):
                raise SelectorError(f"CEL compile error: {_describe(value)}")
            literals[id(node)] = value
    return Selector(expression, ast, literals, _device_reads(ast, literals))


_PLAIN = frozenset({str, bool})  # attribute types that always convert
_ABSENT = ("absent", None)  # a missing domain reads as an empty map: the same as a missing id


def _encoded(value: Any) -> tuple[str, Hashable]:
    """An attribute value as a key, what its conversion to CEL depends on: the type as well, as
    True == 1 in Python; no objects the garbage collector tracks, as the keys are many."""
    if value.__class__ is str:
        return ("s", value)
    if isinstance(value, bool):
        return ("b", value)
    if isinstance(value, int):
        return ("i", value)
    if isinstance(value, str):
        return ("s", value)
    if isinstance(value, Version):
        return ("v", value.text)
    return ("l", tuple(part for v in value for part in _encoded(v)))


class _Prepared:
    """One device as SelectorCache keys it: its attributes and capacity by domain and id, as
    `_cel_device` makes them but the raw values; or the error that converting it gives, which
    every selector then fails with."""

    __slots__ = ("attributes", "capacity", "driver", "invalid", "multiple")

    def __init__(self, device: DeviceView) -> None:
        self.driver = device.driver
        self.multiple = bool(device.allow_multiple_allocations)
        self.invalid: str | None = None
        self.attributes: dict[str, dict[str, Any]] = {}
        self.capacity: dict[str, dict[str, Any]] = {}
        try:
            for name, value in device.attributes.items():
                if not (value.__class__ in _PLAIN or (type(value) is int and INT64[0] <= value <= INT64[1])):
                    _cel_attribute(name, value)  # raises as the conversion does
                self._put(self.attributes, name, value)
            for name, text in device.capacity.items():
                _cel_capacity(name, text)
                self._put(self.capacity, name, text)
        except SelectorError as err:
            self.invalid = str(err)

    def _put(self, maps: dict[str, dict[str, Any]], name: str, value: Any) -> None:
        domain, slash, ident = name.partition("/")  # as _split_name
        if not slash:
            domain, ident = self.driver, name
        ids = maps.get(domain)
        if ids is None:
            ids = maps[domain] = {}
        ids[ident] = value

    def projection(self, reads: tuple[_Read, ...]) -> tuple[Hashable, ...]:
        """The values read, two items each."""
        values: list[Hashable] = []
        for part, domain, ident in reads:
            if part == "driver":
                values += ("s", self.driver)
            elif part == "allowMultipleAllocations":
                values += ("b", self.multiple)
            else:
                ids = (self.attributes if part == "attributes" else self.capacity).get(domain)
                if ident is None:
                    values += ("b", ids is not None)
                elif ids is None or ident not in ids:
                    values += _ABSENT
                elif part == "attributes":
                    values += _encoded(ids[ident])
                else:
                    values += ("q", ids[ident])
        return tuple(values)

    def content(self) -> tuple[Hashable, ...]:
        """All that a selector sees of the device, map order included (macros iterate in it):
        four items an attribute or capacity, in `_cel_device`'s order."""
        values: list[Hashable] = [self.driver, self.multiple, sum(map(len, self.attributes.values()))]
        for domain, ids in self.attributes.items():
            for ident, value in ids.items():
                values += (domain, ident, *_encoded(value))
        for domain, ids in self.capacity.items():
            for ident, text in ids.items():
                values += (domain, ident, "q", text)
        return tuple(values)


class SelectorCache:
    """Compiled selectors by expression and results by expression and device content, each
    bounded (least recently used goes first).

    A result is kept for what the selector reads of the device (`Selector.reads`): devices that
    differ only in attributes it does not read (uuid, index) share one evaluation. A selector that
    may read all of the device is kept per device content, by a number for each content (the
    contents are bounded too, by `max_devices`). A device changed under the same name is thus
    evaluated again.

    An expression that runs over the cost limit on one device fails on every device from then on:
    a hostile selector costs one bounded evaluation, not one for each of thousands of devices."""

    def __init__(
        self, max_selectors: int = 4096, max_results: int = 262_144, max_devices: int = 65_536
    ) -> None:
        self.max_selectors = max_selectors
        self.max_results = max_results
        self.max_devices = max_devices
        self._selectors: OrderedDict[str, Selector | SelectorError] = OrderedDict()
        self._results: OrderedDict[tuple[str, Hashable], bool | SelectorError] = OrderedDict()
        self._contents: OrderedDict[tuple[Hashable, ...], int] = OrderedDict()
        self._numbers = itertools.count()
        self._last: tuple[DeviceView, _Prepared] | None = None
        self._lock = threading.Lock()

    def selector(self, expression: str) -> Selector:
        with self._lock:
            found = self._selectors.get(expression)
            if found is not None:
                self._selectors.move_to_end(expression)
        if found is None:
            try:
                found = compile_selector(expression)
            except SelectorError as err:
                found = err
            with self._lock:
                self._selectors[expression] = found
                _trim(self._selectors, self.max_selectors)
        if isinstance(found, SelectorError):
            raise found.with_traceback(None)  # a fresh traceback each time, not a growing one
        return found

    def matches(self, expression: str, device_key: Hashable, device: DeviceView) -> bool:
        """Whether the device matches; SelectorError (also when cached) otherwise. `device_key` is
        not used: results are kept by what the device holds, not by its name."""
        selector = self.selector(expression)
        last = self._last
        if last is None or last[0] is not device:  # a device is tried on its selectors one after the other
            last = (device, _Prepared(device))
            self._last = last
        prepared = last[1]
        key: tuple[str, Hashable]
        if prepared.invalid is not None:
            key = (expression, ("invalid", prepared.invalid))
        elif selector.reads is not None:
            key = (expression, prepared.projection(selector.reads))
        else:
            key = (expression, self._number(prepared.content()))
        with self._lock:
            found = self._results.get(key)
            if found is not None:
                self._results.move_to_end(key)
        if found is None:
            try:
                found = selector.matches(device)
            except SelectorError as err:
                found = err
            with self._lock:
                self._results[key] = found
                _trim(self._results, self.max_results)
                if isinstance(found, _CostLimitError):
                    self._selectors[expression] = found
        if isinstance(found, SelectorError):
            raise found.with_traceback(None)
        return found

    def _number(self, content: tuple[Hashable, ...]) -> int:
        """The number of a device content; a content forgotten gets a new one if seen again, never
        an old one, so no result is ever taken for another content's."""
        with self._lock:
            number = self._contents.get(content)
            if number is None:
                number = self._contents[content] = next(self._numbers)
                _trim(self._contents, self.max_devices)
            else:
                self._contents.move_to_end(content)
        return number

    def __len__(self) -> int:
        return len(self._results)


def _trim(entries: OrderedDict[Any, Any], limit: int) -> None:
    while len(entries) > limit:
        entries.popitem(last=False)
