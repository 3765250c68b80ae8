"""Resume after a real kill: the second run fetches only the pages not yet done."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

from scrape_assets.manifest import latest_manifest, list_snapshots
from scrape_assets.storage import ObjectStore
from scrape_assets.warehouse import Warehouse, products
from scrape_assets_tests.conftest import REPO_ROOT

CATEGORY = "default"  # 12 pages in the demo catalogue
PAGE_PREFIX = "/catalogue/category/books/default_15/"


def _env(tmp_path: Path, base_url: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SCRAPE_")}
    home = tmp_path / "dagster_home"
    home.mkdir(exist_ok=True)
    # The shipped instance settings (pools, run queue): a killed run must not block its restart.
    shutil.copy(REPO_ROOT / "dagster.yaml", home / "dagster.yaml")
    env.update(
        DAGSTER_HOME=str(home),
        SCRAPE_BASE_URL=base_url,
        SCRAPE_DATA_DIR=str(tmp_path / "data"),
        SCRAPE_REQUESTS_PER_SECOND="4",  # slow enough to kill it half-way
        SCRAPE_MAX_CONCURRENCY="1",
    )
    return env


def _materialize(env, select: str) -> subprocess.Popen:
    dagster = Path(sys.executable).with_name("dagster")
    return subprocess.Popen(
        [str(dagster), "asset", "materialize", "-m", "scrape_assets.definitions", "--select", select,
         "--partition", CATEGORY],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True,
    )


def test_killed_run_resumes_fetching_only_pages_not_done(tmp_path, demo_server):
    env = _env(tmp_path, demo_server.base_url)
    store = ObjectStore(str(tmp_path / "data" / "objects"))

    first = _materialize(env, "raw_pages")
    deadline = time.monotonic() + 120
    done_at_kill: set[int] = set()
    while time.monotonic() < deadline:
        manifest = latest_manifest(store, "demo", CATEGORY) if store.exists(f"demo/{CATEGORY}") else None
        if manifest is not None:
            done_at_kill = {n for n, p in manifest.pages.items() if p.status == "done"}
            if len(done_at_kill) >= 4:
                break
        assert first.poll() is None, "the run ended before it could be killed"
        time.sleep(0.05)
    os.killpg(first.pid, signal.SIGKILL)
    first.wait(timeout=30)
    assert first.returncode == -signal.SIGKILL

    killed = latest_manifest(store, "demo", CATEGORY)
    assert not killed.is_complete
    done_at_kill = {n for n, p in killed.pages.items() if p.status == "done"}
    assert 4 <= len(done_at_kill) < 12
    before = Counter(r.path for r in demo_server.requests if r.path.startswith(PAGE_PREFIX))

    second = _materialize(env, "*")
    _, err = second.communicate(timeout=300)
    assert second.returncode == 0, err[-3000:]

    resumed = latest_manifest(store, "demo", CATEGORY)
    assert resumed.snapshot_id == killed.snapshot_id  # continued, not restarted
    assert list_snapshots(store, "demo", CATEGORY) == [killed.snapshot_id]
    assert resumed.is_complete and resumed.counts()["done"] == 12

    after = Counter(r.path for r in demo_server.requests if r.path.startswith(PAGE_PREFIX))
    refetched = after - before
    done_paths = {killed.page_key(n).rsplit("/", 1)[1] for n in done_at_kill}
    # Pages done before the kill were never requested again.
    for n in done_at_kill:
        path = PAGE_PREFIX + ("index.html" if n == 1 else f"page-{n}.html")
        assert after[path] == 1, (path, done_paths)
    # Every other page once more at most; in-flight pages (≤ concurrency 1) may repeat.
    assert sum(refetched.values()) == 12 - len(done_at_kill)
    assert sum(after.values()) <= 12 + 1
    for n, entry in resumed.pages.items():
        if n not in done_at_kill:
            assert entry.attempts >= 1

    wh = Warehouse(f"sqlite:///{tmp_path / 'data' / 'warehouse.db'}")
    assert wh.count(products, CATEGORY) == 232
    assert wh.duplicate_product_keys() == []


def test_a_category_failing_cancels_the_others_without_recording_failures(tmp_path):
    """The crawl of travel is in flight (robots.txt stalls) when mystery's storage fails: travel is
    cancelled before the client closes, its page left pending (fetched on resume), not failed."""
    import asyncio
    import logging

    import pytest

    from scrape_assets.defs.assets.raw_pages import crawl_partitions
    from scrape_assets.defs.resources import ObjectStoreResource, SiteResource
    from scrape_assets.errors import StorageError
    from scrape_assets.faults import FaultSpec
    from scrape_assets_tests.fault_scenarios import fault_server

    class _MysteryUnwritable(ObjectStore):
        def write_bytes_atomic(self, key, data, *, sync_folder=True):
            if key.startswith("demo/mystery/"):
                raise StorageError(f"{self.describe()}/{key}", "write failed: [Errno 28] No space left on device")
            return super().write_bytes_atomic(key, data, sync_folder=sync_folder)

    class _Store(ObjectStoreResource):
        def store(self):
            return _MysteryUnwritable(self.url)

    root = tmp_path / "objects"
    stall = FaultSpec.model_validate({"rules": [{"match": r"robots\.txt$", "fault": "stall_after_headers", "first_n": 1}]})
    with fault_server(stall) as server:
        site = SiteResource(site="demo", base_url=server.base_url, timeout_s=5)
        with pytest.raises(StorageError, match="No space left"):
            asyncio.run(crawl_partitions(site, _Store(url=str(root)), ["travel", "mystery"], new_snapshot=False,
                                         log=logging.getLogger("test")))
    travel = latest_manifest(ObjectStore(str(root)), "demo", "travel")
    assert travel is not None and not travel.is_complete
    page = travel.pages[1]
    assert (page.status, page.last_error) == ("pending", None)  # not "failed: robots_unreachable"
