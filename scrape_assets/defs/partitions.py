"""``category_partitions``: one static partition per category of the configured site."""


import os

import dagster as dg

from scrape_assets.settings import load_settings
from scrape_assets.spec import SiteSpec, load_spec


def build_category_partitions(spec: SiteSpec) -> dg.StaticPartitionsDefinition:
    """Partition keys = the spec's category keys, in spec order (so ranges follow the file)."""
    return dg.StaticPartitionsDefinition(list(spec.categories))


def configured_spec() -> SiteSpec:
    """The spec ``SCRAPE_SITE`` names, read now (from the file, each call).

    Raises:
        SettingsError, SpecError: the setting or the spec is not valid.
    """
    return load_spec(load_settings().site)


#: The spec the definitions are loaded with (``SCRAPE_SITE``): its categories are the partition
#: keys, its parsing rules part of ``parsed_products``' code version.
site_spec = configured_spec()
category_partitions = build_category_partitions(site_spec)
_told_ephemeral: set[str] = set()  # runs already warned that their instance is temporary (once per run)
#: The folder prefix of the instance Dagster's CLI makes in the current folder when DAGSTER_HOME
#: is unset (dagster._cli.utils.TMP_DAGSTER_HOME_PREFIX; pinned Dagster, tested by a CLI run).
_CLI_TEMPORARY_HOME = ".tmp_dagster_home_"


def _temporary(instance: dg.DagsterInstance) -> bool:
    """Whether ``instance`` vanishes with its process: an in-memory one, or the folder Dagster's
    CLI makes (and deletes) in the current folder without DAGSTER_HOME, a persistent instance
    to Dagster."""
    if instance.is_ephemeral:
        return True
    try:
        return os.path.basename(os.path.normpath(instance.root_directory)).startswith(_CLI_TEMPORARY_HOME)
    except Exception:  # noqa: BLE001 - an instance class without a root folder: not the CLI's
        return False


def run_categories(context: dg.AssetExecutionContext) -> list[str]:
    """The run's categories: its partition keys, in the spec's order.

    Raises:
        dagster.Failure: (not retried) the run's partition range selects no category, its ends
            given in the reverse of the spec's order (Dagster runs such a range as empty); or
            it names a category the loaded spec does not have (the spec changed after the
            code location loaded, or a typo).
    """
    try:
        keys = list(context.partition_keys)
    except dg.DagsterInvalidInvocationError as exc:  # "... Nonexistent partition keys: [...]"
        order = context.assets_def.partitions_def.get_partition_keys()
        shown = ", ".join(order[:12]) + (f", ... ({len(order)} in all)" if len(order) > 12 else "")
        raise dg.Failure(
            description=(  # what to do first: an alert shortens the text
                "the run's categories are not the spec's (renamed or removed since the code location loaded?): "
                "reload the code location (restart `make ui` or `dagster dev`, or Reload in the UI's Deployment "
                f"page) and launch again. {' '.join(str(exc).split())}. The spec's categories, as this run's process "
                f"read it: {shown}"
            ),
            allow_retries=False,
        ) from exc
    if not keys:
        bounds = context.partition_key_range
        order = context.assets_def.partitions_def.get_partition_keys()
        raise dg.Failure(
            description=(
                f"the partition range {bounds.start}...{bounds.end} selects no category: a range follows the order "
                f"of the spec's categories ({', '.join(order)}); give the earlier one first"
            ),
            allow_retries=False,
        )
    if _temporary(context.instance) and context.run_id not in _told_ephemeral:
        _told_ephemeral.add(context.run_id)
        context.log.warning(
            "this run is on a temporary Dagster instance (DAGSTER_HOME is not set): nothing of it is kept when the "
            "command ends, and the UI, the sensors and the schedule never see it; set DAGSTER_HOME to the instance's "
            "folder (the clone's .dagster_home, or the server's)")
    return keys


def consecutive_ranges(chosen: list[str], keys: list[str]) -> list[tuple[str, str]]:
    """``chosen`` as ``(first, last)`` ranges of consecutive keys in ``keys`` order; those not
    in ``keys`` (a category since removed from the spec: no partition to run) are left out."""
    ranges: list[list[str]] = []
    last = None
    for index in sorted(keys.index(k) for k in chosen if k in keys):
        if last is not None and index == last + 1:
            ranges[-1][1] = keys[index]
        else:
            ranges.append([keys[index], keys[index]])
        last = index
    return [(first, end) for first, end in ranges]


def range_label(first: str, last: str) -> str:
    """A partition range as Dagster's CLI takes it: ``first...last``, or ``first`` alone."""
    return first if first == last else f"{first}...{last}"
