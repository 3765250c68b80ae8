"""``category_partitions``: one static partition per category of the configured site."""


import dagster as dg

from scrape_assets.settings import load_settings
from scrape_assets.spec import load_spec


def build_category_partitions(site: str) -> dg.StaticPartitionsDefinition:
    """Partition keys = the spec's category keys, in spec order (so ranges follow the file)."""
    return dg.StaticPartitionsDefinition(list(load_spec(site).categories))


category_partitions = build_category_partitions(load_settings().site)
