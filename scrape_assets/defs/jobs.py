"""Jobs: ``daily_scrape_job`` (every asset), ``reparse_job`` (no fetching), ``load_job`` (tables only)."""


import dagster as dg

from scrape_assets.defs.partitions import category_partitions
from scrape_assets.settings import load_settings

#: Runs carrying this tag key queue one at a time (the shipped dagster.yaml limits it to 1 across values).
QUEUE_TAG = "scrape/day"

SCRAPE_ASSETS = ["raw_pages", "parsed_products", "products_table", "dead_letters"]
REPARSE_ASSETS = ["parsed_products", "products_table", "dead_letters"]
LOAD_ASSETS = ["products_table", "dead_letters"]

daily_scrape_job = dg.define_asset_job(
    "daily_scrape_job",
    selection=dg.AssetSelection.assets(*SCRAPE_ASSETS),
    partitions_def=category_partitions,
    description="Fetch, parse, validate and load categories (one run covers a range of categories).",
)

reparse_job = dg.define_asset_job(
    "reparse_job",
    selection=dg.AssetSelection.assets(*REPARSE_ASSETS),
    partitions_def=category_partitions,
    description="Re-parse saved pages and reload the tables: zero HTTP requests (after a parser fix).",
)

load_job = dg.define_asset_job(
    "load_job",
    selection=dg.AssetSelection.assets(*LOAD_ASSETS),
    partitions_def=category_partitions,
    description=(
        "Load the rows parsed_products already validated into the tables: no request, no parse "
        "(held_back_load_sensor launches it for categories a failed check held back)."
    ),
)


def partition_range_tags(first: str, last: str) -> dict[str, str]:
    """Run tags selecting the partitions ``first`` to ``last`` (in the spec's order) as one range."""
    return {"dagster/asset_partition_range_start": first, "dagster/asset_partition_range_end": last}


def all_categories_tags(partitions_def: dg.StaticPartitionsDefinition) -> dict[str, str]:
    """Run tags selecting every partition as one range (one run, one process start)."""
    keys = partitions_def.get_partition_keys()
    return partition_range_tags(keys[0], keys[-1])


def queue_tags(value: str) -> dict[str, str]:
    """Tags of a run that must not overlap a daily run: ``scrape/day`` (= ``value``, the day for
    a daily run) and ``dagster/max_runtime``.

    The shipped ``dagster.yaml`` lets one run with ``scrape/day`` (any value) go at a time;
    ``dagster/max_runtime`` (``SCRAPE_RESUME_MAX_AGE_H`` in seconds, >= 36) lets the daemon's
    run monitoring end one whose process died, which would otherwise hold that slot forever.
    """
    return {QUEUE_TAG: value, "dagster/max_runtime": str(int(load_settings().resume_max_age_h * 3600))}


defs = dg.Definitions(jobs=[daily_scrape_job, reparse_job, load_job])

__all__ = [
    "QUEUE_TAG", "all_categories_tags", "category_partitions", "daily_scrape_job", "defs", "load_job",
    "partition_range_tags", "queue_tags", "reparse_job",
]
