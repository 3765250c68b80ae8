"""Sensors: ``success_rate_collapse_sensor`` and ``run_failure_alert_sensor``.

The collapse sensor reads new materializations of ``raw_pages`` (page success rates,
per category and per run) and ``parsed_products`` / ``products_table`` (products per
category) from the instance's event log, feeds them to :mod:`scrape_assets.collapse`,
and alerts once per collapse. Its cursor holds the event-log positions and the state.
"""


import json

import dagster as dg

from scrape_assets.alerts import send_alert
from scrape_assets.collapse import CollapseRules, CollapseState, observe_products, observe_rate
from scrape_assets.defs.resources import AlertsResource

RULES = CollapseRules()
BATCH = 200


def _new_records(instance, asset: str, cursor: str | None):
    result = instance.fetch_materializations(dg.AssetKey(asset), limit=BATCH, cursor=cursor, ascending=True)
    return result.records, (result.cursor if result.records else cursor)


def _by_run(records) -> dict[str, dict]:
    """One metadata dict per run (a multi-category run records one event per partition)."""
    out: dict[str, dict] = {}
    for record in records:
        materialization = record.asset_materialization
        if materialization is not None:
            out.setdefault(record.run_id, {k: v.value for k, v in materialization.metadata.items()})
    return out


def evaluate(instance, cursor: str | None, rules: CollapseRules = RULES) -> tuple[list[str], str]:
    """Alerts for materializations recorded since ``cursor``; returns ``(alerts, new_cursor)``."""
    data = json.loads(cursor) if cursor else {}
    state = CollapseState.from_dict(data.get("state"))
    positions = dict(data.get("positions", {}))
    alerts: list[str] = []

    records, positions["raw_pages"] = _new_records(instance, "raw_pages", positions.get("raw_pages"))
    for run_id, metadata in _by_run(records).items():
        by_category = metadata.get("by_category") or {}
        for category, numbers in sorted(by_category.items()):
            alerts.append(observe_rate(state, category, float(numbers["success_rate"]), rules))
        if len(by_category) > 1:
            alerts.append(observe_rate(state, "all", float(metadata["success_rate"]), rules))

    for asset, field in (("parsed_products", "by_category"), ("products_table", "rows_by_category")):
        records, positions[asset] = _new_records(instance, asset, positions.get(asset))
        for run_id, metadata in _by_run(records).items():
            for category, value in sorted((metadata.get(field) or {}).items()):
                count = value["products"] if isinstance(value, dict) else int(value)
                alerts.append(observe_products(state, category, count))

    new_cursor = json.dumps({"positions": positions, "state": state.to_dict()}, sort_keys=True)
    return [a for a in alerts if a], new_cursor


@dg.sensor(minimum_interval_seconds=60, default_status=dg.DefaultSensorStatus.RUNNING)
def success_rate_collapse_sensor(context: dg.SensorEvaluationContext, alerts: AlertsResource):
    """Alert (log + webhook) when a category's or a run's success rate collapses."""
    found, new_cursor = evaluate(context.instance, context.cursor)
    for text in found:
        context.log.warning(f"collapse: {text}")
        send_alert(f"scrape_assets collapse: {text}", webhook_url=alerts.webhook_url, fields={"kind": "collapse"})
    context.update_cursor(new_cursor)
    return dg.SkipReason(f"{len(found)} alert(s) sent" if found else "no collapse")


@dg.run_failure_sensor(default_status=dg.DefaultSensorStatus.RUNNING)
def run_failure_alert_sensor(context: dg.RunFailureSensorContext, alerts: AlertsResource):
    """Alert when a run fails (crash, storage error, refused resume...)."""
    run = context.dagster_run
    message = context.failure_event.message or "run failed"
    send_alert(
        f"scrape_assets run {run.run_id[:8]} of {run.job_name} failed: {message}",
        webhook_url=alerts.webhook_url,
        fields={"kind": "run_failure", "run_id": run.run_id, "job": run.job_name},
    )


defs = dg.Definitions(sensors=[success_rate_collapse_sensor, run_failure_alert_sensor])
