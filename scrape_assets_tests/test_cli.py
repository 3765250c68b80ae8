"""``scrape-assets demo``: one run on a real instance, progress, and a summary with figures."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import dagster as dg

from scrape_assets.warehouse import Warehouse, products


def test_demo_command_runs_all_categories_in_one_run_and_prints_summary(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("SCRAPE_")}
    home = tmp_path / "dagster_home"
    env.update(DAGSTER_HOME=str(home), SCRAPE_DATA_DIR=str(tmp_path / "data"))
    cli = Path(sys.executable).with_name("scrape-assets")
    done = subprocess.run([str(cli), "demo"], env=env, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout
    assert "12 categories in one run" in out
    assert "categories      12/12" in out
    assert "pages           38 done, 0 failed" in out
    assert "success rate    100.0%" in out
    assert "products loaded 678 (table `products`)" in out
    assert "dead letters    0 (table `dead_letters`)" in out
    assert f"raw pages       {tmp_path / 'data' / 'objects'}" in out
    assert "default: 12/12 pages done" in done.stderr  # progress lines from the crawl
    assert Warehouse(f"sqlite:///{tmp_path / 'data' / 'warehouse.db'}").count(products) == 678

    # The run is on the instance `make ui` opens: one run for all twelve categories.
    with dg.DagsterInstance.from_config(str(home)) as instance:
        runs = instance.get_runs()
        assert len(runs) == 1 and runs[0].job_name == "daily_scrape_job"
        assert runs[0].tags["dagster/asset_partition_range_end"] == "sequential-art"


def test_bad_settings_give_one_clear_error(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("SCRAPE_")}
    env.update(DAGSTER_HOME=str(tmp_path), SCRAPE_SITE="no_such_site")
    cli = Path(sys.executable).with_name("scrape-assets")
    done = subprocess.run([str(cli), "demo"], env=env, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1] == (
        "scrape-assets: error: no_such_site: unknown site: expected a shipped spec name "
        "(books_toscrape, demo) or a path to a .yaml file"
    )
    env.update(SCRAPE_SITE="demo", SCRAPE_MAX_ATTEMPTS="zero")
    done = subprocess.run([str(cli), "demo"], env=env, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 2
    assert "SCRAPE_MAX_ATTEMPTS='zero' is invalid: expected an integer ≥ 1" in done.stderr
