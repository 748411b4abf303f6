"""Kubernetes resource quantities ("500m", "1Gi", "2e3") as exact numbers.

Bounded: a quantity is at most `MAX_LENGTH` characters and its exponent at most `MAX_EXPONENT`
in magnitude, so that no input ("1e1000000000", a million digits) costs more than a moment;
anything else is refused with QuantityError.
"""

from __future__ import annotations

import math
import re
from decimal import Decimal, InvalidOperation
from fractions import Fraction

MAX_LENGTH = 64  # characters; the longest quantity Kubernetes writes is far shorter
MAX_EXPONENT = 64  # |e| of "1e64": beyond any resource amount, and cheap to compute

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
        if not math.isfinite(text):
            raise QuantityError(f"{text!r} is not a Kubernetes quantity (not a finite number)")
        return Fraction(Decimal(repr(text)))
    if not isinstance(text, str):
        raise QuantityError(f"{text!r} is not a Kubernetes quantity (not a string or a number)")
    if len(text) > MAX_LENGTH:
        raise QuantityError(f"{text[:20]!r}… ({len(text)} characters) is not a Kubernetes quantity")
    match = _PATTERN.match(text.strip())
    if not match:
        raise QuantityError(f"{text!r} is not a Kubernetes quantity (e.g. 500m, 2, 1Gi)")
    number, exponent, suffix = match.groups()
    try:
        value = Fraction(Decimal(number))
    except InvalidOperation as err:
        raise QuantityError(f"{text!r} is not a Kubernetes quantity") from err
    if exponent:
        power = int(exponent[1:])
        if abs(power) > MAX_EXPONENT:
            raise QuantityError(f"{text!r} is out of range (exponent beyond ±{MAX_EXPONENT})")
        return value * Fraction(10) ** power
    if suffix in _BINARY:
        return value * _BINARY[suffix]
    return value * _DECIMAL[suffix or ""]
