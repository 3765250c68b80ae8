"""Sensors and the schedule, evaluated against a real test instance with real runs."""

from __future__ import annotations

import json
import shutil
from datetime import datetime, timezone

import dagster as dg

from scrape_assets.defs.resources import AlertsResource
from scrape_assets.defs.schedules import daily_scrape_schedule
from scrape_assets.defs.sensors import run_failure_alert_sensor, success_rate_collapse_sensor
from scrape_assets.warehouse import Warehouse, products
from scrape_assets_tests.conftest import REPO_ROOT, make_resources, materialize

DEAD_HOST = "http://127.0.0.1:9/"  # discard port: connection refused, every page fails


def _tick(instance, cursor, webhook_url):
    context = dg.build_sensor_context(
        instance=instance, cursor=cursor, resources={"alerts": AlertsResource(webhook_url=webhook_url)}
    )
    result = success_rate_collapse_sensor(context)
    return context.cursor, result


def test_collapse_alerts_once_then_clears_on_recovery(tmp_path, instance, webhook_server):
    healthy = make_resources(tmp_path)
    broken = make_resources(tmp_path / "b", base_url=DEAD_HOST, max_attempts=1)

    assert materialize(instance, healthy, ["travel", "mystery"]).success
    cursor, result = _tick(instance, None, webhook_server.url)
    assert webhook_server.received == []  # a healthy run does not alert
    assert "no collapse" in result.skip_message

    run = materialize(instance, broken, ["travel", "mystery"], selection=["raw_pages"])
    assert run.success  # dead pages never fail the run
    cursor, result = _tick(instance, cursor, webhook_server.url)
    # One message for the evaluation's three collapses, each listed.
    [message] = webhook_server.received
    expected = [
        "all: success rate 0% is below the floor 90%",
        "mystery: success rate 0% is below the floor 90%",
        "travel: success rate 0% is below the floor 90%",
    ]
    assert message["kind"] == "collapse" and sorted(message["alerts"]) == expected
    assert message["text"].startswith("scrape_assets: 3 collapses\n- ")
    assert sorted(message["text"].split("\n")[1:]) == [f"- {t}" for t in expected]
    assert result.skip_message == "3 alert(s) sent in one message"

    # Same cursor again, and another collapsed run: still one alert per collapse.
    cursor, _ = _tick(instance, cursor, webhook_server.url)
    assert materialize(instance, broken, ["travel", "mystery"], selection=["raw_pages"]).success
    cursor, _ = _tick(instance, cursor, webhook_server.url)
    assert len(webhook_server.received) == 1

    # Recovery clears the state; a new collapse alerts again.
    assert materialize(instance, healthy, ["travel"], selection=["raw_pages"]).success
    cursor, _ = _tick(instance, cursor, webhook_server.url)
    assert len(webhook_server.received) == 1
    assert materialize(instance, broken, ["travel"], selection=["raw_pages"]).success
    cursor, _ = _tick(instance, cursor, webhook_server.url)
    assert webhook_server.received[-1]["text"] == "scrape_assets collapse: travel: success rate 0% is below the floor 90%"
    assert webhook_server.received[-1]["alerts"] == ["travel: success rate 0% is below the floor 90%"]
    assert len(webhook_server.received) == 2
    state = json.loads(cursor)["state"]
    assert set(state["collapsed"]) == {"rate:travel", "rate:mystery", "rate:all"}


def test_products_falling_to_zero_alerts(tmp_path, instance, webhook_server):
    from scrape_assets_tests.test_pipeline import _broken_spec

    assert materialize(instance, make_resources(tmp_path), ["travel"]).success
    cursor, _ = _tick(instance, None, webhook_server.url)
    result = materialize(instance, make_resources(tmp_path, site=_broken_spec(tmp_path)), ["travel"], raise_on_error=False)
    assert not result.success
    cursor, _ = _tick(instance, cursor, webhook_server.url)
    cursor, _ = _tick(instance, cursor, webhook_server.url)
    assert [m["text"] for m in webhook_server.received] == [
        "scrape_assets collapse: travel: products parsed fell to zero (layout change or empty site?)"
    ]


def test_a_category_failing_day_after_day_alerts_once(tmp_path, instance, webhook_server):
    """Nothing parsed, while the table keeps the rows carried forward: the alert is not repeated each run."""
    assert materialize(instance, make_resources(tmp_path), ["travel"]).success
    cursor, _ = _tick(instance, None, webhook_server.url)
    dead = make_resources(tmp_path, base_url=DEAD_HOST, max_attempts=1)
    for _ in range(3):
        assert materialize(instance, dead, ["travel"]).success  # dead pages never fail the run
        cursor, _ = _tick(instance, cursor, webhook_server.url)
    [message] = webhook_server.received
    assert sorted(message["alerts"]) == [
        "travel: products parsed fell to zero (layout change or empty site?)",
        "travel: success rate 0% is below the floor 90%",
    ]
    assert Warehouse(f"sqlite:///{tmp_path / 'warehouse.db'}").count(products, "travel") == 11  # carried forward


def test_alerts_the_webhook_refused_are_sent_with_the_next_evaluation(tmp_path, instance, webhook_server):
    assert materialize(instance, make_resources(tmp_path, base_url=DEAD_HOST, max_attempts=1), ["travel"],
                       selection=["raw_pages"]).success
    webhook_server.status = 500
    cursor, result = _tick(instance, None, webhook_server.url)
    assert result.skip_message == "webhook refused 1 alert(s): kept for the next evaluation"
    assert json.loads(cursor)["unsent"] == ["travel: success rate 0% is below the floor 90%"]
    webhook_server.status = 200
    assert materialize(instance, make_resources(tmp_path / "m", base_url=DEAD_HOST, max_attempts=1), ["mystery"],
                       selection=["raw_pages"]).success
    cursor, _ = _tick(instance, cursor, webhook_server.url)
    refused, delivered = webhook_server.received
    assert refused["alerts"] == ["travel: success rate 0% is below the floor 90%"]
    assert "held since" not in refused["text"]
    assert "\n(some held since 20" in delivered["text"] and "the webhook refused them then" in delivered["text"]
    assert delivered["alerts"] == ["travel: success rate 0% is below the floor 90%",
                                   "mystery: success rate 0% is below the floor 90%"]
    assert "unsent" not in json.loads(cursor)
    _tick(instance, cursor, webhook_server.url)
    assert len(webhook_server.received) == 2  # delivered once


def test_one_message_lists_at_most_max_lines_alerts():
    from scrape_assets.defs.sensors import MAX_LINES, alert_message

    texts = [f"cat-{i:03d}: success rate 0% is below the floor 90%" for i in range(MAX_LINES + 5)]
    lines = alert_message(texts).split("\n")
    assert lines[0] == f"scrape_assets: {MAX_LINES + 5} collapses"
    assert lines[1:-1] == [f"- {t}" for t in texts[:MAX_LINES]] and lines[-1] == "- ... and 5 more"


def test_alerts_without_webhook_only_log(tmp_path, instance, caplog):
    assert materialize(instance, make_resources(tmp_path, base_url=DEAD_HOST, max_attempts=1), ["travel"], selection=["raw_pages"]).success
    with caplog.at_level("WARNING"):
        _tick(instance, None, None)
    assert "ALERT: scrape_assets collapse: travel: success rate 0% is below the floor 90%" in caplog.text


def test_run_failure_sensor_posts_without_leaking_the_webhook(tmp_path, instance, webhook_server, caplog):
    result = materialize(
        instance, make_resources(tmp_path, site=str(tmp_path / "missing.yaml")), ["travel"], raise_on_error=False
    )
    assert not result.success
    run = instance.get_run_by_id(result.run_id)
    failure = [e for e in result.all_events if e.event_type_value in ("STEP_FAILURE", "RUN_FAILURE")][-1]
    context = dg.build_run_status_sensor_context(
        sensor_name="run_failure_alert_sensor",
        dagster_instance=instance,
        dagster_run=run,
        dagster_event=failure,
        resources={"alerts": AlertsResource(webhook_url=webhook_server.url)},
    ).for_run_failure()
    with caplog.at_level("WARNING"):
        run_failure_alert_sensor(context)
    assert len(webhook_server.received) == 1
    alert = webhook_server.received[0]
    assert alert["kind"] == "run_failure" and alert["run_id"] == result.run_id
    assert alert["text"].startswith(f"scrape_assets run {result.run_id[:8]} of __ephemeral_asset_job__ failed")
    assert "SECRET-TOKEN" not in caplog.text


def test_daily_schedule_launches_one_run_for_all_categories():
    context = dg.build_schedule_context(scheduled_execution_time=datetime(2026, 11, 30, 2, 0, tzinfo=timezone.utc))
    request = daily_scrape_schedule(context)
    assert request.run_key == "daily-2026-11-30"
    assert request.tags["dagster/asset_partition_range_start"] == "travel"
    assert request.tags["dagster/asset_partition_range_end"] == "sequential-art"
    assert daily_scrape_schedule.cron_schedule == "0 2 * * *"
    assert daily_scrape_schedule.execution_timezone == "UTC"
    assert daily_scrape_schedule.default_status == dg.DefaultScheduleStatus.RUNNING


def test_the_shipped_instance_queues_daily_runs_one_at_a_time_and_catches_up_one_day(tmp_path, monkeypatch):
    """A daily run still going when the next fires waits in the queue; missed days are not replayed."""
    shutil.copy(REPO_ROOT / "dagster.yaml", tmp_path / "dagster.yaml")
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path))
    request = daily_scrape_schedule(dg.build_schedule_context(
        scheduled_execution_time=datetime(2026, 11, 30, 2, 0, tzinfo=timezone.utc)))
    assert request.tags["scrape/day"] == "2026-11-30"
    # A daily run whose process died would hold that one slot forever: run monitoring ends it after 20 h.
    assert request.tags["dagster/max_runtime"] == str(20 * 3600)
    monkeypatch.setenv("SCRAPE_RESUME_MAX_AGE_H", "30")
    assert daily_scrape_schedule(dg.build_schedule_context(
        scheduled_execution_time=datetime(2026, 12, 1, 2, 0, tzinfo=timezone.utc))).tags["dagster/max_runtime"] == "108000"
    with dg.DagsterInstance.get() as instance:
        assert instance.run_monitoring_enabled
        limits = instance.get_concurrency_config().run_queue_config.tag_concurrency_limits
        assert {"key": "scrape/day", "limit": 1} in limits  # no value: one run across all days
        assert instance.scheduler.max_catchup_runs == 1


def test_first_evaluation_alerts_only_collapses_still_open(tmp_path, instance, webhook_server):
    """A sensor started on an instance with history replays it silently, then alerts what is open."""
    from scrape_assets_tests.test_pipeline import _broken_spec

    healthy = make_resources(tmp_path)
    broken_layout = make_resources(tmp_path, site=_broken_spec(tmp_path))
    dead = make_resources(tmp_path / "dead", base_url=DEAD_HOST, max_attempts=1)
    assert materialize(instance, healthy, ["travel"]).success
    assert not materialize(instance, broken_layout, ["travel"], raise_on_error=False).success  # products -> 0
    assert materialize(instance, healthy, ["travel"]).success  # recovered
    assert materialize(instance, dead, ["mystery"], selection=["raw_pages"]).success  # still collapsed
    assert not materialize(instance, broken_layout, ["classics"], raise_on_error=False).success  # still at zero
    _tick(instance, None, webhook_server.url)
    [message] = webhook_server.received
    assert sorted(message["alerts"]) == [
        "classics: products parsed fell to zero (layout change or empty site?)",
        "mystery: success rate 0% is below the floor 90%",
    ]


def test_a_run_whose_events_span_two_evaluations_counts_once_for_all(tmp_path, instance, monkeypatch):
    from scrape_assets.defs import sensors

    broken = make_resources(tmp_path, base_url=DEAD_HOST, max_attempts=1)
    assert materialize(instance, broken, ["travel", "mystery"], selection=["raw_pages"]).success
    monkeypatch.setattr(sensors, "BATCH", 1)  # one partition's event per evaluation
    cursor = json.dumps({})  # not a first evaluation: every observation counts
    for _ in range(3):
        _, cursor = sensors.evaluate(instance, cursor)
    state = json.loads(cursor)["state"]
    assert state["history"] == {"travel": [0.0], "mystery": [0.0], "all": [0.0]}
    assert len(json.loads(cursor)["runs"]) == 1
