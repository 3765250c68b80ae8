"""Micro-benchmarks behind the analysis: what one request and one page cost, in CPU.

Not part of ``make bench``; run it on a quiet machine when a figure of BENCHMARKS.md needs
explaining (``.venv/bin/python -m benchmarks.micro``, ~1 min). It starts the 1,000-page
catalogue, then measures in fresh subprocesses (so one measurement's imports or patches
never leak into another):

* HTTP clients, 1,000 GETs at 16 (and 64) concurrent keep-alive connections, bodies read
  whole: httpx with its own transport (httpcore), as ``PageFetcher._download`` used it before
  ``scrape_assets/http_transport.py`` (``client.stream`` + ``aiter_bytes``); the same httpx
  client on our :class:`~scrape_assets.http_transport.AiohttpTransport`; our
  ``PageFetcher.fetch`` (robots.txt, limiter, deadline, on that transport); and bare aiohttp.
* Parsing, the same 1,000 saved pages: ``parsing.parse_listing`` as the pipeline calls it,
  the same without the mojibake repair (``repair_text``), without resolving links
  (``UrlJoiner``), and the bare selectolax loop of ``bare_parse.py``.
* The Dagster event log, 500 asset materialization events into a fresh SQLite event log:
  Dagster's ``SqliteEventLogStorage`` (a new engine per event) against our
  :class:`~scrape_assets.instance_storage.PooledSqliteEventLogStorage` (one kept per shard),
  one event at a time and in batches of 100 (``store_event_batch``, as a 100-partition
  step's materializations arrive).

Prints one line per measurement: pages per second (wall) and CPU milliseconds per item.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

_HTTP = r'''
import asyncio, resource, sys, time
base, paths, mode, conc = sys.argv[1].rstrip("/"), [l for l in open(sys.argv[2]).read().split() if l], sys.argv[3], int(sys.argv[4])

async def httpx_run(aiohttp_transport=False):
    import httpx
    from scrape_assets.http_transport import AiohttpTransport
    sem = asyncio.Semaphore(conc)
    transport = AiohttpTransport(max_connections=conc + 2) if aiohttp_transport else None
    async with httpx.AsyncClient(limits=httpx.Limits(max_connections=conc + 2, max_keepalive_connections=conc),
                                 transport=transport) as client:
        async def one(p):
            async with sem:
                async with client.stream("GET", base + p) as r:
                    return b"".join([c async for c in r.aiter_bytes()])
        await asyncio.gather(*(one(p) for p in paths))

async def fetcher_run():
    from scrape_assets.fetcher import FetchPolicy, PageFetcher, build_client
    policy = FetchPolicy(user_agent="bench", requests_per_second=100000, max_concurrency=conc)
    async with build_client(policy) as client:
        fetcher = PageFetcher(client, policy)
        await asyncio.gather(*(fetcher.fetch(base + p) for p in paths))

async def aiohttp_run():
    import aiohttp
    sem = asyncio.Semaphore(conc)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=conc)) as session:
        async def one(p):
            async with sem:
                async with session.get(base + p) as r:
                    return await r.read()
        await asyncio.gather(*(one(p) for p in paths))

run = {"httpx": httpx_run, "httpx_aiohttp": lambda: httpx_run(True), "fetcher": fetcher_run, "aiohttp": aiohttp_run}[mode]
asyncio.run(run())  # warm-up: imports, robots.txt, connections
usage = lambda: sum(resource.getrusage(resource.RUSAGE_SELF)[:2])
c0, t0 = usage(), time.perf_counter()
asyncio.run(run())
print(len(paths) / (time.perf_counter() - t0), 1000 * (usage() - c0) / len(paths))
'''

_PARSE = r'''
import resource, sys, time
from pathlib import Path
from scrape_assets import parsing
from scrape_assets.spec import load_spec
from benchmarks.bare_parse import page_files, parse_page
spec = load_spec(sys.argv[1]); mode = sys.argv[3]
files = page_files(Path(sys.argv[2]), "bench")
pages = [(path.read_bytes(), url) for path, url in files]
if mode == "no_repair":
    parsing.repair_text = lambda text: text
if mode == "no_urljoin":
    parsing.UrlJoiner = lambda base: (lambda href: base + href)
def run():
    for body, url in pages:
        if mode == "bare":
            parse_page(body, url)
        else:
            parsing.parse_listing(body, spec, url, canonical_base_url=spec.base_url, fetch_base_url=spec.base_url,
                                  content_type="text/html; charset=utf-8")
run()
usage = lambda: sum(resource.getrusage(resource.RUSAGE_SELF)[:2])
c0, t0 = usage(), time.perf_counter()
run()
print(len(pages) / (time.perf_counter() - t0), 1000 * (usage() - c0) / len(pages))
'''

_EVENTS = r'''
import resource, sys, tempfile, time
import dagster as dg
from dagster._core.events import DagsterEvent, DagsterEventType, StepMaterializationData
from dagster._core.events.log import EventLogEntry
from dagster._core.storage.event_log.sqlite.sqlite_event_log import SqliteEventLogStorage
from scrape_assets.instance_storage import PooledSqliteEventLogStorage
cls = {"stock": SqliteEventLogStorage, "pooled": PooledSqliteEventLogStorage}[sys.argv[1]]
storage = cls(tempfile.mkdtemp(prefix="bench-events-"))
def event(i):
    mat = dg.AssetMaterialization(asset_key="raw_pages", partition=f"cat-{i:03d}", metadata={"pages": 100})
    return EventLogEntry(error_info=None, level=20, user_message="", run_id="run", timestamp=time.time(),
                         step_key="raw_pages", job_name="job",
                         dagster_event=DagsterEvent(event_type_value=DagsterEventType.ASSET_MATERIALIZATION.value,
                                                    job_name="job", event_specific_data=StepMaterializationData(mat)))
storage.store_event(event(0))  # warm-up: creates the run and index databases
events = [event(i) for i in range(500)]
usage = lambda: sum(resource.getrusage(resource.RUSAGE_SELF)[:2])
c0, t0 = usage(), time.perf_counter()
if len(sys.argv) > 2:  # batches of that many events, as a step's partition materializations reach the storage
    size = int(sys.argv[2])
    for start in range(0, len(events), size):
        storage.store_event_batch(events[start:start + size])
else:
    for e in events:
        storage.store_event(e)
print(500 / (time.perf_counter() - t0), 1000 * (usage() - c0) / 500)
'''


def _measure(code: str, *args: str) -> tuple[float, float]:
    from benchmarks.measure import wait_for_quiet

    wait_for_quiet(max_wait_s=30)
    out = subprocess.run([sys.executable, "-c", code, *args], cwd=ROOT, capture_output=True, text=True, check=True)
    rate, cpu_ms = out.stdout.split()
    return float(rate), float(cpu_ms)


def main() -> int:
    from benchmarks import large_site
    from benchmarks.run import DAGSTER, Server, listing_paths, pipeline_env

    with tempfile.TemporaryDirectory(prefix="bench-micro-") as tmp:
        work = Path(tmp)
        server = Server(work, 20, 50)
        try:
            paths = work / "paths.txt"
            paths.write_text("\n".join(listing_paths(20, 50)))
            print(f"{'measurement':58s} {'per s':>8s} {'CPU ms each':>12s}")
            for label, mode, conc in (
                ("httpx, its own transport (httpcore), c=16", "httpx", 16),
                ("httpx, its own transport (httpcore), c=64", "httpx", 64),
                ("httpx on AiohttpTransport, c=16", "httpx_aiohttp", 16),
                ("httpx on AiohttpTransport, c=64", "httpx_aiohttp", 64),
                ("PageFetcher.fetch (robots, limiter, deadline), c=16", "fetcher", 16),
                ("PageFetcher.fetch, c=64", "fetcher", 64),
                ("aiohttp ClientSession, c=16", "aiohttp", 16),
                ("aiohttp ClientSession, c=64", "aiohttp", 64),
            ):
                rate, cpu_ms = _measure(_HTTP, server.base_url, str(paths), mode, str(conc))
                print(f"{label:58s} {rate:8.0f} {cpu_ms:12.3f}", flush=True)
            # Saved pages to parse: one pipeline run's raw_pages.
            spec = work / "spec.yaml"
            spec.write_text(large_site.spec_yaml(server.base_url, 20))
            env = pipeline_env(work / "run", spec, server.base_url, 16)
            subprocess.run([DAGSTER, "asset", "materialize", "-m", "scrape_assets.definitions", "--select", "raw_pages",
                            "--partition-range", "cat-000...cat-019"], env=env, cwd=work, check=True, capture_output=True)
            objects = str(work / "run" / "data" / "objects")
            for label, mode in (("parse_listing (as extract_snapshot calls it)", "pipeline"),
                                ("parse_listing without repair_text (ftfy)", "no_repair"),
                                ("parse_listing without resolving links (UrlJoiner)", "no_urljoin"),
                                ("bare selectolax loop (bare_parse.py)", "bare")):
                rate, cpu_ms = _measure(_PARSE, str(spec), objects, mode)
                print(f"{label:58s} {rate:8.0f} {cpu_ms:12.3f}", flush=True)
            for label, args in (("event log: Dagster's SqliteEventLogStorage", ["stock"]),
                                ("event log: PooledSqliteEventLogStorage", ["pooled"]),
                                ("event log: PooledSqliteEventLogStorage, batches of 100", ["pooled", "100"])):
                rate, cpu_ms = _measure(_EVENTS, *args)
                print(f"{label:58s} {rate:8.0f} {cpu_ms:12.3f}", flush=True)
        finally:
            server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
