"""``parsed_products``: product rows parsed from saved pages, validated by a blocking check."""


from dataclasses import replace

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
from scrape_assets.schemas import ValidationReport, merge_reports, pages_frame, products_frame, validate_parsed
from scrape_assets.spec import SiteSpec
from scrape_assets.storage import ObjectStore

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
    reports, per_category = [], {}
    with store.locks(context, spec.name):
        # One category at a time: parse, save, validate, drop (memory stays one category's worth).
        for category in context.partition_keys:
            per_category[category], report = parse_category(object_store, spec, category, log=context.log)
            if report is not None:
                reports.append(report)

    report = merge_reports(reports) if reports else ValidationReport(passed=True, failure_count=0)
    if not report.passed:
        context.log.error(f"{SCHEMA_CHECK} failed: {report.failure_count} failure case(s): {report.by_check}")
    check = dg.AssetCheckResult(
        check_name=SCHEMA_CHECK,
        passed=report.passed,
        metadata={
            "failure_count": report.failure_count,
            "failures_by_check": dg.MetadataValue.json(report.by_check),
            "failure_cases": dg.MetadataValue.json(report.failure_cases),
            "rows_checked": sum(c["products"] for c in per_category.values() if not c["unchanged"]),
            "partitions_checked": len(reports),
        },
    )
    return dg.MaterializeResult(
        metadata={
            "products": sum(c["products"] for c in per_category.values()),
            "pages_parsed": sum(c["pages_parsed"] for c in per_category.values()),
            "partitions_unchanged": sum(c["unchanged"] for c in per_category.values()),
            "by_category": dg.MetadataValue.json(per_category),
            "parser_version": PARSER_VERSION,
        },
        check_results=[check],
    )


def parse_category(store: ObjectStore, spec: SiteSpec, category: str, *, log) -> tuple[dict, ValidationReport | None]:
    """Parse (or reuse) one partition's latest complete snapshot and validate its rows.

    Returns:
        ``(figures, report)``; ``report`` is None when the input is unchanged since a parse
        that passed validation (nothing is read, parsed or validated again).

    Raises:
        ManifestError: the partition has no complete snapshot yet.
    """
    manifest = latest_manifest(store, spec.name, category, complete=True)
    if manifest is None:
        raise ManifestError(f"{spec.name}/{category}", "no complete snapshot: materialize raw_pages for this partition first")
    version = input_version(manifest, spec)
    state = load_parse_state(store, spec.name, category)
    figures = {"snapshot_id": manifest.snapshot_id, "pages_parsed": 0, "unchanged": False}
    if state is not None and state.input_version == version and state.validated:
        # Every page unchanged, same parser and rules, rows already valid: nothing to do.
        save_parse_state(store, spec.name, category, replace(state, latest_snapshot_id=manifest.snapshot_id))
        log.info(f"{category}: unchanged since snapshot {state.snapshot_id}: 0 pages re-parsed")
        return {**figures, "parsed_snapshot_id": state.snapshot_id, "products": state.products,
                "rejects": state.rejects, "unchanged": True}, None
    if state is not None and state.input_version == version:
        parsed, _ = load_current(store, spec.name, category)  # same input, failed validation before
    else:
        parsed = extract_snapshot(store, manifest, spec, fetch_base_url=manifest.fetch_config.get("base_url", spec.base_url))
        save_parsed(store, manifest, parsed)
        figures["pages_parsed"] = len(parsed.pages)
    report = validate_parsed(products_frame(parsed.products), pages_frame(parsed.pages))
    save_parse_state(
        store,
        spec.name,
        category,
        ParseState(
            snapshot_id=parsed.snapshot_id,
            input_version=version,
            latest_snapshot_id=manifest.snapshot_id,
            validated=report.passed,
            products=len(parsed.products),
            rejects=len(parsed.rejects),
        ),
    )
    log.info(
        f"{category}: parsed {len(parsed.products)} products from {figures['pages_parsed']} pages of snapshot "
        f"{parsed.snapshot_id} ({len(parsed.rejects)} rejected cards; schema {'passed' if report.passed else 'FAILED'})"
    )
    return {**figures, "parsed_snapshot_id": parsed.snapshot_id, "products": len(parsed.products),
            "rejects": len(parsed.rejects)}, report
