"""Sizes and durations as people write and read them."""

from __future__ import annotations

import pytest

from proxy.core.units import format_size, parse_size


@pytest.mark.parametrize(
    ("n", "text"),
    [
        (12, "12B"),
        (640 << 10, "640KiB"),
        (1.5 * (1 << 20), "1.5MiB"),
        (1010 * (1 << 20), "1010MiB"),  # three digits would need an exponent: none
        (1023.9 * (1 << 10), "1024KiB"),
        (3 << 30, "3GiB"),
    ],
)
def test_a_size_reads_with_its_unit_and_never_an_exponent(n, text):
    assert format_size(n) == text


def test_a_formatted_size_reads_back_near_what_it_was():
    for n in (12, 4096, 5 << 20, 1010 << 20, 7 << 30):
        assert abs(parse_size(format_size(n)) - n) <= n * 0.005
