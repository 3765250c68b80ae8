"""Concurrent runs: partition locks, the per-host pool across runs, parallel SQLite loads."""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from scrape_assets.errors import PartitionLockedError
from scrape_assets.locks import host_lock, host_lock_name, partition_lock
from scrape_assets.manifest import latest_manifest, list_snapshots, load_manifest
from scrape_assets.storage import ObjectStore
from scrape_assets.warehouse import Warehouse, products
from scrape_assets_tests.conftest import REPO_ROOT

DAGSTER = str(Path(sys.executable).with_name("dagster"))


def _env(tmp_path: Path, name: str, *, pools: bool, **extra) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SCRAPE_")}
    home = tmp_path / f"home-{name}"
    home.mkdir(exist_ok=True)
    if pools:
        shutil.copy(REPO_ROOT / "dagster.yaml", home / "dagster.yaml")
    else:
        (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    env.update(DAGSTER_HOME=str(home), SCRAPE_DATA_DIR=str(tmp_path / "data"), **extra)
    return env


def _start(env, select: str, partition: str) -> subprocess.Popen:
    return subprocess.Popen(
        [DAGSTER, "asset", "materialize", "-m", "scrape_assets.definitions", "--select", select, "--partition", partition],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )


def _wait_for_fetching(store: ObjectStore, category: str, proc: subprocess.Popen, pages: int = 2) -> None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if store.exists(f"demo/{category}"):
            manifest = latest_manifest(store, "demo", category)
            if manifest and manifest.counts()["done"] >= pages:
                return
        assert proc.poll() is None, proc.communicate()[1][-2000:]
        time.sleep(0.05)
    raise AssertionError("the first run never started fetching")


def test_lock_is_exclusive_names_the_holder_and_dies_with_it(tmp_path):
    store = ObjectStore(str(tmp_path))
    with partition_lock(store, "demo", "travel", owner="run-A"):
        with pytest.raises(PartitionLockedError) as info:
            with partition_lock(store, "demo", "travel", owner="run-B"):
                pass
        assert "raw_pages of run run-A (pid" in str(info.value) and "SCRAPE_LOCK_WAIT_S" in str(info.value)
        with partition_lock(store, "demo", "mystery", owner="run-B"):  # other partitions are free
            pass
    with partition_lock(store, "demo", "travel", owner="run-B"):
        pass
    # A holder killed with SIGKILL releases the lock (the kernel drops the flock).
    holder = subprocess.Popen(
        [sys.executable, "-c", (
            "import sys, time; from scrape_assets.storage import ObjectStore; "
            "from scrape_assets.locks import partition_lock\n"
            f"with partition_lock(ObjectStore({str(tmp_path)!r}), 'demo', 'travel', owner='doomed'):\n"
            "    print('held', flush=True); time.sleep(600)"
        )],
        stdout=subprocess.PIPE, text=True,
    )
    assert holder.stdout.readline().strip() == "held"
    with pytest.raises(PartitionLockedError, match="run doomed"):
        with partition_lock(store, "demo", "travel", owner="run-C"):
            pass
    holder.kill()
    holder.wait()
    with partition_lock(store, "demo", "travel", owner="run-C", wait_s=5):
        pass


def test_second_run_of_the_same_partition_stops_with_a_clear_message(tmp_path, demo_server):
    # 12 pages at 1.5 requests/s: the first run is still fetching when the second has started.
    env = _env(tmp_path, "nopool", pools=False, SCRAPE_BASE_URL=demo_server.base_url,
               SCRAPE_REQUESTS_PER_SECOND="1.5", SCRAPE_MAX_CONCURRENCY="1")
    store = ObjectStore(str(tmp_path / "data" / "objects"))
    first = _start(env, "raw_pages", "default")
    _wait_for_fetching(store, "default", first, pages=1)
    second = _start(env, "raw_pages", "default")
    _, err2 = second.communicate(timeout=120)
    _, err1 = first.communicate(timeout=300)
    assert first.returncode == 0, err1[-2000:]
    assert second.returncode != 0
    assert "partition 'demo/default' is being written by another run: raw_pages of run " in err2
    # The first run's snapshot is whole: one snapshot, every page fetched exactly once.
    assert len(list_snapshots(store, "demo", "default")) == 1
    manifest = latest_manifest(store, "demo", "default")
    assert manifest.is_complete and manifest.counts() == {"pending": 0, "done": 12, "failed": 0, "attempts": 12}
    pages = [r.path for r in demo_server.requests if r.path.startswith("/catalogue/")]
    assert len(pages) == len(set(pages)) == 12


@pytest.mark.parametrize("spellings", [
    ["http://example.com/", "http://Example.COM:80/shop/", "http://example.com./", "example.com:80",
     "http://example.com\u3002/"],  # an ideographic full stop: a dot to IDNA
    ["https://bücher.example/", "https://xn--bcher-kva.example:443/"],
    ["https://straße.de/", "https://xn--strae-oqa.de/", "https://STRAßE.DE./"],  # IDNA 2008, as httpx
])
def test_one_host_lock_however_the_host_is_spelled(tmp_path, spellings):
    """Host case, a trailing dot, an explicit default port, Unicode or punycode: one host,
    one lock (each spelling used to get a lock file of its own, so two runs fetched at once)."""
    assert len({host_lock_name(s) for s in spellings}) == 1
    store = ObjectStore(str(tmp_path))
    with host_lock(store, spellings[0], owner="run-A", wait_s=0):
        for other in spellings[1:]:
            with pytest.raises(PartitionLockedError):
                with host_lock(store, other, owner="run-B", wait_s=0):
                    pass


def test_a_long_host_name_or_user_info_makes_a_usable_lock_name(tmp_path):
    long_host = "a" * 60 + "." + "b" * 60 + ".example.com"  # 133 characters: a valid host name
    store = ObjectStore(str(tmp_path))
    with host_lock(store, f"http://{long_host}/", owner="run-A", wait_s=0):
        pass
    assert host_lock_name(f"http://{long_host}/") != host_lock_name("http://" + "a" * 60 + ".other.example.com/")
    assert "secret" not in host_lock_name("http://user:secret@example.com/")  # user info is no part of a host
    assert host_lock_name("http://example.com:8080/") != host_lock_name("http://example.com/")


def test_hosts_that_idna_2003_would_merge_get_a_lock_each():
    """straße.de and strasse.de are two hosts for httpx (IDNA 2008: ß is kept, xn--strae-oqa.de);
    the lock names used Python's IDNA 2003 codec, which maps ß to "ss": one lock for both
    (and another for xn--strae-oqa.de, the name httpx fetches straße.de by)."""
    from scrape_assets.defs.pools import host_pool

    assert host_lock_name("https://straße.de/") == host_lock_name("https://xn--strae-oqa.de/") == "host-xn--strae-oqa.de=443"
    assert host_lock_name("https://strasse.de/") == "host-strasse.de=443"
    assert host_pool("https://straße.de/") == "scrape-host-xn--strae-oqa.de"
    assert host_pool("https://strasse.de/") == "scrape-host-strasse.de"


def test_host_lock_serialises_fetching_across_runs(tmp_path, demo_server):
    """A second run of another category waits for the host instead of doubling the request rate."""
    rps = 2.0  # 12 pages take 6 s: the second run starts while the first is still fetching
    env = _env(tmp_path, "pool", pools=True, SCRAPE_BASE_URL=demo_server.base_url,
               SCRAPE_REQUESTS_PER_SECOND=str(rps), SCRAPE_MAX_CONCURRENCY="1")
    store = ObjectStore(str(tmp_path / "data" / "objects"))
    first = _start(env, "raw_pages", "default")
    _wait_for_fetching(store, "default", first, pages=1)
    second = _start(env, "raw_pages", "nonfiction")
    out1, err1 = first.communicate(timeout=300)
    out2, err2 = second.communicate(timeout=300)
    assert first.returncode == 0, err1[-2000:]
    assert second.returncode == 0, err2[-2000:]
    # Two hosts' worth of limits never overlapped: requests stay ≥ 1/rps apart (10% slack).
    times = sorted(r.at_s for r in demo_server.requests if r.path.startswith("/catalogue/"))
    assert len(times) == 12 + 6
    gaps = [b - a for a, b in zip(times, times[1:])]
    assert min(gaps) >= 0.9 / rps, min(gaps)
    for category, pages in (("default", 12), ("nonfiction", 6)):
        assert latest_manifest(store, "demo", category).counts()["done"] == pages


def test_parallel_processes_load_sqlite_without_database_is_locked(tmp_path):
    categories = ["travel", "mystery", "classics", "romance"]
    procs = [
        _start(_env(tmp_path, c, pools=False), "*", c)  # in-process demo host: no network
        for c in categories
    ]
    results = [p.communicate(timeout=300) for p in procs]
    for proc, (_, err) in zip(procs, results):
        assert proc.returncode == 0, err[-2000:]
        assert "database is locked" not in err
    wh = Warehouse(f"sqlite:///{tmp_path / 'data' / 'warehouse.db'}")
    assert {c: wh.count(products, c) for c in categories} == {"travel": 11, "mystery": 32, "classics": 19, "romance": 35}
    assert wh.duplicate_product_keys() == []
    store = ObjectStore(str(tmp_path / "data" / "objects"))
    for c in categories:
        (snapshot,) = list_snapshots(store, "demo", c)
        assert load_manifest(store, "demo", c, snapshot).is_complete


def test_one_host_is_one_pool_however_its_url_spells_it():
    """As one host lock (locks.host_lock_name): an explicit default port, a trailing dot, upper
    case, the Unicode form of a punycode name all name the host's one pool (else two runs
    with S3 storage could fetch from it at once)."""
    from scrape_assets.defs.pools import host_pool

    assert {host_pool(u) for u in ("https://Shop.Example.:443/", "https://shop.example/", "HTTPS://SHOP.EXAMPLE")} == {
        "scrape-host-shop.example"}
    assert host_pool("http://bücher.example/") == host_pool("http://xn--bcher-kva.example:80/") == (
        "scrape-host-xn--bcher-kva.example")
    assert host_pool("https://shop.example:80/") == "scrape-host-shop.example:80"  # not https' default
    assert host_pool("http://[::1]:8000/") == "scrape-host-[::1]:8000"


def test_the_daemon_frees_the_pool_slot_a_killed_run_kept_once_the_run_is_failed(tmp_path, monkeypatch):
    """With S3 storage, raw_pages runs in the host's pool: a killed run must not keep its one slot forever.

    The shipped dagster.yaml sets ``free_slots_after_run_end_seconds``: the daemon's run
    monitoring frees the slots of a run that ended (marked failed after its worker died,
    or terminated from the UI) that long after. Driven here through the daemon's own
    iteration, with its clock moved past the delay.
    """
    import datetime
    import logging
    from types import SimpleNamespace

    import dagster as dg
    from dagster._core.storage.dagster_run import DagsterRun, DagsterRunStatus
    from dagster._daemon.monitoring import concurrency

    from scrape_assets.defs.pools import host_pool

    shutil.copy(REPO_ROOT / "dagster.yaml", tmp_path / "dagster.yaml")
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path))
    pool = host_pool("https://shop.example/")
    # The name the README gives: the host, lowercased, with the port when the URL names one.
    assert (pool, host_pool("http://127.0.0.1:8000/"), host_pool("https://Shop.Example:8443/x")) == (
        "scrape-host-shop.example", "scrape-host-127.0.0.1:8000", "scrape-host-shop.example:8443")
    with dg.DagsterInstance.get() as instance:
        assert instance.run_monitoring_settings["free_slots_after_run_end_seconds"] == 60
        storage = instance.event_log_storage
        run = instance.add_run(DagsterRun(job_name="daily_scrape_job", run_id="killed-run",
                                          status=DagsterRunStatus.STARTED))
        storage.initialize_concurrency_limit_to_default(pool)
        assert storage.claim_concurrency_slot(pool, run.run_id, "raw_pages").is_claimed
        second = storage.claim_concurrency_slot(pool, "next-run", "raw_pages")
        assert not second.is_claimed  # the pool's one slot is taken: the next run's raw_pages waits

        def sweep(after_s: float) -> None:  # one pass of the daemon, its clock after_s seconds ahead
            now = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(seconds=after_s)
            monkeypatch.setattr(concurrency, "get_current_datetime", lambda: now)
            list(concurrency.execute_concurrency_slots_iteration(SimpleNamespace(instance=instance),
                                                                 logging.getLogger("test")))

        sweep(120)
        assert [s.run_id for s in storage.get_concurrency_info(pool).claimed_slots] == ["killed-run"]  # still started
        instance.report_run_failed(run, message="run worker died")  # what run monitoring records
        sweep(30)
        assert [s.run_id for s in storage.get_concurrency_info(pool).claimed_slots] == ["killed-run"]  # not yet
        sweep(120)
        assert storage.get_concurrency_info(pool).claimed_slots == []
        assert storage.claim_concurrency_slot(pool, "next-run", "raw_pages").is_claimed



def test_partition_locks_are_taken_in_sorted_order_and_each_once(tmp_path, monkeypatch):
    """One order for every run (no deadlock between two runs over overlapping ranges), and a
    category named twice does not conflict with its own lock."""
    from contextlib import nullcontext

    from scrape_assets import locks
    from scrape_assets.storage import ObjectStore

    store = ObjectStore(str(tmp_path))
    with locks.partition_locks(store, "demo", ["travel", "mystery", "travel"], owner="r", scope="raw_pages"):
        pass
    taken = []
    monkeypatch.setattr(locks, "partition_lock",
                        lambda store, site, category, **kw: taken.append(category) or nullcontext())
    with locks.partition_locks(store, "demo", ["travel", "mystery", "art"], owner="r", scope="raw_pages"):
        pass
    assert taken == ["art", "mystery", "travel"]


def test_a_locked_partition_fails_raw_pages_once_without_retries(tmp_path, instance, monkeypatch):
    """raw_pages.py: PartitionLockedError is in the allow_retries=False list: another run
    holding the partition's lock fails the step once, not three more times after backoff."""
    from scrape_assets_tests.conftest import make_resources, materialize

    from scrape_assets.defs.resources import ObjectStoreResource
    from scrape_assets.errors import PartitionLockedError

    def locked(self, context, site):
        raise PartitionLockedError(f"{site}/travel", "raw_pages of run abcdef12")

    monkeypatch.setattr(ObjectStoreResource, "locks", locked)
    res = make_resources(tmp_path, base_url="http://127.0.0.1:9/")
    result = materialize(instance, res, ["travel"], selection=["raw_pages"], raise_on_error=False)
    assert not result.success
    assert not any(e.event_type_value in ("STEP_UP_FOR_RETRY", "STEP_RESTARTED") for e in result.all_events)
    (failure,) = [e for e in result.all_events if e.event_type_value == "STEP_FAILURE"]
    assert "is being written by another run" in failure.step_failure_data.user_failure_data.description


def test_the_lock_file_names_its_live_holder_only(tmp_path):
    """A holder killed with SIGKILL leaves its line in the lock file: the next holder's line
    replaces it whole, and a released lock names nobody."""
    import json
    import socket

    store = ObjectStore(str(tmp_path))
    path = tmp_path / "demo" / "travel" / "raw_pages.lock"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"owner": "killed-run-" + "x" * 200, "pid": 1, "host": "gone", "since": "then"}))
    with partition_lock(store, "demo", "travel", owner="run-B"):
        with pytest.raises(PartitionLockedError) as info:
            with partition_lock(store, "demo", "travel", owner="run-C"):
                pass
        assert info.value.holder.startswith(f"raw_pages of run run-B (pid {os.getpid()} on {socket.gethostname()}, "
                                            "since 20")
    assert path.read_text() == ""


def test_a_lock_held_without_a_line_names_another_process(tmp_path):
    """A holder between its flock and its line (or a tool that only flocks): no 'run None'."""
    import fcntl

    store = ObjectStore(str(tmp_path))
    path = tmp_path / "demo" / "travel" / "raw_pages.lock"
    path.parent.mkdir(parents=True)
    with open(path, "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        with pytest.raises(PartitionLockedError) as info:
            with partition_lock(store, "demo", "travel", owner="run-B"):
                pass
    assert info.value.holder == "raw_pages of another process"


class _FakeClock:
    """The locks module's clock: sleeps advance it at once; each reading moves it 1 µs on (as a real one does)."""

    def __init__(self):
        self.now, self.slept = 1000.0, []

    def monotonic(self) -> float:
        self.now += 1e-6
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


def _held_elsewhere(store, key_path):
    import fcntl

    key_path.parent.mkdir(parents=True, exist_ok=True)
    held = open(key_path, "w")
    held.write('{"owner": "run-A", "pid": 4242, "host": "worker-1", "since": "2026-12-01T02:00:00Z"}')
    held.flush()
    fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
    return held


def test_a_host_lock_waits_a_day_by_default_naming_the_holder_every_minute(tmp_path, monkeypatch):
    from scrape_assets import locks

    clock = _FakeClock()
    monkeypatch.setattr(locks, "time", clock)
    store = ObjectStore(str(tmp_path))
    lines = []
    with _held_elsewhere(store, tmp_path / "locks" / f"{host_lock_name('http://shop.example/')}.lock"):
        start = clock.now
        with pytest.raises(PartitionLockedError) as info:
            with host_lock(store, "http://scraper:hunter2@Shop.Example/catalogue/", owner="run-B", on_wait=lines.append):
                pass
    assert 24 * 3600 <= clock.now - start < 24 * 3600 + 1  # waited the day, polling
    assert 24 * 60 - 10 <= len(lines) <= 24 * 60  # once when the wait starts, then every minute (a poll late at most)
    assert set(lines) == {"waiting for shop.example:80: fetched by run run-A (pid 4242 on worker-1, "
                          "since 2026-12-01T02:00:00Z)"}
    assert info.value.partition == "shop.example:80" and "hunter2" not in str(info.value)


def test_a_partition_lock_stops_at_once_by_default_and_waits_when_asked(tmp_path, monkeypatch):
    from scrape_assets import locks

    clock = _FakeClock()
    monkeypatch.setattr(locks, "time", clock)
    store = ObjectStore(str(tmp_path))
    with _held_elsewhere(store, tmp_path / "demo" / "travel" / "parsed_products.lock"):
        for take in (lambda: partition_lock(store, "demo", "travel", owner="run-B", scope="parsed_products"),
                     lambda: locks.partition_locks(store, "demo", ["travel"], owner="run-B", scope="parsed_products")):
            with pytest.raises(PartitionLockedError, match="parsed_products of run run-A"):
                with take():
                    pass
            assert clock.slept == []  # SCRAPE_LOCK_WAIT_S unset: no wait
        start = clock.now
        with pytest.raises(PartitionLockedError):
            with locks.partition_locks(store, "demo", ["mystery", "travel"], owner="run-B", scope="parsed_products",
                                       wait_s=30):
                pass
        assert 30 <= clock.now - start < 31
    with locks.partition_locks(store, "demo", ["travel"], owner="run-B", scope="parsed_products"):
        assert (tmp_path / "demo" / "travel" / "parsed_products.lock").read_text().startswith('{"owner": "run-B"')


def test_a_host_port_that_is_no_number_is_no_port():
    from scrape_assets.locks import host_origin

    assert host_origin("http://example.com:abc/") == ("http", "example.com", 80)


def test_a_run_killed_while_fetching_is_failed_by_the_dead_run_sensor_and_its_slot_freed(tmp_path, demo_server,
                                                                                       caplog):
    """A `dagster asset materialize` killed with SIGKILL stays "started" for good: with S3
    storage its host's pool slot with it, and every later raw_pages waited for it silently
    (a newcomer's trial: 10 minutes at 95% CPU, SIGTERM ignored). raw_pages tags its run with
    its process; the daemon's dead_run_sensor fails the run once that process is gone and
    frees its slots (claimed here by hand: the pool is S3's; the demo server is local)."""
    import signal

    import dagster as dg

    from scrape_assets.defs.resources import AlertsResource
    from scrape_assets.defs.sensors import dead_run_sensor
    from scrape_assets.run_processes import PROCESS_TAG, process_gone

    env = _env(tmp_path, "killed", pools=True, SCRAPE_BASE_URL=demo_server.base_url,
               SCRAPE_REQUESTS_PER_SECOND="2", SCRAPE_MAX_CONCURRENCY="1")
    store = ObjectStore(str(tmp_path / "data" / "objects"))
    killed = _start(env, "raw_pages", "default")
    _wait_for_fetching(store, "default", killed, pages=1)
    killed.send_signal(signal.SIGKILL)
    killed.communicate(timeout=60)
    with dg.instance_for_test(temp_dir=env["DAGSTER_HOME"]) as instance:
        (run,) = instance.get_runs()
        assert run.status == dg.DagsterRunStatus.STARTED  # nobody marks it: no launcher watched the CLI run
        assert process_gone(run.tags[PROCESS_TAG]) is True and run.tags["scrape/pid"] == str(killed.pid)
        assert run.tags["scrape/process_run"] == run.run_id  # set for this run, not inherited by a re-execution
        pool = "scrape-host-example"
        instance.event_log_storage.set_concurrency_slots(pool, 1)
        assert instance.event_log_storage.claim_concurrency_slot(pool, run.run_id, "raw_pages").is_claimed
        context = dg.build_sensor_context(instance=instance, resources={"alerts": AlertsResource(webhook_url=None)})
        with caplog.at_level(logging.WARNING, logger="scrape_assets.alerts"):
            skip = dead_run_sensor(context)
        (alert,) = [r.getMessage() for r in caplog.records if r.name == "scrape_assets.alerts"]
        assert alert.startswith(f"ALERT: scrape_assets: run {run.run_id}, left started by a process that is gone (pid "
                                f"{killed.pid}), marked failed; its slot in {pool} freed\n(launch it again")
        assert skip.skip_message == "1 run left started by a process that is gone: marked failed"
        failed = instance.get_run_by_id(run.run_id)
        assert failed.status == dg.DagsterRunStatus.FAILURE
        assert not instance.event_log_storage.get_concurrency_info(pool).claimed_slots
        (event,) = instance.all_logs(run.run_id, of_type=dg.DagsterEventType.RUN_FAILURE)
        assert event.dagster_event.message == f"the process running it (pid {killed.pid} on {run.tags['scrape/host']}) " \
                                              "is gone: it was killed"
        again = dead_run_sensor(dg.build_sensor_context(instance=instance,
                                                        resources={"alerts": AlertsResource(webhook_url=None)}))
        assert again.skip_message == "no run left started by a process that is gone"
    # The next run resumes the killed run's snapshot.
    again = _start(env, "raw_pages", "default")
    _, err = again.communicate(timeout=300)
    assert again.returncode == 0, err[-2000:]
    (snapshot,) = list_snapshots(store, "demo", "default")
    assert latest_manifest(store, "demo", "default").counts()["done"] == 12


def test_every_cli_run_is_tagged_with_its_process_before_its_first_step(tmp_path):
    """A run killed while its raw_pages still waits for the host's pool slot (S3) got no tag
    (raw_pages tagged it from its body, after the wait): Dagster then handed the freed slot
    to that dead run, and a third run waited for good. The project's executor tags each run
    before its first step, whatever it selects (here raw_pages not at all)."""
    import dagster as dg

    from scrape_assets.run_processes import PROCESS_RUN_TAG, PROCESS_TAG, process_gone

    env = _env(tmp_path, "tagged", pools=True)
    done = subprocess.run([DAGSTER, "asset", "materialize", "-m", "scrape_assets.definitions", "--select",
                           "dead_letters", "--partition", "travel"], env=env, capture_output=True, text=True,
                          timeout=300)
    with dg.instance_for_test(temp_dir=env["DAGSTER_HOME"]) as instance:
        (run,) = instance.get_runs()
        assert run.tags[PROCESS_RUN_TAG] == run.run_id, done.stderr[-2000:]
        assert process_gone(run.tags[PROCESS_TAG]) is True  # the command's process, exited
        starts = [r.timestamp for r in instance.all_logs(run.run_id, of_type=dg.DagsterEventType.STEP_START)]
        assert starts  # a step ran, after the tag was set (the executor sets it first)


def test_the_next_run_on_a_host_keeps_its_rate_and_its_retry_after_pause(tmp_path):
    """One run hands the host to the next (the host lock, or pool, passes at once): the next
    run's first request (its robots.txt) waits the gap the rate asks after the previous run's
    last request, and for the end of a Retry-After pause the previous run was told (before,
    0.3 s after it at 0.5 requests/s, and every request inside a 10-s pause)."""
    import asyncio

    from scrape_assets.defs.assets.raw_pages import crawl_partitions
    from scrape_assets.defs.resources import ObjectStoreResource, SiteResource
    from scrape_assets.faults import FaultSpec, make_fault_server
    from scrape_assets.locks import host_handoff_key
    from scrape_assets_tests.conftest import serving

    rps = 2.0
    spec = FaultSpec.model_validate({"rules": [{"match": "travel_2/", "fault": "http_429", "retry_after_s": 3,
                                                "first_n": 1}]})
    store = ObjectStoreResource(url=str(tmp_path / "objects"))
    with serving(make_fault_server(spec, "127.0.0.1", 0)) as server:
        site = SiteResource(base_url=server.base_url, requests_per_second=rps, max_attempts=1)

        def run() -> tuple[float, float]:
            before = len(server.requests)
            asyncio.run(crawl_partitions(site, store, ["travel"], new_snapshot=True, log=logging.getLogger("test")))
            times = [r.at_s for r in server.requests[before:]]
            return times[0], times[-1]

        _first, last_told_to_wait = run()  # travel: robots.txt, then a 429 asking for 3 s (a dead letter)
        first, last = run()
        assert first - last_told_to_wait >= 3.0 - 0.1  # the pause, not 1/rps, from the 429
        first_again, _ = run()
        assert 1.0 / rps - 0.05 <= first_again - last < 3.0  # the rate's gap (no pause this time)
    handoff = json.loads(ObjectStore(str(tmp_path / "objects")).read_bytes(host_handoff_key(server.base_url)))
    assert set(handoff) == {"last_request_at", "paused_until", "crawl_delay_s"}
    assert handoff["paused_until"] is None and handoff["crawl_delay_s"] is None


def test_a_retry_after_pause_is_recorded_for_the_next_run_when_it_begins(tmp_path, monkeypatch):
    """A run killed with SIGKILL during a Retry-After pause runs no finally: the pause is
    written when it begins, so the next run does not ask the host inside it; in a thread,
    so a slow store does not stall the crawl (a synchronous S3 write froze its event loop)."""
    from scrape_assets import locks
    from scrape_assets.defs.assets.raw_pages import _host_handoff
    from scrape_assets.fetcher import FetchPolicy
    from scrape_assets.locks import read_host_handoff
    from scrape_assets.politeness import HostLimiter

    slow_write = locks.write_host_handoff

    def write_in_a_second(*args, **kwargs):
        time.sleep(1.0)
        slow_write(*args, **kwargs)

    monkeypatch.setattr(locks, "write_host_handoff", write_in_a_second)
    store = ObjectStore(str(tmp_path / "objects"))
    limiter = HostLimiter(requests_per_second=2, max_concurrency=1)
    policy = FetchPolicy(user_agent="t", requests_per_second=2, max_concurrency=1)
    with _host_handoff(store, limiter, "http://Shop.Example/", policy, logging.getLogger("test")):
        assert read_host_handoff(store, "http://shop.example/") is None
        began = time.monotonic()
        assert limiter.pause("shop.example", 30)  # a 429's Retry-After: 30
        assert limiter.pause("other.example", 30)  # another host's pause is not this file's
        assert time.monotonic() - began < 0.5  # the write does not hold the caller (the event loop)
        deadline = time.monotonic() + 10
        while (handoff := read_host_handoff(store, "http://shop.example/")) is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert handoff["paused_until"] == pytest.approx(time.time() + 30, abs=3)  # written before the run ends
    assert read_host_handoff(store, "http://shop.example/")["paused_until"] == pytest.approx(time.time() + 29, abs=3)


def test_the_handoff_writer_coalesces_pauses_and_never_holds_the_run_past_its_wait():
    """Each pause queued a whole write, and the end of the crawl waited for all of them: a
    store taking 3 s a write held a SIGTERM'd run for 18 s (a hanging one: for good). The
    writer writes the latest state once per round, and the end waits at most its timeout."""
    import threading

    from scrape_assets.defs.assets.raw_pages import _LatestWriter

    writes, release = [], threading.Event()

    def slow_write():
        writes.append(time.monotonic())
        release.wait(0.5)

    writer = _LatestWriter(slow_write)
    for _ in range(5):  # five pauses while the first write runs
        writer.request()
        time.sleep(0.05)
    assert writer.close(5.0)
    assert 2 <= len(writes) <= 3  # the first, one for the four asked meanwhile (and the close's)

    hang = threading.Event()
    stuck = _LatestWriter(lambda: hang.wait(60))  # a store that never answers
    stuck.request()
    began = time.monotonic()
    assert not stuck.close(0.3)  # gives up, the thread a daemon: the process can still exit
    assert time.monotonic() - began < 2
    hang.set()
