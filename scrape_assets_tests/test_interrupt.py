"""Terminate, SIGTERM and Ctrl-C stop a crawl: real `dagster asset materialize` processes, a real server.

Dagster retries an interrupted step that has a RetryPolicy (raw_pages has one, for
crashes), so without care a terminated run went on fetching and ended in success.
"""

from __future__ import annotations

import datetime
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from scrape_assets.defs.assets.raw_pages import INTERRUPTED
from scrape_assets.demo_site import make_server
from scrape_assets.manifest import latest_manifest, list_snapshots
from scrape_assets.storage import ObjectStore
from scrape_assets_tests.conftest import serving

DAY = datetime.date(2026, 11, 30)
PAGES = 38  # the demo catalogue's listing pages
DAGSTER = Path(sys.executable).with_name("dagster")


def _materialize(tmp_path, base_url: str) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SCRAPE_")}
    env.update(DAGSTER_HOME=str(tmp_path / "home"), SCRAPE_DATA_DIR=str(tmp_path / "data"), SCRAPE_BASE_URL=base_url,
               SCRAPE_REQUESTS_PER_SECOND="4")  # ~10 s for the catalogue: time to interrupt it
    (tmp_path / "home").mkdir(exist_ok=True)
    return subprocess.Popen(
        [str(DAGSTER), "asset", "materialize", "-m", "scrape_assets.definitions", "--select", "raw_pages",
         "--partition-range", "travel...sequential-art"],
        env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _page_requests(server) -> int:
    return sum(1 for r in server.requests if r.path != "/robots.txt")


def _interrupted(tmp_path, server, sig: signal.Signals) -> tuple[int, int, str]:
    """Start a run, send ``sig`` once it has fetched a few pages; (exit code, page requests at the signal, output)."""
    process = _materialize(tmp_path, server.base_url)
    try:
        deadline = time.monotonic() + 120
        while _page_requests(server) < 3 and process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        at_signal = _page_requests(server)
        assert at_signal < PAGES, "the crawl finished before it could be interrupted"
        process.send_signal(sig)
        output, _ = process.communicate(timeout=60)
    finally:
        process.kill()
    return process.returncode, at_signal, output


@pytest.mark.timeout(300)
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM (Terminate)", "SIGINT (Ctrl-C)"])
def test_an_interrupted_crawl_stops_without_a_retry_and_the_next_run_resumes(tmp_path, sig):
    with serving(make_server("127.0.0.1", 0, day=DAY)) as server:
        returncode, at_signal, output = _interrupted(tmp_path, server, sig)
        after = _page_requests(server)
        assert returncode == 1, output[-3000:]
        assert INTERRUPTED in output and "RUN_FAILURE" in output
        assert "STEP_UP_FOR_RETRY" not in output and "STEP_RESTARTED" not in output  # the crawl did not go on
        assert after <= at_signal + 4  # at most the requests already in flight (the spec's max_concurrency: 4)
        store = ObjectStore(str(tmp_path / "data" / "objects"))
        interrupted = {c: latest_manifest(store, "demo", c) for c in ("travel", "default")}
        assert any(m is None or not m.is_complete for m in interrupted.values())  # stopped mid-snapshot
        if sig != signal.SIGTERM:
            return
        # The next run resumes each snapshot: pages saved before the interrupt are not asked again.
        process = _materialize(tmp_path, server.base_url)
        output, _ = process.communicate(timeout=240)
        assert process.returncode == 0, output[-3000:]
        assert "(resumed)" in output
        assert PAGES <= _page_requests(server) <= PAGES + 4  # each page once, plus those in flight at the interrupt
        for category in ("travel", "default"):
            assert len(list_snapshots(store, "demo", category)) == 1
            assert latest_manifest(store, "demo", category).is_complete
