"""``products_table``: the warehouse table ``products``, loaded idempotently per partition."""

from collections import Counter
from datetime import datetime, timezone

import dagster as dg

from scrape_assets.batched_log import BatchedLog
from scrape_assets.counts import counted
from scrape_assets.defs.assets.partition_metadata import add_per_category
from scrape_assets.defs.partitions import category_partitions, run_categories
from scrape_assets.defs.resources import ObjectStoreResource, SiteResource, WarehouseResource, warehouse_for_load
from scrape_assets.errors import ManifestError
from scrape_assets.extract import ParseState, load_parse_state, load_parsed
from scrape_assets.manifest import load_manifest, utc_now_iso
from scrape_assets.warehouse import Warehouse, products

ROWS_CHECK = "products_table_matches_parsed"


class SchemaValidationFailed(dg.Failure):
    """Parsed rows failed the schema: the table is left untouched."""


def load_categories(context, categories: list[str], site: SiteResource, store: ObjectStoreResource, wh: Warehouse,
                    *, step_started_at: str | None = None):
    """Check every partition of the run (``categories``) passed the schema, then load them one by one.

    An input already loaded (same input version in ``partition_loads``) is not reloaded;
    only its day in ``price_history`` is written. Unless the table no longer holds the rows
    that load inserted (rows deleted or replaced outside the pipeline, a partial restore;
    counted, not compared, so a value edited in place goes unseen): that category is loaded
    again, and the log says so.

    ``step_started_at`` (a retry of the step: when its first attempt began, UTC ``...Z`` as
    ``partition_loads.loaded_at`` holds it): an unchanged input loaded since then was loaded
    by an earlier attempt of this step (each category commits on its own), and counts as
    loaded by this run in the figures returned and the log.

    Returns:
        ``(totals, rows loaded by category, rows in the table by category, the check's problems)``.
    """
    spec = site.spec()
    object_store = store.store()
    states = {}
    for category in categories:
        state = load_parse_state(object_store, spec.name, category)
        if state is None:
            raise ManifestError(f"{spec.name}/{category}", "partition not parsed yet: materialize parsed_products first")
        states[category] = state
    failed = sorted(c for c, state in states.items() if not state.validated)
    if failed:  # nothing is touched: a bad partition must not load, nor hold back the check's meaning
        raise SchemaValidationFailed(
            description=(
                f"parsed rows of {', '.join(failed)} failed the schema (see the parsed_products_match_schema "
                "check); products_table not changed"
            )
        )
    loaded, carried, in_table, problems = {}, {}, {}, []
    log = BatchedLog(context.log.info)
    versions = wh.loaded_versions(products, states)
    to_load = {c for c, state in states.items() if versions.get(c) != state.input_version}
    unchanged = [c for c in states if c not in to_load]
    in_place = wh.rows_of_loaded_snapshots(unchanged) if unchanged else {}
    altered = {c: in_place.get(c, 0) for c in unchanged if in_place.get(c, 0) != states[c].products}
    to_load |= set(altered)
    # Loaded by an earlier attempt of this step (a retry): this run's load, not an unchanged input.
    earlier = (wh.loaded_since(products, [c for c in unchanged if c not in altered], step_started_at)
               if step_started_at and unchanged else set())
    for category, state in states.items():
        rows, manifest, rejected, moved = None, None, set(), False
        if category in to_load:
            manifest = load_manifest(object_store, spec.name, category, state.snapshot_id)
            # On SQLite prices stay decimal strings: bound as the same numbers (200,000 rows: ~0.1 s less in a run).
            parsed = load_parsed(object_store, manifest, decimal_prices=not wh.accepts_decimal_strings)
            if load_parse_state(object_store, spec.name, category) != state:
                # A parse ran beside this load (a re-parse launched outside the daily queue) and
                # may have replaced parsed.json after the state above was read: these rows are
                # not the ones it vouched for. Nothing of this category is touched.
                raise ManifestError(f"{spec.name}/{category}", "parsed rows changed while this load read them (a "
                                    "parse of this category ran at the same time): run products_table again")
            rows = parsed.products  # dicts with the table's columns and more (insert_many picks the columns)
            rejected = {r["product_id"] for r in parsed.rejects if r.get("product_id")}
            # A card whose product id could not be read (its link is what failed) may be any of
            # the earlier rows: none of those the snapshot did not see is dropped.
            unidentified = sum(not r.get("product_id") for r in parsed.rejects)
            # Fewer cards than page 1's results count (parsed_products' count check warns): pages
            # not reached (a pager the spec no longer reads, max_pages), the unseen products with them.
            short = (manifest.products_expected is not None
                     and len(parsed.products) + len(parsed.rejects) < manifest.products_expected)
            moved = parsed.listing_moved is not None or short or unidentified > 0
        loaded[category], carried[category] = wh.load_products(
            category,
            rows,
            input_version=state.input_version,
            snapshot_id=state.snapshot_id,
            loaded_at=utc_now_iso(),
            history_date=history_day(state),
            history_snapshot_id=state.latest_snapshot_id,
            # Nothing to carry when the snapshot saw every page of a listing that held still while
            # they were fetched (the usual case): no rows are read back.
            carry_unseen=manifest is not None and (not manifest.sees_every_page or moved),
            carry_ids=rejected,  # a card that no longer parses keeps its row
        )
        if category in earlier:
            log.add(f"{category}: loaded {counted(state.products, 'row')} into products by an earlier attempt of this "
                    f"step (parsed from snapshot {state.snapshot_id})")
            continue
        log.add(
            f"{category}: "
            + (f"unchanged input, but the table holds {counted(altered[category], 'row')} of the "
               f"{counted(state.products, 'row')} loaded from it (changed outside the pipeline): " if category in altered else "")
            + (
                "unchanged input: products not reloaded"
                if rows is None
                else f"loaded {counted(loaded[category], 'row')} into products (parsed from snapshot {state.snapshot_id})"
                + (f"; kept {counted(carried[category], 'earlier row')} not seen this time (a page failed, a card "
                   "was rejected, or the listing changed while it was crawled)" if carried[category] else "")
            )
        )
    # The check, for all the run's partitions at once (two queries, not two per partition).
    counts = wh.rows_by_category(products, states)
    duplicates = Counter(category for category, _product_id, _n in wh.duplicate_product_keys(states))
    for category in earlier:  # what that attempt inserted and kept (its transaction is in the table as it left it)
        loaded[category], carried[category] = states[category].products, counts.get(category, 0) - states[category].products
    for category, state in states.items():
        count = in_table[category] = counts.get(category, 0)
        reloaded_wrong = category in to_load and count != state.products + carried[category]
        if reloaded_wrong or duplicates[category]:
            problems.append(
                {"category": category, "rows_parsed": state.products, "rows_carried_forward": carried[category],
                 "rows_in_table": count, "duplicates": duplicates[category]}
            )
    reloaded = len(to_load) + len(earlier)  # a category reloaded with no row seen (every page failed) counts too
    totals = {"rows_loaded": sum(loaded.values()), "partitions_reloaded": reloaded,
              "rows_carried_forward": sum(carried.values())}
    log.close(
        f"{counted(len(states), 'category')}: {counted(totals['rows_loaded'], 'row')} loaded into products "
        f"({counted(reloaded, 'category')} reloaded"
        + (f", {len(earlier)} of them by an earlier attempt of this step" if earlier else "")
        + f", {counted(totals['rows_carried_forward'], 'earlier row')} kept in them; "
        f"{len(states) - reloaded} unchanged, their rows as they were)"
    )
    return totals, loaded, in_table, problems


def _first_attempt_started_at(context) -> str | None:
    """When this step's first attempt began (UTC, ``partition_loads.loaded_at``'s format): its
    earliest ``STEP_START`` event in the run; the run's start when the event log has none; None
    when neither is known. Loads committed before it (another run's, while this run was still
    crawling or parsing) are not counted as this step's."""
    step_key = context.get_step_execution_context().step.key
    starts = context.instance.get_records_for_run(context.run_id, of_type=dg.DagsterEventType.STEP_START).records
    started = next((r.event_log_entry.timestamp for r in starts if r.event_log_entry.step_key == step_key), None)
    if started is None:
        record = context.instance.get_run_record_by_id(context.run_id)
        started = record.start_time if record is not None else None
    return None if started is None else utc_now_iso(datetime.fromtimestamp(started, timezone.utc))


def snapshot_date(snapshot_id: str) -> str:
    """``2026-11-30T084512Z`` -> ``2026-11-30`` (the UTC day of the snapshot)."""
    return snapshot_id[:10]


def history_day(state: ParseState) -> str:
    """The ``price_history`` day of a category's latest snapshot: the UTC day it was completed
    (``YYYY-MM-DD``). A snapshot started late one day and resumed after midnight (its run was
    killed) holds the prices seen when it was completed, so they are that day's; the day
    it started has no complete snapshot. A state written before the field: the day it started."""
    return (state.latest_completed_at or "")[:10] or snapshot_date(state.latest_snapshot_id)


@dg.asset(
    deps=["parsed_products"],
    partitions_def=category_partitions,
    backfill_policy=dg.BackfillPolicy.single_run(),
    group_name="scrape",
    kinds={"sql", "sqlite"},
    check_specs=[
        dg.AssetCheckSpec(ROWS_CHECK, asset="products_table",
                          description="rows in table = rows parsed + rows carried forward (their page failed or card was "
                                      "rejected); no duplicate keys")
    ],
)
def products_table(
    context: dg.AssetExecutionContext, site: SiteResource, store: ObjectStoreResource, warehouse: WarehouseResource
):
    """The ``products`` table: one row per (category, product_id), replaced per partition.

    Delete-then-insert in one transaction per category: a rerun gives the same table. When a
    page failed, the pages disagree on the listing's size or a page lists only products of
    earlier pages (``ParsedSnapshot.listing_moved``), or the snapshot has fewer cards than
    page 1's results count (pages not reached), earlier rows not seen this time are carried
    forward, never deleted by a failed fetch or a moving listing, and so is the earlier row
    of a product whose card was rejected (every earlier row not seen, when a rejected card's
    product id could not be read: it may be any of them; see ``Warehouse.load_products``). An
    unchanged input is not reloaded; ``price_history`` gets the prices seen that day either way (not
    those of carried-forward rows).
    """
    categories = run_categories(context)  # a backwards range fails before the warehouse is opened (or claimed)
    name = site.spec().name
    with warehouse_for_load(context, store, warehouse, name) as wh:
        step_started_at = _first_attempt_started_at(context) if context.retry_number else None
        totals, loaded, in_table, problems = load_categories(context, categories, site, store, wh,
                                                             step_started_at=step_started_at)
        total_rows = wh.count(products)
    add_per_category(context, {"rows_by_category": in_table, "rows_loaded_by_category": loaded},
                     {"rows": in_table, "rows_loaded": loaded})
    return dg.MaterializeResult(
        metadata={
            **totals,
            "table": "products",
            "warehouse": wh.describe(),
            "total_rows_in_table": total_rows,
        },
        check_results=[
            dg.AssetCheckResult(
                check_name=ROWS_CHECK,
                passed=not problems,
                metadata={"problems": dg.MetadataValue.json(problems), "categories_checked": len(loaded)},
            )
        ],
    )
