"""Terminate, SIGTERM and Ctrl-C stop a crawl: real `dagster asset materialize` processes, a real server.

Dagster retries an interrupted step that has a RetryPolicy (raw_pages has one, for
crashes), so without care a terminated run went on fetching and ended in success.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from scrape_assets.defs.assets.raw_pages import INTERRUPTED
from scrape_assets.demo_site import make_server
from scrape_assets.interrupts import STOP_SIGNALS, CrawlInterrupted, run_interruptible
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
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT (Ctrl-C, Terminate in the UI)"])
def test_an_interrupted_crawl_stops_without_a_retry_and_the_next_run_resumes(tmp_path, sig):
    with serving(make_server("127.0.0.1", 0, day=DAY)) as server:
        returncode, at_signal, output = _interrupted(tmp_path, server, sig)
        after = _page_requests(server)
        assert returncode == 1, output[-3000:]
        assert INTERRUPTED in output and "RUN_FAILURE" in output
        assert "STEP_UP_FOR_RETRY" not in output and "STEP_RESTARTED" not in output  # the crawl did not go on
        assert after <= at_signal + 8  # those in flight (max_concurrency 4), and a slow machine's lag to the signal
        store = ObjectStore(str(tmp_path / "data" / "objects"))
        interrupted = {c: latest_manifest(store, "demo", c) for c in ("travel", "default")}
        assert any(m is None or not m.is_complete for m in interrupted.values())  # stopped mid-snapshot
        if sig != signal.SIGTERM:
            return
        # The next run resumes each snapshot: pages saved before the interrupt are not asked again.
        process = _materialize(tmp_path, server.base_url)
        try:
            output, _ = process.communicate(timeout=240)
        finally:
            process.kill()
        assert process.returncode == 0, output[-3000:]
        assert "(resumed)" in output
        # Every page asked at least once; the pages saved before the interrupt not again.
        assert PAGES <= _page_requests(server) and _page_requests(server) - after < PAGES
        for category in ("travel", "default"):
            assert len(list_snapshots(store, "demo", category)) == 1
            assert latest_manifest(store, "demo", category).is_complete


# -- run_interruptible, in this process ----------------------------------------------------------


@contextlib.contextmanager
def _signal_later(delay_s: float, sig: signal.Signals):
    """Send ``sig`` to this process after ``delay_s``, unless the block has ended (then never: it could kill pytest)."""
    timer = threading.Timer(delay_s, os.kill, (os.getpid(), sig))
    timer.start()
    try:
        yield
    finally:
        timer.cancel()


def test_a_signal_while_the_handlers_are_restored_still_stops_the_step(monkeypatch):
    """SIGINT after the loop closed, while run_interruptible puts the handlers back (SIGTERM's
    done, SIGINT's not yet): no RuntimeError "Event loop is closed" (which raw_pages'
    RetryPolicy would retry), the crawl is reported interrupted."""
    real_signal, calls = signal.signal, []

    def signal_then_interrupt(signum, handler):
        previous = real_signal(signum, handler)
        calls.append(signum)
        if len(calls) == len(STOP_SIGNALS) + 1:  # the first handler put back
            os.kill(os.getpid(), signal.SIGINT)  # handled now, by run_interruptible's handler still on SIGINT
        return previous

    monkeypatch.setattr(signal, "signal", signal_then_interrupt)
    with pytest.raises(CrawlInterrupted) as raised:
        run_interruptible(_crawl_like(0.05, []))
    assert raised.value.signal_name == "SIGINT"
    assert calls == [signal.SIGINT, signal.SIGTERM, signal.SIGTERM, signal.SIGINT]  # put back in reverse order


def _busy_callbacks(loop, until: float) -> None:
    """CPU work in plain loop callbacks (as a transport's read handler), where asyncio drops most BaseExceptions."""
    started = time.monotonic()
    while time.monotonic() - started < 0.02:
        pass
    if time.monotonic() < until:
        loop.call_soon(_busy_callbacks, loop, until)


async def _crawl_like(seconds: float, cleaned: list[str]) -> str:
    loop = asyncio.get_running_loop()
    loop.call_soon(_busy_callbacks, loop, time.monotonic() + seconds)
    try:
        await asyncio.sleep(seconds + 0.2)
        return "finished"
    finally:
        cleaned.append("unwound")  # a task's cleanup (journals, slots) runs


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_cancels_the_crawl_even_under_dagsters_handler(sig):
    from dagster._core.errors import raise_execution_interrupts

    cleaned: list[str] = []
    with raise_execution_interrupts():  # as in a Dagster step: its handler raises wherever the signal lands
        dagsters = {s: signal.getsignal(s) for s in STOP_SIGNALS}
        with _signal_later(0.3, sig):
            started = time.monotonic()
            with pytest.raises(CrawlInterrupted) as raised:
                run_interruptible(_crawl_like(3.0, cleaned))
        assert {s: signal.getsignal(s) for s in STOP_SIGNALS} == dagsters  # handlers given back
    assert raised.value.signal_name == sig.name
    assert cleaned == ["unwound"]
    assert time.monotonic() - started < 2.5  # stopped, not run to its end (3 s)


def test_without_a_signal_the_result_comes_back():
    before = {s: signal.getsignal(s) for s in STOP_SIGNALS}
    cleaned: list[str] = []
    assert run_interruptible(_crawl_like(0.05, cleaned)) == "finished"
    assert cleaned == ["unwound"]
    assert {s: signal.getsignal(s) for s in STOP_SIGNALS} == before


def test_a_second_signal_cuts_the_cleanup_short():
    async def slow_cleanup() -> None:
        try:
            await asyncio.sleep(5)
        finally:
            os.kill(os.getpid(), signal.SIGINT)  # the second, while unwinding
            await asyncio.sleep(5)

    started = time.monotonic()
    with _signal_later(0.2, signal.SIGTERM), pytest.raises(CrawlInterrupted) as raised:
        run_interruptible(slow_cleanup())
    assert raised.value.signal_name == "SIGTERM" and isinstance(raised.value.__cause__, KeyboardInterrupt)
    assert time.monotonic() - started < 3


def test_a_signal_before_the_loop_runs_never_starts_the_crawl(monkeypatch):
    """interrupts.py: a signal arriving after the handlers are set but before the loop runs
    the coroutine: the coroutine never runs (no page fetched), CrawlInterrupted is raised."""
    import asyncio

    import scrape_assets.interrupts as interrupts

    ran = []

    async def crawl():
        ran.append(True)
        return "done"

    real_run = asyncio.run

    def run_after_a_signal(coro):
        signal.raise_signal(signal.SIGTERM)  # handled by on_signal before the loop starts
        return real_run(coro)

    monkeypatch.setattr(interrupts.asyncio, "run", run_after_a_signal)
    with pytest.raises(interrupts.CrawlInterrupted, match="SIGTERM"):
        interrupts.run_interruptible(crawl())
    assert ran == []
