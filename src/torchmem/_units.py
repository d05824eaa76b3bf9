"""Size units, in one table for every place torchmem reads a size (OOM messages, ``limit()``, ``budget()``,
the pytest marker, CLI options).

torch prints every size in binary units, and labels some of them "GB"/"MB" (MPS, the CPU allocator, old
messages): "GB" in a torch message means GiB. torchmem reads them all the same way, so a size copied from an
OOM message means what it said: ``"20GB"`` is ``20 * 2**30`` bytes everywhere in torchmem, the same as
``"20GiB"``. There are no decimal (powers of 1000) units: they would make the same text mean two sizes.
"""

from __future__ import annotations

import re

UNITS: dict[str, int] = {
    "b": 1,
    "byte": 1,
    "bytes": 1,
    "k": 1 << 10,
    "kb": 1 << 10,
    "kib": 1 << 10,
    "m": 1 << 20,
    "mb": 1 << 20,
    "mib": 1 << 20,
    "g": 1 << 30,
    "gb": 1 << 30,
    "gib": 1 << 30,
    "t": 1 << 40,
    "tb": 1 << 40,
    "tib": 1 << 40,
    "p": 1 << 50,
    "pb": 1 << 50,
    "pib": 1 << 50,
}
"""Lower-case unit -> bytes. Binary throughout: ``"gb"`` and ``"gib"`` are both ``2**30``."""

UNITS_TEXT = "B, KiB/KB, MiB/MB, GiB/GB, TiB/TB (all powers of 1024, as in torch's messages)"
"""How messages list the units."""

NUMBER_AND_UNIT = r"(\d+(?:\.\d+)?)\s?(bytes|byte|B|KiB|MiB|GiB|TiB|PiB|KB|MB|GB|TB|PB)\b"
"""A regular expression for a size as torch prints it (``"2.00 GiB"``): groups number and unit."""

_FULL = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*$")


def unit_bytes(unit: str) -> int | None:
    """Bytes in one ``unit`` (any case; ``""`` is bytes), or ``None`` for an unknown unit.

    Example:
        >>> unit_bytes("GB") == unit_bytes("GiB") == 1 << 30
        True
    """
    return 1 if unit == "" else UNITS.get(unit.lower())


def parse_size(text: str) -> int | None:
    """``"2.00 GiB" -> 2147483648``; ``None`` when ``text`` is not a number with a known unit.

    Example:
        >>> parse_size("20.00 MiB"), parse_size("1.5GB"), parse_size("512")
        (20971520, 1610612736, 512)
    """
    m = _FULL.match(text)
    if m is None:
        return None
    scale = unit_bytes(m.group(2))
    if scale is None:
        return None
    return round(float(m.group(1)) * scale)


__all__ = ["NUMBER_AND_UNIT", "UNITS", "UNITS_TEXT", "parse_size", "unit_bytes"]
