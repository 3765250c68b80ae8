"""``parsed_products``: product rows parsed from saved pages, validated by a blocking check."""


import dagster as dg

from scrape_assets.defs.partitions import category_partitions
from scrape_assets.defs.resources import ObjectStoreResource, SiteResource
from scrape_assets.errors import ManifestError
from scrape_assets.extract import (
    PARSER_VERSION,
    ParseState,
    extract_snapshot,
    input_version,
    load_current,
    load_parse_state,
    save_parse_state,
    save_parsed,
)
from scrape_assets.manifest import latest_manifest
from scrape_assets.schemas import products_frame, pages_frame, validate_parsed

SCHEMA_CHECK = "parsed_products_match_schema"


@dg.asset(
    deps=["raw_pages"],
    partitions_def=category_partitions,
    backfill_policy=dg.BackfillPolicy.single_run(),
    code_version=PARSER_VERSION,
    group_name="scrape",
    kinds={"python", "pandas"},
    check_specs=[
        dg.AssetCheckSpec(
            SCHEMA_CHECK,
            asset="parsed_products",
            blocking=True,
            description="pandera: types, required fields, price > 0, rating 1-5, unique keys, layout guard",
        )
    ],
)
def parsed_products(context: dg.AssetExecutionContext, site: SiteResource, store: ObjectStoreResource):
    """One row per product parsed from the latest complete snapshot's saved pages (no network).

    Writes ``parsed.json`` next to the snapshot. The blocking pandera check stops
    ``products_table`` (and ``dead_letters``) when any category in the run fails it.
    """
    spec = site.spec()
    object_store = store.store()
    all_products, all_pages = [], []
    per_category = {}
    with store.locks(context, spec.name):
        for category in context.partition_keys:
            manifest = latest_manifest(object_store, spec.name, category, complete=True)
            if manifest is None:
                raise ManifestError(
                    f"{spec.name}/{category}", "no complete snapshot: materialize raw_pages for this partition first"
                )
            version = input_version(manifest, spec)
            state = load_parse_state(object_store, spec.name, category)
            if state is not None and state.input_version == version:
                # Every page unchanged and the same parser: reuse the parse, re-parse nothing.
                parsed, _ = load_current(object_store, spec.name, category)
                pages_parsed, unchanged = 0, True
                note = f"unchanged since snapshot {state.snapshot_id}: 0 pages re-parsed"
            else:
                parsed = extract_snapshot(
                    object_store, manifest, spec, fetch_base_url=manifest.fetch_config.get("base_url", spec.base_url)
                )
                save_parsed(object_store, manifest, parsed)
                pages_parsed, unchanged = len(parsed.pages), False
                note = f"parsed {len(parsed.products)} products from {pages_parsed} pages of snapshot {manifest.snapshot_id}"
            save_parse_state(
                object_store,
                spec.name,
                category,
                ParseState(snapshot_id=parsed.snapshot_id, input_version=version, latest_snapshot_id=manifest.snapshot_id),
            )
            all_products += parsed.products
            all_pages += parsed.pages
            per_category[category] = {
                "snapshot_id": manifest.snapshot_id,
                "parsed_snapshot_id": parsed.snapshot_id,
                "products": len(parsed.products),
                "pages_parsed": pages_parsed,
                "unchanged": unchanged,
                "rejects": len(parsed.rejects),
            }
            context.log.info(f"{category}: {note} ({len(parsed.rejects)} rejected cards)")

    products = products_frame(all_products)
    report = validate_parsed(products, pages_frame(all_pages))
    if not report.passed:
        context.log.error(f"{SCHEMA_CHECK} failed: {report.failure_count} failure case(s): {report.by_check}")
    check = dg.AssetCheckResult(
        check_name=SCHEMA_CHECK,
        passed=report.passed,
        metadata={
            "failure_count": report.failure_count,
            "failures_by_check": dg.MetadataValue.json(report.by_check),
            "failure_cases": dg.MetadataValue.json(report.failure_cases),
            "rows_checked": len(products),
        },
    )
    return dg.MaterializeResult(
        metadata={
            "products": len(products),
            "pages_parsed": sum(c["pages_parsed"] for c in per_category.values()),
            "partitions_unchanged": sum(c["unchanged"] for c in per_category.values()),
            "by_category": dg.MetadataValue.json(per_category),
            "parser_version": PARSER_VERSION,
        },
        check_results=[check],
    )
