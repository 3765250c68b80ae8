"""Sensors and the schedule, evaluated against a real test instance with real runs."""

from __future__ import annotations

import json
import logging
import shutil
from collections import Counter
from datetime import datetime, timezone
from types import SimpleNamespace

import dagster as dg
import pytest

from scrape_assets.defs.resources import AlertsResource
from scrape_assets.defs.schedules import daily_scrape_schedule
from scrape_assets.defs.jobs import load_job
from scrape_assets.defs.sensors import (
    HELD_BACK_TAG,
    held_back_load_sensor,
    run_failure_alert_sensor,
    success_rate_collapse_sensor,
)
from scrape_assets.manifest import latest_manifest
from scrape_assets.warehouse import Warehouse, dead_letters, products
from scrape_assets_tests.conftest import REPO_ROOT, make_resources, materialize, run_metadata

DEAD_HOST = "http://127.0.0.1:9/"  # discard port: connection refused, every page fails


def _tick(instance, cursor, webhook_url):
    context = dg.build_sensor_context(
        instance=instance, cursor=cursor, resources={"alerts": AlertsResource(webhook_url=webhook_url)}
    )
    result = success_rate_collapse_sensor(context)
    return context.cursor, result


def _raw_pages_event(storage_id: int, rates: dict[str, float], run_rate: float = 0.0, categories: int | None = None):
    """A raw_pages materialization record as the collapse sensor reads it (for tests of its
    logic with ``_new_records`` replaced): run ``run-<storage_id>``, each category's success
    rate, the run's own rate, and how many categories the run covered (default: ``rates``')."""
    metadata = {"by_category": {c: {"success_rate": r} for c, r in rates.items()},
                "categories": len(rates) if categories is None else categories, "success_rate": run_rate}
    return SimpleNamespace(storage_id=storage_id, run_id=f"run-{storage_id}", asset_materialization=SimpleNamespace(
        metadata={k: SimpleNamespace(value=v) for k, v in metadata.items()}))


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
    expected = [  # the run's own first, then its categories by name
        "whole run: success rate 0% is below the floor 90%",
        "mystery: success rate 0% is below the floor 90%",
        "travel: success rate 0% is below the floor 90%",
    ]
    assert message["kind"] == "collapse" and message["alerts"] == expected
    assert message["text"] == "scrape_assets: 3 collapses\n" + "\n".join(f"- {t}" for t in expected)
    assert result.skip_message == "3 alert(s) sent in one message"

    # Same cursor again, and another collapsed run: still one alert per collapse.
    cursor, _ = _tick(instance, cursor, webhook_server.url)
    assert materialize(instance, broken, ["travel", "mystery"], selection=["raw_pages"]).success
    cursor, _ = _tick(instance, cursor, webhook_server.url)
    assert len(webhook_server.received) == 1

    # Recovery clears the state, and says so once; a new collapse alerts again.
    assert materialize(instance, healthy, ["travel"], selection=["raw_pages"]).success
    cursor, _ = _tick(instance, cursor, webhook_server.url)
    assert webhook_server.received[-1]["text"] == (
        "scrape_assets: travel: recovered: success rate 100% (was: success rate 0% is below the floor 90%)")
    assert webhook_server.received[-1]["kind"] == "recovery"  # good news only: not a "collapse" to page on
    cursor, _ = _tick(instance, cursor, webhook_server.url)
    assert len(webhook_server.received) == 2
    assert materialize(instance, broken, ["travel"], selection=["raw_pages"]).success
    cursor, _ = _tick(instance, cursor, webhook_server.url)
    assert webhook_server.received[-1]["text"] == "scrape_assets collapse: travel: success rate 0% is below the floor 90%"
    assert webhook_server.received[-1]["alerts"] == ["travel: success rate 0% is below the floor 90%"]
    assert webhook_server.received[-1]["kind"] == "collapse"
    assert len(webhook_server.received) == 3
    state = json.loads(cursor)["state"]
    assert set(state["collapsed"]) == {"rate:travel", "rate:mystery", "rate:whole run"}


def test_a_cursor_from_before_whole_run_forgets_what_it_recorded_under_all(monkeypatch):
    from scrape_assets.defs import sensors

    monkeypatch.setattr(sensors, "_new_records", lambda instance, asset, cursor: ([], cursor))
    recorded = {"history": {"all": [0.5], "travel": [1.0]}, "collapsed": {"rate:all": "x", "rate:travel": "y"}}
    _, cursor = sensors.evaluate(None, json.dumps({"state": recorded}))  # format 1: no "format" key
    state = json.loads(cursor)["state"]
    assert (state["history"], state["collapsed"]) == ({"travel": [1.0]}, {"rate:travel": "y"})
    assert json.loads(cursor)["format"] == 2
    # A cursor of this format keeps a category "all" as it is.
    _, again = sensors.evaluate(None, json.dumps({"format": 2, "state": recorded}))
    assert json.loads(again)["state"]["history"] == recorded["history"]


def test_alerts_are_listed_whole_run_first_then_by_category():
    from scrape_assets.defs.sensors import _alert_order

    texts = ["art: b", "art-history: a", "whole run: c", "a1: d"]
    assert sorted(texts, key=_alert_order) == ["whole run: c", "a1: d", "art: b", "art-history: a"]


def test_a_category_named_all_has_a_collapse_of_its_own(monkeypatch):
    """books.toscrape.com has a category "all": its collapse is not cleared by the healthy run it is part of."""
    from scrape_assets.defs import sensors

    runs = []

    def records(instance, asset, cursor):  # each run's raw_pages event: "all" dead, the run healthy overall
        if asset != "raw_pages" or cursor == str(len(runs)):
            return [], cursor
        return [_raw_pages_event(len(runs), {"all": 0.0, "travel": 1.0}, 0.97, categories=52)], str(len(runs))

    monkeypatch.setattr(sensors, "_new_records", records)
    cursor = json.dumps({})
    found = []
    for n in range(3):
        runs.append(n)
        alerts, cursor = sensors.evaluate(None, cursor)
        found.append(alerts)
    assert found == [["all: success rate 0% is below the floor 90%"], [], []]  # one alert a collapse
    state = json.loads(cursor)["state"]
    assert state["history"]["whole run"] == [0.97] * 3 and state["history"]["all"] == [0.0] * 3


def test_a_collapse_that_clears_says_so_once(monkeypatch):
    """A collapse alerted, then a healthy run: one recovery line; a collapse and its recovery
    read in the same evaluation come together, the collapse first; replaying the history on
    a first evaluation tells nothing of what recovered within it."""
    from scrape_assets.defs import sensors

    events = []  # (travel's success rate) per run, all recorded so far

    def records(instance, asset, cursor):
        start = int(cursor or 0)
        if asset != "raw_pages" or start >= len(events):
            return [], cursor
        return [_raw_pages_event(n, {"travel": rate}, rate) for n, rate in enumerate(events) if n >= start], str(len(events))

    monkeypatch.setattr(sensors, "_new_records", records)
    cursor = json.dumps({})
    found = []
    for rate in (0.0, 1.0, 1.0):
        events.append(rate)
        alerts, cursor = sensors.evaluate(None, cursor)
        found.append(alerts)
    assert found == [["travel: success rate 0% is below the floor 90%"],
                     ["travel: recovered: success rate 100% (was: success rate 0% is below the floor 90%)"], []]
    events += [0.0, 1.0]  # both in one evaluation
    alerts, cursor = sensors.evaluate(None, cursor)
    assert alerts == ["travel: success rate 0% is below the floor 90%",
                      "travel: recovered: success rate 100% (was: success rate 0% is below the floor 90%)"]
    assert sensors.alert_message(sorted(alerts, key=sensors._alert_order)).split("\n") == [
        "scrape_assets: 1 collapse, 1 recovery", f"- {alerts[0]}", f"- {alerts[1]}"]
    assert sensors.alert_message(alerts[1:]) == f"scrape_assets: {alerts[1]}"
    assert sensors.evaluate(None, None)[0] == []  # the whole history replayed: travel is healthy now


def test_a_category_removed_from_the_spec_is_not_alerted(monkeypatch):
    """The first evaluation replays weeks of runs: a category taken out of the spec since,
    collapsed in its last run, is forgotten, not alerted; one still in the spec is."""
    from scrape_assets.defs import sensors

    def records(instance, asset, cursor):
        if asset != "raw_pages" or cursor:
            return [], cursor
        return [_raw_pages_event(1, {"horror": 0.0, "travel": 0.0}, categories=1)], "1"

    monkeypatch.setattr(sensors, "_new_records", records)
    alerts, cursor = sensors.evaluate(None, None, categories={"travel", "mystery"})
    assert alerts == ["travel: success rate 0% is below the floor 90%"]
    assert list(json.loads(cursor)["state"]["collapsed"]) == ["rate:travel"]
    assert sensors.evaluate(None, None)[0] == ["horror: success rate 0% is below the floor 90%",
                                              "travel: success rate 0% is below the floor 90%"]  # no filter

    # Later evaluations alike: a new run of a category outside the spec (and a whole run's) is read.
    def later(instance, asset, cursor):
        if asset != "raw_pages" or cursor != "1":
            return [], cursor
        return [_raw_pages_event(2, {"horror": 0.0, "mystery": 0.0})], "2"

    monkeypatch.setattr(sensors, "_new_records", later)
    alerts, cursor = sensors.evaluate(None, cursor, categories={"travel", "mystery"})
    assert sorted(alerts) == ["mystery: success rate 0% is below the floor 90%",
                              "whole run: success rate 0% is below the floor 90%"]
    assert sorted(json.loads(cursor)["state"]["collapsed"]) == ["rate:mystery", "rate:travel", "rate:whole run"]



def test_partition_events_that_repeat_their_runs_table_count_each_category_once(monkeypatch):
    """Events recorded before per-partition tables: each partition's raw_pages event carries the
    whole run's by_category. A run of two categories is one observation of each, not two (a
    doubled history would weigh that run twice in the median a sharp drop is measured from)."""
    from scrape_assets.defs import sensors

    first, second = (_raw_pages_event(n, {"travel": 1.0, "mystery": 0.0}, 0.5) for n in (1, 2))
    second.run_id = first.run_id  # the run's two partitions, one event each

    def records(instance, asset, cursor):
        if asset != "raw_pages" or cursor:
            return [], cursor
        return [first, second], "2"

    monkeypatch.setattr(sensors, "_new_records", records)
    alerts, cursor = sensors.evaluate(None, json.dumps({}))
    assert sorted(alerts) == ["mystery: success rate 0% is below the floor 90%",
                              "whole run: success rate 50% is below the floor 90%"]
    assert json.loads(cursor)["state"]["history"] == {"mystery": [0.0], "travel": [1.0], "whole run": [0.5]}

def test_the_collapse_sensor_reads_the_specs_categories_and_rules_at_each_tick(tmp_path, monkeypatch, caplog):
    """A category added to the spec after the code location loaded is not forgotten, nor an
    edited collapse rule; a spec that cannot be read now falls back to the partition keys and
    rules of when it loaded, with a warning."""
    from scrape_assets.defs import sensors
    from scrape_assets.defs.partitions import category_partitions

    spec = tmp_path / "demo.yaml"
    spec.write_text((REPO_ROOT / "scrape_assets" / "sites" / "demo.yaml").read_text().replace(
        "categories:\n", "categories:\n  brand-new: catalogue/category/books/brand-new_99/index.html\n", 1)
        + "\ncollapse: {floor: 0.5, max_drop: 0.2}\n")
    monkeypatch.setenv("SCRAPE_SITE", str(spec))
    categories, rules = sensors._spec_now()
    assert "brand-new" in categories and (rules.floor, rules.max_drop) == (0.5, 0.2)
    assert "brand-new" not in category_partitions.get_partition_keys()
    spec.write_text("name: [not a spec")
    warnings = []
    categories, rules = sensors._spec_now(SimpleNamespace(warning=warnings.append))
    assert categories == category_partitions.get_partition_keys() and (rules.floor, rules.max_drop) == (0.9, 0.3)
    assert len(warnings) == 1 and warnings[0].startswith("spec unreadable now (")


def test_a_site_whose_pages_often_fail_alerts_on_a_sharp_drop_with_its_own_floor(tmp_path, instance, monkeypatch):
    """collapse: {floor: 0.35}: a category that always loses a quarter of its pages does not
    alert, and a fall from its usual 75% to 40% is a collapse of its own (the drop rule,
    which cannot fire at the default floor: any drop above 0.3 from 100% is below 0.9)."""
    from scrape_assets.defs import sensors

    spec = tmp_path / "demo.yaml"
    spec.write_text((REPO_ROOT / "scrape_assets" / "sites" / "demo.yaml").read_text()
                    + "\ncollapse: {floor: 0.35, max_drop: 0.3}\n")
    monkeypatch.setenv("SCRAPE_SITE", str(spec))
    rates = [0.75, 0.75, 0.75, 0.4, 0.75]
    monkeypatch.setattr(sensors, "_new_records", lambda instance_, asset, cursor: (
        ([_raw_pages_event(n + 1, {"travel": rates[n]}) for n in range(int(cursor or 0), len(rates))], str(len(rates)))
        if asset == "raw_pages" and int(cursor or 0) < len(rates) else ([], cursor)))
    rates_seen, rates[:] = rates[:], rates[:3]
    cursor, result = _tick(instance, None, None)  # the history: nothing collapsed
    assert result.skip_message == "no collapse"
    rates[:] = rates_seen[:4]
    cursor, result = _tick(instance, cursor, None)
    assert result.skip_message == "1 alert(s) logged (no webhook)"
    assert json.loads(cursor)["state"]["collapsed"] == {
        "rate:travel": "success rate 40% dropped from a recent median of 75%"}
    rates[:] = rates_seen
    cursor, result = _tick(instance, cursor, None)
    assert json.loads(cursor)["state"]["collapsed"] == {}  # recovered at its usual rate


def test_a_message_with_a_collapse_and_a_recovery_is_kind_collapse(instance, webhook_server, monkeypatch):
    """One collapse among recoveries keeps the message "collapse" (a consumer paging on it
    must not sleep through it); recoveries alone are "recovery"."""
    from scrape_assets.defs import sensors

    rates = []  # per evaluation: {category: success rate}

    def records(instance_, asset, cursor):
        start = int(cursor or 0)
        if asset != "raw_pages" or start >= len(rates):
            return [], cursor
        return [_raw_pages_event(n + 1, table, categories=1) for n, table in enumerate(rates) if n >= start], str(len(rates))

    monkeypatch.setattr(sensors, "_new_records", records)
    cursor, _ = _tick(instance, None, webhook_server.url)  # nothing recorded yet
    for table in ({"travel": 0.0}, {"travel": 1.0, "mystery": 0.0}, {"mystery": 1.0}):
        rates.append(table)
        cursor, _ = _tick(instance, cursor, webhook_server.url)
    assert [(m["kind"], len(m["alerts"])) for m in webhook_server.received] == [
        ("collapse", 1), ("collapse", 2), ("recovery", 1)]
    assert webhook_server.received[1]["text"].startswith("scrape_assets: 1 collapse, 1 recovery\n")


def test_products_falling_to_zero_alerts(tmp_path, instance, webhook_server):
    from scrape_assets_tests.test_pipeline import _broken_spec

    assert materialize(instance, make_resources(tmp_path), ["travel"]).success
    cursor, _ = _tick(instance, None, webhook_server.url)
    result = materialize(instance, make_resources(tmp_path, site=_broken_spec(tmp_path)), ["travel"], raise_on_error=False)
    assert not result.success
    cursor, _ = _tick(instance, cursor, webhook_server.url)
    cursor, _ = _tick(instance, cursor, webhook_server.url)
    assert [m["text"] for m in webhook_server.received] == [
        "scrape_assets collapse: travel: products parsed fell to zero (its pages failed, a layout change, or an empty site? see dead_letters and the parsed_products_match_schema check)"
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
        "travel: products parsed fell to zero (its pages failed, a layout change, or an empty site? see dead_letters and the parsed_products_match_schema check)",
        "travel: success rate 0% is below the floor 90%",
    ]
    assert Warehouse(f"sqlite:///{tmp_path / 'warehouse.db'}").count(products, "travel") == 11  # carried forward
    # The site is back: one message of recoveries, the products' with the count parsed now.
    assert materialize(instance, make_resources(tmp_path), ["travel"]).success
    cursor, _ = _tick(instance, cursor, webhook_server.url)
    recovered = webhook_server.received[-1]
    assert recovered["kind"] == "recovery" and sorted(recovered["alerts"]) == [
        "travel: recovered: 11 products parsed again (was: products parsed fell to zero)",
        "travel: recovered: success rate 100% (was: success rate 0% is below the floor 90%)",
    ]


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
    # Held and new ones together, sorted by category; the cursor kept them oldest first.
    assert delivered["alerts"] == ["mystery: success rate 0% is below the floor 90%",
                                   "travel: success rate 0% is below the floor 90%"]
    assert "unsent" not in json.loads(cursor)
    _tick(instance, cursor, webhook_server.url)
    assert len(webhook_server.received) == 2  # delivered once



def test_a_collapse_message_the_webhook_refuses_for_good_is_not_sent_again(tmp_path, instance, webhook_server):
    """A 400 (413, 422) refuses the message itself (too long for a chat hook): sent again each
    minute it would be refused again, and every later collapse with it. Dropped, logged."""
    assert materialize(instance, make_resources(tmp_path, base_url=DEAD_HOST, max_attempts=1), ["travel"],
                       selection=["raw_pages"]).success
    webhook_server.status = 400
    cursor, result = _tick(instance, None, webhook_server.url)
    assert result.skip_message == "webhook refused 1 alert(s) in one message for good: dropped"
    assert "unsent" not in json.loads(cursor)
    webhook_server.status = 200
    _tick(instance, cursor, webhook_server.url)
    assert len(webhook_server.received) == 1  # not sent again


def test_while_the_webhook_refuses_the_newest_alerts_are_kept_and_held_since_the_first_refusal(
        tmp_path, instance, webhook_server, monkeypatch):
    """Beyond MAX_UNSENT held alerts the OLDEST go (the newest say how things are now), and
    "held since" stays the time of the first refusal, not of the latest one."""
    from scrape_assets.defs import sensors

    monkeypatch.setattr(sensors, "MAX_UNSENT", 1)
    clock = iter(["2026-11-30T02:00:00Z", "2026-11-30T02:01:00Z", "2026-11-30T02:02:00Z"])
    monkeypatch.setattr(sensors, "utc_now_iso", lambda: next(clock))
    dead = {c: make_resources(tmp_path / c, base_url=DEAD_HOST, max_attempts=1) for c in ("travel", "mystery")}
    webhook_server.status = 500
    assert materialize(instance, dead["travel"], ["travel"], selection=["raw_pages"]).success
    cursor, _ = _tick(instance, None, webhook_server.url)
    assert (json.loads(cursor)["unsent"], json.loads(cursor)["unsent_since"]) == (
        ["travel: success rate 0% is below the floor 90%"], "2026-11-30T02:00:00Z")
    assert materialize(instance, dead["mystery"], ["mystery"], selection=["raw_pages"]).success
    cursor, result = _tick(instance, cursor, webhook_server.url)  # (logs that the oldest was dropped)
    assert result.skip_message == "webhook refused 2 alert(s): kept for the next evaluation"
    assert (json.loads(cursor)["unsent"], json.loads(cursor)["unsent_since"]) == (
        ["mystery: success rate 0% is below the floor 90%"], "2026-11-30T02:00:00Z")
    webhook_server.status = 200
    cursor, _ = _tick(instance, cursor, webhook_server.url)
    delivered = webhook_server.received[-1]
    assert delivered["alerts"] == ["mystery: success rate 0% is below the floor 90%"]
    assert "(some held since 2026-11-30T02:00:00Z: the webhook refused them then" in delivered["text"]
    assert "unsent" not in json.loads(cursor) and len(webhook_server.received) == 3


def test_without_a_webhook_an_alert_is_logged_once_not_kept_for_later(tmp_path, instance, caplog):
    """No webhook: nothing can refuse the alert, so nothing is held and logged again at the next tick."""
    assert materialize(instance, make_resources(tmp_path, base_url=DEAD_HOST, max_attempts=1), ["travel"],
                       selection=["raw_pages"]).success
    with caplog.at_level("WARNING"):
        cursor, first = _tick(instance, None, None)
        cursor, second = _tick(instance, cursor, None)
    assert first.skip_message == "1 alert(s) logged (no webhook)" and second.skip_message == "no collapse"
    assert "unsent" not in json.loads(cursor)
    assert caplog.text.count("ALERT: scrape_assets collapse: travel: success rate 0% is below the floor 90%") == 1

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
    # Why, not only which step: the step's own error (here a dagster.Failure's description), the step named once.
    assert alert["text"] == (f"scrape_assets run {result.run_id[:8]} of __ephemeral_asset_job__ failed: raw_pages: "
                             f"{tmp_path / 'missing.yaml'}: cannot read spec file: No such file or directory")
    assert "SECRET-TOKEN" not in caplog.text


def test_a_run_failure_alert_the_webhook_refused_is_sent_again_until_it_is_taken(tmp_path, instance, webhook_server):
    """A run-status sensor sees each failed run once: a webhook down that minute (a 503 at
    02:00) must not leave the daily run's failure unheard. The alert is kept in the instance
    and unsent_alerts_sensor sends it again each minute, marked as held, until it is taken."""
    from scrape_assets.defs.sensors import UNSENT_KEY, unsent_alerts_sensor

    result = materialize(
        instance, make_resources(tmp_path, site=str(tmp_path / "missing.yaml")), ["travel"], raise_on_error=False
    )
    run = instance.get_run_by_id(result.run_id)
    failure = [e for e in result.all_events if e.event_type_value in ("STEP_FAILURE", "RUN_FAILURE")][-1]
    alerts = AlertsResource(webhook_url=webhook_server.url)
    webhook_server.status = 503
    run_failure_alert_sensor(dg.build_run_status_sensor_context(
        sensor_name="run_failure_alert_sensor", dagster_instance=instance, dagster_run=run, dagster_event=failure,
        resources={"alerts": alerts}).for_run_failure())

    def tick():
        return unsent_alerts_sensor(dg.build_sensor_context(instance=instance, resources={"alerts": alerts}))

    assert tick().skip_message == "0 held alerts sent, 1 still waiting: kept"  # still down a minute later
    webhook_server.status = 200
    assert tick().skip_message == "1 held alert sent"
    refused, again, delivered = webhook_server.received
    assert again == delivered and refused["kind"] == "run_failure" and refused["run_id"] == result.run_id
    text = f"scrape_assets run {result.run_id[:8]} of __ephemeral_asset_job__ failed: raw_pages: "
    assert refused["text"].startswith(text) and "held since" not in refused["text"]
    assert delivered["text"].startswith(refused["text"] + "\n(held since 20")
    assert delivered["text"].endswith(": the webhook refused it then)")
    assert delivered["held_since"].startswith("20") and delivered["run_id"] == result.run_id
    assert tick().skip_message == "no unsent alert"  # delivered once
    assert len(webhook_server.received) == 3
    assert instance.run_storage.get_cursor_values({UNSENT_KEY}) == {UNSENT_KEY: "[]"}


def test_a_held_alert_the_webhook_refuses_for_good_is_dropped_and_holds_back_no_other(instance, webhook_server):
    """A webhook that takes messages of at most 2,000 characters (a chat hook) answers 400 to a
    longer one however often it is sent: that one is dropped with an error line, the others
    held behind it still go out; one refused that way when it happens is not kept at all."""
    from scrape_assets.defs.sensors import MAX_RESENT, UNSENT_KEY, alert_or_keep, unsent_alerts_sensor

    alerts = AlertsResource(webhook_url=webhook_server.url)
    webhook_server.status = 503  # down: all three are kept
    for text in ("first " + "x" * 3000, "second", "third"):
        assert alert_or_keep(instance, text, alerts, {"kind": "run_failure"}) is False
    webhook_server.status = lambda posted: 400 if len(posted["text"]) > 2000 else 200
    result = unsent_alerts_sensor(dg.build_sensor_context(instance=instance, resources={"alerts": alerts}))
    assert result.skip_message == "2 held alerts sent, 1 refused for good: dropped"
    assert [a["text"].split("\n")[0][:6] for a in webhook_server.received[3:]] == ["first ", "second", "third"]
    assert instance.run_storage.get_cursor_values({UNSENT_KEY}) == {UNSENT_KEY: "[]"}
    assert alert_or_keep(instance, "y" * 3000, alerts, {"kind": "run_failure"}) is False  # refused for good: not kept
    assert instance.run_storage.get_cursor_values({UNSENT_KEY}) == {UNSENT_KEY: "[]"}
    # A revoked or mistyped URL (404, 403, 410) refuses every message until it is fixed: kept.
    webhook_server.status = 404
    assert alert_or_keep(instance, "while the URL is broken", alerts, {"kind": "run_failure"}) is False
    webhook_server.status = 200
    assert unsent_alerts_sensor(dg.build_sensor_context(
        instance=instance, resources={"alerts": alerts})).skip_message == "1 held alert sent"
    # Two alike kept in the same second are two alerts: one sent leaves the other kept.
    webhook_server.status = 503
    for _ in range(2):
        alert_or_keep(instance, "the same words", alerts, {"kind": "dead_run"})
    answers = iter([200, 503])
    webhook_server.status = lambda _posted: next(answers, 503)
    assert unsent_alerts_sensor(dg.build_sensor_context(
        instance=instance, resources={"alerts": alerts})).skip_message == "1 held alert sent, 1 still waiting: kept"
    webhook_server.status = 200
    assert unsent_alerts_sensor(dg.build_sensor_context(
        instance=instance, resources={"alerts": alerts})).skip_message == "1 held alert sent"
    # A long outage: at most MAX_RESENT a minute (each POST may take its 10 s timeout), oldest first.
    webhook_server.status = 503
    for i in range(MAX_RESENT + 2):
        alert_or_keep(instance, f"alert {i}", alerts, {"kind": "dead_run"})
    webhook_server.status = 200
    first = unsent_alerts_sensor(dg.build_sensor_context(instance=instance, resources={"alerts": alerts}))
    assert first.skip_message == f"{MAX_RESENT} held alerts sent, 2 still waiting: kept"
    second = unsent_alerts_sensor(dg.build_sensor_context(instance=instance, resources={"alerts": alerts}))
    assert second.skip_message == "2 held alerts sent"
    held = [a["text"].split("\n")[0] for a in webhook_server.received if "held_since" in a]
    assert held[-(MAX_RESENT + 2):] == [f"alert {i}" for i in range(MAX_RESENT + 2)]


def test_a_run_that_failed_outside_any_step_is_alerted_with_its_error(instance, webhook_server):
    """Bringing up the run can fail before any step runs (a RUN_FAILURE with an error, no
    STEP_FAILURE): the alert says why, not only "An exception was thrown during execution"."""
    from dagster._core.events import DagsterEvent, RunFailureReason
    from dagster._core.test_utils import create_run_for_test
    from dagster._utils.error import SerializableErrorInfo

    run = create_run_for_test(instance, job_name="daily_scrape_job", status=dg.DagsterRunStatus.FAILURE)
    # As Dagster writes it (SerializableErrorInfo.to_string: the message, a blank line, the remote stack).
    error = SerializableErrorInfo(message="dagster._core.errors.DagsterUserCodeProcessError: the code location "
                                  "could not be loaded\n\nStack Trace:\n  File \"x.py\", line 1\n", stack=[],
                                  cls_name="DagsterUserCodeProcessError")
    failure = DagsterEvent.job_failure("daily_scrape_job", "An exception was thrown during execution.",
                                       RunFailureReason.JOB_INITIALIZATION_FAILURE, error_info=error)
    context = dg.build_run_status_sensor_context(
        sensor_name="run_failure_alert_sensor", dagster_instance=instance, dagster_run=run, dagster_event=failure,
        resources={"alerts": AlertsResource(webhook_url=webhook_server.url)},
    ).for_run_failure()
    run_failure_alert_sensor(context)
    (alert,) = webhook_server.received
    assert alert["text"] == (
        f"scrape_assets run {run.run_id[:8]} of daily_scrape_job failed: An exception was thrown during execution: "
        "DagsterUserCodeProcessError: the code location could not be loaded")


def test_a_run_whose_process_was_killed_is_alerted_with_how_it_died(instance, webhook_server):
    """A run's process killed (kill -9, the kernel's OOM killer): Dagster's code server logs
    how it died, then fails the run with generic words; the alert says how, and what to do."""
    import signal

    from dagster._core.test_utils import create_run_for_test
    from dagster._grpc.server import DagsterApiServer
    from dagster._utils import get_run_crash_explanation

    alerts = {"alerts": AlertsResource(webhook_url=webhook_server.url)}
    for exit_code, how in ((-signal.SIGKILL, "was terminated by signal 9 (SIGKILL): killed (kill -9, or by the "
                                             "kernel when out of memory)"),
                           (3, "unexpectedly exited with code 3")):
        run = create_run_for_test(instance, job_name="daily_scrape_job", status=dg.DagsterRunStatus.STARTED)
        # What dagster._grpc.server does when it finds the run's process gone (seen so with a
        # daemon-launched run killed with kill -9: "[DagsterApiServer] Run execution process for ...").
        instance.report_engine_event(get_run_crash_explanation(f"Run execution process for {run.run_id}", exit_code),
                                     run, cls=DagsterApiServer)
        assert instance.all_logs(run.run_id)[-1].dagster_event.message.startswith("[DagsterApiServer] Run execution ")
        failure = instance.report_run_failed(run)
        assert failure.message == "This run has been marked as failed from outside the execution context."
        context = dg.build_run_status_sensor_context(
            sensor_name="run_failure_alert_sensor", dagster_instance=instance,
            dagster_run=instance.get_run_by_id(run.run_id), dagster_event=failure, resources=alerts,
        ).for_run_failure()
        run_failure_alert_sensor(context)
        assert webhook_server.received[-1]["text"] == (
            f"scrape_assets run {run.run_id[:8]} of daily_scrape_job failed: the run's process {how}; re-execute it "
            "from failure (raw_pages resumes its snapshots in flight)")
    # Failed from outside for another reason (no such event): Dagster's words, as they are.
    run = create_run_for_test(instance, job_name="daily_scrape_job", status=dg.DagsterRunStatus.STARTED)
    failure = instance.report_run_failed(run)
    run_failure_alert_sensor(dg.build_run_status_sensor_context(
        sensor_name="run_failure_alert_sensor", dagster_instance=instance,
        dagster_run=instance.get_run_by_id(run.run_id), dagster_event=failure, resources=alerts,
    ).for_run_failure())
    assert webhook_server.received[-1]["text"] == (
        f"scrape_assets run {run.run_id[:8]} of daily_scrape_job failed: This run has been marked as failed from "
        "outside the execution context")


def test_one_alert_a_run_and_none_after_a_forced_termination(instance, webhook_server):
    """Run monitoring fails a run past its dagster/max_runtime, then the run's worker reports
    the interrupted step (a second RUN_FAILURE): one alert. "Force termination" marks a live run
    canceled, then its worker's failure turns it to FAILURE: a stop by hand, no alert. Through
    the sensor's ticks, as the daemon runs it: both failures of a run in one tick."""
    from dagster._core.events import DagsterEvent, RunFailureReason
    from dagster._core.test_utils import create_run_for_test

    from scrape_assets.defs.sensors import needs_no_alert

    resources = {"alerts": AlertsResource(webhook_url=webhook_server.url)}

    def tick(cursor):
        data = run_failure_alert_sensor.evaluate_tick(
            dg.build_sensor_context(instance=instance, cursor=cursor, resources=resources))
        return data.cursor  # (Dagster refuses, raising, a tick whose failures got a SkipReason and a reaction)

    def worker_failure(run):  # what the run's own worker reports (its pid on the event)
        event = DagsterEvent.job_failure(run.job_name, "Steps failed: ['raw_pages'].", RunFailureReason.STEP_FAILURE)
        instance.report_dagster_event(event, run.run_id)

    def new_run():
        return create_run_for_test(instance, job_name="daily_scrape_job", status=dg.DagsterRunStatus.STARTED)

    cursor = tick(None)
    timed_out, forced, raced = new_run(), new_run(), new_run()
    instance.report_run_failed(timed_out, "Exceeded maximum runtime of 25 seconds.")  # run monitoring
    worker_failure(timed_out)
    instance.report_run_canceled(forced, "This pipeline was forcibly marked as canceled from outside the execution "
                                         "context.")
    worker_failure(forced)
    # The worker stopped (RUN_CANCELED) before run monitoring reported the timeout: still alerted.
    instance.report_run_canceled(raced, "Run was canceled.")
    instance.report_run_failed(raced, "Exceeded maximum runtime of 25 seconds.")
    cursor = tick(tick(cursor))
    assert [a["run_id"] for a in webhook_server.received] == [timed_out.run_id, raced.run_id]
    assert all("Exceeded maximum runtime of 25 seconds" in a["text"] for a in webhook_server.received)
    # A failure the run's log does not hold: alerted, never lost.
    stray = DagsterEvent.job_failure("daily_scrape_job", "x", RunFailureReason.STEP_FAILURE)
    assert needs_no_alert(instance, forced.run_id, stray) is None


def test_a_run_failed_by_the_schema_check_is_alerted_with_the_categories_and_why(tmp_path, instance, webhook_server):
    """"Steps failed: ['parsed_products']" alone sends the operator to the UI to learn which
    category failed and why; the alert says both."""
    from scrape_assets.faults import FaultSpec
    from scrape_assets_tests.fault_scenarios import fault_server

    spec = FaultSpec.model_validate({"rules": [{"match": "mystery_3/", "fault": "layout_changed"}]})
    with fault_server(spec) as server:
        result = materialize(instance, make_resources(tmp_path, base_url=server.base_url), ["travel", "mystery"],
                             raise_on_error=False)
    assert not result.success
    check = {c.check_name: c for c in result.get_asset_check_evaluations()}["parsed_products_match_schema"]
    failed = check.metadata["failed_categories"].value
    reasons = "reject reasons: \"price: no element matches 'p.price_color'\" x32; "
    assert list(failed) == ["mystery"] and failed["mystery"].startswith(reasons + "pages: layout_guard x2 (pages 1, 2; ")
    failure = [e for e in result.all_events if e.event_type_value in ("STEP_FAILURE", "RUN_FAILURE")][-1]
    context = dg.build_run_status_sensor_context(
        sensor_name="run_failure_alert_sensor", dagster_instance=instance,
        dagster_run=instance.get_run_by_id(result.run_id), dagster_event=failure,
        resources={"alerts": AlertsResource(webhook_url=webhook_server.url)},
    ).for_run_failure()
    run_failure_alert_sensor(context)
    (alert,) = webhook_server.received
    assert alert["text"].startswith(
        f"scrape_assets run {result.run_id[:8]} of __ephemeral_asset_job__ failed: parsed_products_match_schema failed "
        f"for mystery ({reasons}pages: layout_guard x2 (pages 1, 2; page parsed to zero products")
    # (the cause survives the alert's shortening: the reject reasons come before the layout guard's long message)
    assert alert["text"].endswith("...)") and len(alert["text"]) < 600


def test_daily_schedule_launches_one_run_for_all_categories(instance):
    context = dg.build_schedule_context(instance=instance,
                                        scheduled_execution_time=datetime(2026, 11, 30, 2, 0, tzinfo=timezone.utc))
    request = daily_scrape_schedule(context)
    assert request.run_key == "daily-2026-11-30"
    assert request.tags["dagster/asset_partition_range_start"] == "travel"
    assert request.tags["dagster/asset_partition_range_end"] == "sequential-art"
    assert daily_scrape_schedule.cron_schedule == "0 2 * * *"
    assert daily_scrape_schedule.execution_timezone == "UTC"
    assert daily_scrape_schedule.default_status == dg.DefaultScheduleStatus.RUNNING


def test_a_cron_firing_several_times_a_day_still_launches_one_run_that_day(instance):
    """Dagster's run_key dedupes one tick only: a later tick of the same day is skipped while
    that day's run is queued, going or done, and launches again after it failed or was canceled."""
    import uuid

    from dagster._core.storage.dagster_run import DagsterRun

    def tick(day: int, hour: int):
        return daily_scrape_schedule(dg.build_schedule_context(
            instance=instance, scheduled_execution_time=datetime(2026, 11, day, hour, 0, tzinfo=timezone.utc)))

    first = tick(29, 2)
    assert isinstance(first, dg.RunRequest)
    S = dg.DagsterRunStatus
    for status, launches in ((S.NOT_STARTED, False), (S.STARTED, False), (S.SUCCESS, False), (S.FAILURE, True),
                             (S.CANCELED, True)):
        run = instance.run_storage.add_run(DagsterRun(job_name="daily_scrape_job", run_id=str(uuid.uuid4()),
                                                      status=status, tags=first.tags))
        later = tick(29, 8)
        assert isinstance(later, dg.RunRequest) == launches, status
        if not launches:
            assert later.skip_message == f"the run of 2026-11-29 is {status.value.lower()} (run {run.run_id}): one a day"
        assert isinstance(tick(30, 2), dg.RunRequest)  # the next day's first tick is not held back by it
        instance.delete_run(run.run_id)



@pytest.mark.parametrize("status", [dg.DagsterRunStatus.QUEUED, dg.DagsterRunStatus.STARTING,
                                    dg.DagsterRunStatus.CANCELING])
def test_a_days_run_waiting_in_the_queue_or_about_to_start_or_stop_holds_that_days_later_ticks(instance, status):
    """The shipped instance queues daily runs one at a time, so a day's run is most often
    QUEUED when the day's second tick fires: launching another then would run the day twice."""
    import uuid

    from dagster._core.remote_origin import InProcessCodeLocationOrigin, RemoteJobOrigin, RemoteRepositoryOrigin
    from dagster._core.storage.dagster_run import DagsterRun
    from dagster._core.types.loadable_target_origin import LoadableTargetOrigin

    # A queued run names the code it runs (the run queue launches it from there).
    origin = RemoteJobOrigin(job_name="daily_scrape_job", repository_origin=RemoteRepositoryOrigin(
        repository_name="__repository__", code_location_origin=InProcessCodeLocationOrigin(
            loadable_target_origin=LoadableTargetOrigin(module_name="scrape_assets.definitions"))))

    def tick(hour: int):
        return daily_scrape_schedule(dg.build_schedule_context(
            instance=instance, scheduled_execution_time=datetime(2026, 11, 29, hour, 0, tzinfo=timezone.utc)))

    first = tick(2)
    run = instance.run_storage.add_run(DagsterRun(job_name="daily_scrape_job", run_id=str(uuid.uuid4()),
                                                  status=status, tags=first.tags, remote_job_origin=origin))
    later = tick(8)
    assert isinstance(later, dg.SkipReason)
    assert later.skip_message == f"the run of 2026-11-29 is {status.value.lower()} (run {run.run_id}): one a day"

def test_the_shipped_instance_queues_daily_runs_one_at_a_time_and_catches_up_one_day(tmp_path, monkeypatch):
    """A daily run still going when the next fires waits in the queue; missed days are not replayed."""
    shutil.copy(REPO_ROOT / "dagster.yaml", tmp_path / "dagster.yaml")
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path))
    with dg.DagsterInstance.get() as instance:
        request = daily_scrape_schedule(dg.build_schedule_context(
            instance=instance, scheduled_execution_time=datetime(2026, 11, 30, 2, 0, tzinfo=timezone.utc)))
        assert request.tags["scrape/day"] == "2026-11-30"
        # A daily run whose process died would hold that one slot forever: run monitoring ends it after 20 h.
        assert request.tags["dagster/max_runtime"] == str(20 * 3600)
        monkeypatch.setenv("SCRAPE_RESUME_MAX_AGE_H", "30")
        assert daily_scrape_schedule(dg.build_schedule_context(
            instance=instance, scheduled_execution_time=datetime(2026, 12, 1, 2, 0, tzinfo=timezone.utc)
        )).tags["dagster/max_runtime"] == "108000"
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
        "classics: no products parsed so far (its pages failed, or the spec's selectors do not match the site?)",
        "mystery: success rate 0% is below the floor 90%",
    ]


def test_a_history_longer_than_one_evaluation_reads_is_replayed_silently_to_its_end(tmp_path, instance, monkeypatch):
    """A sensor turned on (or reset) after months of runs reads BATCH events per evaluation:
    a collapse that recovered later in the history must not alert from an early batch."""
    from scrape_assets.defs import sensors

    dead = make_resources(tmp_path / "dead", base_url=DEAD_HOST, max_attempts=1)
    healthy = make_resources(tmp_path)
    assert materialize(instance, dead, ["travel"], selection=["raw_pages"]).success  # collapsed...
    assert materialize(instance, healthy, ["travel"], selection=["raw_pages"]).success  # ...recovered
    assert materialize(instance, dead, ["mystery"], selection=["raw_pages"]).success  # still collapsed
    monkeypatch.setattr(sensors, "BATCH", 1)  # one event per asset per evaluation
    cursor, found = None, []
    for _ in range(5):
        alerts, cursor = sensors.evaluate(instance, cursor)
        found.append(alerts)
    # Silent while batches come back full (3 events, then one more look), then what is open, once.
    assert found == [[], [], [], ["mystery: success rate 0% is below the floor 90%"], []]
    assert "catching_up" not in json.loads(cursor)


def test_a_run_whose_events_span_two_evaluations_counts_once_for_all(tmp_path, instance, monkeypatch):
    from scrape_assets.defs import sensors

    broken = make_resources(tmp_path, base_url=DEAD_HOST, max_attempts=1)
    assert materialize(instance, broken, ["travel", "mystery"], selection=["raw_pages"]).success
    monkeypatch.setattr(sensors, "BATCH", 1)  # one partition's event per evaluation
    cursor = json.dumps({})  # not a first evaluation: every observation counts
    for _ in range(3):
        _, cursor = sensors.evaluate(instance, cursor)
    state = json.loads(cursor)["state"]
    assert state["history"] == {"travel": [0.0], "mystery": [0.0], "whole run": [0.0]}
    assert len(json.loads(cursor)["runs"]) == 1


def _failure_context(instance, result, resources, sensor_name):
    run = instance.get_run_by_id(result.run_id)
    failure = [e for e in result.all_events if e.event_type_value in ("STEP_FAILURE", "RUN_FAILURE")][-1]
    return dg.build_run_status_sensor_context(
        sensor_name=sensor_name, dagster_instance=instance, dagster_run=run, dagster_event=failure, resources=resources,
    ).for_run_failure()


def _sensor_resources(resources, webhook_url=None):
    return {"site": resources["site"], "store": resources["store"], "alerts": AlertsResource(webhook_url=webhook_url)}


def test_categories_a_failed_schema_check_held_back_are_loaded_by_a_follow_up_run(tmp_path, instance):
    """One category failing the schema stops the whole run's load; the sensor loads the others."""
    from scrape_assets.defs.assets.dead_letters import dead_letters as dead_letters_asset
    from scrape_assets.defs.assets.parsed_products import parsed_products
    from scrape_assets.defs.assets.products_table import products_table
    from scrape_assets.defs.assets.raw_pages import raw_pages
    from scrape_assets.faults import FaultSpec
    from scrape_assets.warehouse import price_history
    from scrape_assets_tests.fault_scenarios import fault_server

    categories = ["travel", "mystery", "classics"]
    with fault_server(FaultSpec()) as server:
        res = make_resources(tmp_path, base_url=server.base_url)
        assert materialize(instance, res, categories).success
        wh = Warehouse(f"sqlite:///{tmp_path / 'warehouse.db'}")
        with wh.engine.begin() as conn:  # that load was yesterday's
            conn.execute(price_history.update().values(snapshot_date="2000-01-01"))
        before = {c: sorted((r["product_id"], r["snapshot_id"]) for r in wh.rows(products) if r["category"] == c)
                  for c in categories}

        # Overnight mystery's price element was renamed; travel and classics did not change (304s).
        server.spec = FaultSpec.model_validate({"rules": [{"match": "mystery_3/", "fault": "layout_changed"}]})
        failed = materialize(instance, res, categories, raise_on_error=False)
        assert not failed.success
        assert {c.check_name: c.passed for c in failed.get_asset_check_evaluations()} == {
            "parsed_products_match_schema": False, "parsed_products_match_site_count": True}  # all cards found
        today = {r["snapshot_date"] for r in wh.rows(price_history)} - {"2000-01-01"}
        assert today == set()  # nothing loaded: the whole run's load was held back

        # The sensor as the daemon runs it: its first tick only sets its cursor, the next sees the failure.
        resources = _sensor_resources(res)
        first = held_back_load_sensor.evaluate_tick(dg.build_sensor_context(instance=instance, resources=resources))
        assert first.run_requests == []
        failed_again = materialize(instance, res, categories, raise_on_error=False,  # after the cursor
                                   tags={"scrape/day": "2026-12-01"})  # as the schedule tags it
        tick = held_back_load_sensor.evaluate_tick(
            dg.build_sensor_context(instance=instance, resources=resources, cursor=first.cursor))
        requests = tick.run_requests
        # travel and classics are not consecutive in the spec's order: one run per range; then
        # mystery's dead letters (held back with the load), without products_table.
        ranges = [(r.tags["dagster/asset_partition_range_start"], r.tags["dagster/asset_partition_range_end"],
                   r.asset_selection) for r in requests]
        assert ranges == [("travel", "travel", None), ("classics", "classics", None),
                          ("mystery", "mystery", [dg.AssetKey("dead_letters")])]
        assert {r.tags[HELD_BACK_TAG] for r in requests} == {failed_again.run_id}
        # Queued like daily runs (never beside one), ended by run monitoring if its process dies.
        assert {(r.tags["scrape/day"], r.tags["dagster/max_runtime"]) for r in requests} == {("2026-12-01", "72000")}
        assert [r.run_key for r in requests] == [f"held-back-{failed_again.run_id}-travel",
                                                 f"held-back-{failed_again.run_id}-classics",
                                                 f"held-back-dead-letters-{failed_again.run_id}-mystery"]
        later = held_back_load_sensor.evaluate_tick(
            dg.build_sensor_context(instance=instance, resources=resources, cursor=tick.cursor))
        assert later.run_requests == []  # each failed run is seen once

        # Launched as the daemon would: load_job with the request's tags. No request, no parse.
        job = dg.Definitions(
            assets=[raw_pages, parsed_products, products_table, dead_letters_asset], jobs=[load_job], resources=res
        ).resolve_job_def("load_job")
        requests_before = len(server.fault_log)
        for request in requests:
            result = job.execute_in_process(instance=instance, tags=request.tags, asset_selection=request.asset_selection)
            assert result.success
            if request.asset_selection is None:
                assert run_metadata(result)["products_table"]["partitions_reloaded"] == 0  # unchanged input
            else:
                assert "products_table" not in run_metadata(result)
    after = {c: sorted((r["product_id"], r["snapshot_id"]) for r in wh.rows(products) if r["category"] == c)
             for c in categories}
    assert after == before  # unchanged rows stay as they were; mystery keeps its earlier rows
    history = wh.rows(price_history)
    today = {r["snapshot_date"] for r in history} - {"2000-01-01"}
    assert len(today) == 1  # the day's prices of the categories that passed, written by the follow-up
    assert Counter(r["category"] for r in history if r["snapshot_date"] in today) == {"travel": 11, "classics": 19}
    assert len(server.fault_log) == requests_before
    # mystery's 32 cards the parser rejected are dead letters of the snapshot that failed.
    letters = wh.rows(dead_letters)
    assert Counter((r["category"], r["stage"]) for r in letters) == {("mystery", "parse"): 32}
    assert {r["snapshot_id"] for r in letters} == {latest_manifest(res["store"].store(), "demo", "mystery").snapshot_id}
    wh.close()


def test_held_back_load_sensor_launches_nothing_for_other_failures_and_alerts_when_it_cannot_read(
    tmp_path, instance, webhook_server
):
    from scrape_assets_tests.test_pipeline import _broken_spec

    # A run that failed for another reason (its spec file is missing): no check failed, so no
    # alert either, even though the sensor's own spec is that missing one too.
    missing = make_resources(tmp_path, site=str(tmp_path / "missing.yaml"))
    result = materialize(instance, missing, ["travel"], raise_on_error=False)
    assert not result.success
    for resources in (_sensor_resources(make_resources(tmp_path)), _sensor_resources(missing, webhook_server.url)):
        skip = held_back_load_sensor(_failure_context(instance, result, resources, "held_back_load_sensor"))
        assert isinstance(skip, dg.SkipReason) and "nothing held back" in skip.skip_message
    assert webhook_server.received == []
    good = _sensor_resources(make_resources(tmp_path), webhook_server.url)

    # A failed check in a run that did not plan products_table: nothing was held back.
    broken = make_resources(tmp_path, site=_broken_spec(tmp_path))
    parse_only = materialize(instance, broken, ["travel"], selection=["raw_pages", "parsed_products"],
                             raise_on_error=False)
    assert not parse_only.success
    skip = held_back_load_sensor(_failure_context(instance, parse_only, good, "held_back_load_sensor"))
    assert isinstance(skip, dg.SkipReason) and "nothing held back" in skip.skip_message

    # Every category failed: nothing to load, their dead letters to record (one range).
    blocked = materialize(instance, broken, ["travel", "mystery"], raise_on_error=False)
    assert not blocked.success
    [letters] = held_back_load_sensor(_failure_context(instance, blocked, good, "held_back_load_sensor"))
    assert (letters.asset_selection, letters.tags["dagster/asset_partition_range_start"],
            letters.tags["dagster/asset_partition_range_end"]) == ([dg.AssetKey("dead_letters")], "travel", "mystery")

    # Its categories cannot be read (the spec is gone now): an alert names them instead of a silent skip.
    unreadable = _sensor_resources(make_resources(tmp_path, site=str(tmp_path / "gone.yaml")), webhook_server.url)
    skip = held_back_load_sensor(_failure_context(instance, blocked, unreadable, "held_back_load_sensor"))
    assert isinstance(skip, dg.SkipReason)
    [alert] = webhook_server.received
    assert alert["kind"] == "held_back_load" and alert["run_id"] == blocked.run_id
    assert alert["text"].startswith(f"scrape_assets: run {blocked.run_id[:8]} of __ephemeral_asset_job__: failed its "
                                    "schema check, and its categories (mystery, travel) could not be read")
    assert "gone.yaml" in alert["text"] and "load them with load_job" in alert["text"]
    assert held_back_load_sensor.default_status == dg.DefaultSensorStatus.RUNNING


def test_held_back_load_sensor_skips_what_it_cannot_load_and_loads_the_rest(tmp_path, instance, webhook_server, monkeypatch):
    import scrape_assets.defs.sensors as sensors
    from scrape_assets_tests.test_pipeline import _broken_spec

    categories = ["travel", "mystery", "classics"]  # five-star cards: 0 of 11, 7 of 32, 1 of 19
    changed = make_resources(tmp_path, site=_broken_spec(tmp_path, "rating", "p.star-rating:not(.Five)"))
    failed = materialize(instance, changed, categories, raise_on_error=False)
    assert not failed.success
    resources = _sensor_resources(changed, webhook_server.url)

    def ranges():  # the loads (mystery failed: its dead letters are recorded apart)
        result = held_back_load_sensor(_failure_context(instance, failed, resources, "held_back_load_sensor"))
        if isinstance(result, dg.SkipReason):
            return result.skip_message
        return [(r.tags["dagster/asset_partition_range_start"], r.tags["dagster/asset_partition_range_end"])
                for r in result if r.asset_selection is None]

    assert ranges() == [("travel", "travel"), ("classics", "classics")]
    # travel left the spec since: no partition to run it in.
    monkeypatch.setattr(sensors, "category_partitions", dg.StaticPartitionsDefinition(["mystery", "classics", "poetry"]))
    assert ranges() == [("classics", "classics")]
    monkeypatch.setattr(sensors, "category_partitions", dg.StaticPartitionsDefinition(["mystery", "poetry"]))
    assert ranges() == []  # mystery's dead letters only
    monkeypatch.setattr(sensors, "category_partitions", dg.StaticPartitionsDefinition(["poetry"]))
    assert ranges() == (f"run {failed.run_id[:8]}: no follow-up for the categories it parsed: classics, mystery, travel "
                        "no longer in the spec")
    monkeypatch.undo()
    # classics' parse state is unreadable: travel is still loaded, and an alert names classics.
    (tmp_path / "objects" / "demo" / "classics" / "parse_state.json").write_text("{not json")
    assert ranges() == [("travel", "travel")]
    [alert] = webhook_server.received
    assert "classics (ManifestError" in alert["text"] and "load them with load_job if they passed" in alert["text"]



def test_load_job_writes_the_products_table_and_the_dead_letters_of_what_was_parsed(tmp_path, instance):
    """The follow-up of a held-back load: both tables (a passed category's failed pages are dead
    letters too), no fetch and no parse."""
    from scrape_assets.defs.assets.dead_letters import dead_letters as dead_letters_asset
    from scrape_assets.defs.assets.parsed_products import parsed_products
    from scrape_assets.defs.assets.products_table import products_table
    from scrape_assets.defs.assets.raw_pages import raw_pages

    res = make_resources(tmp_path)
    assert materialize(instance, res, ["travel"], selection=["raw_pages", "parsed_products"]).success
    job = dg.Definitions(assets=[raw_pages, parsed_products, products_table, dead_letters_asset], jobs=[load_job],
                         resources=res).resolve_job_def("load_job")
    result = job.execute_in_process(instance=instance, tags={"dagster/asset_partition_range_start": "travel",
                                                             "dagster/asset_partition_range_end": "travel"})
    assert result.success
    assert {e.asset_key.to_user_string() for e in result.get_asset_materialization_events()} == {
        "products_table", "dead_letters"}
    assert Warehouse(f"sqlite:///{tmp_path / 'warehouse.db'}").count(products, "travel") == 11

def test_consecutive_ranges_follow_the_spec_order():
    from scrape_assets.defs.sensors import consecutive_ranges

    keys = ["a", "b", "c", "d", "e", "f"]
    assert consecutive_ranges(["e", "b", "a", "c", "f"], keys) == [("a", "c"), ("e", "f")]
    assert consecutive_ranges(["d"], keys) == [("d", "d")]
    assert consecutive_ranges([], keys) == []


def test_step_failure_reasons_name_the_steps_own_exception_without_dagsters_wrapper():
    from types import SimpleNamespace

    from dagster._utils.error import SerializableErrorInfo

    from scrape_assets.defs.sensors import step_failure_reasons

    own = SerializableErrorInfo(
        message="scrape_assets.errors.FetchConfigChangedError: demo/travel/2026-12-03T020000Z/manifest.json: the "
                "incomplete snapshot was fetched with a different config (differing keys: start_url)\n",
        stack=[], cls_name="FetchConfigChangedError")
    wrapped = SerializableErrorInfo(message='dagster._core.errors.DagsterExecutionStepExecutionError: Error occurred '
                                    'while executing op "raw_pages":\n', stack=[],
                                    cls_name="DagsterExecutionStepExecutionError", cause=own)
    events = [SimpleNamespace(step_key="raw_pages",
                              event_specific_data=SimpleNamespace(error=wrapped, user_failure_data=None)),
              SimpleNamespace(step_key="dead_letters", event_specific_data=SimpleNamespace(
                  error=None, user_failure_data=SimpleNamespace(description="a  described\nfailure")))]
    assert step_failure_reasons(events) == [
        "raw_pages: FetchConfigChangedError: demo/travel/2026-12-03T020000Z/manifest.json: the incomplete snapshot "
        "was fetched with a different config (differing keys: start_url)",
        "dead_letters: a described failure",
    ]
    assert step_failure_reasons(events, limit=40)[0] == "raw_pages: FetchConfigChangedError: demo/travel/..."


def test_run_failure_text_keeps_the_runs_own_reason_and_names_each_step_once():
    from dagster._utils.error import SerializableErrorInfo

    from scrape_assets.defs.assets.raw_pages import INTERRUPTED
    from scrape_assets.defs.sensors import run_failure_text

    steps_failed = "Execution of run for \"daily_scrape_job\" failed. Steps failed: ['raw_pages']."
    assert run_failure_text(steps_failed, None, ["raw_pages: StorageError: disk full"], {}) == (
        "raw_pages: StorageError: disk full")
    # Run monitoring ended it at dagster/max_runtime: the reason to raise it stays in the alert.
    assert run_failure_text("Exceeded maximum runtime of 72000 seconds.", None, [f"raw_pages: {INTERRUPTED}"], {}) == (
        f"Exceeded maximum runtime of 72000 seconds: raw_pages: {INTERRUPTED}")
    # The schema check's categories, and other steps that failed besides its own.
    assert run_failure_text(steps_failed, None, ["parsed_products: check failed", "dead_letters: OSError: disk"],
                            {"mystery": "layout_guard x2"}) == (
        "parsed_products_match_schema failed for mystery (layout_guard x2); dead_letters: OSError: disk")
    error = SerializableErrorInfo(message="builtins.ValueError: bad config\n", stack=[], cls_name="ValueError")
    assert run_failure_text("Execution of run for \"j\" failed. An exception was thrown during execution.", error, [],
                            {}) == "An exception was thrown during execution: ValueError: bad config"
    assert run_failure_text(None, None, [], {}) == "no reason recorded"
    # A layout change fails every category alike (counts aside): one entry, not one a category.
    alike = {f"cat{i}": f"reject reasons: \"price: no element matches 'p.price_color'\" x{10 + i}; page {i}"
             for i in range(12)}
    assert run_failure_text(None, None, [], {**alike, "odd": "unrecognised_page x1"}) == (
        "parsed_products_match_schema failed for cat0, cat1, cat2, cat3, cat4 and 7 more (cat0's: reject reasons: "
        "\"price: no element matches 'p.price_color'\" x10; page 0); odd (unrecognised_page x1)")
    # ... whatever pages each category failed on (as describe_failures lists them)
    from scrape_assets.validation_report import ValidationReport, describe_failures

    def described(pages: int) -> str:
        case = {"schema": "pages", "schema_context": "DataFrameSchema", "column": None, "check": "layout_guard",
                "message": "page parsed to zero products",
                "reject_reasons": {"price: no element matches 'p.price_tag'": 11 * pages}}
        cases = [{**case, "failure_case": {"category": "c", "page_number": n}} for n in range(1, pages + 1)]
        return describe_failures(ValidationReport(passed=False, failure_count=pages, failure_cases=cases,
                                                  by_check={"pages: layout_guard": pages}))

    layout = {"travel": described(1), "mystery": described(2), "classics": described(3), "fiction": described(5)}
    assert len(set(layout.values())) == 4
    assert run_failure_text(None, None, [], layout) == (
        "parsed_products_match_schema failed for travel, mystery, classics, fiction (travel's: reject reasons: "
        "\"price: no element matches 'p.price_tag'\" x11; pages: layout_guard x1 (page 1; page parsed to zero "
        "products))")
    many = {f"c{i}": "x" * i for i in range(6)}  # six different reasons: three named, the rest counted
    assert run_failure_text(None, None, [], many) == (
        "parsed_products_match_schema failed for c0 (); c1 (x); c2 (xx); and 3 more categories for other reasons")
    dynamic = "Execution of run for \"j\" failed. Steps failed: ['fetch[a]', 'fetch[b]']."  # dynamic step keys
    assert run_failure_text(dynamic, None, ["fetch[a]: OSError: x"], {}) == "fetch[a]: OSError: x"


def test_a_step_whose_retry_policy_gave_up_is_named_with_its_last_error():
    from dagster._utils.error import SerializableErrorInfo

    from scrape_assets.defs.sensors import error_line

    cause = SerializableErrorInfo(message="scrape_assets.errors.StorageError: /data/objects: disk full\n", stack=[],
                                  cls_name="StorageError")
    gave_up = SerializableErrorInfo(message="Exceeded max_retries of 3\n", stack=[], cls_name="RetryRequestedFromPolicy",
                                    cause=cause)
    assert error_line(gave_up) == "StorageError: /data/objects: disk full (after 3 retries)"
    # Dagster wraps some of its messages over lines (a launch with a partition key that is not
    # one): the whole first paragraph, not its first line cut mid-sentence.
    wrapped = SerializableErrorInfo(
        message="dagster._core.errors.DagsterInvalidInvocationError: Partition range mystry to mystry is\n"
                "                not a valid range. Nonexistent partition keys:\n                ['mystry']\n\n"
                "Stack (most recent call last): ...\n", stack=[], cls_name="DagsterInvalidInvocationError")
    assert error_line(wrapped) == ("DagsterInvalidInvocationError: Partition range mystry to mystry is not a valid "
                                   "range. Nonexistent partition keys: ['mystry']")
    # A dagster.Failure that allowed retries: its description, after them.
    from types import SimpleNamespace

    from scrape_assets.defs.sensors import step_failure_reasons

    described = SimpleNamespace(step_key="raw_pages", event_specific_data=SimpleNamespace(
        error=gave_up, user_failure_data=SimpleNamespace(description="storage refused; nothing fetched")))
    assert step_failure_reasons([described]) == ["raw_pages: storage refused; nothing fetched (after 3 retries)"]


@pytest.mark.parametrize("url", ["https://hooks.example:44a/T0", "https://hooks.example/T0\r"])
def test_a_webhook_url_httpx_refuses_keeps_the_alert_and_moves_the_cursor(tmp_path, instance, url):
    """httpx.InvalidURL is no httpx.HTTPError: it used to escape send_alert, so every tick
    raised before saving its cursor and no alert was ever kept or sent."""
    assert materialize(instance, make_resources(tmp_path, base_url=DEAD_HOST, max_attempts=1), ["travel"],
                       selection=["raw_pages"]).success
    cursor, result = _tick(instance, None, url)
    assert result.skip_message == "webhook refused 1 alert(s): kept for the next evaluation"
    assert json.loads(cursor)["unsent"] == ["travel: success rate 0% is below the floor 90%"]


def test_an_alert_with_a_lone_surrogate_is_sent_not_raised(webhook_server):
    """A file name's undecodable byte reaches an error text as a lone surrogate; httpx's own
    JSON encoding (strict UTF-8) raised UnicodeEncodeError out of send_alert, failing its sensor."""
    from scrape_assets.alerts import send_alert

    assert send_alert("run failed: /data/caf\udce9/manifest.json: No space left on device",
                      webhook_url=webhook_server.url, fields={"kind": "run_failure", "path": "caf\udce9"})
    assert webhook_server.received == [{"text": "run failed: /data/caf?/manifest.json: No space left on device",
                                         "kind": "run_failure", "path": "caf?"}]
    assert send_alert("caf\u00e9 \u20ac", webhook_url=webhook_server.url)  # other text is sent as written
    assert webhook_server.received[-1] == {"text": "caf\u00e9 \u20ac"}
    assert webhook_server.content_types == ["application/json"] * 2


def test_a_webhook_that_refuses_or_cannot_be_reached_is_logged_without_its_secret_path(webhook_server, caplog):
    """A Slack-style webhook's path is its credential: the error lines name scheme, host and port only."""
    from scrape_assets.alerts import send_alert

    port = webhook_server.server_address[1]
    webhook_server.status = 500
    with caplog.at_level(logging.ERROR, logger="scrape_assets.alerts"):
        assert not send_alert("travel: success rate 0%", webhook_url=webhook_server.url)
        assert not send_alert("travel: success rate 0%", webhook_url="http://127.0.0.1:1/hooks/SECRET-TOKEN")
    assert [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR] == [
        f"alert webhook http://127.0.0.1:{port}/… answered HTTP 500",
        "alert webhook http://127.0.0.1:1/… unreachable: ConnectError",
    ]
    assert "SECRET-TOKEN" not in caplog.text and "/hooks" not in caplog.text


def test_a_webhook_url_mistyped_without_its_scheme_is_not_logged(caplog):
    """A URL set on the alerts resource is not checked like SCRAPE_ALERT_WEBHOOK_URL: one
    missing "://" ("https//hooks...") has no host to show apart from its secret path, so the
    error line shows none of it."""
    from scrape_assets.alerts import send_alert

    with caplog.at_level(logging.ERROR, logger="scrape_assets.alerts"):
        for typo in ("https//hooks.example/services/SECRET-TOKEN", "hooks.example/services/SECRET-TOKEN"):
            assert not send_alert("travel: success rate 0%", webhook_url=typo)
    assert [r.getMessage().split(" unreachable")[0] for r in caplog.records if r.levelno == logging.ERROR] == [
        "alert webhook (not shown: no scheme://)"] * 2
    assert "SECRET-TOKEN" not in caplog.text and "hooks" not in caplog.text


def test_dead_letters_alone_records_the_fetch_dead_letters_of_a_category_never_parsed(tmp_path, instance):
    """held_back_load_sensor launches dead_letters alone for categories without a parse state
    too: their failed pages are in the manifest, and nothing to parse is no error."""
    res = make_resources(tmp_path, base_url=DEAD_HOST, max_attempts=1)
    assert materialize(instance, res, ["travel"], selection=["raw_pages"]).success
    assert materialize(instance, res, ["travel"], selection=["dead_letters"]).success
    rows = Warehouse(f"sqlite:///{tmp_path / 'warehouse.db'}").rows(dead_letters, "travel")
    assert [(r["stage"], r["reason"].split(":")[0], r["attempts"]) for r in rows] == [("fetch", "robots_unreachable", 0)]


def test_a_shortened_alert_line_cuts_between_words_not_inside_one():
    from scrape_assets.defs.sensors import _shortened

    text = "pages: rejected_share x2 (pages 1, 2; more of the categories' cards were rejected than allowed)"
    assert _shortened(text, 50) == "pages: rejected_share x2 (pages 1, 2; more of..."  # not "more of t..."
    assert _shortened("FetchConfigChangedError: demo/travel/2026-12-03T020000Z/manifest.json", 40) == (
        "FetchConfigChangedError: demo/travel/...")  # a long token keeps its start
    assert _shortened(text, 200) == text



def test_five_categories_failing_alike_are_named_without_and_0_more():
    from scrape_assets.defs.sensors import _schema_failures

    why = {c: "pages: layout_guard x1 (page 1)" for c in ("a", "b", "c", "d", "e")}
    assert _schema_failures(why) == "a, b, c, d, e (a's: pages: layout_guard x1 (page 1))"


def test_a_space_exactly_twelve_from_the_end_of_what_is_kept_is_where_an_alert_is_cut():
    from scrape_assets.defs.sensors import _shortened

    text = "a" * 25 + " " + "b" * 30  # a limit of 40 keeps 37 characters; the space is 12 from their end
    assert _shortened(text, 40) == "a" * 25 + "..."
