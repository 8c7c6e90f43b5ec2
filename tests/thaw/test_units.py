"""Byte sizes (thaw/units.py): parsing what a person writes, showing a count."""

from __future__ import annotations

import pytest

from thaw.units import GiB, MiB, human_bytes, parse_size_bytes


@pytest.mark.parametrize(
    ("size", "expected"),
    [
        ("256MiB", 256 * 1024**2),
        ("1GiB", 1024**3),
        ("1gib", 1024**3),
        ("1.5GB", 1_500_000_000),
        (" 64 MiB ", 64 * 1024**2),
        ("1000000", 1_000_000),
        (12345, 12345),
    ],
)
def test_parse_size_bytes(size: str | int, expected: int) -> None:
    assert parse_size_bytes(size) == expected


@pytest.mark.parametrize("size", ["", "big", "1 GiBs", "-5MiB", "0", 0, "1e9", "MiB"])
def test_parse_size_rejects_garbage(size: str | int) -> None:
    with pytest.raises(ValueError):
        parse_size_bytes(size)


@pytest.mark.parametrize(("n", "shown"), [(0, "0 B"), (512, "512 B"), (1536, "1.5 KiB"), (256 * MiB, "256.0 MiB"),
                                          (1.5 * GiB, "1.5 GiB"), (4096 * GiB, "4096.0 GiB")])
def test_human_bytes(n: float, shown: str) -> None:
    assert human_bytes(n) == shown
