"""Human formatting of byte figures. ``None`` is always ``n/a``."""

from __future__ import annotations

_UNITS = ("B", "KiB", "MiB", "GiB", "TiB")


def fmt_bytes(n: int | float | None, signed: bool = False) -> str:
    """``1536 -> '1.50 KiB'``; ``None -> 'n/a'``; ``signed=True`` puts a ``+`` on positive figures."""
    if n is None:
        return "n/a"
    sign = "-" if n < 0 else ("+" if signed and n > 0 else "")
    v = float(abs(n))
    for unit in _UNITS:
        if v < 1024 or unit == _UNITS[-1]:
            if unit == "B":
                return f"{sign}{int(v)} B"
            return f"{sign}{v:.2f} {unit}"
        v /= 1024
    raise AssertionError("unreachable")


def fmt_remainder(n: int | None) -> str:
    """A remainder figure (what one reading leaves after the others), never negative: a negative remainder
    means two readings disagree, and says by how much instead.

    Example:
        >>> fmt_remainder(2048), fmt_remainder(-1536), fmt_remainder(None)
        ('2.00 KiB', '0 B (the readings disagree by 1.50 KiB)', 'n/a')
    """
    if n is None or n >= 0:
        return fmt_bytes(n)
    return f"0 B (the readings disagree by {fmt_bytes(-n)})"


def fmt_ratio(r: float | None) -> str:
    return "n/a" if r is None else f"{r:.1%}"


def count(n: int, noun: str, plural: str | None = None) -> str:
    """``n`` and the noun agreeing with it: ``count(1, "tensor")`` is ``"1 tensor"``, 2 gives ``"2 tensors"``.

    Example:
        >>> count(1, "storage"), count(3, "storage"), count(0, "live tensor storage")
        ('1 storage', '3 storages', '0 live tensor storages')
    """
    return f"{n} {noun if n == 1 else (plural or noun + 's')}"


def text_table(rows: list[list[str]], right: set[int]) -> list[str]:
    """Plain-text columns (the first row is the header): two spaces between, columns in ``right`` aligned
    right, each line indented by two spaces.

    Example:
        >>> text_table([["rank", "peak"], ["0", "1.00 GiB"]], {1})
        ['  rank      peak', '  0     1.00 GiB']
    """
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    out = []
    for r in rows:
        cells = [c.rjust(widths[i]) if i in right else c.ljust(widths[i]) for i, c in enumerate(r)]
        out.append("  " + "  ".join(cells).rstrip())
    return out
