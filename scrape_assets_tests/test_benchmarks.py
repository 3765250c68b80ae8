"""The benchmark harness's own logic (benchmarks/): what `make bench` launches and how it judges.

The benchmarks themselves take 13–40 minutes and are not run here; these tests keep the parts
that broke silently before from breaking again: the schedule's run request the daily-refresh
scenario launches, the verdicts, and the analysis that belongs to one run only.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

from benchmarks.report import analysis_lines, targets
from scrape_assets_tests.conftest import REPO_ROOT


def test_the_daily_scenario_gets_the_schedules_run_request_on_the_runs_own_instance(tmp_path):
    from scrape_assets.defs.partitions import category_partitions

    home = tmp_path / "dagster_home"
    home.mkdir()
    shutil.copy(REPO_ROOT / "dagster.yaml", home / "dagster.yaml")
    env = {k: v for k, v in os.environ.items() if not k.startswith("SCRAPE_")}
    env.update(DAGSTER_HOME=str(home), SCRAPE_DATA_DIR=str(tmp_path / "data"))
    done = subprocess.run([sys.executable, "-m", "benchmarks.schedule_request", "--at", "2026-01-02T02:00:00+00:00"],
                          env=env, cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    keys = category_partitions.get_partition_keys()
    assert json.loads(done.stdout) == {
        "dagster/asset_partition_range_start": keys[0],
        "dagster/asset_partition_range_end": keys[-1],
        "scrape/day": "2026-01-02",
        "dagster/max_runtime": "72000",
    }


def _run(wall_s: float, ok: bool = True, **more) -> dict:
    return {"wall_s": wall_s, "ok": ok, "in_run_s": None, "steps": {}, "rss_max_process_mb": 200.0, **more}


def _verdicts(results: dict) -> dict[str, str]:
    return {target.split(",")[0].split(" (")[0]: verdict for target, _measured, verdict in targets(results)}


def test_a_target_is_met_or_missed_only_on_runs_that_passed_their_checks():
    def results(ours_ok: bool) -> dict:
        return {"sizes": {"1000": {"throughput": {
            "16": {"ours": _run(4.0, ours_ok), "scrapy": _run(10.0)},
            "64": {"ours": _run(4.5), "scrapy": _run(10.0)},
        }}}}

    good = _verdicts(results(True))
    assert good["fetch+store+parse+load ≥ 2× Scrapy's pages/s"] == "met"
    assert good["throughput at c=64 not lower than at c=16"].startswith("missed: 88.9% of c=16")
    bad = _verdicts(results(False))  # a failed run is fast: it must not count as a win
    assert bad["fetch+store+parse+load ≥ 2× Scrapy's pages/s"] == "invalid: the pipeline run failed its check (see its log)"
    assert bad["throughput at c=64 not lower than at c=16"].startswith("invalid: the c=16 pipeline run failed")


def test_the_memory_target_is_judged_on_the_whole_process_tree():
    big = {"throughput": {"16": {"ours": _run(30.0, rss_max_process_mb=254.0, pss_peak_tree_mb=307.0),
                                 "scrapy": _run(100.0)}}}
    rows = {target: (measured, verdict) for target, measured, verdict in targets({"sizes": {"10000": big}})}
    measured, verdict = rows["peak RSS ≤ 300 MB at 10,000 pages"]
    assert verdict == "missed by 7 MB (the whole process tree's PSS)"
    assert measured.startswith("307 MB PSS of the whole process tree")


def test_the_analysis_is_embedded_only_in_the_report_of_its_own_run():
    text = "<!-- analysis of the run with pipeline source fingerprint abc123 -->\n## Analysis: the run\n\n9.5 s against 29.3 s\n"
    own = analysis_lines({"code_at_start": "abc123", "mode": "full"}, text)
    assert own[0].startswith("## Analysis: the run") and "<!--" not in own[0]
    for other in ({"code_at_start": "def456", "mode": "full"}, {"code_at_start": "abc123", "mode": "quick"}):
        lines = analysis_lines(other, text)
        assert "9.5 s against 29.3 s" not in "\n".join(lines)
        assert "was written for another run (pipeline source fingerprint `abc123`" in lines[2]


def test_the_published_analysis_names_the_run_of_the_published_report():
    report = (REPO_ROOT / "BENCHMARKS.md").read_text()
    analysis = (REPO_ROOT / "benchmarks" / "analysis.md").read_text()
    fingerprint = next(line for line in report.splitlines() if "pipeline source fingerprint" in line).split("`")[1]
    assert f"pipeline source fingerprint {fingerprint} -->" in analysis.splitlines()[0]
