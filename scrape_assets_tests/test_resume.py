"""Resume after a real kill: the second run fetches only the pages not yet done."""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

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


@pytest.fixture
def launched():
    """Processes a test started; any still running when it ends (a failed assertion, a timeout) are killed."""
    processes: list[subprocess.Popen] = []
    yield processes
    for process in processes:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=30)


def _materialize(env, select: str, launched: list) -> subprocess.Popen:
    dagster = Path(sys.executable).with_name("dagster")
    process = subprocess.Popen(
        [str(dagster), "asset", "materialize", "-m", "scrape_assets.definitions", "--select", select,
         "--partition", CATEGORY],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True,
    )
    launched.append(process)
    return process


@pytest.mark.parametrize("storage", ["local", "s3"])
def test_killed_run_resumes_fetching_only_pages_not_done(tmp_path, demo_server, storage, request, launched):
    # On S3 (moto's server on 127.0.0.1) every change is a PUT of the whole manifest: nothing can be appended.
    bucket = request.getfixturevalue("bucket")[0] if storage == "s3" else None  # sets AWS_* before _env copies them
    env = _env(tmp_path, demo_server.base_url)
    if bucket is not None:
        env["SCRAPE_STORAGE_URL"] = f"s3://{bucket}/objects"
    store = ObjectStore(env.get("SCRAPE_STORAGE_URL", str(tmp_path / "data" / "objects")))

    first = _materialize(env, "raw_pages", launched)
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

    if bucket is not None:
        _free_the_killed_runs_pool_slot(env, demo_server.base_url)

    killed = latest_manifest(store, "demo", CATEGORY)
    assert not killed.is_complete
    done_at_kill = {n for n, p in killed.pages.items() if p.status == "done"}
    assert 4 <= len(done_at_kill) < 12
    before = Counter(r.path for r in demo_server.requests if r.path.startswith(PAGE_PREFIX))

    # Resumed at another rate (the pace only: before, refused until the earlier rate was set again).
    second = _materialize({**env, "SCRAPE_REQUESTS_PER_SECOND": "50"}, "*", launched)
    _, err = second.communicate(timeout=300)
    assert second.returncode == 0, err[-3000:]
    assert f"{CATEGORY}: snapshot {killed.snapshot_id} goes on at the pace set now: requests_per_second 4.0 -> 50.0" \
        in err

    resumed = latest_manifest(store, "demo", CATEGORY)
    assert (killed.fetch_config["requests_per_second"], resumed.fetch_config["requests_per_second"]) == (4.0, 50.0)
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


def _free_the_killed_runs_pool_slot(env: dict, base_url: str) -> None:
    """What the README says to do after a SIGKILL on S3: free the run's slot of the host's pool.

    On S3 (no flock) ``raw_pages`` runs in the Dagster pool ``scrape-host-<host>``; a run
    killed with SIGKILL keeps its slot, so the next run's ``raw_pages`` would wait for it
    forever. This is the operation behind the run page's "Free concurrency slots" button.
    """
    import dagster as dg
    from dagster._core.instance.ref import InstanceRef

    from scrape_assets.defs.pools import host_pool

    with dg.DagsterInstance.from_ref(InstanceRef.from_dir(env["DAGSTER_HOME"])) as instance:
        (killed_run,) = instance.get_runs()
        pool = instance.event_log_storage.get_concurrency_info(host_pool(base_url))
        assert [slot.run_id for slot in pool.claimed_slots] == [killed_run.run_id]  # held by the dead run
        instance.event_log_storage.free_concurrency_slots_for_run(killed_run.run_id)
        assert instance.event_log_storage.get_concurrency_info(host_pool(base_url)).claimed_slots == []


def test_a_crawl_failing_cancels_what_is_in_flight_without_recording_failures(tmp_path):
    """Storage fails while other requests are in flight (robots.txt for another category, pages
    of the same category): all of them are cancelled before the client closes, their pages left
    pending (fetched on resume), none recorded failed by the closed client."""
    import asyncio
    import logging

    import pytest

    from scrape_assets.defs.assets.raw_pages import crawl_partitions
    from scrape_assets.defs.resources import ObjectStoreResource, SiteResource
    from scrape_assets.errors import StorageError
    from scrape_assets.faults import FaultSpec
    from scrape_assets_tests.fault_scenarios import fault_server

    class _Unwritable(ObjectStore):
        def write_bytes_atomic(self, key, data, *, sync_folder=True):
            if _UnwritableStore.refuses(key):
                raise StorageError(f"{self.describe()}/{key}", "write failed: [Errno 28] No space left on device")
            return super().write_bytes_atomic(key, data, sync_folder=sync_folder)

    class _UnwritableStore(ObjectStoreResource):
        refuses = staticmethod(lambda key: False)

        def store(self):
            return _Unwritable(self.url)

    def crawl(name, stall_match, refuses, categories, then=None):
        _UnwritableStore.refuses = staticmethod(refuses)
        store = _UnwritableStore(url=str(tmp_path / name))  # max_attempts=1: any attempt kept would dead-letter
        spec = FaultSpec.model_validate({"rules": [{"match": stall_match, "fault": "stall_after_headers", "first_n": 1}]})

        async def run():
            with pytest.raises(StorageError, match="No space left"):
                await crawl_partitions(site, store, categories, new_snapshot=False, log=logging.getLogger("t"))
            return [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]

        with fault_server(spec) as server:
            site = SiteResource(site="demo", base_url=server.base_url, timeout_s=5, max_attempts=1)
            assert asyncio.run(run()) == []  # nothing of the crawl is left running when it raises
            if then is not None:
                server.spec = FaultSpec()  # no more stalls either
                then(ObjectStore(store.url), lambda: asyncio.run(crawl_partitions(
                    site, _UnwritableStore(url=store.url), categories, new_snapshot=False, log=logging.getLogger("t"))))
        return ObjectStore(store.url)

    # travel's robots.txt is in flight (it stalls) when mystery's new manifest cannot be written.
    root = crawl("robots", r"robots\.txt$", lambda key: key.startswith("demo/mystery/"), ["travel", "mystery"])
    travel = latest_manifest(root, "demo", "travel")
    assert not travel.is_complete and (travel.pages[1].status, travel.pages[1].last_error) == ("pending", None)

    # default has 12 pages: page 3's body cannot be stored while page 2's request is in flight (it
    # stalls; the demo spec's 2 connections per host keep pages 4-12 waiting for a slot).
    def check_then_resume(root, resume):
        default = latest_manifest(root, "demo", "default")
        assert default.pages[1].status == "done" and len(default.pages) == 12
        assert [n for n, page in default.pages.items() if page.status == "failed"] == []
        assert {n for n, page in default.pages.items() if page.status == "pending"} == set(range(2, 13))
        # The attempts started and not finished are given back (page 3's by the storage error,
        # page 2's by the cancellation): with max_attempts=1, the resume fetches both.
        assert {n: page.attempts for n, page in default.pages.items() if n in (2, 3)} == {2: 0, 3: 0}
        _UnwritableStore.refuses = staticmethod(lambda key: False)  # storage works again
        [report] = resume()
        assert report.resumed and report.snapshot_id == default.snapshot_id
        assert (report.pages_done, report.pages_failed) == (12, 0)

    crawl("pages", r"default_15/page-(?!3\.)\d+\.html$", lambda key: key.endswith("/pages/page-0003.html"),
          ["default"], then=check_then_resume)


def test_a_crawl_cancelled_while_a_body_is_being_stored_gives_that_attempt_back(tmp_path):
    """The crawl is cancelled (its step stopping) while page 2's body is in a storage thread:
    page 2 stays pending with its attempt given back, the other pages keep what they did,
    and with max_attempts=1 the resume fetches page 2 instead of dead-lettering it."""
    import asyncio
    import logging
    import threading

    from scrape_assets.defs.assets.raw_pages import crawl_partitions
    from scrape_assets.defs.resources import ObjectStoreResource, SiteResource

    writing, release = threading.Event(), threading.Event()

    class _SlowPage2(ObjectStore):
        def write_bytes_atomic(self, key, data, *, sync_folder=True):
            if key.endswith("/pages/page-0002.html") and not release.is_set():
                writing.set()
                release.wait(10)  # the storage thread outlives the cancelled coroutine
            return super().write_bytes_atomic(key, data, sync_folder=sync_folder)

    class _Store(ObjectStoreResource):
        def store(self):
            return _SlowPage2(self.url)

    site = SiteResource(site="demo", max_concurrency=1, max_attempts=1)  # in-process demo: one page at a time
    store = _Store(url=str(tmp_path / "objects"))

    async def crawl_until_page2_is_being_stored():
        task = asyncio.ensure_future(
            crawl_partitions(site, store, [CATEGORY], new_snapshot=False, log=logging.getLogger("t")))
        while not writing.is_set() and not task.done():
            await asyncio.sleep(0.01)
        assert writing.is_set(), f"the crawl ended before page 2's body was stored: {task.exception()!r}"
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            return "cancelled"
        finally:
            release.set()  # the thread then stores the body: no matter, the manifest says pending
        return "finished"

    assert asyncio.run(crawl_until_page2_is_being_stored()) == "cancelled"
    manifest = latest_manifest(ObjectStore(store.url), "demo", CATEGORY)
    assert not manifest.is_complete
    assert (manifest.pages[1].status, manifest.pages[1].attempts) == ("done", 1)
    assert (manifest.pages[2].status, manifest.pages[2].attempts, manifest.pages[2].last_error) == ("pending", 0, None)

    [report] = asyncio.run(crawl_partitions(site, store, [CATEGORY], new_snapshot=False, log=logging.getLogger("t")))
    assert report.resumed and report.snapshot_id == manifest.snapshot_id
    assert (report.pages_done, report.pages_failed) == (12, 0)


def test_an_attempt_whose_record_cannot_be_stored_is_not_counted(tmp_path):
    """The attempt is recorded before its request is sent; if that record fails, nothing was sent.

    Counting it anyway would let a later save of the manifest (on S3, any sibling page's)
    store an attempt the site never saw, and a page could be dead-lettered early.
    """
    import asyncio

    import pytest

    from scrape_assets.crawl import PartitionCrawler
    from scrape_assets.errors import StorageError
    from scrape_assets.manifest import Manifest, PageEntry
    from scrape_assets.spec import load_spec

    class _JournalFull(ObjectStore):
        def append_bytes(self, key, data):
            raise StorageError(f"{self.describe()}/{key}", "append failed: [Errno 28] No space left on device")

    class _Fetcher:  # the PageFetcher contract: on_attempt is awaited before each request is sent
        sent = 0

        async def fetch(self, url, *, prior_attempts, on_attempt, **_):
            await on_attempt(prior_attempts + 1)
            _Fetcher.sent += 1
            raise AssertionError("not reached: the record failed")

    store = _JournalFull(str(tmp_path / "objects"))
    crawler = PartitionCrawler(load_spec("demo"), "travel", store, _Fetcher(), fetch_config={},
                               fetch_base_url="http://x/", max_attempts=3)
    crawler.manifest = Manifest(site="demo", category="travel", snapshot_id="2026-12-01T000000Z", fetch_config={},
                                fetch_config_hash="h", start_url="http://x/", pages={1: PageEntry(url="http://x/")})
    with pytest.raises(StorageError, match="No space left"):
        asyncio.run(crawler._fetch(1))
    assert crawler.manifest.pages[1].attempts == 0 and _Fetcher.sent == 0
    assert crawler._requests == 0


def test_a_journal_line_cut_short_by_a_full_disk_leaves_a_manifest_the_next_runs_resume(tmp_path):
    """The disk fills inside a journal append (half the line written, then ENOSPC): the crawl
    fails. The step's retry (same run id) resumes and, the disk filling again before any full
    save, fails too; the run after (another run id) resumes the same snapshot and completes it.
    Before, the retry's lines were appended right after the torn half-line, and every later
    load failed with "journal line N unreadable" until someone deleted the journal by hand."""
    import asyncio
    import logging

    import pytest

    from scrape_assets.defs.assets.raw_pages import crawl_partitions
    from scrape_assets.defs.resources import ObjectStoreResource, SiteResource
    from scrape_assets.errors import StorageError

    disk = {"appends": 0, "tear_at": 5, "bodies": 0, "full_after_bodies": None, "full": False}

    def no_space(store, key, what):
        return StorageError(f"{store.describe()}/{key}", f"{what} failed: [Errno 28] No space left on device")

    class _DiskFills(ObjectStore):
        def append_bytes(self, key, data):
            if disk["full"]:
                raise no_space(self, key, "append")
            disk["appends"] += 1
            if disk["appends"] == disk["tear_at"]:
                disk["full"] = True
                super().append_bytes(key, data[: len(data) // 2])  # what fitted before the disk was full
                raise no_space(self, key, "append")
            return super().append_bytes(key, data)

        def write_bytes_atomic(self, key, data, *, sync_folder=True):
            if key.endswith(".html"):
                disk["bodies"] += 1
                if disk["full_after_bodies"] is not None and disk["bodies"] >= disk["full_after_bodies"]:
                    disk["full"] = True
            if disk["full"]:
                raise no_space(self, key, "write")
            return super().write_bytes_atomic(key, data, sync_folder=sync_folder)

    class _Store(ObjectStoreResource):
        def store(self):
            return _DiskFills(self.url)

    site = SiteResource(site="demo", max_concurrency=1)
    store = _Store(url=str(tmp_path / "objects"))
    root = ObjectStore(store.url)

    def crawl(run_id):
        return asyncio.run(crawl_partitions(site, store, [CATEGORY], new_snapshot=False, log=logging.getLogger("t"),
                                            run_id=run_id))

    with pytest.raises(StorageError, match="No space left"):
        crawl("run-1")
    first = latest_manifest(root, "demo", CATEGORY)
    assert not first.is_complete and root.read_bytes(first.journal_key)[-1:] != b"\n"  # the torn half-line
    # The step's retry, same run: space is back, then the disk fills again two page bodies later.
    disk.update(full=False, bodies=0, full_after_bodies=3)
    with pytest.raises(StorageError, match="No space left"):
        crawl("run-1")
    journal = root.read_bytes(first.journal_key) if root.exists(first.journal_key) else b""
    assert all(line.startswith(b'{"seq":') and line.count(b'{"seq":') == 1 for line in journal.splitlines())
    second = latest_manifest(root, "demo", CATEGORY)
    assert second.snapshot_id == first.snapshot_id and sum(p.status == "done" for p in second.pages.values()) > \
        sum(p.status == "done" for p in first.pages.values())
    # The next run: the disk has room, the snapshot resumes and completes.
    disk.update(full=False, full_after_bodies=None)
    [report] = crawl("run-2")
    assert report.resumed and report.snapshot_id == first.snapshot_id
    assert (report.pages_done, report.pages_failed) == (12, 0)


def test_the_retry_of_a_new_snapshot_run_resumes_the_snapshots_it_opened(tmp_path, instance):
    """A run with ``new_snapshot: true`` (after a fetch-config change; ``demo --new-snapshot``)
    meets a storage error once, right before mystery page 2 is requested; the step's
    RetryPolicy retries it with the same config. The retry goes on with the snapshots the first attempt opened (travel
    complete: adopted; mystery: resumed), one new snapshot per category in all, each page
    asked once. Before, every retry opened yet another snapshot and fetched everything again."""
    import time

    from scrape_assets.faults import FaultSpec
    from scrape_assets.manifest import list_snapshots
    from scrape_assets_tests.conftest import make_resources, materialize
    from scrape_assets_tests.fault_scenarios import _FLAKY_BUDGET, FlakyObjectStoreResource, fault_server, page_path

    token = f"new-snapshot-retry-{time.monotonic_ns()}"
    _FLAKY_BUDGET[token] = 0
    pages = [page_path("travel", 1), page_path("mystery", 1), page_path("mystery", 2)]
    with fault_server(FaultSpec()) as server:
        resources = make_resources(tmp_path, base_url=server.base_url)
        resources["store"] = FlakyObjectStoreResource(url=str(tmp_path / "objects"), token=token)
        assert materialize(instance, resources, ["travel", "mystery"]).success  # yesterday's snapshots
        before = {p: server.attempts(p) for p in pages}
        _FLAKY_BUDGET[token] = 1  # the disk is full once, right before mystery page 2 is stored
        result = materialize(instance, resources, ["travel", "mystery"],
                             run_config={"ops": {"raw_pages": {"config": {"new_snapshot": True}}}})
        assert result.success
        asked = {p: server.attempts(p) - before[p] for p in pages}
    root = ObjectStore(str(tmp_path / "objects"))
    snapshots = {c: list_snapshots(root, "demo", c) for c in ("travel", "mystery")}
    assert {c: len(s) for c, s in snapshots.items()} == {"travel": 2, "mystery": 2}, snapshots
    assert asked == {pages[0]: 1, pages[1]: 1, pages[2]: 1}, asked  # the failed record came before its request
    assert all(latest_manifest(root, "demo", c).is_complete for c in snapshots)
    # Said in the run's log at WARNING, with why (Dagster logs its own retry at DEBUG only).
    warned = [e.user_message for e in instance.all_logs(result.run_id)
              if e.level >= logging.WARNING and "the step tries again" in e.user_message]
    assert len(warned) == 1 and warned[0].endswith(
        "write failed: [Errno 28] No space left on device: the step tries again (retry 1 of 3; the snapshots resume "
        "where they stopped)"), warned


def test_a_killed_sitemap_run_keeps_its_adopted_pages_and_resumes_the_rest(tmp_path, demo_server, launched):
    """``revalidate: sitemap``, killed after adopting pages 2-6 and while revalidating 7-12:
    the resumed snapshot asks none of the adopted pages, nor those done before the kill."""
    import datetime
    from email.utils import format_datetime, parsedate_to_datetime

    from scrape_assets.manifest import utc_now_iso

    demo_spec = REPO_ROOT / "scrape_assets" / "sites" / "demo.yaml"
    spec_file = tmp_path / "demo-sitemap.yaml"
    spec_file.write_text(demo_spec.read_text() + "incremental:\n  revalidate: sitemap\n  max_days_without_request: 365\n")
    env = _env(tmp_path, demo_server.base_url) | {"SCRAPE_SITE": str(spec_file)}
    store = ObjectStore(str(tmp_path / "data" / "objects"))

    first = _materialize(env | {"SCRAPE_REQUESTS_PER_SECOND": "100"}, "raw_pages", launched)
    _, err = first.communicate(timeout=300)
    assert first.returncode == 0, err[-3000:]
    saved = latest_manifest(store, "demo", CATEGORY, complete=True)
    for n in range(7, 13):  # as if saved a day before their current version: the sitemap dates them later
        lastmod = parsedate_to_datetime(saved.pages[n].last_modified)
        saved.pages[n].last_modified = format_datetime(lastmod - datetime.timedelta(days=1), usegmt=True)
        saved.pages[n].fetched_at = utc_now_iso(lastmod - datetime.timedelta(hours=23))
    saved.save(store)
    demo_server.clear_requests()

    second = _materialize(env, "raw_pages", launched)  # 4 requests/s, one at a time
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        manifest = latest_manifest(store, "demo", CATEGORY)
        if manifest.snapshot_id != saved.snapshot_id and sum(
                manifest.pages[n].status == "done" for n in range(7, 13) if n in manifest.pages) >= 2:
            break
        assert second.poll() is None, "the run ended before it could be killed"
        time.sleep(0.05)
    os.killpg(second.pid, signal.SIGKILL)
    second.wait(timeout=30)

    killed = latest_manifest(store, "demo", CATEGORY)
    assert killed.snapshot_id != saved.snapshot_id and not killed.is_complete
    assert [n for n, p in killed.pages.items() if p.assumed_unchanged] == [2, 3, 4, 5, 6]
    assert all(killed.pages[n].status == "done" for n in range(1, 7))
    revalidated_at_kill = {n for n in range(7, 13) if killed.pages[n].status == "done"}
    assert 2 <= len(revalidated_at_kill) < 6
    before = Counter(r.path for r in demo_server.requests if r.path.startswith(PAGE_PREFIX))

    third = _materialize(env, "raw_pages", launched)  # the killed run's settings: a resume refuses others
    _, err = third.communicate(timeout=300)
    assert third.returncode == 0, err[-3000:]

    resumed = latest_manifest(store, "demo", CATEGORY, complete=True)
    assert resumed.snapshot_id == killed.snapshot_id  # continued, not restarted
    assert [n for n, p in resumed.pages.items() if p.assumed_unchanged] == [2, 3, 4, 5, 6]
    assert resumed.counts()["done"] == 12
    for n in range(2, 7):  # adopted: the saved copy's body, no request in either run
        assert resumed.pages[n].body_key == saved.body_key(n)
    after = Counter(r.path for r in demo_server.requests if r.path.startswith(PAGE_PREFIX))
    page_path = {n: PAGE_PREFIX + ("index.html" if n == 1 else f"page-{n}.html") for n in range(1, 13)}
    assert [after[page_path[n]] for n in range(1, 7)] == [1, 0, 0, 0, 0, 0]  # page 1 (the check) once, before the kill
    for n in revalidated_at_kill:
        assert after[page_path[n]] == 1
    refetched = after - before
    assert sum(refetched.values()) == 6 - len(revalidated_at_kill)  # only the pages not done at the kill
    assert sum(after.values()) <= 1 + 6 + 1  # one in-flight page may repeat
    assert [r.path for r in demo_server.requests].count("/sitemap.xml") == 2  # once per run


def test_raw_pages_refuses_to_resume_a_snapshot_of_the_categorys_old_url(tmp_path):
    """The spec moved a category while its snapshot was incomplete: the run stops before any
    request, naming start_url; with new_snapshot a new snapshot of the new URL starts."""
    import asyncio
    import logging

    from scrape_assets.defs.assets.raw_pages import crawl_partitions
    from scrape_assets.defs.resources import ObjectStoreResource, SiteResource
    from scrape_assets.errors import FetchConfigChangedError
    from scrape_assets.manifest import open_snapshot

    site = SiteResource(site="demo")
    store = ObjectStoreResource(url=str(tmp_path / "objects"))
    object_store = store.store()
    old_url = site.spec().start_url("travel", site.fetch_base_url()).replace("travel_2", "nonfiction_13")
    old, _ = open_snapshot(object_store, site="demo", category="travel", start_url=old_url,
                           fetch_config=site.fetch_config())
    with pytest.raises(FetchConfigChangedError) as info:
        asyncio.run(crawl_partitions(site, store, ["travel"], new_snapshot=False, log=logging.getLogger("t")))
    assert info.value.differing_keys == ["start_url"]
    assert latest_manifest(object_store, "demo", "travel").snapshot_id == old.snapshot_id  # nothing opened, nothing fetched
    [report] = asyncio.run(crawl_partitions(site, store, ["travel"], new_snapshot=True, log=logging.getLogger("t")))
    fresh = latest_manifest(object_store, "demo", "travel")
    assert report.snapshot_id == fresh.snapshot_id != old.snapshot_id
    assert fresh.start_url != old_url and fresh.pages[1].url == fresh.start_url and fresh.is_complete


PAGE_2 = r"mystery_3/page-2\.html$"


def _stop_during_page_2s_back_off(site, store) -> None:
    """Crawl mystery until page 2's back-off is recorded in its manifest, then cancel the crawl
    (as a run stopped there; a SIGKILL leaves the same manifest)."""
    import asyncio
    import logging

    from scrape_assets.defs.assets.raw_pages import crawl_partitions

    def waiting() -> bool:
        manifest = latest_manifest(ObjectStore(store.url), "demo", "mystery")
        return manifest is not None and 2 in manifest.pages and manifest.pages[2].retry_at is not None

    async def run():
        crawl = asyncio.create_task(crawl_partitions(site, store, ["mystery"], new_snapshot=False,
                                                     log=logging.getLogger("t")))
        while not waiting():
            assert not crawl.done()
            await asyncio.sleep(0.02)
        crawl.cancel()
        with pytest.raises(asyncio.CancelledError):
            await crawl

    asyncio.run(run())


@contextlib.contextmanager
def _page_2_stopped_in_its_back_off(tmp_path, *, retry_after_s: float, max_attempts: int):
    """Yield ``(server, site, store)``: mystery's page 2 answered 503 with ``Retry-After:
    retry_after_s`` and the crawl was stopped during that back-off; the server still runs."""
    from scrape_assets.defs.resources import ObjectStoreResource, SiteResource
    from scrape_assets.faults import FaultSpec
    from scrape_assets_tests.fault_scenarios import fault_server

    store = ObjectStoreResource(url=str(tmp_path / "objects"))
    spec = FaultSpec.model_validate({"rules": [{"match": PAGE_2, "fault": "http_error", "status": 503,
                                                "retry_after_s": retry_after_s}]})
    with fault_server(spec) as server:
        site = SiteResource(site="demo", base_url=server.base_url, max_attempts=max_attempts)
        _stop_during_page_2s_back_off(site, store)
        yield server, site, store


def _resume_mystery(site, store):
    import asyncio
    import logging

    from scrape_assets.defs.assets.raw_pages import crawl_partitions

    [report] = asyncio.run(crawl_partitions(site, store, ["mystery"], new_snapshot=False, log=logging.getLogger("t")))
    return report


def test_a_resumed_page_waits_out_the_retry_after_its_last_answer_asked_for(tmp_path):
    """Mystery's page 2 answers 503 with Retry-After: 3; the crawl is stopped during that
    back-off and resumed at once. The manifest kept when the page may be asked again, so the
    resumed run waits out the rest instead of asking at once (RFC 9110 §10.2.3); the page's
    entry says why it waits, and forgets it once done."""
    from scrape_assets.faults import FaultSpec
    from scrape_assets.manifest import seconds_until

    with _page_2_stopped_in_its_back_off(tmp_path, retry_after_s=3, max_attempts=3) as (server, site, store):
        entry = latest_manifest(ObjectStore(store.url), "demo", "mystery").pages[2]
        assert (entry.status, entry.attempts, entry.http_status) == ("pending", 1, 503)
        assert entry.last_error.startswith("http_503")
        assert 1.5 < seconds_until(entry.retry_at) <= 4  # 3 s asked, rounded up to the second
        server.spec = FaultSpec()  # the site is fine again: only the wait is left
        resumed = time.monotonic()
        report = _resume_mystery(site, store)
        answers = [e for e in server.fault_log if e.path.endswith("mystery_3/page-2.html")]
    assert report.resumed and (report.pages_done, report.pages_failed) == (2, 0)
    assert [(e.attempt, e.status) for e in answers] == [(1, 503), (2, 200)]
    assert answers[1].at_s - answers[0].answered_s >= 3.0  # not before Retry-After, across the two runs
    assert answers[1].at_s - resumed > 1.0  # the resumed run waited (it started well inside the 3 s)
    entry = latest_manifest(ObjectStore(store.url), "demo", "mystery").pages[2]
    assert (entry.status, entry.attempts, entry.retry_at, entry.last_error) == ("done", 2, None, None)


def test_a_page_whose_last_attempt_was_cut_short_keeps_the_failure_before_it(tmp_path):
    """Page 2 failed with a 503, then a run died while its last allowed attempt was in flight:
    the resume dead-letters it without asking again, and the dead letter names that 503."""
    from scrape_assets.defs.assets.dead_letters import dead_letter_rows

    with _page_2_stopped_in_its_back_off(tmp_path, retry_after_s=1, max_attempts=2) as (server, site, store):
        manifest = latest_manifest(ObjectStore(store.url), "demo", "mystery")
        manifest.pages[2].attempts = 2  # the last attempt sent, then the process died
        manifest.save(ObjectStore(store.url))
        report = _resume_mystery(site, store)
        asked = [e for e in server.fault_log if e.path.endswith("mystery_3/page-2.html")]
    assert len(asked) == 1 and (report.pages_done, report.pages_failed) == (1, 1)  # not asked again
    resumed = latest_manifest(ObjectStore(store.url), "demo", "mystery")
    [letter] = dead_letter_rows(resumed, [])
    assert letter["recorded_at"] == resumed.pages[2].failed_at is not None  # when the resume recorded it
    assert letter["reason"].startswith("attempts_exhausted: interrupted on the last attempt (the one before: http_503")
    assert (letter["http_status"], letter["attempts"]) == (503, 2)


def test_the_crawls_progress_line_counts_the_retries(tmp_path):
    """Travel's page answers 503 once: the crawl's last progress line says 1 retry."""
    import logging

    from scrape_assets.defs.resources import ObjectStoreResource, SiteResource
    from scrape_assets.faults import FaultSpec
    from scrape_assets_tests.fault_scenarios import fault_server

    lines: list[str] = []

    class Recorder(logging.Logger):
        def info(self, msg, *args, **kwargs):
            lines.append(str(msg))

    spec = FaultSpec.model_validate({"rules": [{"match": r"travel_2/index\.html$", "fault": "http_error",
                                                "status": 503, "retry_after_s": 0, "first_n": 1}]})
    with fault_server(spec) as server:
        site = SiteResource(site="demo", base_url=server.base_url, max_attempts=3)
        import asyncio

        from scrape_assets.defs.assets.raw_pages import crawl_partitions

        [report] = asyncio.run(crawl_partitions(site, ObjectStoreResource(url=str(tmp_path / "objects")), ["travel"],
                                                new_snapshot=False, log=Recorder("t")))
    assert (report.pages_done, report.pages_failed) == (1, 0)
    assert lines[-1].startswith("1/1 pages done, 0 failed for good, 1 retry; 1/1 categories complete; ")


@contextlib.contextmanager
def _mystery_crawled_then_reopened(tmp_path, rule: dict, *, max_attempts: int, lose_page_2s_body: bool = False):
    """Crawl mystery once (``rule`` a fault on its page 2), then make that complete snapshot
    look as a run that died before completing it left it (``completed_at`` unset), page 2's
    body lost too if asked (a power loss). Yields ``(server, site, store, manifest)``, the server
    still running."""
    from scrape_assets.defs.resources import ObjectStoreResource, SiteResource
    from scrape_assets.faults import FaultSpec
    from scrape_assets_tests.fault_scenarios import fault_server

    store = ObjectStoreResource(url=str(tmp_path / "objects"))
    with fault_server(FaultSpec.model_validate({"rules": [{"match": PAGE_2, **rule}]})) as server:
        site = SiteResource(site="demo", base_url=server.base_url, max_attempts=max_attempts)
        _resume_mystery(site, store)  # (a new snapshot: there is none yet)
        objects = ObjectStore(store.url)
        manifest = latest_manifest(objects, "demo", "mystery")
        if lose_page_2s_body:
            (tmp_path / "objects" / manifest.page_key(2)).unlink()
        manifest.completed_at = None
        manifest.save(objects)
        yield server, site, store, manifest


def test_a_page_done_on_its_last_allowed_attempt_whose_body_was_lost_is_fetched_again_on_resume(tmp_path):
    """Page 2 answered 503 once, then 200 on its second and last allowed attempt; its body is
    lost (a power loss) before the snapshot completed. The resume asks it again with a new retry
    budget: it was fetched fine, it is not a page whose last attempt was cut short."""
    with _mystery_crawled_then_reopened(
            tmp_path, {"fault": "http_error", "status": 503, "retry_after_s": 0, "first_n": 1},
            max_attempts=2, lose_page_2s_body=True) as (server, site, store, before):
        assert (before.pages[2].status, before.pages[2].attempts) == ("done", 2)
        report = _resume_mystery(site, store)
        asked = [e.status for e in server.fault_log if e.path.endswith("mystery_3/page-2.html")]
    assert report.resumed and (report.pages_done, report.pages_failed) == (2, 0)
    assert asked == [503, 200, 200]  # asked again, not dead-lettered "interrupted on the last attempt"
    entry = latest_manifest(ObjectStore(store.url), "demo", "mystery").pages[2]
    assert (entry.status, entry.attempts, entry.last_error) == ("done", 1, None)
    assert (tmp_path / "objects" / before.page_key(2)).exists()


def test_a_resumed_snapshots_progress_line_counts_the_pages_that_failed_before(tmp_path):
    """The run that died had dead-lettered page 2 (404): the resume's last progress line counts
    it among the failed, as the snapshot's totals do, without asking it again."""
    import logging

    lines: list[str] = []

    class Recorder(logging.Logger):
        def info(self, msg, *args, **kwargs):
            lines.append(str(msg))

    import asyncio

    from scrape_assets.defs.assets.raw_pages import crawl_partitions

    with _mystery_crawled_then_reopened(tmp_path, {"fault": "http_error", "status": 404},
                                        max_attempts=2) as (server, site, store, _):
        asked = len(server.fault_log)
        [report] = asyncio.run(crawl_partitions(site, store, ["mystery"], new_snapshot=False, log=Recorder("t")))
        assert len(server.fault_log) == asked  # nothing left to ask
    assert report.resumed and (report.pages_done, report.pages_failed) == (1, 1)
    assert lines[-1].startswith("1/2 pages done, 1 failed for good; 1/1 categories complete; ")


def test_an_adopted_complete_snapshot_is_left_as_it_is_even_with_a_body_missing(tmp_path):
    """A complete snapshot adopted (completed by a run that died before recording it) is not
    crawled again: none of its done pages is turned back to pending, even one whose body is
    gone (that snapshot would say complete with a page pending, and its report one page short)."""
    import asyncio
    import logging

    from scrape_assets.defs.assets.raw_pages import crawl_partitions
    from scrape_assets.defs.resources import ObjectStoreResource, SiteResource
    from scrape_assets.faults import FaultSpec
    from scrape_assets_tests.fault_scenarios import fault_server

    store = ObjectStoreResource(url=str(tmp_path / "objects"))
    with fault_server(FaultSpec()) as server:
        site = SiteResource(site="demo", base_url=server.base_url, max_attempts=2)
        _resume_mystery(site, store)
        before = latest_manifest(ObjectStore(store.url), "demo", "mystery")
        (tmp_path / "objects" / before.page_key(2)).unlink()
        asked = len(server.fault_log)
        [report] = asyncio.run(crawl_partitions(site, store, ["mystery"], new_snapshot=False, log=logging.getLogger("t"),
                                                adopt_complete=lambda _manifest: True))
        assert len(server.fault_log) == asked
    assert (report.resumed, report.snapshot_id, report.requests_made) == (True, before.snapshot_id, 0)
    assert (report.pages_done, report.pages_failed) == (2, 0)
    after = latest_manifest(ObjectStore(store.url), "demo", "mystery")
    assert after.is_complete and [p.status for p in after.pages.values()] == ["done", "done"]


def test_a_page_adopted_on_resume_forgets_the_attempt_an_earlier_run_made_on_it(tmp_path):
    """A resumed sitemap run adopts page 2 from the previous snapshot after the run that died had
    one 503 on it: the adopted (done) entry carries the copy's state, not that run's error and
    back-off (a done page saying it waits out a Retry-After, or failed with http_503)."""
    from scrape_assets.crawl import PartitionCrawler
    from scrape_assets.manifest import Manifest, PageEntry
    from scrape_assets.spec import load_spec

    def manifest(snapshot_id: str, page_2: PageEntry) -> Manifest:
        return Manifest(site="demo", category="travel", snapshot_id=snapshot_id, fetch_config={},
                        fetch_config_hash="h", start_url="http://x/", pages={2: page_2})

    previous = manifest("2026-12-01T000000Z", PageEntry(
        url="http://x/page-2.html", status="done", attempts=1, http_status=200, content_hash="sha256:b", bytes=10,
        fetched_at="2026-12-01T00:00:00Z", etag='"e"', content_type="text/html"))
    crawler = PartitionCrawler(load_spec("demo"), "travel", ObjectStore(str(tmp_path / "objects")), None,
                               fetch_config={}, fetch_base_url="http://x/", max_attempts=3)
    crawler.manifest = manifest("2026-12-02T000000Z", PageEntry(
        url="http://x/page-2.html", attempts=1, http_status=503, last_error="http_503: Service Unavailable",
        retry_at="2026-12-02T00:00:10Z"))
    crawler._adopt(2, previous, 2)
    entry = crawler.manifest.pages[2]
    assert (entry.status, entry.assumed_unchanged, entry.http_status, entry.etag) == ("done", True, 200, '"e"')
    assert entry.body_key == previous.page_key(2) and entry.content_hash == "sha256:b"
    assert (entry.last_error, entry.retry_at) == (None, None)


def test_an_error_of_ours_during_an_attempt_fails_the_step_and_the_dead_letter_keeps_it(tmp_path, monkeypatch):
    """Not the site's answer: an exception that is no FetchError (here the transport raising
    OverflowError, as the demo catalogue did for SCRAPE_DEMO_DATE=0001-01-01) fails the crawl
    at once, and the page records what happened. Its attempt still counts, as a crash's does,
    so a page that makes this happen every time becomes a dead letter after max_attempts runs
    (step retries) instead of failing every run, and the dead letter says why (before:
    "attempts_exhausted: interrupted on the last attempt", the error lost; it was not interrupted)."""
    import asyncio
    import logging

    import httpx

    from scrape_assets import demo_site
    from scrape_assets.defs.assets.raw_pages import crawl_partitions
    from scrape_assets.defs.resources import ObjectStoreResource, SiteResource

    real = demo_site.DemoTransport.handle_async_request

    async def broken(self, request: httpx.Request) -> httpx.Response:
        if "/travel_2/" in request.url.path:
            raise OverflowError("date value out of range")
        return await real(self, request)

    monkeypatch.setattr(demo_site.DemoTransport, "handle_async_request", broken)
    store = ObjectStore(str(tmp_path / "objects"))

    def crawl():
        return asyncio.run(crawl_partitions(SiteResource(site="demo"), ObjectStoreResource(url=store.url), ["travel"],
                                            new_snapshot=False, log=logging.getLogger("test")))

    for attempt in (1, 2, 3):  # the run and its step's retries
        with pytest.raises(OverflowError):
            crawl()
        entry = latest_manifest(store, "demo", "travel").pages[1]
        assert (entry.status, entry.attempts, entry.last_error) == (
            "pending", attempt, f"unexpected_error on attempt {attempt}: OverflowError: date value out of range")
    [report] = crawl()  # the next run: its last allowed attempt was used
    entry = latest_manifest(store, "demo", "travel").pages[1]
    assert (report.pages_failed, entry.status, entry.last_error) == (1, "failed", (
        "attempts_exhausted: unexpected_error on attempt 3: OverflowError: date value out of range"))


def test_a_resumed_snapshots_log_says_which_of_its_pages_this_run_did(tmp_path, instance, monkeypatch):
    """After a kill, the snapshot's pages done count those the killed run fetched; the 304s,
    requests and failures said with them are this run's: the line says how many pages
    were this run's, so "done minus 304s" is not read as pages downloaded whole."""
    from scrape_assets.demo_site import DATE_ENV_VAR
    from scrape_assets_tests.conftest import make_resources, materialize

    monkeypatch.setenv(DATE_ENV_VAR, "2026-12-01")  # one catalogue day, however long the test runs (midnight)
    res = make_resources(tmp_path)
    assert materialize(instance, res, ["mystery"], selection=["raw_pages"]).success
    store = ObjectStore(str(tmp_path / "objects"))
    manifest = latest_manifest(store, "demo", "mystery")
    manifest.completed_at = None  # killed before its last page was recorded
    manifest.pages[2].status = "pending"
    manifest.save(store)
    result = materialize(instance, res, ["mystery"], selection=["raw_pages"])
    lines = "\n".join(e.user_message for e in instance.all_logs(result.run_id))
    assert (f"mystery: snapshot {manifest.snapshot_id} (resumed): 2 done, 1 of them this run (0 not modified: 304), "
            "0 failed, 1 request, ") in lines
    assert "1 category: 2 pages done, 1 of them this run (0 not modified: 304), 0 failed, 1 request" in lines
    again = materialize(instance, res, ["mystery"], selection=["raw_pages"])  # a new snapshot: every page 304
    lines = "\n".join(e.user_message for e in instance.all_logs(again.run_id))
    assert "1 category: 2 pages done (2 not modified: 304), 0 failed, 2 requests" in lines
