"""What the Dagster instance recorded about the benchmark's runs, as JSON (run after them).

For every run of the instance at ``$DAGSTER_HOME``, oldest first: status, start and end
times (the run's own events, so the process start before ``RUN_START`` is excluded), each
step's duration and the materialization metadata of each asset (its partitions' events
merged: run totals once, per-category tables joined; see
``scrape_assets.defs.assets.partition_metadata``).

Run: ``DAGSTER_HOME=... python -m benchmarks.run_info`` (prints one JSON document).
"""

from __future__ import annotations

import json
import sys

import dagster as dg

from scrape_assets.defs.assets.partition_metadata import metadata_by_asset


def _value(metadata_value):
    value = getattr(metadata_value, "value", metadata_value)
    try:
        json.dumps(value)
    except TypeError:
        return str(value)
    return value


def describe_runs(instance: dg.DagsterInstance) -> list[dict]:
    """One dict per run: ``run_id, status, job, tags, started_at, ended_at, steps, assets``."""
    out = []
    for run in reversed(instance.get_runs()):
        steps: dict[str, dict] = {}
        materializations = []
        started = ended = None
        for entry in instance.all_logs(run.run_id):
            event = entry.dagster_event
            if event is None:
                continue
            kind = event.event_type.name  # RUN_START (its value is the legacy PIPELINE_START)
            if kind == "RUN_START":
                started = entry.timestamp
            elif kind in ("RUN_SUCCESS", "RUN_FAILURE"):
                ended = entry.timestamp
            elif kind == "STEP_START":
                steps.setdefault(event.step_key, {})["started_at"] = entry.timestamp
            elif kind in ("STEP_SUCCESS", "STEP_FAILURE"):
                step = steps.setdefault(event.step_key, {})
                step["ended_at"] = entry.timestamp
                step["status"] = kind
                if "started_at" in step:
                    step["duration_s"] = round(entry.timestamp - step["started_at"], 3)
            elif kind == "ASSET_MATERIALIZATION":
                materializations.append(event.event_specific_data.materialization)
        out.append(
            {
                "run_id": run.run_id,
                "status": run.status.value,
                "job": run.job_name,
                "tags": {k: v for k, v in run.tags.items() if not k.startswith(".dagster")},
                "started_at": started,
                "ended_at": ended,
                "in_run_s": round(ended - started, 3) if started and ended else None,
                "steps": steps,
                "assets": {name: {k: _value(v) for k, v in metadata.items()}
                           for name, metadata in metadata_by_asset(materializations).items()},
            }
        )
    return out


def main() -> int:
    with dg.DagsterInstance.get() as instance:
        json.dump(describe_runs(instance), sys.stdout, indent=1, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
