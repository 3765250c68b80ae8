"""``daily_scrape_schedule``: refresh every category once a day (02:00 UTC by default).

It launches ONE run covering all categories as a partition range (the assets use a
single-run backfill policy), so a daily refresh costs one process start rather than one
per category; categories are crawled concurrently inside it under the shared per-host
limits. Set ``SCRAPE_SCHEDULE_CRON`` to change the time.

Daily runs queue one at a time (the shipped ``dagster.yaml`` limits the tag ``scrape/day``
to 1). Each carries ``dagster/max_runtime`` = ``SCRAPE_RESUME_MAX_AGE_H``: the daemon's run
monitoring stops a run still going after that (Dagster marks it failed), and marks failed one whose process died
(killed, host rebooted) that would otherwise stay "started" and hold the queue forever;
its snapshots would not be resumed after that age anyway.
"""

import time

import dagster as dg
from dagster._utils.schedules import cron_string_iterator  # the daemon's own iterator (pinned Dagster)
from dagster._vendored.croniter import CroniterBadDateError

from scrape_assets.defs.jobs import QUEUE_TAG, all_categories_tags, category_partitions, daily_scrape_job, queue_tags
from scrape_assets.errors import SettingsError
from scrape_assets.settings import load_settings


def checked_cron(cron: str) -> str:
    """``cron`` if Dagster's ``ScheduleDefinition`` accepts it and its scheduler finds a next tick.

    Dagster's definition checks the 5 fields and their ranges (and refuses 30 or 31
    February); an expression whose days never occur in its months otherwise (``0 0 31 4 *``:
    April has 30 days) passes that check and would fail at every tick of the daemon, so
    the next tick after now is computed too, with Dagster's own cron iterator (UTC).

    Raises:
        SettingsError: naming ``SCRAPE_SCHEDULE_CRON`` (e.g. ``99 99 * * *``, ``0 0 30 2 *``,
            ``0 0 31 4 *``).
    """
    try:
        dg.ScheduleDefinition(name="cron_check", cron_schedule=cron, job_name="cron_check")
    except dg.DagsterInvalidDefinitionError:
        raise SettingsError(
            "SCRAPE_SCHEDULE_CRON", cron,
            "a cron expression Dagster's scheduler accepts: 5 fields, each in range (minute 0-59, hour 0-23, "
            "day of month 1-31, month 1-12, day of week 0-7 or a name), e.g. '0 2 * * *'",
        ) from None
    try:
        next(cron_string_iterator(time.time(), cron, "UTC"))
    except CroniterBadDateError:  # no date matches
        raise SettingsError(
            "SCRAPE_SCHEDULE_CRON", cron,
            "a cron expression that fires: its day of month must occur in its months (April, June, "
            "September and November have 30 days), e.g. '0 2 * * *'",
        ) from None
    return cron


@dg.schedule(
    cron_schedule=checked_cron(load_settings().schedule_cron),
    job=daily_scrape_job,
    execution_timezone="UTC",
    default_status=dg.DefaultScheduleStatus.RUNNING,
)
def daily_scrape_schedule(context: dg.ScheduleEvaluationContext):
    """One run of ``daily_scrape_job`` over all categories, keyed by the scheduled date (UTC).

    A cron firing more than once a day (``SCRAPE_SCHEDULE_CRON``) still launches one run a
    day: a tick skips while that day's run is queued, going or has succeeded (Dagster's
    ``run_key`` dedupes one tick only). After a day's run failed or was canceled, the next
    tick of that day launches it again (``0 2,8 * * *`` gives a second chance at 08:00).
    """
    scheduled = context.scheduled_execution_time
    day = scheduled.strftime("%Y-%m-%d") if scheduled else "manual"
    if scheduled is not None:
        done_or_going = context.instance.get_run_records(
            dg.RunsFilter(job_name=daily_scrape_job.name, tags={QUEUE_TAG: day}, statuses=_NOT_ENDED_BADLY), limit=1)
        if done_or_going:
            run = done_or_going[0].dagster_run
            return dg.SkipReason(f"the run of {day} is {run.status.value.lower()} (run {run.run_id}): one a day")
    tags = {**all_categories_tags(category_partitions), **queue_tags(day)}
    return dg.RunRequest(run_key=f"daily-{day}", tags=tags)


#: A day's run in one of these keeps later ticks of that day from launching another.
_NOT_ENDED_BADLY = [dg.DagsterRunStatus.QUEUED, dg.DagsterRunStatus.NOT_STARTED, dg.DagsterRunStatus.STARTING,
                    dg.DagsterRunStatus.STARTED, dg.DagsterRunStatus.SUCCESS, dg.DagsterRunStatus.CANCELING]


defs = dg.Definitions(schedules=[daily_scrape_schedule])
