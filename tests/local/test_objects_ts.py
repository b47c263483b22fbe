"""Object timestamps: the remembered per-second text equals datetime's formatting of the exact time."""

from __future__ import annotations

import datetime as dt

from hypothesis import given, settings
from hypothesis import strategies as st

from taugrid.local.objects import ts


def _reference(at: float) -> str:
    return dt.datetime.fromtimestamp(at, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@settings(max_examples=2000, deadline=None)
@given(st.floats(min_value=0, max_value=4e9, allow_nan=False))
def test_same_text_as_datetime_for_any_time(at: float) -> None:
    assert ts(at) == _reference(at)


@settings(max_examples=500, deadline=None)
@given(st.integers(min_value=0, max_value=4_000_000_000),
       st.sampled_from([0.0, 0.4999995, 0.9999994999, 0.9999995, 0.99999951, 0.9999996, 0.0000004]))
def test_same_text_where_rounding_to_the_microsecond_carries_a_second(second: int, frac: float) -> None:
    assert ts(second + frac) == _reference(second + frac)


def test_a_known_time() -> None:
    assert ts(1796071093.9999996) == "2026-11-30T20:38:14Z"
