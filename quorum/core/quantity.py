"""Kubernetes resource quantities ("500m", "1Gi", "2e3") as exact numbers."""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation
from fractions import Fraction

_BINARY: dict[str, int] = {
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
    "Pi": 2**50,
    "Ei": 2**60,
}
_DECIMAL: dict[str, Fraction] = {
    "n": Fraction(1, 10**9),
    "u": Fraction(1, 10**6),
    "m": Fraction(1, 1000),
    "": Fraction(1),
    "k": Fraction(10**3),
    "M": Fraction(10**6),
    "G": Fraction(10**9),
    "T": Fraction(10**12),
    "P": Fraction(10**15),
    "E": Fraction(10**18),
}
_PATTERN = re.compile(r"^([+-]?[0-9.]+)(?:([eE][+-]?[0-9]+)|(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]))?$")


class QuantityError(ValueError):
    pass


def parse_quantity(text: str | int | float) -> Fraction:
    """The exact value of a quantity: parse_quantity("100m") == Fraction(1, 10)."""
    if isinstance(text, int):
        return Fraction(text)
    if isinstance(text, float):
        return Fraction(Decimal(repr(text)))
    match = _PATTERN.match(text.strip())
    if not match:
        raise QuantityError(f"{text!r} is not a Kubernetes quantity (e.g. 500m, 2, 1Gi)")
    number, exponent, suffix = match.groups()
    try:
        value = Fraction(Decimal(number))
    except InvalidOperation as err:
        raise QuantityError(f"{text!r} is not a Kubernetes quantity") from err
    if exponent:
        return value * Fraction(10) ** int(exponent[1:])
    if suffix in _BINARY:
        return value * _BINARY[suffix]
    return value * _DECIMAL[suffix or ""]
