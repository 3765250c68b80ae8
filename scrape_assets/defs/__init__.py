"""Everything Dagster loads: partitions, resources, assets, checks, jobs, schedules, sensors."""

import warnings

import dagster as dg

# Single-run backfill policies are the documented way to run a range of partitions in
# one run; they are labelled beta in Dagster 1.13. Keep the console readable.
warnings.filterwarnings("ignore", category=dg.BetaWarning)
