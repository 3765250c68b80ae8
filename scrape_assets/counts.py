"""Counts and lists in progress and summary lines: ``1 page``, ``2 pages``, ``1,000 categories``, ``A, B and C``."""

from __future__ import annotations


def counted(n: int, noun: str, plural: str | None = None) -> str:
    """``n`` with thousands separators and ``noun`` agreeing with it.

    Args:
        n: the count (an int; ``-1`` and ``1`` take the singular).
        noun: the singular, e.g. ``"page"``.
        plural: the plural when it is not ``noun + "s"``; a noun ending in a consonant and
            ``y`` gets ``ies`` (``category`` -> ``categories``), one ending in ``s``, ``x``,
            ``ch`` or ``sh`` gets ``es`` (``process`` -> ``processes``).

    Returns:
        e.g. ``"1 page"``, ``"0 pages"``, ``"12,345 categories"``.
    """
    if abs(n) == 1:
        return f"{n:,} {noun}"
    if plural is None:
        if noun.endswith("y") and noun[-2:-1] not in ("a", "e", "i", "o", "u", ""):
            plural = noun[:-1] + "ies"
        elif noun.endswith(("s", "x", "ch", "sh")):
            plural = noun + "es"
        else:
            plural = noun + "s"
    return f"{n:,} {plural}"


def listed(items: list[str]) -> str:
    """``A``, ``A and B``, ``A, B and C`` (``""`` for none)."""
    return " and ".join(items) if len(items) < 3 else f"{', '.join(items[:-1])} and {items[-1]}"
