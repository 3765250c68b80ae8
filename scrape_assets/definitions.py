"""The one composition root: Definitions built from the modules in ``defs/``."""

from __future__ import annotations

import dagster as dg

from scrape_assets.defs import jobs, schedules, sensors
from scrape_assets.defs.assets.dead_letters import dead_letters
from scrape_assets.defs.assets.parsed_products import parsed_products
from scrape_assets.defs.assets.products_table import products_table
from scrape_assets.defs.assets.raw_pages import raw_pages
from scrape_assets.defs.executor import in_process_executor
from scrape_assets.defs.resources import build_resources
from scrape_assets.gc_tuning import apply_gc_policy
from scrape_assets.instance_storage import configured_event_batch_size

configured_event_batch_size()  # a bad value stops here, before `dagster asset materialize` creates a run

# Steps run in the run's own process (in_process_executor): the four steps are sequential
# anyway, and a process per step cost ~1.5 s each (measured in BENCHMARKS.md); a crash of
# the run process is then one event for the whole run, which resumes from the manifests.
defs = dg.Definitions.merge(
    dg.Definitions(
        assets=[raw_pages, parsed_products, products_table, dead_letters],
        resources=build_resources(),
        executor=in_process_executor,  # Dagster's, tagging the run with its process first
    ),
    jobs.defs,
    schedules.defs,
    sensors.defs,
)

# Last: everything above is loaded and long-lived (see gc_tuning for what this saves).
apply_gc_policy()
