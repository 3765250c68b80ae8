"""``products_table``: the warehouse table ``products``, loaded idempotently per partition."""


import dagster as dg

from scrape_assets.defs.partitions import category_partitions
from scrape_assets.defs.resources import ObjectStoreResource, SiteResource, WarehouseResource
from scrape_assets.errors import ManifestError
from scrape_assets.extract import load_parsed
from scrape_assets.manifest import latest_manifest
from scrape_assets.schemas import PRODUCT_COLUMNS, pages_frame, products_frame, validate_parsed
from scrape_assets.warehouse import products

ROWS_CHECK = "products_table_matches_parsed"


class SchemaValidationFailed(dg.Failure):
    """Parsed rows failed the schema: the table is left untouched."""


def load_categories(context, site: SiteResource, store: ObjectStoreResource, warehouse: WarehouseResource):
    spec = site.spec()
    object_store = store.store()
    wh = warehouse.warehouse()
    loaded, problems = {}, []
    parsed_by_category = {}
    for category in context.partition_keys:
        manifest = latest_manifest(object_store, spec.name, category, complete=True)
        if manifest is None:
            raise ManifestError(f"{spec.name}/{category}", "no complete snapshot: materialize raw_pages first")
        parsed_by_category[category] = load_parsed(object_store, manifest)
    # Validate everything before touching the table: a bad partition loads nothing.
    for category, parsed in parsed_by_category.items():
        report = validate_parsed(products_frame(parsed.products), pages_frame(parsed.pages))
        if not report.passed:
            raise SchemaValidationFailed(
                description=f"{category}: parsed rows fail the schema ({report.by_check}); products_table not changed",
                metadata={"failure_cases": dg.MetadataValue.json(report.failure_cases)},
            )
    for category, parsed in parsed_by_category.items():
        rows = [{column: product[column] for column in PRODUCT_COLUMNS} for product in parsed.products]
        loaded[category] = wh.replace_partition(products, category, rows)
        count = wh.count(products, category)
        duplicates = wh.duplicate_product_keys(category)
        if count != len(rows) or duplicates:
            problems.append({"category": category, "rows_parsed": len(rows), "rows_in_table": count, "duplicates": len(duplicates)})
        context.log.info(f"{category}: loaded {loaded[category]} rows into products (snapshot {parsed.snapshot_id})")
    return wh, loaded, problems


@dg.asset(
    deps=["parsed_products"],
    partitions_def=category_partitions,
    backfill_policy=dg.BackfillPolicy.single_run(),
    group_name="scrape",
    kinds={"sql", "sqlite"},
    check_specs=[
        dg.AssetCheckSpec(ROWS_CHECK, asset="products_table", description="rows in table = rows parsed; no duplicate keys")
    ],
)
def products_table(
    context: dg.AssetExecutionContext, site: SiteResource, store: ObjectStoreResource, warehouse: WarehouseResource
):
    """The ``products`` table: one row per (category, product_id), replaced per partition.

    Delete-then-insert in one transaction per category: a rerun gives the same table.
    """
    with store.locks(context, site.spec().name):
        wh, loaded, problems = load_categories(context, site, store, warehouse)
    return dg.MaterializeResult(
        metadata={
            "rows_loaded": sum(loaded.values()),
            "rows_by_category": dg.MetadataValue.json(loaded),
            "table": "products",
            "warehouse": wh.describe(),
            "total_rows_in_table": wh.count(products),
        },
        check_results=[
            dg.AssetCheckResult(
                check_name=ROWS_CHECK,
                passed=not problems,
                metadata={"problems": dg.MetadataValue.json(problems), "categories_checked": len(loaded)},
            )
        ],
    )
