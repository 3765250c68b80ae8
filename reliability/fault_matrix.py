"""Fault matrix: run every fault scenario once through Dagster and tabulate what happened.

Usage (from the repository root)::

    .venv/bin/python -m reliability.fault_matrix [--out rows.json] [SCENARIO ...]

The scenarios are the ones ``scrape_assets_tests/test_faults.py`` holds to their exact
outcome (:data:`scrape_assets_tests.fault_scenarios.SCENARIOS`: every fault kind of
:mod:`scrape_assets.faults`, some in two variants, and the seeded random mode), plus the three
storage scenarios (object storage unwritable: the run fails and the next one resumes; freed
before the step's retry; failing once before a request). Each scenario runs against its own
faulty demo server on 127.0.0.1, in its own folder under ``workdir``, on one throwaway
Dagster instance. It prints a Markdown table (the figures of RELIABILITY.md).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable
from pathlib import Path

STORAGE_SCENARIOS = ("storage-unwritable-run-fails", "storage-heals-on-retry", "storage-flaky-manifest-write")


def run_fault_matrix(workdir: Path, names: Iterable[str] | None = None) -> list[dict]:
    """Run fault scenarios once each; one row per scenario, in scenario order.

    Args:
        workdir: an empty folder for the scenarios' object storage and warehouses.
        names: scenario names to run (see ``SCENARIOS`` and :data:`STORAGE_SCENARIOS`); all when None.

    Returns:
        Rows ``{kind, scenario, pages_done, pages_failed, reasons, http_status, attempts, waits_ok,
        success_rate, schema_check_passed, run_succeeded, duration_s}``: ``reasons``, ``http_status``
        and ``attempts`` map a page (``"mystery/2"``) to its dead-letter reason code, last HTTP
        status and attempts; ``waits_ok`` is None when the server sent no Retry-After, else
        whether every wait was at least what it asked. Storage scenarios that take two runs give
        two rows (the failed run, then the resuming one).

    Raises:
        KeyError: an unknown scenario name.
    """
    import dagster as dg

    from scrape_assets_tests import fault_scenarios as fs

    known = [s.name for s in fs.SCENARIOS] + list(STORAGE_SCENARIOS)
    wanted = known if names is None else list(names)
    unknown = sorted(set(wanted) - set(known))
    if unknown:
        raise KeyError(f"unknown fault scenario(s) {unknown}; known: {', '.join(known)}")
    rows = []
    with dg.instance_for_test() as instance:
        for name in [n for n in known if n in wanted]:
            folder = Path(workdir) / name
            if name == "storage-unwritable-run-fails":
                rows += [o.row() for o in fs.run_storage_fails_then_resumes(folder, instance)]
            elif name == "storage-heals-on-retry":
                rows.append(fs.run_storage_heals_on_retry(folder, instance).row())
            elif name == "storage-flaky-manifest-write":
                rows.append(fs.run_storage_flaky_manifest(folder, instance).row())
            else:
                rows.append(fs.run_scenario(fs.SCENARIOS_BY_NAME[name], folder, instance).row())
    return rows


def markdown(rows: list[dict]) -> str:
    """The rows as a Markdown table: one line per scenario, failed pages with reason and status."""
    lines = [
        "| fault | scenario | done | failed | failed pages (reason, HTTP status, attempts) | attempts | "
        "waits ≥ Retry-After | success rate | run |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        failed = "; ".join(
            f"{page}: {reason}, {r['http_status'][page]}, {r['attempts'][page]}" for page, reason in r["reasons"].items()
        ) or "-"
        attempts = ", ".join(f"{page} {n}" for page, n in r["attempts"].items())
        waits = {None: "-", True: "yes", False: "NO"}[r["waits_ok"]]
        run = "succeeded" if r["run_succeeded"] else "failed" + ("" if r["schema_check_passed"] is not False else " (schema check)")
        lines.append(
            f"| {r['kind']} | {r['scenario']} | {r['pages_done']} | {r['pages_failed']} | {failed} | {attempts} | "
            f"{waits} | {r['success_rate']} | {run} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    import tempfile

    parser = argparse.ArgumentParser(prog="python -m reliability.fault_matrix", description=__doc__.split("\n\n")[0])
    parser.add_argument("scenarios", nargs="*", help="scenario names (default: all)")
    parser.add_argument("--out", type=Path, help="also write the rows as JSON here")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="fault-matrix-") as workdir:
        rows = run_fault_matrix(Path(workdir), args.scenarios or None)
    if args.out:
        args.out.write_text(json.dumps(rows, indent=1))
    print(markdown(rows))
    return 0 if all(r["waits_ok"] is not False for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
