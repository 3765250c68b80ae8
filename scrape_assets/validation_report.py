"""The verdict of a schema validation, and merging several: plain data, no pandas.

Kept apart from :mod:`scrape_assets.schemas` (which imports pandas and pandera, ~0.3 s)
so that code which only reports results, like the ``parsed_products`` asset when nothing
needed validating, does not pay for that import.
"""

from __future__ import annotations

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


def merge_reports(reports: list[ValidationReport]) -> ValidationReport:
    """One report for several partitions validated one by one (cases capped at :data:`MAX_FAILURE_CASES`)."""
    merged = ValidationReport(passed=all(r.passed for r in reports), failure_count=sum(r.failure_count for r in reports))
    for report in reports:
        merged.failure_cases.extend(report.failure_cases[: MAX_FAILURE_CASES - len(merged.failure_cases)])
        for name, count in report.by_check.items():
            merged.by_check[name] = merged.by_check.get(name, 0) + count
    return merged
