"""Byte sizes in one place: the binary unit constants, parsing a size a person writes
(``"256MiB"``, ``"1.5GB"``, ``140GiB``) and showing one (``"1.5 GiB"``)."""

from __future__ import annotations

import re

KiB = 1 << 10
MiB = 1 << 20
GiB = 1 << 30

_UNITS = {
    "": 1, "b": 1,
    "kb": 1000, "mb": 1000**2, "gb": 1000**3, "tb": 1000**4,
    "kib": KiB, "mib": MiB, "gib": GiB, "tib": 1 << 40,
}
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")


def parse_size_bytes(size: str | int) -> int:
    """Parse ``"256MiB"``, ``"1GiB"``, ``"1.5GB"``, ``"1000000"`` or an int into a byte count.

    Binary units (KiB, MiB, GiB, TiB) are powers of 1024, decimal ones (KB, MB,
    GB, TB) powers of 1000; case is ignored. Raises ValueError otherwise.
    """
    if isinstance(size, bool):
        raise ValueError(f"size must be a byte count or a string, not {size!r}")
    if isinstance(size, int):
        n = size
    else:
        m = _SIZE_RE.match(size)
        unit = m.group(2).lower() if m else None
        if m is None or unit not in _UNITS:
            raise ValueError(
                f"cannot parse size {size!r}: use a byte count, or a number with one of "
                "B, KB, MB, GB, TB, KiB, MiB, GiB, TiB (e.g. '256MiB', '1GiB')"
            )
        n = int(float(m.group(1)) * _UNITS[unit])
    if n <= 0:
        raise ValueError(f"size must be positive, got {size!r}")
    return n


def human_bytes(n: float) -> str:
    """``n`` bytes in the largest binary unit up to GiB below 1024 of it: ``"512 B"``,
    ``"1.5 GiB"``."""
    value = float(n)
    for unit in ("B", "KiB", "MiB"):
        if value < 1024:
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} GiB"
