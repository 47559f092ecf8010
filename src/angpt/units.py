"""The units every report speaks in, one home for their formatters: token counts (``1Mi``, ``512K``), learning rates
as run folders name them, durations (``4m05s``, ``12 min``), counts with a suffix (``125.9M``)."""

from __future__ import annotations

import re

from angpt.errors import UserError

_SUFFIX = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9, "ki": 2**10, "mi": 2**20, "gi": 2**30}


def parse_tokens(text: str | int) -> int:
    """A token count: ``4096``, ``512K``, ``1.5M``, ``2G`` (powers of 1000) or ``64Ki``, ``1Mi`` (powers of 1024)."""
    if isinstance(text, int) and not isinstance(text, bool):
        value = text
    else:
        m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:e[0-9]+)?)\s*([kmg]i?)?\s*", str(text), flags=re.IGNORECASE)
        if not m:
            raise UserError(f"bad token count {text!r}; use e.g. 4096, 512K, 1M, 1Mi (=1048576) or 2G")
        value_f = float(m.group(1)) * _SUFFIX[(m.group(2) or "").lower()]
        if value_f != int(value_f):
            raise UserError(f"token count {text!r} is not a whole number of tokens")
        value = int(value_f)
    if value <= 0:
        raise UserError(f"token count {text!r} must be positive")
    return value


def format_tokens(n: float) -> str:
    """A compact exact name for a token count (1M, 64Ki, 12345); approximate (~1.3M) when not whole."""
    if n != int(n):
        for div, s in ((10**9, "G"), (10**6, "M"), (10**3, "K")):
            if n >= div:
                return f"~{n / div:.3g}{s}"
        return f"~{n:.0f}"
    n = int(n)
    for div, s in ((10**9, "G"), (2**30, "Gi"), (10**6, "M"), (2**20, "Mi"), (10**3, "K"), (2**10, "Ki")):
        if n >= div and n % div == 0:
            return f"{n // div}{s}"
    return str(n)


def format_lr(lr: float) -> str:
    """A learning rate as it appears in run directory names and tables (6 significant digits)."""
    return f"{lr:.6g}"


def round_lr(lr: float) -> float:
    """Round to the 6 significant digits of :func:`format_lr`, so a value and its directory name agree."""
    return float(format_lr(lr))


def hms(seconds: float) -> str:
    """A duration as ``4m05s``, or ``1h02m05s`` from an hour up."""
    s = int(round(seconds))
    return f"{s // 3600}h{s % 3600 // 60:02d}m{s % 60:02d}s" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


def si(x: float, digits: int = 3, giga: str = "G", kilo: str = "K") -> str:
    """A count with a suffix at `digits` significant digits: ``1.2M``, ``340K``; the dry run's parameter counts
    take four and say billions (``125.9M``, ``1.073B``, ``3.072k``)."""
    for div, s in ((1e12, "T"), (1e9, giga), (1e6, "M"), (1e3, kilo)):
        if abs(x) >= div:
            return f"{x / div:.{digits}g}{s}"
    return f"{x:.{digits}g}"


def count(n: float) -> str:
    """A count as the dry run and the start-up summary say it: 4 significant digits, billions as B (`125.9M`,
    `1.073B`, `3.072k`)."""
    return si(n, digits=4, giga="B", kilo="k")


def duration(seconds: float) -> str:
    """A duration in the unit a reader plans with: `40 s`, `12 min`, `3.5 h`, `4.2 days`."""
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 2 * 3600:
        return f"{seconds / 60:.0f} min"
    if seconds < 3 * 86400:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} days"
