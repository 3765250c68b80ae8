"""``scrape-assets``: the command line.

``scrape-assets demo``
    Materialize every asset for every category of the configured site (the built-in
    demo catalogue by default) in one run on the Dagster instance at ``$DAGSTER_HOME``
    (``./.dagster_home`` when unset), print progress, and end with a summary whose last
    line is the ``make ui`` command showing that instance, site and data.
``scrape-assets serve-demo --port N [--faults FILE]``
    Serve the demo catalogue on 127.0.0.1:N over real sockets, optionally breaking the
    responses a fault spec names (:mod:`scrape_assets.faults`).
``scrape-assets summary``
    Print the summary of what is stored now (categories, pages, products, dead letters).
``scrape-assets categories``
    List the site's categories, the partition keys, in the spec's order (the order of
    ``--partition-range FIRST...LAST``).
``scrape-assets prune --keep N [--dry-run]``
    Delete old snapshots of every category, keeping the N newest complete ones and
    everything they read (:mod:`scrape_assets.retention`); exit code 1 when a category was
    skipped (a run is writing it, or its files could not be read or deleted), 2 when the
    storage holds no snapshot of the site at all.
``scrape-assets fail-run RUN_ID``
    Mark failed a run left "started" by a killed process and free its concurrency slots.
``scrape-assets daemon-check``
    Exit 1, saying why, when a Dagster daemon beat on the instance recently (``make ui``
    asks before starting ``dagster dev``, which would start a second one).
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import logging
import math
import os
import shlex
import shutil
import socket
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable, Mapping
from pathlib import Path

from scrape_assets.counts import counted, listed
from scrape_assets.errors import ScrapeError, SettingsError, StorageError
from scrape_assets.run_processes import (
    DEMO_LAUNCHER,
    LAUNCHED_BY_TAG,
    PID_TAG,
    fail_dead_runs,
    pools_held,
    process_gone,
    process_tags,
    run_process,
)

#: The clone (the checkout this package runs from): where ``make`` runs, its ``dagster.yaml``,
#: ``data/`` and ``.dagster_home/``.
_CLONE = Path(__file__).resolve().parents[1]


def _instance():
    import dagster as dg

    # Dagster refuses a relative DAGSTER_HOME (with a traceback): a path given relative to
    # the current folder (or with ~) means that folder's, as it would for any other command.
    from scrape_assets.instance_storage import configured_event_batch_size

    configured_event_batch_size()  # the instance reads it only once a run executes: checked before one exists
    home = str(Path(os.environ.get("DAGSTER_HOME") or ".dagster_home").expanduser().resolve())
    os.environ["DAGSTER_HOME"] = home
    config = Path(home) / "dagster.yaml"
    try:
        Path(home).mkdir(parents=True, exist_ok=True)
        if not config.exists():
            shipped = _CLONE / "dagster.yaml"  # the clone's (what `make demo` copies)
            partial = config.with_name(f".dagster.yaml.{os.getpid()}")  # whole or absent, for a run started beside
            if shipped.is_file():
                shutil.copyfile(shipped, partial)
            else:  # installed without the clone
                partial.write_text("telemetry:\n  enabled: false\n")
            os.replace(partial, config)
    except OSError as exc:  # a file in the way, a folder this process may not write
        raise SettingsError("DAGSTER_HOME", home, f"a folder this process can write "
                                                  f"({exc.strerror}: {exc.filename})") from None
    return dg.DagsterInstance.get()


def storage_setting_error(exc: StorageError, usable: str = "can write") -> ScrapeError:
    """``exc`` (object storage unusable) as the setting that chose it: ``SCRAPE_STORAGE_URL``, or ``SCRAPE_DATA_DIR``.

    The value shown is the store's root (the object that failed under it is in the detail),
    or the data folder as set when the store is its ``objects/`` folder.
    When the store's client could not reach it (a wrong endpoint, no credentials: see
    ``storage.CLIENT_HINTS``), the URL is not blamed: "cannot use object storage at <root>:
    ..." with what to check.

    ``usable``: what the command needed of the storage (``"can write"``, ``"can read"``).
    """
    from scrape_assets.settings import DEFAULT_DATA_DIR
    from scrape_assets.storage import CLIENT_HINTS

    variable = _storage_variable()
    value = exc.root or exc.location  # the root the user configured, not the object that failed under it
    text, detail = str(exc), str(exc)
    if text.startswith(f"{value}: "):  # the root itself
        detail = text[len(value) + 2:]
    elif text.startswith(f"{value}/"):  # an object under it: "<key>: <what failed>"
        detail = text[len(value) + 1:]
    if type(exc.__cause__).__name__ in CLIENT_HINTS:  # the URL is fine: the endpoint or the credentials are not
        return ScrapeError(f"cannot use object storage at {value}: {detail}")
    if variable == "SCRAPE_DATA_DIR":  # the store is the data folder's objects/: name the folder as set
        return SettingsError(variable, os.environ.get(variable) or DEFAULT_DATA_DIR, f"a folder this process {usable} ({detail})")
    return SettingsError(variable, value, f"object storage this process {usable} ({detail})")


def preflight(resources: dict) -> None:
    """Fail before launching anything when storage or the warehouse cannot be used.

    Raises:
        SettingsError: object storage cannot be opened or written (names
            ``SCRAPE_STORAGE_URL`` or ``SCRAPE_DATA_DIR`` and the location), or the warehouse URL
            is invalid or its database unreachable.
    """
    import sqlalchemy as sa

    from scrape_assets.manifest import has_snapshot
    from scrape_assets.warehouse import CREATE_PRIVILEGE_HINT, create_refused_in, database_error

    try:
        resources["store"].store().ensure_writable()
    except StorageError as exc:
        raise storage_setting_error(exc) from exc
    warehouse = resources["warehouse"].warehouse()
    try:
        with warehouse:
            warehouse.create_tables()
            name = resources["site"].spec().name  # before a crawl whose load would be refused
            warehouse.check_site(name, owns=has_snapshot(resources["store"].store(), name))
    except sa.exc.SQLAlchemyError as exc:
        if os.environ.get("SCRAPE_WAREHOUSE_URL"):
            error = database_error(exc)
            hint = f"; {CREATE_PRIVILEGE_HINT}" if create_refused_in(error) else ""
            raise SettingsError("SCRAPE_WAREHOUSE_URL", warehouse.describe(),
                                f"a reachable, writable database ({error}{hint})") from exc
        # The default warehouse: the data folder chose it, so name that (SCRAPE_WAREHOUSE_URL is unset).
        from scrape_assets.settings import data_folder

        raise SettingsError("SCRAPE_DATA_DIR", str(data_folder(os.environ)),
                            f"a folder whose warehouse.db is an SQLite database this process can write, or "
                            f"SCRAPE_WAREHOUSE_URL set ({warehouse.describe()}: {database_error(exc)})") from exc


def summarize(resources: dict) -> dict:
    """Figures of the latest complete snapshot of every category, and the table sizes.

    ``categories`` counts the categories whose latest complete snapshot has a page done;
    ``categories_without_pages`` names those whose every page failed for good;
    ``categories_without_snapshot`` those of the spec with no complete snapshot (never
    crawled, added to the spec since, or their first crawl still going);
    ``categories_failing_schema`` maps those whose latest parse failed the schema check (so
    ``products`` still holds rows of an earlier snapshot) to that parse's snapshot id;
    ``categories_not_loaded`` names the others whose latest complete snapshot is not parsed
    or not loaded yet (a run stopped after ``raw_pages``, or one still going);
    ``snapshots_completed`` is ``(oldest, newest)`` of when those snapshots were completed
    (UTC ``...Z``), None without any;
    ``categories_unreadable`` maps those whose latest manifest cannot be read (damaged, of
    another version) to the error, which says what to do; they are left out of the other
    figures, which the rest still get.
    """
    import sqlalchemy as sa

    from scrape_assets.errors import ManifestError
    from scrape_assets.extract import load_parse_state
    from scrape_assets.manifest import latest_manifest
    from scrape_assets.warehouse import Warehouse, dead_letters, partition_loads, products, warehouse_site

    site = resources["site"]
    spec = site.spec()
    store = resources["store"].store()
    store.check_root()
    # Read only: a summary creates no warehouse, and no table missing from one (an older warehouse).
    wh = Warehouse(resources["warehouse"].url, create=False)
    try:
        with wh:
            tables = wh.existing_tables()
            by_category = wh.rows_by_category(products) if products.name in tables else {}
            carried = wh.carried_forward() if {products.name, partition_loads.name} <= tables else {}
            loaded = wh.loaded_versions(products, spec.categories) if partition_loads.name in tables else {}
            letters_by_category = wh.rows_by_category(dead_letters) if dead_letters.name in tables else {}
            owner = wh.site() if warehouse_site.name in tables else None
            create_refused = wh.create_refused()  # the first run's CREATE TABLE, checked now (PostgreSQL)
    except sa.exc.SQLAlchemyError as exc:  # unreachable, locked, not a database, or tables of another shape
        raise ScrapeError(wh.unreadable(exc)) from exc
    products_loaded = sum(by_category.values())
    # Another site's tables hold nothing of this spec: no category of theirs is "no longer in it".
    theirs = owner not in (None, spec.name)
    not_in_spec = {} if theirs else {c: n for c, n in by_category.items() if c not in spec.categories}
    letters_not_in_spec = {} if theirs else {c: n for c, n in letters_by_category.items() if c not in spec.categories}
    done = failed = 0
    categories, without_pages, without_snapshot, failing_schema, unreadable, not_loaded = 0, [], [], {}, {}, []
    completed: list[str] = []  # when each category's latest complete snapshot was completed (UTC)
    for category in spec.categories:
        try:
            manifest = latest_manifest(store, spec.name, category, complete=True)
        except ManifestError as exc:  # one damaged file: the other categories are still reported
            unreadable[category] = str(exc)
            continue
        if manifest is None:
            without_snapshot.append(category)
            continue
        try:
            state = load_parse_state(store, spec.name, category)
        except ManifestError:  # unreadable: the next parse rewrites it
            state = None
        if state is not None and not state.validated:
            failing_schema[category] = state.snapshot_id
        elif not theirs and (state is None or state.latest_snapshot_id != manifest.snapshot_id
                             or loaded.get(category) != state.input_version):
            not_loaded.append(category)  # fetched, not parsed or not loaded since (a run killed after raw_pages)
        completed.append(manifest.completed_at)  # set: the manifest is complete
        counts = manifest.counts()
        done += counts["done"]
        failed += counts["failed"]
        if counts["done"]:
            categories += 1
        else:  # complete, but every page failed for good: nothing of it was fetched
            without_pages.append(category)
    return {
        "site": spec.name,
        "categories": categories,
        "categories_without_pages": without_pages,
        "categories_without_snapshot": without_snapshot,
        "categories_failing_schema": failing_schema,
        "categories_not_loaded": not_loaded,
        "snapshots_completed": (min(completed), max(completed)) if completed else None,
        "categories_unreadable": unreadable,
        "categories_configured": len(spec.categories),
        "pages_done": done,
        "pages_failed": failed,
        "success_rate": done / (done + failed) if done + failed else 1.0,
        "products_loaded": products_loaded,
        "products_of_categories_not_in_spec": not_in_spec,
        "products_carried_forward": {c: n for c, (n, _) in carried.items()},
        "carried_forward_oldest_fetch": min((oldest for _, oldest in carried.values()), default=None),
        "dead_letters": sum(letters_by_category.values()),
        "dead_letters_of_categories_not_in_spec": letters_not_in_spec,
        "object_storage": store.describe(),
        "warehouse": wh.describe(),
        "warehouse_exists": products.name in tables,
        **({"warehouse_create_refused": create_refused} if create_refused else {}),
        "warehouse_site": owner,
        "ui_command": ui_command(os.environ),
        "ui_url": ui_url(os.environ),
        "ui_exports": ui_exports(os.environ),
        "daemon_heartbeat_age_s": daemon_heartbeat_age(os.environ),
    }


def run_figures(result) -> dict:
    """What one run did, from its materialization metadata (pages, 304s, parses, loads)."""
    from scrape_assets.defs.assets.partition_metadata import metadata_by_asset

    from scrape_assets.defs.assets.parsed_products import COUNT_CHECK

    assets = metadata_by_asset(event.materialization for event in result.get_asset_materialization_events())
    raw, parsed, table, letters = (assets.get(a, {}) for a in ("raw_pages", "parsed_products", "products_table", "dead_letters"))
    short: dict[str, dict] = {}  # category -> {cards_found, site_says}: the WARN check that does not stop the run
    moved: dict[str, str] = {}  # category -> why its snapshot may have missed products (the same check)
    for evaluation in result.get_asset_check_evaluations():
        if evaluation.check_name == COUNT_CHECK and not evaluation.passed:
            if "mismatched" in evaluation.metadata:
                short.update(evaluation.metadata["mismatched"].value)
            if "listing_moved" in evaluation.metadata:
                moved.update(evaluation.metadata["listing_moved"].value)
    return {
        "success": result.success,
        "categories_short_of_site_count": short,
        "categories_listing_moved": moved,
        "requests_made": raw.get("requests_made"),
        "pages_done": raw.get("pages_done"),
        "pages_not_modified": raw.get("pages_not_modified"),
        "pages_assumed_unchanged": raw.get("pages_assumed_unchanged"),
        "sitemap_requests": raw.get("sitemap_requests"),
        "sitemap_not_modified": raw.get("sitemap_not_modified"),
        "sitemap_error": raw.get("sitemap_error"),
        "pages_failed": raw.get("pages_failed"),
        "pages_parsed": parsed.get("pages_parsed"),
        "partitions_unchanged": parsed.get("partitions_unchanged"),
        "rows_loaded": table.get("rows_loaded"),
        "rows_carried_forward": table.get("rows_carried_forward"),
        "dead_letters": letters.get("dead_letters"),
    }


def _first_names(names: list[str], shown: int = 10) -> str:
    """``a, b, c`` (the first ``shown`` names, then ``...``)."""
    return ", ".join(names[:shown]) + (", ..." if len(names) > shown else "")


def print_summary(summary: dict, run: dict | None = None, out=None) -> None:
    """Print what a run did (when given, after a blank line parting it from the run's log) and what is stored now."""
    lines = []
    if run is not None:
        lines.append("")
        def step(figure: str, text: Callable[[], str], asset: str) -> str:  # a step that did not finish recorded nothing
            if run[figure] is not None:
                return text()
            if asset == "products_table" and run.get("load_held_back"):
                return f"{asset} held back: a schema check failed (the categories that passed are loaded below)"
            return f"{asset} did not finish"

        lines += [
            "This run" + ("" if run["success"] else f" (FAILED: see the log above or {_ui_hint(summary)})"),
            *([f"  failed          {why}"] if not run["success"] and (why := run.get("failure")) else []),
            "  requests        " + step("requests_made", lambda: (
                f"{run['requests_made']:,} ({run['pages_not_modified']:,} not modified: 304"
                + (f"; {counted(kept, 'page')} kept without a request" if (kept := run.get("pages_assumed_unchanged")) else "")
                + (f"; {counted(more, 'more request')} for the sitemap" if (more := run.get("sitemap_requests")) else "")
                + (f" ({same:,} not modified: 304)" if (same := run.get("sitemap_not_modified")) else "")
                + (f"; sitemap not used ({failed.partition(': ')[2]})" if (failed := run.get("sitemap_error")) else "")
                + "), "
                f"{counted(run['pages_failed'], 'page')} failed for good"), "raw_pages"),
            *(["  nothing fetched: every page failed before a request was made (site unreachable from here, or "
               "robots.txt refused? the reasons are in `dead_letters`)"]
              if run["requests_made"] == 0 and not run.get("pages_done") and (run["pages_failed"] or 0) > 0 else []),
            "  parsed          " + step("pages_parsed", lambda: (
                f"{counted(run['pages_parsed'], 'page')} re-parsed, "
                f"{counted(run['partitions_unchanged'], 'category')} unchanged"), "parsed_products"),
            *([f"  maybe missed    products in {counted(len(moved), 'category')} although every page was fetched: "
               + _first_names([f"{c} ({how})" for c, how in moved.items()])
               + " (earlier rows of products not seen are kept)"]
              if (moved := run.get("categories_listing_moved")) else []),
            *([f"  fewer cards     than the site counts in {counted(len(short), 'category')}: " + _first_names(
                [f"{c} ({f['cards_found']:,} of {f['site_says']:,})" for c, f in short.items()])
               + (" (no card at all: does the spec's selectors.product still match the site's markup?)"
                  if all(not f["cards_found"] for f in short.values())
                  else " (pages the crawl did not reach: pagination, the spec's max_pages?)")]
              if (short := run.get("categories_short_of_site_count")) else []),
            "  loaded          " + step("rows_loaded", lambda: (
                f"{counted(run['rows_loaded'], 'row')} (re)loaded"
                # Only by this run's loads: an unchanged category keeps its carried rows unloaded (Summary below).
                + (f", and {counted(kept, 'earlier row')} kept in those categories for pages that failed, cards "
                   "rejected or a listing that moved"
                   if (kept := run["rows_carried_forward"]) else "")), "products_table"),
            "",
        ]
    lines += [
        f"Summary ({summary['site']}, latest complete snapshots)",
        f"  categories      {summary['categories']}/{summary['categories_configured']}" + (
            f" ({len(empty)} whose latest snapshot has no page done: {', '.join(empty)})"
            if (empty := summary.get("categories_without_pages")) else "") + (
            # Named once something was crawled (before that, the success rate line says where it looked).
            f" ({len(never)} without a complete snapshot yet: {_first_names(never)})"
            if (never := summary.get("categories_without_snapshot")) and len(never) < summary["categories_configured"]
            else ""),
        *([f"  unreadable      {len(broken)} not counted here, a manifest cannot be read: "
           + " | ".join(list(broken.values())[:2]) + (f" | and {len(broken) - 2} more: {_first_names(list(broken)[2:])}"
                                                       if len(broken) > 2 else "")]
          if (broken := summary.get("categories_unreadable")) else []),
        *([f"  schema failed   {len(failing)} whose latest parse failed the schema check, `products` holding "
           f"their earlier rows, if any: " + _first_names([f"{c} (parsed from snapshot {s})" for c, s in failing.items()])
           + " (why: the parsed_products_match_schema check in the UI)"]
          if (failing := summary.get("categories_failing_schema")) else []),
        *([f"  not loaded yet  {len(waiting)} whose latest snapshot is not parsed or not loaded yet (a run stopped "
           "after fetching it, or one still going), `products` holding their earlier rows, if any: "
           + _first_names(waiting) + "; the next daily run loads them (or re-parse them: README, Runbook)"
           + ("; while a category of a run fails the schema check, that run loads none of its categories: "
              "see `schema failed`" if summary.get("categories_failing_schema") else "")]
          if (waiting := summary.get("categories_not_loaded")) and summary.get("warehouse_exists", True) else []),
        *([f"  completed       {' to '.join(dict.fromkeys(span))} (UTC: when the oldest and the newest of those "
           "snapshots were completed)"] if (span := summary.get("snapshots_completed")) else []),
        f"  pages           {summary['pages_done']:,} done, {summary['pages_failed']:,} failed",
        "  success rate    " + (f"{summary['success_rate']:.1%}" if summary["pages_done"] + summary["pages_failed"]
                                  else f"n/a (no complete snapshot of {summary['site']} in {summary['object_storage']}"
                                       f" yet: {_storage_hint(summary['site'])})"),
        f"  products loaded {summary['products_loaded']:,} (table `products`)"
        + ("" if summary.get("warehouse_exists", True) else f"; no `products` table yet in {summary['warehouse']}"),
        *([f"  warehouse       the first run will fail: {refused}"]
          if (refused := summary.get("warehouse_create_refused")) else []),
    ]
    if carried := summary.get("products_carried_forward"):
        shown = ", ".join(f"{c} ({n:,})" for c, n in list(carried.items())[:10]) + (", ..." if len(carried) > 10 else "")
        lines.append(
            f"  carried forward {sum(carried.values()):,} of those rows were not seen in the snapshot last loaded (a page "
            f"of their category failed, their card was rejected, or its listing changed while it was crawled; the "
            f"oldest parsed from a body fetched {summary['carried_forward_oldest_fetch']}, later 304s not counted): "
            f"{shown}; failed pages and rejected cards are in `dead_letters`"
        )
    stale = summary.get("products_of_categories_not_in_spec") or {}
    if stale:
        lines.append(
            f"  not in spec     {sum(stale.values()):,} of those rows belong to categories no longer in the spec: "
            + ", ".join(f"{c} ({n:,})" for c, n in stale.items()) + " (README: 'Removing a category')"
        )
    stale_letters = summary.get("dead_letters_of_categories_not_in_spec") or {}
    lines += [
        f"  dead letters    {summary['dead_letters']:,} (table `dead_letters`)" + (
            f"; {sum(stale_letters.values()):,} of them of categories no longer in the spec: "
            + ", ".join(f"{c} ({n:,})" for c, n in stale_letters.items()) if stale_letters else ""),
        f"  raw pages       {summary['object_storage']}",
        f"  warehouse       {summary['warehouse']}" + (
            f" (tables of site {summary['warehouse_site']!r}, not {summary['site']!r}: the products and dead "
            "letters counted above are theirs)"
            if summary.get("warehouse_site") not in (None, summary["site"]) else ""),
        _ui_line(summary),
    ]
    print("\n".join(lines), file=sys.stdout if out is None else out)


def _ui_hint(summary: dict) -> str:
    """Where to look at a run: the command of :func:`_ui_line`, or, while a daemon runs on the
    instance (whose UI is likely open already), that UI."""
    if summary.get("daemon_heartbeat_age_s") is not None:
        return "the Dagster UI serving this instance"
    exports = summary.get("ui_exports")
    return f"`{summary.get('ui_command', 'make ui')}`" + (f" (with {listed(exports)} exported)" if exports else "")


def _ui_line(summary: dict) -> str:
    """The summary's last line: the ``make ui`` command for this instance, or, while a Dagster
    daemon runs on it (``daemon_heartbeat_age_s``), why not: ``make ui`` (dagster dev) starts a
    daemon of its own, and Dagster supports one per instance."""
    if (age := summary.get("daemon_heartbeat_age_s")) is not None:
        return (f"  Dagster UI      not `make ui`: a Dagster daemon beat on this instance {age:.0f} s ago (a "
                "dagster-daemon service, or `make ui` already open) and `make ui` would start a second one; open "
                "the UI already serving the instance, or serve one without a daemon: `.venv/bin/dagster-webserver -w "
                "workspace.yaml` in the clone, in the runs' environment (README: A production setup)")
    exports = summary.get("ui_exports")
    return (f"  Dagster UI      {summary.get('ui_command', 'make ui')}  (then open {summary.get('ui_url', ui_url({}))})"
            + (f"; with {listed(exports)} exported as for the pipeline's runs" if exports else ""))


def _ui_port(env: Mapping[str, str]) -> str:
    """The port ``make ui`` serves the UI on: ``UI_PORT`` when exported (the Makefile reads it too), else 3000."""
    port = env.get("UI_PORT", "").strip()  # else `make ui` refuses it (digits only) or takes 3000 (empty)
    return port if port.isascii() and port.isdigit() else "3000"


def ui_url(env: Mapping[str, str]) -> str:
    """Where ``make ui`` serves the UI (:func:`_ui_port`)."""
    return f"http://127.0.0.1:{_ui_port(env)}"


#: Settings the UI's runs need as this process had them, carried in the ``make ui`` command
#: when set: without the User-Agent or attempts a killed snapshot was fetched with, the UI's
#: run could not resume it; the rest make its runs behave as this one did.
UI_CARRIED = ("SCRAPE_USER_AGENT", "SCRAPE_MAX_ATTEMPTS", "SCRAPE_REQUESTS_PER_SECOND", "SCRAPE_MAX_CONCURRENCY",
              "SCRAPE_RESUME_MAX_AGE_H", "SCRAPE_LOCK_WAIT_S", "SCRAPE_DEMO_DATE", "SCRAPE_SCHEDULE_CRON",
              "SCRAPE_GC_FREEZE")
#: Settings whose values may hold credentials: named by :func:`ui_exports`, never printed.
UI_SECRETS = ("SCRAPE_STORAGE_URL", "SCRAPE_WAREHOUSE_URL", "SCRAPE_PROXY_URL", "SCRAPE_ALERT_WEBHOOK_URL")


def ui_command(env: Mapping[str, str]) -> str:
    """The ``make ui`` command (run in the clone) that shows this process's site, data and instance.

    ``env`` is the process environment. The UI's code location reads the same variables,
    so the command carries those that differ from what ``make ui`` uses in the clone:
    ``SCRAPE_SITE`` (other than ``demo``), the data folder (``SCRAPE_DATA_DIR``, else
    ``./data`` of the current folder) other than the clone's ``data``,
    ``SCRAPE_BASE_URL``, every other setting in :data:`UI_CARRIED` that is set (the
    User-Agent and attempts a snapshot resumes only under, the pace, the demo's day, ...),
    and ``DAGSTER_HOME`` other than the clone's ``.dagster_home``
    (unset: ``./.dagster_home`` of the current folder when it holds an instance, as
    ``scrape-assets demo`` run there used it; else the clone's),
    each shell-quoted; paths absolute; a base URL only when it has nothing to redact (else
    :func:`ui_exports` names it).
    The storage, warehouse, proxy and webhook URLs are left out (they may hold
    credentials; :func:`ui_exports` names them): set them as for the run. ``UI_PORT`` is
    carried when it is not 3000.
    """
    parts = [*ui_settings(env), "make ui"]
    if (home := _ui_home(env)) != _CLONE / ".dagster_home":
        parts.append(f"DAGSTER_HOME={shlex.quote(str(home))}")
    if (port := _ui_port(env)) != "3000":  # exported now, perhaps not in the shell that runs it
        parts.append(f"UI_PORT={port}")
    return " ".join(parts)


def ui_settings(env: Mapping[str, str]) -> list[str]:
    """The ``NAME=value`` words (shell-quoted) :func:`ui_command` puts before ``make ui``: the
    settings a UI (or any command serving the instance) needs to show this process's site."""
    from scrape_assets.settings import data_folder

    parts = []
    if (site := env.get("SCRAPE_SITE")) not in (None, "", "demo"):
        site = str(Path(site).resolve()) if Path(site).is_file() else site  # a spec file, from any folder
        parts.append(f"SCRAPE_SITE={shlex.quote(site)}")
    data = data_folder(env)
    if data != _CLONE / "data":
        parts.append(f"SCRAPE_DATA_DIR={shlex.quote(str(data))}")
    if (base := env.get("SCRAPE_BASE_URL")) and _shown_whole(base):  # else named by ui_exports, not printed
        parts.append(f"SCRAPE_BASE_URL={shlex.quote(base)}")
    # The User-Agent as set (one with a trailing space is recorded so, and a resume compares it
    # whole); the others as the settings read them, stripped (a \r of a CRLF .env file would
    # garble the printed line).
    parts.extend(f"{name}={shlex.quote(env[name] if name == 'SCRAPE_USER_AGENT' else value)}"
                 for name in UI_CARRIED if (value := env.get(name, "").strip()))
    return parts


def _ui_home(env: Mapping[str, str]) -> Path:
    """The instance folder the summary's UI line is about: ``DAGSTER_HOME`` (absolute); unset:
    ``./.dagster_home`` when it holds an instance, as :func:`_instance` uses it, else the clone's."""
    home = Path(env.get("DAGSTER_HOME") or ".dagster_home").expanduser().resolve()
    if not env.get("DAGSTER_HOME") and not (home / "dagster.yaml").is_file():
        home = _CLONE / ".dagster_home"
    return home


DAEMON_SEEN_S = 40
"""A daemon heartbeat this recent (seconds) means a daemon runs, for ``make ui``
(``daemon-check``) and the summary's UI line alike: each of a daemon's loops beats every
30 s, so a live one's newest beat is younger; a UI stopped just now blocks its restart for
less than a minute, and meanwhile the summary says so rather than suggest ``make ui``."""


def daemon_heartbeat_age(env: Mapping[str, str], now: float | None = None) -> float | None:
    """Seconds since the newest Dagster daemon heartbeat on the instance the UI line names
    (:func:`_ui_home`) when it is at most :data:`DAEMON_SEEN_S`, else ``None``.

    A daemon runs there: a ``dagster-daemon`` service, or ``make ui`` (``dagster dev``,
    which starts one) already open. Only an instance on Dagster's default SQLite storage
    under ``DAGSTER_HOME`` (as the shipped ``dagster.yaml`` has it) is looked at: its
    ``history/runs.db`` is opened read-only, so nothing is created or migrated and a locked
    file costs at most a second. With a ``storage:`` (or ``run_storage:``) block, which may
    name a PostgreSQL server that does not answer, nothing is read: ``None``. Anything that
    cannot be read counts as no daemon (the summary never fails on this).
    """
    import sqlite3

    import yaml

    home = _ui_home(env)
    try:
        config = yaml.safe_load((home / "dagster.yaml").read_text(encoding="utf-8")) or {}
        if not isinstance(config, dict) or config.keys() & {"storage", "run_storage"}:
            return None
        runs = home / "history" / "runs.db"
        if not runs.is_file():
            return None
        from dagster._daemon.types import DaemonHeartbeat  # private, pinned (the test runs a real daemon)
        from dagster._serdes import deserialize_value

        with contextlib.closing(sqlite3.connect(f"{runs.as_uri()}?mode=ro", uri=True, timeout=1)) as conn:
            bodies = [body for (body,) in conn.execute("SELECT body FROM daemon_heartbeats")]
        beats = [deserialize_value(body, DaemonHeartbeat).timestamp for body in bodies]
    except Exception:  # noqa: BLE001 - a hint only: an unreadable instance shows the plain line
        return None
    age = (time.time() if now is None else now) - max(beats, default=float("-inf"))
    return max(age, 0.0) if age <= DAEMON_SEEN_S else None


def run_daemon_check() -> int:
    """``make ui``'s first step: 1, saying why and what to do instead, when a daemon beat on
    the instance within :data:`DAEMON_SEEN_S` (``dagster dev`` would start a second one,
    which Dagster does not support: its sensors and schedules would run twice); else 0."""
    age = daemon_heartbeat_age(os.environ)
    if age is None:
        return 0
    port, home = _ui_port(os.environ), shlex.quote(str(_ui_home(os.environ)))
    # The commands name the instance, port and site's settings: pasted into another shell
    # they serve this one (without the settings, the webserver showed the demo's spec).
    settings = "".join(f"{word} " for word in ui_settings(os.environ))
    exports = ui_exports(os.environ)
    print(f"scrape-assets: a Dagster daemon beat on the instance at {home} {age:.0f} s ago: another "
          "`make ui` (dagster dev) or a dagster-daemon service runs on it, and `make ui` would start a second daemon "
          "(Dagster supports one per instance). Open the UI already serving it, or serve one without a daemon: "
          f"`{settings}DAGSTER_HOME={home} .venv/bin/dagster-webserver -w workspace.yaml -p {port}`. Stopped it just "
          f"now? Its last beat stops counting in {max(DAEMON_SEEN_S - age, 1):.0f} s; or "
          f"`{settings}make ui UI_FORCE=1 UI_PORT={port} DAGSTER_HOME={home}`"
          + (f" (with {listed(exports)} exported as for the pipeline's runs)" if exports else "") + ".", file=sys.stderr)
    return 1


def run_port_check(port: int, host: str = "127.0.0.1") -> int:
    """``make ui``'s check before it starts ``dagster dev``: 1, saying what to do, when ``port``
    on ``host`` is taken; else 0.

    ``dagster dev`` started on a taken port prints "Serving dagster-webserver on ..." and
    starts its daemon before the webserver fails to bind: the browser then shows the other
    program, and the daemon's heartbeats make the next ``make ui`` (on a free port) refuse
    for 40 s. The bind is tried as the webserver does (``SO_REUSEADDR``: a port left in
    TIME_WAIT by a stopped UI is free).
    """
    import errno
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                why, other = "another program, or another `make ui`, listens there", port + 1 if port < 65535 else 3001
            elif exc.errno == errno.EACCES and port < 1024:
                why, other = "a port below 1024 needs privileges", 3000
            else:
                why, other = "not a port this process may serve on", 3000 if port != 3000 else 3001
            print(f"scrape-assets: cannot serve the UI on {host}:{port}: {exc.strerror or exc} ({why}): "
                  f"`make ui UI_PORT={other}` serves it on another port", file=sys.stderr)
            return 1
    return 0


def ui_exports(env: Mapping[str, str]) -> list[str]:
    """The variables :func:`ui_command` leaves out that the UI needs too: those of :data:`UI_SECRETS` set in
    ``env`` (storage, warehouse, proxy, webhook URLs), and a ``SCRAPE_BASE_URL`` that
    :func:`~scrape_assets.storage.redact_url` would not show whole.

    Their values may hold credentials, so the summary names them instead of printing them;
    without them the UI's code location would read ``./data`` and show another store.
    """
    exports = [name for name in UI_SECRETS if env.get(name, "").strip()]
    if (base := env.get("SCRAPE_BASE_URL")) and not _shown_whole(base):  # not in the command
        exports.insert(0, "SCRAPE_BASE_URL")
    return exports


def _shown_whole(url: str) -> bool:
    """Whether :func:`~scrape_assets.storage.redact_url` shows ``url`` as it is (nothing hidden, nothing normalised)."""
    from scrape_assets.storage import redact_url

    return redact_url(url) == url


def pool_holders_notice(instance, pool: str | None) -> str | None:
    """A line naming the runs holding every slot of ``pool`` (``raw_pages`` would wait for them), else None.

    Only with remote storage (``pool`` set: :func:`~scrape_assets.defs.pools.configured_host_pool`):
    a run killed with SIGKILL keeps its slot, and Dagster's in-process executor then waits
    for it silently, using a core, without answering SIGTERM; this says so up front.
    """
    if pool is None:
        return None
    info = instance.event_log_storage.get_concurrency_info(pool)
    limit = info.limit if info.limit is not None else info.slot_count
    if not limit or len(info.claimed_slots) < limit:
        return None
    holders = []
    for run_id in sorted(info.active_run_ids):
        run = instance.get_run_by_id(run_id)
        holders.append(f"{run_id} ({run.status.value.lower() if run else 'not a run of this instance'})")
    return (f"scrape-assets: raw_pages will wait for the pool {pool} (one fetching step per host), held by run "
            f"{', '.join(holders)}: if that run was killed, free its slot from its page in the UI (`make ui`, \"Free "
            "concurrency slots\") or with `scrape-assets fail-run RUN_ID`; until then this process waits, using a "
            "core (Ctrl-C does not stop it: kill it)")


def run_fail_run(run_id: str) -> int:
    """``scrape-assets fail-run RUN_ID``: end a run whose process is gone, free its slots.

    The UI's "Free concurrency slots" (and Terminate's end of the run), for a machine
    without the UI (CI with an instance that outlives its jobs): a ``dagster asset
    materialize`` killed with SIGKILL on S3 storage stays "started" holding its host's pool
    slot, and the next run waits for it (the README's "Runs and limits"). A run "starting"
    or "started" is marked failed (``RUN_FAILURE`` with the reason; the alert sensor sees
    it only for runs the daemon or the UI launched: command-line runs belong to no code
    location); one stuck "canceling" is marked canceled. The operator says the process is
    gone: only the process of a run tagged with it (every run of the project's executor,
    ``raw_pages`` and ``scrape-assets demo``: :mod:`scrape_assets.run_processes`) can be
    checked, on the same machine, boot and pid namespace, and one still running is refused. A run that ended only has its slots
    freed. Prints what it did; returns 0.

    Raises:
        ScrapeError: no such run (the full id, or the 8-character short id when only one run
            has it), a run queued or not started
            (nothing to free: delete it), or a run whose process still runs.
    """
    import dagster as dg

    live = (dg.DagsterRunStatus.STARTING, dg.DagsterRunStatus.STARTED, dg.DagsterRunStatus.CANCELING)
    reason = "ended with `scrape-assets fail-run`: its process is gone, said the operator"
    with _instance() as instance:
        run = _run_by_id_or_short_id(instance, run_id)
        run_id = run.run_id
        status = run.status.value.lower()
        if run.status in (dg.DagsterRunStatus.QUEUED, dg.DagsterRunStatus.NOT_STARTED):
            raise ScrapeError(f"run {run_id} is {status}: it has not started and holds no slot; delete it from the UI "
                              f"or with `dagster run delete {run_id}` if it should not start")
        done = f"had already ended ({status})"
        if run.status in live:
            if (identity := run_process(run)) and process_gone(identity) is False:
                launcher = run.tags.get(LAUNCHED_BY_TAG, "")
                raise ScrapeError(f"run {run_id} is {status} and its {launcher + ' ' if launcher else ''}process "
                                  f"(pid {run.tags.get(PID_TAG, '?')}) is still running: stop that process instead "
                                  "(Ctrl-C), or terminate the run from the UI")
            if run.status == dg.DagsterRunStatus.CANCELING:
                instance.report_run_canceled(run, message=reason)
                done = f"was {status}, now canceled"
            else:
                instance.report_run_failed(run, message=reason)
                done = f"was {status}, now failed"
        pools = pools_held(instance, run_id)
        instance.event_log_storage.free_concurrency_slots_for_run(run_id)
    freed = f"freed its slot{'s' if len(pools) > 1 else ''} in {', '.join(pools)}" if pools else "it held no slot"
    print(f"scrape-assets: run {run_id} {done}; {freed}")
    return 0


SHORT_ID_CHARS = 8
"""Characters of a run id the UI's run lists and this project's alerts show (``1a2b3c4d``)."""


def _run_by_id_or_short_id(instance, run_id: str):
    """The run whose id is ``run_id``, or the only one it begins (at least ``SHORT_ID_CHARS``).

    Raises:
        ScrapeError: no such run, a prefix shorter than the short id, or one several runs share.
    """
    run = instance.get_run_by_id(run_id)
    if run is not None:
        return run
    where = f"on the Dagster instance at {os.environ['DAGSTER_HOME']} (DAGSTER_HOME)"
    expected = (f"expected a run's id, full or its first {SHORT_ID_CHARS} characters as the UI's run lists and the "
                "alerts show it (`dagster run list` shows full ids)")
    if len(run_id) < SHORT_ID_CHARS:
        raise ScrapeError(f"no run {run_id} {where}: {expected}")
    matches = [each for each in instance.get_run_ids() if each.startswith(run_id)]
    if not matches:
        raise ScrapeError(f"no run {run_id} {where}: {expected}")
    if len(matches) > 1:
        raise ScrapeError(f"{len(matches)} runs {where} have ids beginning {run_id}: "
                          f"{', '.join(sorted(matches)[:5])}{', ...' if len(matches) > 5 else ''}; give more of the id")
    return instance.get_run_by_id(matches[0])


def run_demo(new_snapshot: bool = False, min_success_rate: float | None = None) -> int:
    """Materialize all assets for all categories in one run; print a summary. Returns an exit code:
    1 when the run failed, or when the summary's success rate is below ``min_success_rate``
    (a fraction; :func:`below_success_rate`)."""
    from scrape_assets.definitions import defs
    from scrape_assets.defs.jobs import all_categories_tags, category_partitions
    from scrape_assets.defs.resources import build_resources

    resources = build_resources(secrets_as_env_vars=False)  # used here, outside Dagster's runs
    preflight(resources)
    job = defs.resolve_job_def("daily_scrape_job")
    keys = category_partitions.get_partition_keys()
    with _instance() as instance:  # disposed: its SQLite files are closed (WAL folded) before exit
        print(f"scrape-assets: {counted(len(keys), 'category')} in one run on the Dagster instance at {os.environ['DAGSTER_HOME']}")
        from scrape_assets.defs.pools import configured_host_pool

        for dead in fail_dead_runs(instance):
            print(dead.line, file=sys.stderr, flush=True)
        if notice := pool_holders_notice(instance, configured_host_pool()):
            print(notice, file=sys.stderr, flush=True)
        run_id = str(uuid.uuid4())  # as Dagster's make_new_run_id: known before the run, for its process tag
        result = job.execute_in_process(
            instance=instance,
            run_id=run_id,
            tags={**all_categories_tags(category_partitions), LAUNCHED_BY_TAG: DEMO_LAUNCHER, **process_tags(run_id)},
            run_config={
                "loggers": {"console": {"config": {"log_level": "INFO"}}},
                "ops": {"raw_pages": {"config": {"new_snapshot": new_snapshot}}},
            },
            raise_on_error=False,
        )
        held_back, loaded_after = None, False
        if not result.success:
            try:
                held_back = _load_held_back(defs, instance, result.run_id, resources, keys)
                loaded_after = held_back is not None
            except Exception as exc:  # noqa: BLE001 - the summary still prints; the load is named instead
                held_back = (f"\nCould not load the categories a failed schema check held back ({type(exc).__name__}: "
                             f"{exc}); load those that passed with `dagster job execute -m scrape_assets.definitions "
                             "-j load_job --tags '{\"dagster/asset_partition_range_start\": \"FIRST\", "
                             "\"dagster/asset_partition_range_end\": \"LAST\"}'`")
        failure = None if result.success else run_failure_reason(instance, result)
    summary = summarize(resources)
    print_summary(summary, {**run_figures(result), "load_held_back": loaded_after, "failure": failure})
    if held_back:
        print(held_back)
    if not result.success:
        print(f"\nrun {result.run_id} did not succeed: {failure}\n(see {_ui_hint(summary)} for the failed step)",
              file=sys.stderr)
        return 1
    if short := below_success_rate(summary, min_success_rate):
        print(f"\nscrape-assets: {short}", file=sys.stderr)
        return 1
    return 0


def run_failure_reason(instance, result) -> str:
    """Why the in-process run ``result`` failed, in one line: the run-failure alert's text
    (:func:`scrape_assets.defs.sensors.run_failure_message`): the schema check's failing
    categories and their reasons, else each failed step's error."""
    import dagster as dg

    from scrape_assets.defs.sensors import run_failure_message

    failure = next((e for e in result.all_events if e.event_type == dg.DagsterEventType.RUN_FAILURE), None)
    return run_failure_message(instance, result.run_id, failure, result.get_step_failure_events())


def held_back_load_line(categories: int, spans: list[str], rows_loaded: int, rows_kept: int, *,
                        any_failed: bool) -> str:
    """The line saying what the follow-up load of a held-back run did: its ranges (``spans``,
    a failed one marked ``(FAILED: run ...)``) and the rows its successful runs loaded and
    kept (with ``any_failed``, a run failed: it records no figures, though what it committed
    before failing stays)."""
    return (f"  loaded the {counted(categories, 'category')} that passed it, held back with them: " + ", ".join(spans)
            + f": {counted(rows_loaded, 'row')} (re)loaded" + (" by the runs that succeeded" if any_failed else "")
            + (f", {counted(rows_kept, 'earlier row')} kept for pages that failed or cards rejected" if rows_kept else ""))


def _load_held_back(defs, instance, run_id: str, resources: dict, keys: list[str]) -> str | None:
    """After a run whose blocking schema check failed (which holds back the load of every
    category in it), load the categories that passed, as ``held_back_load_sensor`` does for
    the daemon's runs; return the lines saying so (None when nothing was held back).
    """
    from scrape_assets.defs.jobs import partition_range_tags
    from scrape_assets.defs.partitions import consecutive_ranges, range_label
    from scrape_assets.defs.sensors import DEAD_LETTERS, HELD_BACK_TAG, held_back_by_schema_check, split_by_schema

    parsed = held_back_by_schema_check(instance, instance.get_run_by_id(run_id))
    if not parsed:
        return None
    passed, failed, unreadable = split_by_schema(parsed, resources["site"].spec().name, resources["store"].store())
    its = "its" if len(failed) == 1 else "their"
    lines = ["", f"Schema check failed for {', '.join(failed) or 'no category readable as failed'}: {its} rows are not "
                 f"loaded (the error above says why, per category; the table keeps {its} earlier rows)"]
    lines += [f"  parse state of {c} unreadable ({e}): not loaded" for c, e in unreadable.items()]
    job = defs.resolve_job_def("load_job")

    figures = Counter()  # products_table's rows_loaded and rows_carried_forward over the follow-up runs, failed runs

    def follow_up(categories: list[str], asset_selection=None) -> list[str]:
        done = []
        for first, last in consecutive_ranges(categories, keys):
            follow_up_id = str(uuid.uuid4())  # tagged with this process, as the demo's own run (fail_dead_runs)
            run = job.execute_in_process(instance=instance, raise_on_error=False, asset_selection=asset_selection,
                                         run_id=follow_up_id,
                                         tags={**partition_range_tags(first, last), HELD_BACK_TAG: run_id,
                                               LAUNCHED_BY_TAG: DEMO_LAUNCHER, **process_tags(follow_up_id)},
                                         run_config={"loggers": {"console": {"config": {"log_level": "WARNING"}}}})
            span = range_label(first, last)
            done.append(span if run.success else f"{span} (FAILED: run {run.run_id})")
            figures["failed_runs"] += not run.success
            # One event per partition of the range, each with the run's totals: the first one counts.
            table = next((e for e in run.get_asset_materialization_events()
                          if e.asset_key.to_user_string() == "products_table"), None)
            if table is not None:
                metadata = table.materialization.metadata
                figures.update({k: metadata[k].value for k in ("rows_loaded", "rows_carried_forward") if k in metadata})
        return done

    # (a category since removed from the spec has no partition)
    loadable, failing = [c for c in passed if c in keys], [c for c in failed if c in keys]
    if loaded := follow_up(loadable):
        lines.append(held_back_load_line(len(loadable), loaded, figures["rows_loaded"], figures["rows_carried_forward"],
                                         any_failed=figures["failed_runs"] > 0))
    if recorded := follow_up(failing, [DEAD_LETTERS]):  # held back too: the pages and cards that failed
        lines.append(f"  recorded the dead letters of the {counted(len(failing), 'category')} that failed it "
                     f"(table `dead_letters`): " + ", ".join(recorded))
    return "\n".join(lines)


def run_prune(keep: int, dry_run: bool, out=None) -> int:
    """Prune the configured site's snapshots (see :mod:`scrape_assets.retention`); 1 if a category was skipped.

    Raises:
        ScrapeError: the storage holds no snapshot of the site at all (a mistyped data folder,
            most likely; nothing is created there).
    """
    out = out or sys.stdout
    from scrape_assets.defs.resources import build_resources
    from scrape_assets.retention import categories_left_alone, prune

    resources = build_resources(secrets_as_env_vars=False)
    spec = resources["site"].spec()
    store = resources["store"].store()
    store.check_root()
    if not store.is_local:  # before the work, where it can still stop someone
        print("warning: remote storage has no partition locks: prune only while no run of this site is active",
              file=sys.stderr)
    try:
        left = categories_left_alone(store, spec.name, list(spec.categories))
    except StorageError as exc:  # only a note: prune itself may still work
        left = None
        print(f"warning: could not look for folders of categories not in the spec: {exc}", file=sys.stderr)
    left_alone = (f"{counted(len(left), 'folder')} of categories not in the spec, which prune does not visit: "
                  f"{_first_names(left)} (README: Removing a category)") if left else None
    plans = prune(store, spec.name, list(spec.categories), keep, owner=f"scrape-assets prune (pid {os.getpid()})",
                  dry_run=dry_run)
    if not any(p.kept or p.objects or p.skipped for p in plans):  # nothing of this site there: wrong folder or site?
        raise ScrapeError(f"no snapshot of {spec.name} in {_storage_as_set()}: "
                          + (f"it holds {left_alone}. " if left_alone else f"{_storage_hint(spec.name)} ")
                          + "Nothing pruned")
    for plan in plans:
        print(plan.line(dry_run=dry_run), file=out)
    skipped = [p.category for p in plans if p.skipped]
    done = [p for p in plans if not p.skipped]  # a skipped line says what, if anything, went
    freed = sum(p.bytes_freed for p in done)
    print(f"{'dry run: would delete' if dry_run else 'deleted'} {counted(sum(len(p.deleted) for p in done), 'snapshot')} "
          f"({freed / 1e6:.1f} MB) across {counted(len(plans), 'category')} of {spec.name} at {store.describe()}"
          + (f"; skipped {len(skipped)}: {', '.join(skipped)}" if skipped else ""), file=out)
    if left_alone:
        print(f"left alone: {left_alone}", file=out)
    return 1 if skipped else 0


def _storage_variable() -> str:
    """The setting that chose object storage: ``SCRAPE_STORAGE_URL`` when set, else ``SCRAPE_DATA_DIR``."""
    return "SCRAPE_STORAGE_URL" if os.environ.get("SCRAPE_STORAGE_URL") else "SCRAPE_DATA_DIR"


def _storage_as_set() -> str:
    """Where the store is, as the user set it: ``SCRAPE_STORAGE_URL`` (without credentials), or the data folder."""
    from scrape_assets.settings import data_folder
    from scrape_assets.storage import redact_url

    if _storage_variable() == "SCRAPE_STORAGE_URL":
        return redact_url(os.environ["SCRAPE_STORAGE_URL"])
    return str(data_folder(os.environ))


def _storage_hint(site: str) -> str:
    return f"is {_storage_variable()} the one you scraped into, and SCRAPE_SITE ({site}) the site?"


def _at_least_one(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1 (the newest complete snapshot is always kept), got {value}")
    return value


def run_serve_demo(host: str, port: int, faults: str | None) -> int:
    """``scrape-assets serve-demo``: serve until Ctrl-C; 2 with one line when the date or address is unusable."""
    from scrape_assets.demo_site import DATE_ENV_VAR, resolve_day, serve_forever

    try:
        resolve_day()
    except ValueError:
        raise SettingsError(DATE_ENV_VAR, os.environ.get(DATE_ENV_VAR, ""), "a date as YYYY-MM-DD, e.g. 2026-12-01") from None
    try:
        if faults:
            from scrape_assets.faults import serve_faulty_forever

            serve_faulty_forever(faults, host, port)
        else:
            serve_forever(host, port)
    except OSError as exc:
        # Binding's errors: the address is taken, not this machine's, not allowed, or the host unknown.
        if not isinstance(exc, socket.gaierror) and exc.errno not in (errno.EADDRINUSE, errno.EADDRNOTAVAIL, errno.EACCES):
            raise
        print(f"scrape-assets: error: cannot listen on {host}:{port}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    return 0


def run_categories_command(out=None) -> int:
    """``scrape-assets categories``: the partition keys of ``SCRAPE_SITE`` in the spec's order.

    The order is the one partition ranges follow (``--partition-range FIRST...LAST``: the
    first and last lines cover every category). Reads the settings and the spec; touches
    no storage, warehouse or Dagster instance.
    """
    from scrape_assets.settings import load_settings
    from scrape_assets.spec import load_spec

    # One write, not one per key: a reader that takes the first line and goes (`| head -1`)
    # then finds the whole list already in the pipe, even with PYTHONUNBUFFERED set (a
    # write per key failed once it had gone: exit 1, which `set -o pipefail` turns into a
    # failed script). A list longer than a pipe's buffer (~64 KB) can still meet a reader gone.
    (sys.stdout if out is None else out).write("".join(f"{key}\n" for key in load_spec(load_settings().site).categories))
    return 0


def _to_a_reader(write: Callable[[], int]) -> int:
    """``write()``'s exit code; 1, quietly, if stdout's reader went away meanwhile
    (``scrape-assets categories | head -1``): stdout is then pointed at ``/dev/null`` so the
    interpreter's last flush does not fail again (Python's docs, "Note on SIGPIPE")."""
    try:
        code = write()
        sys.stdout.flush()  # here, not at exit: a reader gone shows now
        return code
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1


def _percent(text: str) -> float:
    """argparse type: a percentage 0..100, with or without its ``%`` (``90``, ``99.5%``), as a fraction.

    A number between 0 and 1 without ``%`` (``0.9``) is refused: it reads as a fraction (the
    spec's ``collapse.floor`` is one) but would mean 0.9%, a gate that never closes.
    """
    bare = text.strip()
    try:
        value = float(bare.removesuffix("%"))
    except ValueError:
        value = math.nan
    if not 0 <= value <= 100:  # nan (not a number at all, or "nan") too
        raise argparse.ArgumentTypeError(f"expected a percentage from 0 to 100, e.g. 90 or 99.5%, got {text!r}")
    if 0 < value < 1 and not bare.endswith("%"):
        raise argparse.ArgumentTypeError(f"expected a percentage from 0 to 100, e.g. 90 or 99.5%, got {text!r}: "
                                         f"for {value * 100:g}% write {value * 100:g}; for {value:g}% write {value:g}%")
    return value / 100


def below_success_rate(summary: dict, minimum: float | None) -> str | None:
    """Why ``summary`` (:func:`summarize`) falls short of ``--min-success-rate`` (a fraction), or ``None``.

    The rate is the summary's: pages done / (done + failed) over the latest complete snapshot
    of every category. No complete snapshot at all falls short too (nothing was fetched).
    """
    if minimum is None:
        return None
    done, failed = summary["pages_done"], summary["pages_failed"]
    if done + failed == 0:
        return (f"no complete snapshot of {summary['site']} in {summary['object_storage']} yet: nothing to hold to "
                f"--min-success-rate {minimum:.1%}")
    if summary["success_rate"] >= minimum:
        return None
    return (f"success rate {summary['success_rate']:.1%} ({done:,} pages done, {failed:,} failed in the latest complete "
            f"snapshots) is below --min-success-rate {minimum:.1%}; the failed pages' reasons are in `dead_letters`")


def _port(text: str) -> int:
    """argparse type: a TCP port 0..65535 (0: any free port)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a port number 0-65535, got {text!r}") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"expected a port number 0-65535, got {value}")
    return value


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("scrape_assets")
    except PackageNotFoundError:  # run from a checkout that is not installed
        return "(not installed)"


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``scrape-assets``; returns the exit code (0 ok, 1 run failed or a category
    not pruned, 2 bad input)."""
    parser = argparse.ArgumentParser(
        prog="scrape-assets", description="Scrape a catalogue site's category listings into Dagster assets.",
        epilog="Settings come from SCRAPE_* environment variables (SCRAPE_SITE, SCRAPE_DATA_DIR, SCRAPE_STORAGE_URL, "
               "SCRAPE_WAREHOUSE_URL, ...: the README's Configuration section) and the Dagster instance from "
               "DAGSTER_HOME (default: ./.dagster_home).")
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name: str, text: str) -> argparse.ArgumentParser:
        return sub.add_parser(name, help=text, description=text[0].upper() + text[1:] + ".")

    demo = command("demo", "materialize every asset for every category of the site in one run, then print a summary")
    demo.add_argument("--new-snapshot", action="store_true", help="start new snapshots even if one is incomplete")
    rate_help = ("exit 1 when the summary's success rate (pages done / done + failed, latest complete snapshot of "
                 "every category) is below this percentage, e.g. 90: a site that is down fails CI (default: never)")
    demo.add_argument("--min-success-rate", type=_percent, metavar="PERCENT", help=rate_help)
    serve = command("serve-demo", "serve the demo catalogue over real sockets until Ctrl-C")
    serve.add_argument("--port", type=_port, default=8000, help="0..65535; 0 picks a free port (default 8000)")
    serve.add_argument("--host", default="127.0.0.1",
                       help="address to listen on (default 127.0.0.1; another address exposes the demo to the network)")
    serve.add_argument("--faults", metavar="FILE", help="inject the faults of this spec (see scrape_assets/faults.py)")
    summary_command = command("summary", "print what is stored now: categories, pages, products, dead letters "
                                         "(reads only)")
    summary_command.add_argument("--min-success-rate", type=_percent, metavar="PERCENT", help=rate_help)
    command("categories", "list the site's categories (the partition keys) in the spec's order, one per line")
    prune = command("prune", "delete old snapshots, keeping the newest N complete ones per category")
    prune.add_argument("--keep", type=_at_least_one, required=True, metavar="N",
                       help="complete snapshots to keep per category (>= 1)")
    prune.add_argument("--dry-run", action="store_true", help="report what would be deleted; delete nothing")
    fail_run = command("fail-run", "mark failed a run left started by a killed process and free its concurrency "
                                   "slots (the UI's Free concurrency slots)")
    fail_run.add_argument("run_id", metavar="RUN_ID",
                          help="the run's id: full (`dagster run list`), or its first 8 characters as the UI's "
                               "run lists and the alerts show it")
    command("daemon-check", f"exit 1, saying why, when a Dagster daemon beat on the instance in the last "
                            f"{DAEMON_SEEN_S} s (`make ui` asks first: dagster dev would start a second one)")
    port_check = command("port-check", "exit 1, saying why, when PORT on 127.0.0.1 is taken (`make ui` asks "
                                       "first: dagster dev would say it serves, then fail to bind)")
    port_check.add_argument("port", type=_port, metavar="PORT")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        if args.command == "demo":
            return run_demo(new_snapshot=args.new_snapshot, min_success_rate=args.min_success_rate)
        if args.command == "serve-demo":
            return run_serve_demo(args.host, args.port, args.faults)
        if args.command == "prune":
            return run_prune(args.keep, args.dry_run)
        if args.command == "fail-run":
            return run_fail_run(args.run_id)
        if args.command == "daemon-check":
            return run_daemon_check()
        if args.command == "port-check":
            return run_port_check(args.port)
        if args.command == "categories":
            return _to_a_reader(run_categories_command)
        if args.command == "summary":
            from scrape_assets.defs.resources import build_resources
            from scrape_assets.defs.schedules import checked_cron  # the schedule's check, as the definitions make it
            from scrape_assets.settings import load_settings

            checked_cron(load_settings().schedule_cron)  # the README's pre-flight: a cron the daemon would refuse

            summary = summarize(build_resources(secrets_as_env_vars=False))
            code = _to_a_reader(lambda: print_summary(summary) or 0)
            if code == 0 and (broken := summary["categories_unreadable"]):  # printed in full, then failed as before
                print(f"scrape-assets: error: {counted(len(broken), 'category')} with a manifest that cannot be read "
                      f"({', '.join(broken)}): see the `unreadable` line", file=sys.stderr)
                return 2
            if code == 0 and (short := below_success_rate(summary, args.min_success_rate)):
                print(f"scrape-assets: {short}", file=sys.stderr)
                return 1
            return code
    except StorageError as exc:  # e.g. an unknown protocol, found when the definitions load
        usable = "can read" if args.command == "summary" or getattr(args, "dry_run", False) else "can write"
        print(f"scrape-assets: error: {storage_setting_error(exc, usable)}", file=sys.stderr)
        return 2
    except ScrapeError as exc:
        print(f"scrape-assets: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
