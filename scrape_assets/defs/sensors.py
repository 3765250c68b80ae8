"""Sensors: ``success_rate_collapse_sensor``, ``run_failure_alert_sensor``, ``held_back_load_sensor``,
``dead_run_sensor``, ``unsent_alerts_sensor``.

The collapse sensor reads new materializations of ``raw_pages`` (page success rates,
per category and per run) and ``parsed_products`` / ``products_table`` (products per
category) from the instance's event log, feeds them to :mod:`scrape_assets.collapse`,
and alerts once per collapse: one webhook message per evaluation however many collapses
it found (an outage of 50 categories is one message, not 101). Its cursor holds the
event-log positions, the state, and the alerts the webhook has not accepted yet (sent
again with the next evaluation's, up to :data:`MAX_UNSENT`).

``held_back_load_sensor`` loads what a failed blocking check held back: one run covers
many categories, so one category failing ``parsed_products_match_schema`` stops the load
of all of them. After such a run fails, it launches ``load_job`` (``products_table`` and
``dead_letters``, no request, no parse) for the run's categories whose rows passed the
schema (unchanged ones too: their load writes the day's ``price_history``), one run per
consecutive range of them.

``dead_run_sensor`` fails the runs a killed process left "started" and frees their pool
slots (:mod:`scrape_assets.run_processes`).

The alerts of the other sensors (a failed run, a held-back load that could not be
followed up, runs found dead) are one message each when they happen: those the webhook
refuses or cannot be reached for are kept in the instance's database
(:data:`UNSENT_KEY`) and ``unsent_alerts_sensor`` sends them again every minute, oldest
first, until the webhook takes them.
"""


import json
import re
import threading
import uuid
from collections.abc import Collection

import dagster as dg

from scrape_assets.alerts import REFUSED_FOR_GOOD, SENT, deliver_alert
from scrape_assets.collapse import CollapseRules, CollapseState, observe_products, observe_rate
from scrape_assets.counts import counted
from scrape_assets.defs.assets.parsed_products import SCHEMA_CHECK
from scrape_assets.defs.jobs import QUEUE_TAG, category_partitions, load_job, partition_range_tags, queue_tags
from scrape_assets.defs.partitions import configured_spec, consecutive_ranges, range_label, site_spec
from scrape_assets.defs.resources import AlertsResource, ObjectStoreResource, SiteResource
from scrape_assets.extract import load_parse_state
from scrape_assets.manifest import utc_now_iso
from scrape_assets.run_processes import fail_dead_runs

RULES = CollapseRules()
BATCH = 200
#: Runs whose run-wide rate the cursor remembers as observed (a run's events may span evaluations).
RUNS_REMEMBERED = 200
#: Alerts kept for the next evaluation while the webhook refuses them (the oldest are dropped beyond).
MAX_UNSENT = 100
#: Alerts listed in one message; the rest are counted.
MAX_LINES = 30
#: The instance key-value entry (a run storage cursor, in the instance's database, so on a
#: shared PostgreSQL instance too) holding the alerts :func:`alert_or_keep` could not deliver:
#: a JSON list of ``{"id", "text", "fields", "since"}``, oldest first, at most :data:`MAX_UNSENT`.
UNSENT_KEY = "scrape_assets.unsent_alerts"
#: Held alerts sent again in one evaluation at most (each POST may take its 10 s timeout; the
#: daemon gives a sensor 60 s), the rest in the next.
MAX_RESENT = 5
#: Held off between read and write of :data:`UNSENT_KEY` by sensors in this process (the
#: daemon evaluates sensors in threads when ``sensors: use_threads: true``).
_UNSENT_LOCK = threading.Lock()
# The subject of a run's own success rate: a space, so no category (a partition key,
# spec.PARTITION_KEY_PATTERN) shares its history or its collapse; books.toscrape.com has
# a category "all".
RUN_SUBJECT = "whole run"
#: The collapse sensor's cursor format: 2 since the run's subject is RUN_SUBJECT.
CURSOR_FORMAT = 2


def _spec_now(log=None) -> tuple[list[str], CollapseRules]:
    """The categories and collapse rules (``collapse:``) of the spec ``SCRAPE_SITE`` names, read
    now; if it cannot be read, the partition keys and rules of the spec the definitions loaded
    (an edit in progress must not stop the alerts)."""
    try:
        spec = configured_spec()
        categories = list(spec.categories)
    except Exception as exc:  # noqa: BLE001 - SpecError, SettingsError, OSError: all mean "not now"
        if log is not None:
            log.warning(f"spec unreadable now ({type(exc).__name__}: {str(exc).splitlines()[0][:200]}); "
                        "the categories and collapse rules of when the definitions loaded are used")
        spec, categories = site_spec, category_partitions.get_partition_keys()
    return categories, collapse_rules(spec)


def collapse_rules(spec) -> CollapseRules:
    """The :class:`CollapseRules` of a spec: its ``collapse.floor`` and ``collapse.max_drop``."""
    return CollapseRules(floor=spec.collapse.floor, max_drop=spec.collapse.max_drop)


def _new_records(instance, asset: str, cursor: str | None):
    result = instance.fetch_materializations(dg.AssetKey(asset), limit=BATCH, cursor=cursor, ascending=True)
    return result.records, (result.cursor if result.records else cursor)


def _key_subject(key: str) -> str:
    """The subject of a collapse key, ``rate:{subject}`` or ``products:{source}:{subject}``
    (subjects have no ":")."""
    return key.rsplit(":", 1)[1]


def _text_subject(text: str) -> str:
    """The subject of an alert's text, ``{subject}: ...``."""
    return text.split(":", 1)[0]


def _alert_order(text: str) -> tuple[bool, str, bool, str]:
    """The whole run's alert first, then the categories' by name: a long list is scanned by category."""
    subject = _text_subject(text)
    return (subject != RUN_SUBJECT, subject, _is_recovery(text), text)  # a subject's recovery after its collapse


def evaluate(instance, cursor: str | None, rules: CollapseRules = RULES,
             categories: Collection[str] | None = None) -> tuple[list[str], str]:
    """Alerts for materializations recorded since ``cursor``; returns ``(alerts, new_cursor)``.

    ``categories``: the spec's categories (None: any). A collapse of a category the spec no
    longer has is forgotten, never alerted (a first evaluation replaying weeks of runs would
    otherwise alert the last state of a category removed since).

    Events of the three assets are replayed in the order they were recorded, so a recovery
    is never seen before the collapse it recovers from. Each partition's event carries its
    own category's figures (``by_category``); a ``raw_pages`` event also carries its run's
    totals, observed once per run as :data:`RUN_SUBJECT` when the run covered several categories (the
    cursor remembers the last :data:`RUNS_REMEMBERED` runs observed, so a run whose events
    span two evaluations counts once). On the first evaluation (no cursor) the history only
    builds the state, over as many evaluations as reading it takes (:data:`BATCH` events of
    each asset per evaluation; ``catching_up`` in the cursor): once it is read, just the
    collapses still open at its end alert, never one that recovered within it. Alerts come
    in the order they were found (the messages sort them: :func:`_alert_order`).
    """
    data = json.loads(cursor) if cursor else {}
    catching_up = cursor is None or bool(data.get("catching_up"))
    state = CollapseState.from_dict(data.get("state"))
    if cursor is not None and data.get("format") != CURSOR_FORMAT:
        # A cursor from when a run's own rate was the subject "all": that history and
        # collapse cannot be told from those of a category named "all", so both go.
        state.history.pop("all", None)
        state.collapsed.pop("rate:all", None)
    positions = dict(data.get("positions", {}))
    runs_observed = list(data.get("runs", []))
    events = []
    more = False  # an asset has more events than this evaluation read
    for asset in ("raw_pages", "parsed_products", "products_table"):
        records, positions[asset] = _new_records(instance, asset, positions.get(asset))
        more |= len(records) >= BATCH
        for record in records:
            if record.asset_materialization is not None:
                metadata = {k: v.value for k, v in record.asset_materialization.metadata.items()}
                events.append((record.storage_id, record.run_id, asset, metadata))

    alerts: list[str | None] = []
    seen: set[tuple[str, str, str]] = set()  # events recorded before per-partition tables repeat the run's table
    for _, run_id, asset, metadata in sorted(events, key=lambda e: e[0]):
        field = "rows_by_category" if asset == "products_table" else "by_category"
        table = metadata.get(field) or {}
        for category, value in sorted(table.items()):
            if (asset, run_id, category) in seen:
                continue
            seen.add((asset, run_id, category))
            if asset == "raw_pages":
                alerts.append(observe_rate(state, category, float(value["success_rate"]), rules))
            else:
                count = value["products"] if isinstance(value, dict) else int(value)
                source = "loaded" if asset == "products_table" else "parsed"
                alerts.append(observe_products(state, category, count, source))
        if asset == "raw_pages" and metadata.get("categories", len(table)) > 1 and run_id not in runs_observed:
            runs_observed.append(run_id)
            alerts.append(observe_rate(state, RUN_SUBJECT, float(metadata["success_rate"]), rules))
    # What was alerted (before, or in this evaluation) and is healthy now says so once.
    alerts += [recovery_text(state, key, reason) for key, reason in state.cleared.items() if key not in state.collapsed]
    alerts = [a for a in alerts if a]
    if categories is not None:
        known = {*categories, RUN_SUBJECT}
        for key in [k for k in state.collapsed if _key_subject(k) not in known]:
            state.collapsed.pop(key)
        alerts = [a for a in alerts if _text_subject(a) in known]
    if catching_up:  # replaying the history: once it is all read, alert only what is still collapsed
        alerts = [] if more else sorted((f"{_key_subject(key)}: {reason}" for key, reason in state.collapsed.items()),
                                        key=_alert_order)
    new_cursor = json.dumps(
        {"format": CURSOR_FORMAT, "positions": positions, "state": state.to_dict(),
         "runs": runs_observed[-RUNS_REMEMBERED:],
         **({"catching_up": True} if catching_up and more else {})}, sort_keys=True
    )
    return alerts, new_cursor


#: What follows the subject in a recovery's text (:func:`recovery_text`).
RECOVERED = "recovered: "


def recovery_text(state, key: str, reason: str) -> str:
    """``"<subject>: recovered: <how it is now> (was: <the collapse>)"`` for the collapse ``key``
    (``rate:<subject>`` or ``products:<source>:<subject>``), cleared by a healthy observation."""
    kind, subject = key.split(":", 1)[0], _key_subject(key)
    if kind == "rate":
        now = f"success rate {state.history[subject][-1]:.0%}" if state.history.get(subject) else "success rate healthy"
    else:
        count = state.counts.get(key)
        parsed = key.startswith("products:parsed:")
        now = (("products parsed again" if parsed else "rows in the products table again") if count is None
               else f"{counted(count, 'product')} parsed again" if parsed
               else f"{counted(count, 'row')} in the products table again")
    return f"{subject}: {RECOVERED}{now} (was: {reason.split(' (')[0]})"


def _is_recovery(text: str) -> bool:
    return text.split(": ", 1)[-1].startswith(RECOVERED)


def alert_message(texts: list[str], held_since: str | None = None) -> str:
    """One message for an evaluation's collapses and recoveries: the line itself for one, a
    list for several.

    ``held_since``: when the oldest of them was first refused by the webhook (UTC ISO 8601), if any.
    """
    if len(texts) == 1:
        text = f"scrape_assets: {texts[0]}" if _is_recovery(texts[0]) else f"scrape_assets collapse: {texts[0]}"
    else:
        more = len(texts) - MAX_LINES
        recovered = sum(map(_is_recovery, texts))
        collapses = len(texts) - recovered
        head = ", ".join(filter(None, [counted(collapses, "collapse") if collapses else "",
                                       counted(recovered, "recovery") if recovered else ""]))
        text = (f"scrape_assets: {head}\n" + "\n".join(f"- {t}" for t in texts[:MAX_LINES])
                + (f"\n- ... and {more} more" if more > 0 else ""))
    if held_since:
        text += f"\n(some held since {held_since}: the webhook refused them then; a collapse may have cleared since)"
    return text


@dg.sensor(minimum_interval_seconds=60, default_status=dg.DefaultSensorStatus.RUNNING)
def success_rate_collapse_sensor(context: dg.SensorEvaluationContext, alerts: AlertsResource):
    """Alert (log + webhook) when a category's or a run's success rate collapses, and once
    when an alerted collapse has cleared (``<subject>: recovered: ...``)."""
    previous = json.loads(context.cursor) if context.cursor else {}
    unsent, held_since = list(previous.get("unsent", [])), previous.get("unsent_since")
    # The spec as it is now, not the partition keys of when the code location loaded: a category
    # added since (and run by a fresh process, e.g. scrape-assets demo) must not be forgotten.
    categories, rules = _spec_now(context.log)
    found, new_cursor = evaluate(context.instance, context.cursor, rules, categories=set(categories))
    for text in found:
        (context.log.info if _is_recovery(text) else context.log.warning)(
            text if _is_recovery(text) else f"collapse: {text}")
    pending, sent, outcome = unsent + found, True, SENT  # oldest first: what is dropped below when too many are held
    if pending:
        shown = sorted(pending, key=_alert_order)
        # "recovery" only when nothing in it collapsed: a consumer that pages on "collapse" is not woken by good news.
        kind = "recovery" if all(map(_is_recovery, shown)) else "collapse"
        outcome = deliver_alert(alert_message(shown, held_since if unsent else None), webhook_url=alerts.webhook_url,
                                fields={"kind": kind, "alerts": shown})
        sent = outcome in (SENT, REFUSED_FOR_GOOD)  # a message refused for good is not sent again
        if outcome == REFUSED_FOR_GOOD:
            context.log.error(f"the webhook refused this message of {counted(len(pending), 'alert')} for good "
                              "(400, 413 or 422): not kept to send again (each is in this tick's log)")
    cursor = json.loads(new_cursor)
    if pending and not sent and alerts.webhook_url:  # refused or unreachable: try again next time
        if len(pending) > MAX_UNSENT:
            context.log.warning(f"webhook still refusing: {len(pending) - MAX_UNSENT} oldest unsent alert(s) dropped")
        cursor["unsent"] = pending[-MAX_UNSENT:]
        cursor["unsent_since"] = (held_since if unsent else None) or utc_now_iso()
    context.update_cursor(json.dumps(cursor, sort_keys=True))
    if not pending:
        return dg.SkipReason("no collapse")
    if not alerts.webhook_url:
        return dg.SkipReason(f"{len(pending)} alert(s) logged (no webhook)")
    if outcome == REFUSED_FOR_GOOD:
        return dg.SkipReason(f"webhook refused {len(pending)} alert(s) in one message for good: dropped")
    if sent:
        return dg.SkipReason(f"{len(pending)} alert(s) sent in one message")
    return dg.SkipReason(f"webhook refused {len(pending)} alert(s): kept for the next evaluation")


def _unsent(instance: dg.DagsterInstance) -> list[dict]:
    value = instance.run_storage.get_cursor_values({UNSENT_KEY}).get(UNSENT_KEY)
    try:
        kept = json.loads(value) if value else []
    except ValueError:  # written by hand, say: nothing to resend rather than a sensor that always fails
        return []
    return kept if isinstance(kept, list) else []


def alert_or_keep(instance: dg.DagsterInstance, text: str, alerts: AlertsResource, fields: dict, log=None) -> bool:
    """:func:`~scrape_assets.alerts.send_alert`, keeping the alert for :func:`unsent_alerts_sensor`
    when a webhook is set and it was not delivered (unreachable, a 5xx, a URL revoked or
    mistyped: 401, 403, 404, 410 until it is fixed): a failed daily run must not go unheard
    because the webhook was down that minute (a run-status sensor sees each failed run once).
    One the webhook refuses for good (400, 413, 422: the message itself) is not kept.
    Returns whether the webhook took it."""
    outcome = deliver_alert(text, webhook_url=alerts.webhook_url, fields=fields)
    if outcome == REFUSED_FOR_GOOD and log is not None:
        log.error(f"the webhook refused this alert's message for good (400, 413 or 422): not kept to send again: "
                  f"{text[:300]}")
    if outcome != SENT and outcome != REFUSED_FOR_GOOD and alerts.webhook_url:
        if log is not None:
            log.warning(f"the webhook did not take this alert: kept, unsent_alerts_sensor sends it again: {text[:300]}")
        with _UNSENT_LOCK:
            # An id of its own: two alerts alike kept in one second are two, and one sent removes one.
            kept = _unsent(instance) + [{"id": uuid.uuid4().hex, "text": text, "fields": fields, "since": utc_now_iso()}]
            instance.run_storage.set_cursor_values({UNSENT_KEY: json.dumps(kept[-MAX_UNSENT:])})
        if len(kept) > MAX_UNSENT and log is not None:
            log.warning(f"webhook still refusing: {len(kept) - MAX_UNSENT} oldest unsent alert(s) dropped")
    return outcome == SENT


@dg.sensor(minimum_interval_seconds=60, default_status=dg.DefaultSensorStatus.RUNNING)
def unsent_alerts_sensor(context: dg.SensorEvaluationContext, alerts: AlertsResource):
    """Send again, oldest first, the alerts of ``run_failure_alert_sensor``,
    ``held_back_load_sensor`` and ``dead_run_sensor`` that were not delivered
    (:func:`alert_or_keep`), at most :data:`MAX_RESENT` an evaluation, each as it was with
    ``(held since <time>: the webhook refused it then)`` after its text and ``"held_since"``
    among its fields. One not delivered again stops the round (it and those after it wait
    for the next); one whose message the webhook refuses for good (400, 413, 422) is
    dropped, so it cannot hold back the others."""
    kept = _unsent(context.instance)
    if not kept:
        return dg.SkipReason("no unsent alert")
    if not alerts.webhook_url:  # the webhook was unset since: logged when they happened, nowhere to send
        with _UNSENT_LOCK:
            context.instance.run_storage.set_cursor_values({UNSENT_KEY: "[]"})
        return dg.SkipReason(f"{counted(len(kept), 'unsent alert')} dropped: no webhook is set any more")
    done, sent, dropped = [], 0, 0
    for alert in kept[:MAX_RESENT]:
        text = f"{alert['text']}\n(held since {alert['since']}: the webhook refused it then)"
        outcome = deliver_alert(text, webhook_url=alerts.webhook_url,
                                fields={**alert["fields"], "held_since": alert["since"]})
        if outcome == REFUSED_FOR_GOOD:
            context.log.error(f"the webhook refused a held alert's message for good: dropped: {alert['text'][:200]}")
        elif outcome != SENT:
            break
        done.append(alert)
        sent += outcome == SENT
        dropped += outcome == REFUSED_FOR_GOOD
    with _UNSENT_LOCK:  # read again: another sensor may have kept one meanwhile
        left = [alert for alert in _unsent(context.instance) if alert not in done]
        context.instance.run_storage.set_cursor_values({UNSENT_KEY: json.dumps(left)})
    said = f"{counted(sent, 'held alert')} sent" + (f", {dropped} refused for good: dropped" if dropped else "")
    return dg.SkipReason(f"{said}, {len(left)} still waiting: kept" if left else said)


@dg.sensor(minimum_interval_seconds=60, default_status=dg.DefaultSensorStatus.RUNNING)
def dead_run_sensor(context: dg.SensorEvaluationContext, alerts: AlertsResource):
    """Mark failed the runs left "started" by a process killed on this machine, and free the
    pool slots they held (:func:`~scrape_assets.run_processes.fail_dead_runs`): a
    ``dagster asset materialize`` killed with SIGKILL on S3 storage otherwise keeps its host's
    slot for good, and every later run's ``raw_pages`` waits for it silently. One alert
    (log + webhook) names the runs; requests no run (re-execute one from failure to resume
    its snapshots)."""
    dead = fail_dead_runs(context.instance)
    if not dead:
        return dg.SkipReason("no run left started by a process that is gone")
    for run in dead:
        context.log.warning(run.line)
    # Runs of the code location get run_failure_alert_sensor's alert (the failure's reason names
    # the process): one alert a run. Command-line runs belong to no code location: alerted here.
    unseen = [run.line.removeprefix("scrape-assets: ") for run in dead if not run.of_code_location]
    if unseen:
        alert_or_keep(context.instance, "scrape_assets: " + "\n".join(unseen) + "\n(launch it again, or re-execute it "
                      "from failure: raw_pages resumes its snapshots)", alerts, {"kind": "dead_run"}, context.log)
    return dg.SkipReason(f"{counted(len(dead), 'run')} left started by a process that is gone: marked failed")


#: The start of Dagster's RUN_FAILURE (or STEP_FAILURE) message, said by the alert's own "run <id> of <job> failed".
_DAGSTER_RUN_FAILED = re.compile(r'^Execution of (?:run for|step) "[^"]*" failed\.\s*')
#: The rest of it when steps failed: the alert names each with its reason instead.
_STEPS_FAILED = re.compile(r"^Steps failed: \[.*\]\.?$")  # (a dynamic step key holds brackets)
#: The step that evaluates the blocking schema check (it fails with the check).
SCHEMA_CHECK_STEP = "parsed_products"
#: Dagster's RUN_FAILURE message when the failure was reported for the run, not by it.
_FAILED_FROM_OUTSIDE = "This run has been marked as failed from outside the execution context."
#: The code server's engine event when a run's process died ("[DagsterApiServer] Run execution process
#: for <run id> was terminated by signal 9 (SIGKILL). ...": Dagster puts the reporting class first).
_PROCESS_DIED = re.compile(r"^(?:\[\w+\] )?Run execution process for \S+ (?P<how>.*)$", re.S)


def run_process_death(instance: dg.DagsterInstance, run_id: str) -> str | None:
    """How the run's process died, from the engine event Dagster's code server logs before it
    fails a run whose process is gone (``dagster._grpc.server``: "[DagsterApiServer] Run
    execution process for <id> was terminated by signal 9 (SIGKILL)" or "unexpectedly exited
    with code N"), as
    ``"the run's process was terminated by signal 9 (SIGKILL): killed (kill -9, or by the
    kernel when out of memory)"``; ``None`` when there is no such event."""
    from dagster import DagsterEventType

    for record in reversed(instance.all_logs(run_id, of_type=DagsterEventType.ENGINE_EVENT)):
        found = _PROCESS_DIED.match((record.dagster_event and record.dagster_event.message) or "")
        if found:
            how = found["how"].split(". ", 1)[0].rstrip(".")  # Dagster's advice on memory follows
            if "SIGKILL" in how:
                how += ": killed (kill -9, or by the kernel when out of memory)"
            return f"the run's process {how}"
    return None


@dg.run_failure_sensor(default_status=dg.DefaultSensorStatus.RUNNING)
def run_failure_alert_sensor(context: dg.RunFailureSensorContext, alerts: AlertsResource):
    """Alert when a run fails (crash, storage error, refused resume...), with why
    (:func:`run_failure_text`): the run's own reason, then when its schema check failed the
    failing categories and their reasons (the check's ``failed_categories``), otherwise each
    failed step's error (its first line, shortened), or the run's error when no step failed.

    One alert a run, none for a deliberate stop (:func:`needs_no_alert`)."""
    run = context.dagster_run
    if quiet := needs_no_alert(context.instance, run.run_id, context.failure_event):
        # Logged, not a SkipReason: a tick handling several failures (both of a timed-out run)
        # must answer each with a reaction (None), or Dagster refuses the whole tick.
        context.log.info(f"run {run.run_id[:8]}: {quiet}")
        return None
    said = context.failure_event.message
    if (said or "").strip() == _FAILED_FROM_OUTSIDE and (died := run_process_death(context.instance, run.run_id)):
        # Dagster's generic words when its code server found the process gone: say how it died.
        said = f"{died}; re-execute it from failure (raw_pages resumes its snapshots in flight)"
    message = run_failure_message(context.instance, run.run_id, context.failure_event,
                                  context.get_step_failure_events(), said=said)
    alert_or_keep(context.instance, f"scrape_assets run {run.run_id[:8]} of {run.job_name} failed: {message}", alerts,
                  {"kind": "run_failure", "run_id": run.run_id, "job": run.job_name}, context.log)


def needs_no_alert(instance: dg.DagsterInstance, run_id: str, failure: dg.DagsterEvent) -> str | None:
    """Why the run failure ``failure`` (one of the run's RUN_FAILURE events) gets no alert, or None.

    Only a failure the run's worker reported itself (its event has the worker's ``pid``) may
    go unalerted, and only after an earlier end of the run: Dagster's run monitoring fails a
    run past its ``dagster/max_runtime`` (an event from outside the run, no ``pid``: alerted)
    and interrupts it, then the worker reports the interrupted step (a second RUN_FAILURE:
    the first was alerted, unless the sensor was off or the webhook refused it then). And
    "Force termination" marks a live run canceled at once, then its worker reports the same
    step failure, which turns the run to FAILURE: a stop by hand, not a failure to page
    anyone for. (A plain "Terminate" ends the run CANCELED, no RUN_FAILURE.) A failure not
    found among the run's events is alerted.
    """
    from dagster import DagsterEventType

    if failure.pid is None:  # reported from outside the run: monitoring, a start timeout...
        return None
    events = [e.dagster_event for e in instance.all_logs(
        run_id, of_type={DagsterEventType.RUN_FAILURE, DagsterEventType.RUN_CANCELED})]
    try:
        at = events.index(failure)
    except ValueError:
        return None
    earlier = {event.event_type for event in events[:at] if event is not None}
    if DagsterEventType.RUN_CANCELED in earlier:
        return "canceled by hand (forced termination) before its worker reported this failure: no alert"
    if earlier:
        return "failed before (alerted then); this is its worker reporting the interrupted steps: no second alert"
    return None


def run_failure_message(instance, run_id: str, failure, step_failures, said: str | None = None) -> str:
    """Why run ``run_id`` failed, in one line (:func:`run_failure_text`), from its RUN_FAILURE
    event ``failure`` (None: none found), its STEP_FAILURE events and its schema check's
    evaluations on ``instance``; ``said`` stands for the failure event's message when given.
    The run-failure alert's text, and ``scrape-assets demo``'s for its own run."""
    return run_failure_text(
        said if said is not None else getattr(failure, "message", None),
        getattr(getattr(failure, "event_specific_data", None), "error", None),
        step_failure_reasons(step_failures), schema_check_failures(instance, run_id))


def run_failure_text(said: str | None, error, reasons: list[str], why: dict[str, str]) -> str:
    """Why a run failed, in one line: its own reason, then the schema check's failing
    categories or each failed step's reason, else the run's error.

    Args:
        said: Dagster's failure message. Its "Execution of run for ... failed." (the alert
            says so) and a "Steps failed: [...]" that ``reasons`` repeat are left out; what
            remains is the run's own reason (run monitoring: "Exceeded maximum runtime of
            72000 seconds."), kept first.
        error: the failure event's ``SerializableErrorInfo`` (used when no step failed).
        reasons: :func:`step_failure_reasons`.
        why: :func:`schema_check_failures` (category -> why).
    """
    said = _DAGSTER_RUN_FAILED.sub("", (said or "").strip())
    said = "" if _STEPS_FAILED.match(said) else said
    said = said[:-1] if said.endswith(".") and not said.endswith("...") else said  # ": " + why follows
    if why:
        parts = [f"{SCHEMA_CHECK} failed for " + _schema_failures(why)]
        parts += [r for r in reasons if not r.startswith(f"{SCHEMA_CHECK_STEP}: ")]  # other steps that failed
    elif reasons:
        parts = reasons  # each names its step
    else:  # failed outside any step: its error
        parts = [_shortened(error_line(error), 300)] if error is not None else []
    return ": ".join(filter(None, [said, "; ".join(parts)])) or "no reason recorded"


def _schema_failures(why: dict[str, str], groups_shown: int = 3, names_shown: int = 5) -> str:
    """``travel (why)``, or for categories failing alike (the same reasons but for their
    counts: a layout change hits every category) one entry naming them and the first one's
    reasons: ``travel, mystery, classics, romance, fiction and 7 more (travel's: why)``. At
    most ``groups_shown`` entries; the rest are counted."""
    groups: dict[str, list[str]] = {}
    # Alike: the same text once page lists ("page 1", "pages 1, 2, ...") and counts are masked.
    for category, text in why.items():
        groups.setdefault(re.sub(r"\d+", "#", re.sub(r"\bpages? \d[\d, .]*", "pages", text)), []).append(category)
    entries = []
    for names in list(groups.values())[:groups_shown]:
        text = _shortened(why[names[0]], 300)
        if len(names) == 1:
            entries.append(f"{names[0]} ({text})")
        else:
            more = f" and {len(names) - names_shown} more" if len(names) > names_shown else ""
            entries.append(f"{', '.join(names[:names_shown])}{more} ({names[0]}'s: {text})")
    rest = sum(len(names) for names in list(groups.values())[groups_shown:])
    return "; ".join(entries) + (f"; and {rest} more categories for other reasons" if rest else "")


def step_failure_reasons(events, limit: int = 300) -> list[str]:
    """``"<step>: <error>"`` per failed step, from its STEP_FAILURE events (the last of each step,
    after its retries). The error is a ``dagster.Failure``'s description, else the exception
    the step raised (under Dagster's ``DagsterExecutionStepExecutionError`` wrapper): its type
    and the first line of its message, shortened to ``limit`` characters."""
    reasons: dict[str, str] = {}
    for event in events:
        data = event.event_specific_data
        text = getattr(getattr(data, "user_failure_data", None), "description", None) or ""
        error = getattr(data, "error", None)
        if not text and error is not None:
            text = error_line(error)
        elif error is not None:  # a dagster.Failure's description, after its retries if it allowed them
            text += _after_retries(error)
        reasons[event.step_key or "run"] = _shortened(" ".join(text.split()), limit)
    return [f"{step}: {text}" for step, text in reasons.items() if text]


def error_line(error) -> str:
    """``"<Class>: <first paragraph of the message>"`` (on one line) of a Dagster
    ``SerializableErrorInfo``: the exception raised under Dagster's
    ``DagsterExecutionStepExecutionError`` wrapper, if any, and without the module path Dagster
    puts before the class name; when the step's RetryPolicy gave up
    (``RetryRequestedFromPolicy``), its last attempt's error, `` (after N retries)``. A
    paragraph, not a line: some of Dagster's own messages wrap one sentence over lines."""
    retries = _after_retries(error)
    if retries and error.cause is not None:
        error = error.cause  # the last attempt's error
    if error.cls_name == "DagsterExecutionStepExecutionError" and error.cause is not None:
        error = error.cause  # the step's own exception
    first = re.split(r"\n\s*\n", (error.message or "").strip(), maxsplit=1)[0]
    head, sep, rest = first.partition(": ")  # "module.Class: message"
    text = f"{error.cls_name}: {rest}" if sep and head.split(".")[-1] == error.cls_name else (first or error.cls_name)
    return " ".join(text.split()) + retries


def _after_retries(error) -> str:
    """`` (after N retries)`` when ``error`` says the step's RetryPolicy gave up
    (``RetryRequestedFromPolicy``: "Exceeded max_retries of N"), else ``""``."""
    if error.cls_name != "RetryRequestedFromPolicy":
        return ""
    found = re.search(r"max_retries of (\d+)", error.message or "")
    return f" (after {found[1]} retries)" if found else " (after its retries)"


def schema_check_failures(instance, run_id: str) -> dict[str, str]:
    """Category -> why, from the run's failed ``parsed_products_match_schema`` evaluations
    (their ``failed_categories`` metadata); empty when the check passed or did not run."""
    why: dict[str, str] = {}
    for entry in instance.all_logs(run_id, of_type=dg.DagsterEventType.ASSET_CHECK_EVALUATION):
        data = entry.dagster_event.event_specific_data
        if data.check_name == SCHEMA_CHECK and not data.passed:
            value = getattr(data.metadata.get("failed_categories"), "value", None)
            why.update(value if isinstance(value, dict) else {})
    return why


def _shortened(text: str, limit: int) -> str:
    """``text`` cut to at most ``limit`` characters ("..." last): at the last space when it is
    among the last 12 characters kept (no word cut in two), else where the limit falls (a
    long path keeps its start)."""
    if len(text) <= limit:
        return text
    cut = text[: limit - 3]
    space = cut.rfind(" ")
    return (cut[:space].rstrip(" ,;:(") if space >= len(cut) - 12 else cut) + "..."


#: Tag of the runs ``held_back_load_sensor`` launches: the failed run whose load they finish.
HELD_BACK_TAG = "scrape/held_back_by"
DEAD_LETTERS = dg.AssetKey("dead_letters")


def held_back_by_schema_check(instance, run: dg.DagsterRun) -> list[str]:
    """The categories a failed ``run`` parsed, if its failed schema check held back their load.

    Empty unless the run planned ``products_table`` and recorded a failed
    ``parsed_products_match_schema`` evaluation; then its ``parsed_products``
    materializations' partitions, sorted. Reads the instance only.
    """
    if run.tags.get(HELD_BACK_TAG):
        return []  # a load this sensor launched: it ran no check
    evaluations = instance.all_logs(run.run_id, of_type=dg.DagsterEventType.ASSET_CHECK_EVALUATION)
    if not any(e.dagster_event.event_specific_data.check_name == SCHEMA_CHECK
               and not e.dagster_event.event_specific_data.passed for e in evaluations):
        return []
    plan = instance.get_execution_plan_snapshot(run.execution_plan_snapshot_id) if run.execution_plan_snapshot_id else None
    if plan is None or "products_table" not in (plan.step_keys_to_execute or [step.key for step in plan.steps]):
        return []
    parsed = [e.dagster_event.partition
              for e in instance.all_logs(run.run_id, of_type=dg.DagsterEventType.ASSET_MATERIALIZATION)
              if e.dagster_event.asset_key == dg.AssetKey("parsed_products") and e.dagster_event.partition]
    return sorted(set(parsed))


def split_by_schema(categories: list[str], site: str, store) -> tuple[list[str], list[str], dict[str, str]]:
    """``(passed, failed, unreadable)``: by each category's parse state (``validated``), order kept;
    ``failed`` also holds a category without a parse state (never parsed).

    Categories whose input did not change count as passed too: loading them writes the
    day's ``price_history`` (the rows themselves are not reloaded). ``unreadable`` maps a
    category whose state could not be read to the error.
    """
    passed, failed, unreadable = [], [], {}
    for category in categories:
        try:
            state = load_parse_state(store, site, category)
        except Exception as exc:  # noqa: BLE001 - one bad file must not cost the others their load
            unreadable[category] = f"{type(exc).__name__}: {exc}"
            continue
        (passed if state is not None and state.validated else failed).append(category)
    return passed, failed, unreadable


def _held_back_alert(context, run: dg.DagsterRun, what: str, alerts: AlertsResource) -> dg.SkipReason:
    text = f"scrape_assets: run {run.run_id[:8]} of {run.job_name}: {what}"
    alert_or_keep(context.instance, text, alerts, {"kind": "held_back_load", "run_id": run.run_id}, context.log)
    return dg.SkipReason(text)


@dg.run_failure_sensor(default_status=dg.DefaultSensorStatus.RUNNING, request_job=load_job)
def held_back_load_sensor(
    context: dg.RunFailureSensorContext, site: SiteResource, store: ObjectStoreResource, alerts: AlertsResource
):
    """After a run failed its blocking schema check, load its categories that passed (``load_job``),
    and record the dead letters of those that failed (``load_job``'s ``dead_letters`` alone).

    One run per consecutive range of each in the spec's order (partition ranges cannot skip
    a key), tagged ``scrape/held_back_by=<run id>`` and like a daily run (``scrape/day``,
    ``dagster/max_runtime``: queued behind daily runs, never beside one); each is launched
    once (its run key). The sensor sees each failed run once, so what it cannot read (the
    run's events, the spec, a parse state) becomes an alert naming the categories to load
    by hand, instead of a lost follow-up.
    """
    run = context.dagster_run
    try:
        parsed = held_back_by_schema_check(context.instance, run)
    except Exception as exc:  # noqa: BLE001 - said, not lost
        return _held_back_alert(context, run, f"could not read its events to see whether a failed schema check held back "
                                     f"its load ({type(exc).__name__}: {exc})", alerts)
    if not parsed:
        return dg.SkipReason(f"run {run.run_id[:8]}: nothing held back by a failed schema check")
    try:
        passed, failed, unreadable = split_by_schema(parsed, site.spec().name, store.store())
        keys = category_partitions.get_partition_keys()
    except Exception as exc:  # noqa: BLE001 - said, not lost
        return _held_back_alert(context, run, f"failed its schema check, and its categories ({', '.join(parsed)}) could not be "
                                     f"read to load those that passed ({type(exc).__name__}: {exc}); load them with "
                                     "load_job", alerts)
    gone = sorted(c for c in passed + failed if c not in keys)  # removed from the spec since: no partition to run
    ranges, letter_ranges = consecutive_ranges(passed, keys), consecutive_ranges(failed, keys)
    if gone:
        context.log.warning(f"run {run.run_id[:8]}: no follow-up for {', '.join(gone)}: no longer categories of the spec")
    if unreadable:
        _held_back_alert(context, run, "failed its schema check; these categories' parse state could not be read, load them "
                              "with load_job if they passed: " + "; ".join(f"{c} ({e})" for c, e in unreadable.items()),
                         alerts)
    if not ranges and not letter_ranges:
        why = [f"{', '.join(gone)} no longer in the spec"] if gone else []
        why += [f"{', '.join(unreadable)} unreadable"] if unreadable else []
        return dg.SkipReason(f"run {run.run_id[:8]}: no follow-up for the categories it parsed: {'; '.join(why)}")
    context.log.info(
        f"run {run.run_id[:8]} failed its schema check ({', '.join(failed) or 'no category readable as failed'}); "
        f"loading the categories that passed: {_spans(ranges) or 'none'}; recording the dead letters of those that "
        f"failed: {_spans(letter_ranges) or 'none'}"
    )
    tags = {HELD_BACK_TAG: run.run_id, **queue_tags(run.tags.get(QUEUE_TAG, "held-back"))}
    return [
        dg.RunRequest(run_key=f"held-back-{run.run_id}-{first}", tags={**partition_range_tags(first, last), **tags})
        for first, last in ranges
    ] + [
        # The failed categories' own dead letters (pages that failed for good, the cards the
        # parser rejected): the blocking check held dead_letters back with products_table.
        dg.RunRequest(run_key=f"held-back-dead-letters-{run.run_id}-{first}", asset_selection=[DEAD_LETTERS],
                      tags={**partition_range_tags(first, last), **tags})
        for first, last in letter_ranges
    ]


def _spans(ranges: list[tuple[str, str]]) -> str:
    return ", ".join(range_label(first, last) for first, last in ranges)


defs = dg.Definitions(sensors=[success_rate_collapse_sensor, run_failure_alert_sensor, held_back_load_sensor,
                               dead_run_sensor, unsent_alerts_sensor])
