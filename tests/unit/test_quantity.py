from __future__ import annotations

from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from quorum.core.model import milli
from quorum.core.quantity import MAX_EXPONENT, MAX_LENGTH, QuantityError, parse_quantity


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("1", Fraction(1)),
        ("500m", Fraction(1, 2)),
        ("1Gi", Fraction(2**30)),
        ("1Ti", Fraction(2**40)),
        ("2k", Fraction(2000)),
        ("1.5", Fraction(3, 2)),
        ("1e3", Fraction(1000)),
        ("100n", Fraction(1, 10**7)),
        ("0.5Gi", Fraction(2**29)),
        (8, Fraction(8)),
    ],
)
def test_examples(text: str | int, value: Fraction) -> None:
    assert parse_quantity(text) == value


@given(st.integers(min_value=0, max_value=10**9))
def test_milli_is_a_thousandth(n: int) -> None:
    assert parse_quantity(f"{n}m") * 1000 == parse_quantity(str(n))


@pytest.mark.parametrize("bad", ["", "1.2.3", "Gi", "1 Gi", "1gi", "abc"])
def test_bad_quantities_say_what_is_expected(bad: str) -> None:
    with pytest.raises(QuantityError, match="not a Kubernetes quantity"):
        parse_quantity(bad)


@pytest.mark.parametrize(
    "absurd",
    [
        "1e1000000000",  # 10**1e9 would take minutes and gigabytes
        "1e-1000000000",
        "1E65",
        "9" * 100_000,  # a hundred thousand digits
        "0." + "0" * 100 + "1",
        " " * 60 + "1" * 10,
    ],
)
def test_absurd_quantities_are_refused_at_once(absurd: str) -> None:
    with pytest.raises(QuantityError):
        parse_quantity(absurd)
    with pytest.raises(QuantityError):
        milli(absurd)


@pytest.mark.parametrize("number", [float("inf"), float("-inf"), float("nan")])
def test_numbers_that_are_not_finite_are_refused(number: float) -> None:
    with pytest.raises(QuantityError, match="not a finite number"):
        parse_quantity(number)


def test_the_bounds_still_take_any_real_quantity() -> None:
    assert parse_quantity(f"1e{MAX_EXPONENT}") == 10**MAX_EXPONENT
    assert parse_quantity("1e-9") == Fraction(1, 10**9)
    assert parse_quantity("8Ei") == 8 * 2**60
    assert parse_quantity("1" * MAX_LENGTH) == int("1" * MAX_LENGTH)
