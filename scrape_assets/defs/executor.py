"""Dagster's in-process executor, tagging each run with the process running it first.

A run killed with SIGKILL stays "started"; :mod:`scrape_assets.run_processes` tells such a run
from a live one by the process tag (``dead_run_sensor``, the next ``scrape-assets demo``). The
tag is set here, when the run's steps start, not in ``raw_pages``: a run killed while its
``raw_pages`` still waits for the host's pool slot (S3 storage; Dagster hands the slot to the
longest waiting claim when the holder is failed) would otherwise hold the slot untagged, and
no one could tell it is dead. ``execute_in_process`` (``materialize()``, ``scrape-assets demo``)
swaps in Dagster's own executor: ``raw_pages`` tags those runs, the demo at launch.

Uses Dagster's private ``InProcessExecutor`` and its config field (dagster is pinned).
"""

from __future__ import annotations

from collections.abc import Iterator

import dagster as dg
from dagster._core.definitions.executor_definition import IN_PROC_CONFIG
from dagster._core.execution.retries import RetryMode
from dagster._core.execution.step_dependency_config import StepDependencyConfig
from dagster._core.executor.in_process import InProcessExecutor

from scrape_assets.run_processes import tag_run_process


class ProcessTaggingExecutor(InProcessExecutor):
    """:class:`InProcessExecutor` that tags the run with its process before any step starts."""

    def execute(self, plan_context, execution_plan) -> Iterator[dg.DagsterEvent]:  # noqa: ANN001 - Dagster's
        tag_run_process(plan_context.instance, plan_context.dagster_run)
        yield from super().execute(plan_context, execution_plan)


@dg.executor(name="in_process", config_schema=IN_PROC_CONFIG)
def in_process_executor(init_context: dg.InitExecutorContext) -> ProcessTaggingExecutor:
    """Dagster's ``in_process`` executor (same config), tagging the run with its process first."""
    config = init_context.executor_config
    return ProcessTaggingExecutor(
        retries=RetryMode.from_config(config["retries"]),
        marker_to_close=config.get("marker_to_close"),
        step_dependency_config=StepDependencyConfig.from_config(config.get("step_dependency_config")),
    )
