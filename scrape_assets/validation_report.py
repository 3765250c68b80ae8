"""The verdict of a schema validation, and merging several: plain data, no pandas.

Kept apart from :mod:`scrape_assets.schemas` (which imports pandas and pandera, ~0.3 s)
so that code which only reports results, like the ``parsed_products`` asset when nothing
needed validating, does not pay for that import.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

#: At most this many failure cases are kept in a ValidationReport (the count covers all).
MAX_FAILURE_CASES = 100


@dataclass
class ValidationReport:
    """Result of :func:`validate_parsed`, ready to attach as Dagster check metadata.

    Attributes:
        passed: no failure case in either frame.
        failure_count: number of failure cases (a frame-wide check counts one per row).
        failure_cases: the first :data:`MAX_FAILURE_CASES` cases, JSON-serialisable dicts with
            keys ``schema`` (``"products"`` or ``"pages"``), ``schema_context``
            (``"Column"``/``"DataFrameSchema"``), ``column`` (for a frame-wide check on a row:
            the columns, comma-joined), ``check`` (e.g. ``"in_range(1, 5)"``, ``"not_nullable"``,
            ``"multiple_fields_uniqueness"``, ``"is_positive_decimal"``, ``"layout_guard"``),
            ``failure_case`` (the value as str/int/float/bool/None, a Decimal as str; for a
            frame-wide check on a row, a dict column -> value), ``index`` (row label or
            ``None``) and, for checks that carry one, ``message`` (the layout guard's text).
        by_check: number of failure cases per ``"<schema>.<column>: <check>"`` for column
            checks and ``"<schema>: <check>"`` for frame-wide ones (``"pages: layout_guard"``).
    """

    passed: bool
    failure_count: int
    failure_cases: list[dict] = field(default_factory=list)
    by_check: dict[str, int] = field(default_factory=dict)


#: A quoted value ('...' or "..." as repr writes them; an opening quote follows no letter or
#: digit, so the apostrophe of "spec's" opens none) or a number in a reject reason.
_VALUE = re.compile(r"""(?<!\w)'(?:[^'\\]|\\.)*'|(?<!\w)"(?:[^"\\]|\\.)*"|\d+(?:[.,]\d+)*""")


def reason_kind(reason: str) -> str:
    """``reason`` with its quoted values and numbers blanked: the key reject reasons are counted by.

    ``"product_id: '(\\d+)' does not match 'https://x/a-1'"`` and the same with another URL
    are one kind, so a cause met by 30 cards counts 30, not 1 thirty times.
    """
    return _VALUE.sub("…", reason)


def common_reasons(reasons: Iterable[str], *, limit: int = 5) -> dict[str, int]:
    """The ``limit`` most common kinds of reject reason (:func:`reason_kind`), most common first.

    Each kind is shown by its first reason as written (with one card's values) and counts
    every reason of that kind: ``{"price: no number in 'N/A' (expected ...)": 30}`` for 30
    cards whose prices were 'N/A', 'TBA', ... Ties keep the order first met.
    """
    first: dict[str, str] = {}
    counts: Counter[str] = Counter()
    for reason in reasons:
        kind = reason_kind(reason)
        first.setdefault(kind, reason)
        counts[kind] += 1
    return {first[kind]: n for kind, n in counts.most_common(limit)}


def check_key(case: dict) -> str:
    """The :attr:`ValidationReport.by_check` key of a failure case: ``"<schema>.<column>: <check>"``
    for a column check, ``"<schema>: <check>"`` for a frame-wide one."""
    row_wide = case["schema_context"] == "DataFrameSchema" or case["column"] is None
    where = case["schema"] if row_wide else f"{case['schema']}.{case['column']}"
    return f"{where}: {case['check']}"


def merge_reports(reports: list[ValidationReport]) -> ValidationReport:
    """One report for several partitions validated one by one (cases capped at :data:`MAX_FAILURE_CASES`)."""
    merged = ValidationReport(passed=all(r.passed for r in reports), failure_count=sum(r.failure_count for r in reports))
    for report in reports:
        merged.failure_cases.extend(report.failure_cases[: MAX_FAILURE_CASES - len(merged.failure_cases)])
        for name, count in report.by_check.items():
            merged.by_check[name] = merged.by_check.get(name, 0) + count
    return merged


def describe_failures(report: ValidationReport, *, limit: int = 3) -> str:
    """One line saying why a partition failed the schema, from its report's kept cases.

    First the partition's most common reject reasons, when a check carries them
    (``rejected_share``): the cause, which an alert shortened to a few hundred characters
    must keep, ahead of the layout guard's long message. Then per check: its case count,
    the pages it names, and its message (a frame-wide check's, e.g. the layout guard's); at
    most ``limit`` pages and reasons each. Example: ``reject reasons: "price: no element
    matches 'p.price_color'" x32; pages: rejected_share x2 (pages 1, 2; more of the
    partition's product cards were rejected...)``.
    """
    parts = []
    reasons = next((c["reject_reasons"] for c in report.failure_cases if c.get("reject_reasons")), None)
    if reasons:
        parts.append("reject reasons: " + ", ".join(f"{r!r} x{n}" for r, n in list(reasons.items())[:limit]))
    for name, count in report.by_check.items():
        cases = [c for c in report.failure_cases if check_key(c) == name]
        details = []
        pages = sorted({c["failure_case"]["page_number"] for c in cases
                        if isinstance(c.get("failure_case"), dict) and "page_number" in c["failure_case"]})
        if pages:
            details.append("page" + ("s " if len(pages) > 1 else " ") + ", ".join(map(str, pages[:limit]))
                           + (", ..." if len(pages) > limit else ""))
        elif cases and not isinstance(cases[0].get("failure_case"), dict):
            details.append("e.g. " + ", ".join(repr(c["failure_case"]) for c in cases[:limit]))
        if cases and cases[0].get("message"):
            details.append(cases[0]["message"])
        parts.append(f"{name} x{count}" + (f" ({'; '.join(details)})" if details else ""))
    return "; ".join(parts)
