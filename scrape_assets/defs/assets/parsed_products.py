"""``parsed_products``: product rows parsed from saved pages, validated by a blocking check."""

import dagster as dg
import pydantic

from scrape_assets.batched_log import BatchedLog
from scrape_assets.counts import counted
from scrape_assets.defs.assets.partition_metadata import add_per_category
from scrape_assets.defs.partitions import (category_partitions, consecutive_ranges, range_label, run_categories,
                                           site_spec)
from scrape_assets.defs.resources import ObjectStoreResource, SiteResource
from scrape_assets.errors import ScrapeError
from scrape_assets.extract import PARSER_VERSION, load_parse_state, parser_code_version
from scrape_assets.spec import SiteSpec
from scrape_assets.storage import ObjectStore
from scrape_assets.validation_report import ValidationReport, describe_failures, merge_reports

SCHEMA_CHECK = "parsed_products_match_schema"
COUNT_CHECK = "parsed_products_match_site_count"
#: Retries of the step after a parse worker died (out of memory, say), and the wait before each.
WORKER_DIED_RETRIES = 2
WORKER_DIED_WAIT_S = 5.0


class ParsedProductsConfig(dg.Config):
    """Run config of ``parsed_products``."""

    parse_workers: int = pydantic.Field(
        default=0, ge=0, description="processes parsing categories at once; 0 = one per CPU (at most 4)"
    )


@dg.asset(
    deps=["raw_pages"],
    partitions_def=category_partitions,
    backfill_policy=dg.BackfillPolicy.single_run(),
    # The parser and the spec's parsing rules: editing a selector marks it stale too (once reloaded).
    code_version=parser_code_version(site_spec),
    group_name="scrape",
    kinds={"python", "pandas"},
    check_specs=[
        dg.AssetCheckSpec(
            SCHEMA_CHECK,
            asset="parsed_products",
            blocking=True,
            description="pandera: types, required fields, price > 0, rating 1-5, unique keys, layout guard",
        ),
        dg.AssetCheckSpec(
            COUNT_CHECK,
            asset="parsed_products",
            blocking=False,
            description="a warning: fewer product cards found in a category than the results count its site "
                        "shows (every page fetched): pages the crawl did not reach (pagination, max_pages)? Or its "
                        "pages disagree on the results or page count: the listing changed during the crawl, and "
                        "products_table keeps the earlier rows of products not seen",
        ),
    ],
)
def parsed_products(
    context: dg.AssetExecutionContext, config: ParsedProductsConfig, site: SiteResource, store: ObjectStoreResource
):
    """One row per product parsed from the latest complete snapshot's saved pages (no network).

    Writes ``parsed.json`` next to the snapshot. Categories are parsed in parallel worker
    processes (``parse_workers``). The blocking pandera check stops ``products_table`` (and
    ``dead_letters``) when any category in the run fails it. A worker process that dies
    (:class:`~scrape_assets.parse_run.ParseWorkerDied`) makes the step try again, up to
    :data:`WORKER_DIED_RETRIES` times :data:`WORKER_DIED_WAIT_S` apart; each retry parses only
    the categories not finished before.
    """
    # Imported here, not at module level: keeps pandas + pandera (~0.3 s) out of every process
    # that loads the definitions (UI code server, sensors); only validation imports them.
    from scrape_assets.parse_run import ParseWorkerDied, default_workers, parse_partitions

    spec = site.spec()
    object_store = store.store()
    reports, per_category, why, counts, moved = [], {}, [], {}, {}
    workers = config.parse_workers or default_workers()
    log = BatchedLog(context.log.info)
    categories = run_categories(context)  # a range the spec lacks fails here, saying what to do
    try:
        with store.locks(context, spec.name):
            for result in parse_partitions(object_store, spec, categories, workers=workers):
                per_category[result.category] = result.figures
                if result.products_expected is not None:
                    counts[result.category] = (result.figures["products"] + result.figures["rejects"],
                                               result.products_expected)
                if result.listing_moved is not None:
                    moved[result.category] = result.listing_moved
                if result.report is not None:
                    reports.append(result.report)
                    if not result.report.passed:
                        why.append((result.category, describe_failures(result.report)))
                log.add(result.line)
    except ParseWorkerDied as exc:
        # A crash, not a verdict on the data: the step's retry parses only the categories
        # not saved yet (the others' parse states match their input).
        retries = context.retry_number
        if retries < WORKER_DIED_RETRIES:
            context.log.warning(f"{exc}; the step tries again in {WORKER_DIED_WAIT_S:.0f} s "
                                f"(retry {retries + 1} of {WORKER_DIED_RETRIES})")
            raise dg.RetryRequested(max_retries=WORKER_DIED_RETRIES, seconds_to_wait=WORKER_DIED_WAIT_S) from exc
        raise dg.Failure(description=f"{exc} (after {counted(retries, 'retry')})", allow_retries=False) from exc
    totals = {key: sum(c[key] for c in per_category.values())
              for key in ("products", "pages_parsed", "unchanged", "validated_again", "rejects")}
    log.close(
        f"{counted(len(per_category), 'category')}: {counted(totals['pages_parsed'], 'page')} parsed"
        + (f" (up to {counted(workers, 'worker process')})" if totals["pages_parsed"] else "")
        + f", {counted(totals['unchanged'], 'category')} unchanged"
        + (f" ({totals['validated_again']} of them validated again)" if totals["validated_again"] else "")
        + f", {counted(totals['products'], 'product')}, {counted(totals['rejects'], 'rejected card')}"
    )

    report = merge_reports(reports) if reports else ValidationReport(passed=True, failure_count=0)
    if not report.passed:
        context.log.error(f"{SCHEMA_CHECK} failed: {report.failure_count} failure case(s) in "
                          f"{counted(len(why), 'category')}, whose rows are not loaded (the table keeps the earlier "
                          "ones; every case is in the check's failure_cases, in the UI):\n"
                          + "\n".join(f"  {category}: {text}" for category, text in why)
                          + held_back_commands(categories, [category for category, _ in why]))
    # Dagster 1.13 keeps one result per run for the check, not one per category: the UI shows
    # the latest run's. A run that leaves a failing category out must not read as "all pass".
    elsewhere = _failing_elsewhere(object_store, spec, categories)
    description = None
    if elsewhere:
        description = (f"{counted(len(elsewhere), 'category')} outside this run still failing this check since "
                       f"an earlier run, rows held back: {', '.join(elsewhere)}")
        context.log.warning(f"{SCHEMA_CHECK}: {description} (`scrape-assets summary` lists them)")
    check = dg.AssetCheckResult(
        check_name=SCHEMA_CHECK,
        passed=report.passed,
        description=description,
        metadata={
            "still_failing_outside_this_run": dg.MetadataValue.json(elsewhere),
            "failure_count": report.failure_count,
            "failures_by_check": dg.MetadataValue.json(report.by_check),
            "failed_categories": dg.MetadataValue.json(dict(why)),
            "failure_cases": dg.MetadataValue.json(report.failure_cases),
            "rows_checked": sum(c["products"] for c in per_category.values()
                                if not c["unchanged"] or c["validated_again"]),
            "partitions_checked": len(reports),
        },
    )
    # Fewer cards than the site counts: pages not reached. More is no sign of that (a card
    # the site repeats on every page counts on each; a count that omits some listings).
    mismatched = {c: {"cards_found": found, "site_says": says} for c, (found, says) in counts.items() if found < says}
    for category, figures in mismatched.items():
        context.log.warning(f"{category}: {counted(figures['cards_found'], 'product card')} found on its pages, the site "
                            f"says {figures['site_says']} results: pages the crawl did not reach (pagination, the "
                            "spec's max_pages)?")
    for category, how in moved.items():
        context.log.warning(f"{category}: the snapshot may not have seen every product ({how}): the listing changed "
                            "while its pages were fetched, a page was served again for another, or pages were not "
                            "reached; products_table keeps the earlier rows of products this snapshot did not see, "
                            "as after a failed page")
    count_check = dg.AssetCheckResult(
        check_name=COUNT_CHECK,
        passed=not (mismatched or moved),
        severity=dg.AssetCheckSeverity.WARN,
        metadata={"mismatched": dg.MetadataValue.json(mismatched), "categories_compared": len(counts),
                  "listing_moved": dg.MetadataValue.json(moved)},
    )
    add_per_category(context, {"by_category": per_category},
                     {"products": {c: row["products"] for c, row in per_category.items()}})
    return dg.MaterializeResult(
        metadata={
            "products": totals["products"],
            "pages_parsed": totals["pages_parsed"],
            "partitions_unchanged": totals["unchanged"],
            "parser_version": PARSER_VERSION,
        },
        check_results=[check, count_check],
    )


def held_back_commands(categories: list[str], failing: list[str]) -> str:
    """The lines that say how to load what a failed schema check held back in a run of
    ``categories``: the categories that passed (``products_table,dead_letters``) and the
    failing ones' dead letters, one command per consecutive range of partition keys (a
    range cannot skip a key). ``held_back_load_sensor`` runs the same after a run the daemon
    sees; a command-line run (``dagster asset materialize``, CI) has only these lines."""
    keys = category_partitions.get_partition_keys()

    def commands(chosen: list[str], selection: str) -> list[str]:
        return [f"  dagster asset materialize -m scrape_assets.definitions --select {selection} --partition"
                + ("" if first == last else "-range") + f" {range_label(first, last)}"
                for first, last in consecutive_ranges(chosen, keys)]

    passed = [c for c in categories if c not in failing]
    lines = commands(passed, "products_table,dead_letters") + commands(failing, "dead_letters")
    if not lines:
        return ""
    what = "the failing categories' dead letters are held back too"
    if passed:
        what = (f"{counted(len(passed), 'other category', 'other categories')} of this run passed and "
                + ("is" if len(passed) == 1 else "are") + " held back with the failing ones (whose dead letters are "
                "held back too)")
    return (f"\n{what}: after a run launched by the schedule, the UI or a backfill, held_back_load_sensor "
            "loads them; after a command-line run, load them with:\n" + "\n".join(lines))


def _failing_elsewhere(store: ObjectStore, spec: SiteSpec, categories: list[str]) -> list[str]:
    """The spec's categories outside ``categories`` whose latest parse failed the schema check
    (their parse state says so), sorted; a state that cannot be read (damaged, storage down)
    is left out. Reads one small file per such category, one after another (on S3 some 10-30
    ms each: N runs of one category each read N * (N - 1) in all); none in a run over
    every category."""
    in_run, failing = set(categories), []
    for category in spec.categories:
        if category in in_run:
            continue
        try:
            state = load_parse_state(store, spec.name, category)
        except (ScrapeError, OSError):  # unreadable or storage down: a hint, not worth failing the step
            continue
        if state is not None and not state.validated:
            failing.append(category)
    return sorted(failing)
