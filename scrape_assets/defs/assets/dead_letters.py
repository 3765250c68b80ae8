"""``dead_letters``: pages and products that failed for good, with their reason."""


import json

import dagster as dg

from scrape_assets.defs.assets.partition_metadata import add_per_category
from scrape_assets.defs.partitions import category_partitions, run_categories
from scrape_assets.defs.resources import ObjectStoreResource, SiteResource, WarehouseResource, warehouse_for_load
from scrape_assets.extract import load_current, load_parse_state
from scrape_assets.manifest import Manifest, latest_manifest, utc_now_iso
from scrape_assets.storage import ObjectStore
from scrape_assets.warehouse import dead_letters as dead_letters_table


#: Reasons of a page that parsed to nothing the schema's page guards accept (stage ``parse``):
#: its cards, if any, are dead letters of their own.
NO_CARD_REASON = ("layout_guard: no product card matched selectors.product while the site says the page lists "
                  "products; the layout may have changed")
UNRECOGNISED_REASON = ("unrecognised_page: neither a product card nor the listing's pager, next link or results "
                       "count (a bot check, or an error page served with status 200?)")


def page_parse_failure(page: dict) -> str | None:
    """Why a parsed page (a ``ParsedSnapshot.pages`` row) fails the schema's page guards with no
    card to blame (``layout_guard`` with no card found, ``unrecognised_page``), or ``None``."""
    if not page["listing_recognised"]:
        return UNRECOGNISED_REASON
    if page["site_claims_products"] and page["cards_found"] == 0:
        return NO_CARD_REASON
    return None


def dead_letter_rows(manifest: Manifest, parse_rejects: list[dict], parsed_pages: list[dict] = (),
                     parsed_snapshot_id: str | None = None) -> list[dict]:
    """Rows ``category, url, stage, reason, http_status, attempts, snapshot_id, recorded_at``.

    ``recorded_at`` is when the failure was recorded: a failed page's ``failed_at`` in the
    manifest, else now (see :func:`keep_recorded_at` for rows recorded by an earlier run).
    Failed pages come from the manifest (stage ``fetch``); product cards the parser
    rejected come from ``parsed.json`` (stage ``parse``), as do pages of ``parsed_pages``
    that hold no card while the site says they list products, or that are no listing at
    all (:func:`page_parse_failure`; stage ``parse``, with the page's HTTP status and attempts).
    ``snapshot_id`` is the manifest's, except for the rejected cards when ``parsed_snapshot_id``
    names the snapshot the parse stands for (older than the manifest when ``raw_pages`` ran
    and ``parsed_products`` has not yet: the cards are that parse's, not the new pages').
    """
    now = utc_now_iso()

    def row(url: str, stage: str, reason: str, http_status: int | None, attempts: int, recorded_at: str,
            snapshot_id: str = manifest.snapshot_id) -> dict:
        return {"category": manifest.category, "url": url, "stage": stage, "reason": reason,
                "http_status": http_status, "attempts": attempts, "snapshot_id": snapshot_id,
                "recorded_at": recorded_at}

    rows = [row(entry.url, "fetch", entry.last_error or "failed", entry.http_status, entry.attempts,
                entry.failed_at or now)  # (a manifest older than failed_at: now)
            for _, entry in sorted(manifest.pages.items()) if entry.status == "failed"]
    rows += [row(reject["url"], "parse", reject["reason"], None, 0, now, parsed_snapshot_id or manifest.snapshot_id)
             for reject in parse_rejects]
    for page in parsed_pages:
        if (reason := page_parse_failure(page)) and (entry := manifest.pages.get(page["page_number"])) is not None:
            rows.append(row(entry.url, "parse", reason, entry.http_status, entry.attempts, now))
    return rows


def keep_recorded_at(rows: list[dict], earlier: list[dict]) -> list[dict]:
    """``rows`` with the ``recorded_at`` of the same dead letter in ``earlier`` (the table's rows
    of the category): same snapshot, URL, stage and reason. Running ``dead_letters`` again (a
    follow-up load, a re-parse backfill) then leaves the time a failure was first recorded."""
    def key(r: dict) -> tuple:
        return r["snapshot_id"], r["url"], r["stage"], r["reason"]

    first: dict[tuple, str] = {}
    for r in earlier:  # the earliest of rows sharing the key (a card listed twice, say)
        first[key(r)] = min(first.get(key(r), r["recorded_at"]), r["recorded_at"])
    return [{**r, "recorded_at": first.get(key(r), r["recorded_at"])} for r in rows]


def dead_letters_key(manifest: Manifest) -> str:
    """Storage key of a snapshot's dead letters: ``{site}/{category}/{snapshot_id}/dead_letters.json``."""
    return f"{manifest.prefix}/dead_letters.json"


def lists_no_dead_letter(store: ObjectStore, manifest: Manifest) -> bool:
    """Whether the snapshot's ``dead_letters.json`` exists and lists no dead letter (one read; unreadable: False)."""
    try:
        return json.loads(store.read_bytes(dead_letters_key(manifest))) == []
    except (FileNotFoundError, ValueError):
        return False


@dg.asset(
    deps=["raw_pages", "parsed_products"],
    partitions_def=category_partitions,
    backfill_policy=dg.BackfillPolicy.single_run(),
    group_name="scrape",
    kinds={"sql", "json"},
)
def dead_letters(
    context: dg.AssetExecutionContext, site: SiteResource, store: ObjectStoreResource, warehouse: WarehouseResource
):
    """One row per page or product that failed for good, with stage, reason and HTTP status.

    Kept as the warehouse table ``dead_letters`` (replaced per partition) and as
    ``dead_letters.json`` next to the snapshot. What already says "no dead letter" is left
    as it is: the table's partition (no transaction) and the file of a snapshot an earlier
    run opened (a re-parse backfill: one read instead of a write; on S3 a GET, not a PUT).
    """
    categories = run_categories(context)  # a backwards range fails before the warehouse is opened (or claimed)
    spec = site.spec()
    object_store = store.store()
    counts = {}
    with warehouse_for_load(context, store, warehouse, spec.name) as wh:
        in_table = wh.rows_by_category(dead_letters_table, categories)
        for category in categories:
            manifest = latest_manifest(object_store, spec.name, category, complete=True)
            if manifest is None:
                counts[category] = 0
                continue
            state = load_parse_state(object_store, spec.name, category)
            rejects, pages, parsed_from = [], [], None
            # parsed.json is read only when it may hold dead letters: rejected cards, or pages the
            # schema refused (a passing category's pages all passed its page guards). A category
            # never parsed has its fetch dead letters only (the manifest's failed pages).
            if state is not None and (state.rejects or not state.validated):
                current = load_current(object_store, spec.name, category)[0]
                # Pages by number: only when the parse stands for this manifest (same pages).
                failing = not state.validated and state.latest_snapshot_id == manifest.snapshot_id
                rejects, pages = current.rejects, (current.pages if failing else [])
                parsed_from = state.latest_snapshot_id
            rows = dead_letter_rows(manifest, rejects, pages, parsed_from)
            if rows and in_table.get(category):
                rows = keep_recorded_at(rows, wh.rows(dead_letters_table, category))
            object_store.sweep_temp_files(manifest.prefix, names=["dead_letters.json"])  # left by a crash
            # A snapshot this run opened is written without a read first (on S3 a GET, most
            # likely of a file not there yet); one an earlier run opened is read first.
            if rows or manifest.run_id == context.run_id or not lists_no_dead_letter(object_store, manifest):
                object_store.write_bytes_atomic(dead_letters_key(manifest), json.dumps(rows, indent=1).encode())
            # None now and none in the table: no transaction.
            counts[category] = wh.replace_partition(dead_letters_table, category, rows) if rows or in_table.get(category) else 0
            if rows:
                context.log.warning(f"{category}: {len(rows)} dead letter(s): " + "; ".join(f"{r['url']} ({r['reason']})" for r in rows[:5]))

    add_per_category(context, {"by_category": counts}, {"dead_letters": counts})
    return dg.MaterializeResult(
        metadata={
            "dead_letters": sum(counts.values()),
            "table": "dead_letters",
        }
    )
