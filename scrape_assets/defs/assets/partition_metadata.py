"""Per-category metadata on each partition's own materialization, and reading it back.

A run over N categories records one materialization per asset and partition. The assets'
per-category tables (``by_category``, ``rows_by_category``, ``rows_loaded_by_category``)
go only to the partition they describe, as a one-entry table ``{category: value}``, with
the category's main figures as plain numbers (``category_success_rate``,
``category_products``...: what the UI plots per partition); the run totals
(``pages_done``, ``success_rate``, ``products``, ...: unprefixed) are on every partition. A table with all N
categories on each of the N events made the event log grow as N² (37 KB per
``raw_pages`` event at 100 categories) and slowed every run's bookkeeping.

:func:`merged_metadata` puts a run's events back together: totals once, tables merged;
:func:`metadata_by_asset` does it for every asset of a run.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import dagster as dg

#: Metadata keys holding ``{category: value}`` tables.
PER_CATEGORY_KEYS = ("by_category", "rows_by_category", "rows_loaded_by_category")
#: Prefix of a partition's own figures (``category_success_rate``...): plain numbers on its
#: materialization, so the UI's plots of a partition follow that category, where the
#: unprefixed figures (``success_rate``, ``products``...) are the whole run's.
CATEGORY_FIGURE_PREFIX = "category_"


def add_per_category(context: dg.AssetExecutionContext, tables: Mapping[str, Mapping[str, Any]],
                     figures: Mapping[str, Mapping[str, int | float]] | None = None) -> None:
    """Attach each category's row of ``tables``, and its ``figures``, to that partition's materialization.

    Args:
        context: the asset's context; its ``partition_keys`` are the categories of the run.
        tables: metadata key -> ``{category: JSON-serialisable value}``; a category missing
            from a table gets no entry for it.
        figures: name -> ``{category: number}``, recorded as ``category_<name>`` (a plain
            number, plotted by the UI per partition); a category missing gets none.
    """
    for category in context.partition_keys:
        rows: dict[str, Any] = {key: dg.MetadataValue.json({category: table[category]})
                                for key, table in tables.items() if category in table}
        rows.update({CATEGORY_FIGURE_PREFIX + name: values[category]
                     for name, values in (figures or {}).items() if values.get(category) is not None})
        if rows:
            context.add_asset_metadata(rows, partition_key=category)


def merged_metadata(metadatas: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """One run's metadata for one asset, from its partitions' materializations.

    Args:
        metadatas: the ``metadata`` of each materialization (values may be Dagster
            ``MetadataValue`` objects or plain values).

    Returns:
        Plain values: each scalar from the first materialization (run totals are the same
        on all), each :data:`PER_CATEGORY_KEYS` table merged over all of them. Events
        written before per-partition tables (the whole table on each) merge the same way.
    """
    out: dict[str, Any] = {}
    for metadata in metadatas:
        for key, raw in metadata.items():
            if key.startswith(CATEGORY_FIGURE_PREFIX):
                continue  # one partition's own figure: the tables hold every category's
            value = getattr(raw, "value", raw)
            if key in PER_CATEGORY_KEYS and isinstance(value, Mapping):
                out.setdefault(key, {}).update(value)
            else:
                out.setdefault(key, value)
    return out


def metadata_by_asset(materializations: Iterable[dg.AssetMaterialization]) -> dict[str, dict[str, Any]]:
    """A run's materializations as ``{asset key (user string): merged_metadata(...)}``."""
    by_asset: dict[str, list] = {}
    for materialization in materializations:
        by_asset.setdefault(materialization.asset_key.to_user_string(), []).append(materialization.metadata)
    return {asset: merged_metadata(metadatas) for asset, metadatas in by_asset.items()}
