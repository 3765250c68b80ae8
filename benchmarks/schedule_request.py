"""Print the tags of the RunRequest ``daily_scrape_schedule`` makes for one tick, as JSON.

The daily-refresh benchmark launches the schedule's run the way the daemon would: it
evaluates the schedule on the run's own Dagster instance (``DAGSTER_HOME``; the schedule asks
it whether that day's run exists already) and passes these tags to ``dagster job execute``.
Exits non-zero with the schedule's reason when it skips the tick.

    DAGSTER_HOME=... SCRAPE_SITE=... python -m benchmarks.schedule_request [--at 2026-01-02T02:00:00+00:00]
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys


def request_tags(at: datetime.datetime) -> dict[str, str]:
    """The tags of the schedule's RunRequest for the tick at ``at`` (aware datetime).

    Raises:
        RuntimeError: the schedule skipped the tick (its reason in the message).
    """
    import dagster as dg

    from scrape_assets.defs.schedules import daily_scrape_schedule

    with dg.DagsterInstance.get() as instance:
        result = daily_scrape_schedule(dg.build_schedule_context(instance=instance, scheduled_execution_time=at))
    if not isinstance(result, dg.RunRequest):
        raise RuntimeError(f"daily_scrape_schedule made no run request for {at.isoformat()}: {result}")
    return dict(result.tags)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--at", type=datetime.datetime.fromisoformat,
                        default=datetime.datetime(2026, 1, 2, 2, tzinfo=datetime.timezone.utc),
                        help="the tick's time, ISO 8601 with a zone (default 2026-01-02T02:00:00+00:00)")
    args = parser.parse_args(argv)
    try:
        print(json.dumps(request_tags(args.at)))
    except RuntimeError as exc:
        print(exc, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
