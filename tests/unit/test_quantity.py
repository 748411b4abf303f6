from __future__ import annotations

from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from quorum.core.quantity import QuantityError, parse_quantity


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
