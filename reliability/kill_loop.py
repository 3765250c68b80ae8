"""Kill loop: SIGKILL a real pipeline run K times, restart it each time, compare with a clean run.

Usage (from the repository root)::

    .venv/bin/python -m reliability.kill_loop --kills 10 --seed 1 \\
        --categories romance,fiction,default --out results.json

What happens, all on 127.0.0.1 and in a work folder of its own:

1. The demo catalogue is served in this process (:class:`~scrape_assets.demo_site.DemoServer`,
   day pinned so prices do not move), with one listing page answering 404 for good so the
   ``dead_letters`` table has a row to compare. The server logs every request.
2. Reference: ``dagster asset materialize --select '*' --partition-range A...B`` runs to the
   end in a subprocess with its own ``DAGSTER_HOME`` and ``SCRAPE_DATA_DIR``.
3. Killed series, in another ``DAGSTER_HOME`` / data folder, with the same ``SCRAPE_*``
   settings: K times, start the run and SIGKILL it, either at a random moment while it
   fetches (after the m-th new page request the server sees, plus a random fraction of the
   request interval; the whole process group is killed) or at a crash point of
   :mod:`scrape_assets.crashpoints` (``SCRAPE_CRASHPOINT=<point>:<n>``, the process kills
   itself on the n-th hit: inside a manifest/page write, after a page body, inside a table
   load; n never exceeds a lower bound of the hits the run still has, counted from the
   manifests, the tables and the snapshots' ``dead_letters.json``, so every kill lands). Each restart re-executes what the killed run
   had not materialized yet, read from the Dagster instance - what "re-execute from
   failure" does in the UI; materializing ``raw_pages`` again after it was recorded would
   be, by design, a new scrape. After the K kills the run is started once more and must
   succeed.
4. Compare: ``products`` and ``dead_letters`` row for row with the reference (except
   columns that legitimately differ, :data:`IGNORED_COLUMNS`), duplicate keys, every
   manifest loadable and complete with every done page's body present and matching its
   hash, no temp files or manifest-less snapshot folders left, and per kill the pages
   requested again after it (counted by the server) against the per-host concurrency.

Runs use Dagster's in-process executor (the default of the definitions), so the run *is* the process: a crash point kills
the whole run, as ``kill -9`` of its process group does (with the multiprocess executor
the orchestrator would survive a killed step and retry it itself).

``SCRAPE_MAX_ATTEMPTS`` is ``kills + 3`` in both series: an attempt interrupted by a kill
counts (README, Resume), so with the default 3 a page unlucky enough to be in flight at
three kills would be dead-lettered by design and the tables would differ for that reason.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

import sqlalchemy as sa

from scrape_assets.crashpoints import ENV_VAR as CRASHPOINT_ENV
from scrape_assets.demo_site import DemoRequestHandler, DemoResponse, DemoServer, catalogue, respond
from scrape_assets.errors import ManifestError
from scrape_assets.manifest import latest_manifest, list_snapshots, load_manifest
from scrape_assets.spec import load_spec
from scrape_assets.storage import TEMP_SUFFIX, ObjectStore
from scrape_assets.warehouse import Warehouse, dead_letters, products

REPO_ROOT = Path(__file__).resolve().parents[1]
SITE = "demo"
#: The assets, upstream first.
ASSETS = ("raw_pages", "parsed_products", "dead_letters", "products_table")
DEMO_DAY = datetime.date(2026, 1, 15)
LISTING_PREFIX = "/catalogue/category/"
#: Columns that differ between two correct runs: snapshot ids and clock times; ``attempts``
#: of a dead letter also counts an attempt a kill interrupted (checked as >= instead).
IGNORED_COLUMNS = {
    "products": ("snapshot_id", "fetched_at"),
    "dead_letters": ("snapshot_id", "recorded_at", "attempts"),
}
FETCH_KINDS = ("time", "storage.after_temp_write", "crawl.after_body_write", "storage.after_replace")
LOAD_KINDS = ("warehouse.after_delete", "warehouse.after_insert")
RUN_TIMEOUT_S = 300.0
POLL_S = 0.005


@dataclass
class KillRecord:
    """One kill of the series.

    Attributes:
        kind: ``"time"`` or the crash point's name.
        n: the crash point's hit, or for ``"time"`` the new page request after which it was killed.
        delay_s: for ``"time"``: the random wait after that request, seconds.
        running: assets the killed run was materializing.
        when_s: seconds from the process start to its death.
        landed: the process died by SIGKILL (False: it finished first).
        pages_done_at_kill: pages marked done in the latest manifests right after the kill.
        temp_files_after_kill: orphaned ``.tmp`` files right after the kill (swept by the next start).
        pages_refetched: page paths requested before this kill and again after it (server log).
    """

    index: int
    planned: str
    kind: str
    n: int
    delay_s: float
    running: list[str]
    when_s: float = 0.0
    landed: bool = False
    exit_code: int | None = None
    pages_done_at_kill: int = 0
    temp_files_after_kill: int = 0
    pages_refetched: int = 0
    refetched: list[str] = field(default_factory=list)


class _DeadPageHandler(DemoRequestHandler):
    """The demo catalogue, except that the server's ``dead_paths`` answer 404 (a dead letter)."""

    def send_demo_response(self, response: DemoResponse) -> None:
        if self.path.split("?", 1)[0] in self.server.dead_paths:
            response = respond(self.command, "/gone.html", day=self.server.day)
        super().send_demo_response(response)


def start_server(day: datetime.date, dead_paths: frozenset[str]) -> DemoServer:
    """Serve the demo catalogue of ``day`` on 127.0.0.1 (free port) in a daemon thread."""
    server = DemoServer(("127.0.0.1", 0), _DeadPageHandler, day=day)
    server.dead_paths = dead_paths
    threading.Thread(target=server.serve_forever, name="demo-catalogue", daemon=True).start()
    return server


def partition_range(categories: list[str]) -> str:
    """``"first...last"`` for consecutive categories of the demo spec.

    Raises:
        ValueError: unknown categories, or not consecutive in ``sites/demo.yaml`` order.
    """
    keys = list(load_spec(SITE).categories)
    unknown = [c for c in categories if c not in keys]
    if not categories or unknown:
        raise ValueError(f"categories {unknown or categories} are not demo categories; known, in order: {', '.join(keys)}")
    start = keys.index(categories[0])
    if keys[start : start + len(categories)] != categories:
        raise ValueError(
            f"categories {','.join(categories)} are not consecutive in sites/demo.yaml order ({', '.join(keys)}): "
            "a run covers a partition range"
        )
    return f"{categories[0]}...{categories[-1]}"


def default_dead_page(categories: list[str], day: datetime.date) -> str:
    """The last listing page of the first multi-page category (its products become a dead letter)."""
    cat = catalogue(day)
    for key in categories:
        category = cat.category(key)
        if category.page_count > 1:
            return "/" + category.page_path(category.page_count)
    return "/" + cat.category(categories[0]).page_path(1)


def plan_kills(kills: int, rng: random.Random) -> list[str]:
    """The kinds of the K kills: kinds that land while fetching first, table-load crash points last.

    Each kind appears at least once when K allows; about 30 % of the kills land in table loads.
    """
    if kills <= 0:
        return []
    n_load = max(1, round(kills * 0.3)) if kills >= 2 else 0
    n_fetch = kills - n_load
    fetch = list(FETCH_KINDS[:n_fetch]) + [rng.choice(FETCH_KINDS) for _ in range(n_fetch - len(FETCH_KINDS))]
    load = list(LOAD_KINDS[:n_load]) + [rng.choice(LOAD_KINDS) for _ in range(n_load - len(LOAD_KINDS))]
    rng.shuffle(fetch)
    rng.shuffle(load)
    return fetch + load


class Series:
    """One data folder + Dagster instance, and the runs started against it."""

    def __init__(self, root: Path, base_env: dict, server: DemoServer, categories: list[str]):
        self.root = root
        self.home = root / "dagster_home"
        self.data = root / "data"
        self.home.mkdir(parents=True, exist_ok=True)
        # The shipped instance settings (pooled event log, pools, run queue): kills must not
        # hurt the instance users run either.
        (self.home / "dagster.yaml").write_bytes((REPO_ROOT / "dagster.yaml").read_bytes())
        self.env = {**base_env, "DAGSTER_HOME": str(self.home), "SCRAPE_DATA_DIR": str(self.data)}
        self.server = server
        self.categories = categories
        self.store = ObjectStore(str(self.data / "objects"))
        self.segments: list[list[int]] = []  # [first, end) of each run in the server's request log
        self.runs = 0

    def start(self, select: list[str], crashpoint: str | None = None) -> subprocess.Popen:
        """Start ``dagster asset materialize`` for ``select`` over the partition range."""
        env = dict(self.env)
        if crashpoint:
            env[CRASHPOINT_ENV] = crashpoint
        self.runs += 1
        dagster = Path(sys.executable).with_name("dagster")
        self.segments.append([len(self.server.requests), -1])
        with open(self.root / f"run-{self.runs:02d}.log", "w") as log:
            return subprocess.Popen(
                [str(dagster), "asset", "materialize", "-m", "scrape_assets.definitions",
                 "--select", ",".join(select), "--partition-range", partition_range(self.categories)],
                env=env, cwd=self.root, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            )

    def wait(self, proc: subprocess.Popen) -> int:
        """Wait for the run to exit (killing what it left in its session); close its log segment."""
        try:
            return proc.wait(timeout=RUN_TIMEOUT_S)
        finally:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.segments[-1][1] = len(self.server.requests)

    def log_tail(self, chars: int = 3000) -> str:
        return (self.root / f"run-{self.runs:02d}.log").read_text(errors="replace")[-chars:]

    def run_to_end(self, select: list[str]) -> float:
        """Run ``select`` to completion; return its wall time. Raises RuntimeError if it fails."""
        started = time.monotonic()
        code = self.wait(self.start(select))
        if code != 0:
            raise RuntimeError(f"run of {select} exited with {code}:\n{self.log_tail()}")
        return time.monotonic() - started

    def remaining(self) -> list[str]:
        """Assets not yet materialized for every category, per this series' Dagster instance."""
        import dagster as dg

        with dg.DagsterInstance.from_config(str(self.home)) as instance:
            return [
                name for name in ASSETS
                if not set(self.categories) <= instance.get_materialized_partitions(dg.AssetKey(name))
            ]

    def manifests(self) -> list:
        out = []
        for category in self.categories:
            if self.store.exists(f"{SITE}/{category}"):
                manifest = latest_manifest(self.store, SITE, category)
                if manifest is not None:
                    out.append(manifest)
        return out

    def page_requests(self, segment: int) -> list[str]:
        """Listing-page paths the server saw during run ``segment`` (0-based)."""
        start, end = self.segments[segment]
        if segment + 1 < len(self.segments):
            end = self.segments[segment + 1][0]  # a request a killed run sent may be logged just after it died
        requests = self.server.requests[start:end]
        return [r.path.split("?", 1)[0] for r in requests if r.path.startswith(LISTING_PREFIX)]

    def temp_files(self) -> list[str]:
        root = Path(self.store.root.path)
        if not root.is_dir():
            return []
        found = list(root.rglob(f".*{TEMP_SUFFIX}")) + list(root.glob("write-probe-*"))
        return sorted(str(p.relative_to(root)) for p in found)


def _kill_at_time(series: Series, proc: subprocess.Popen, record: KillRecord, started: float) -> None:
    """SIGKILL the run's process group after ``record.n`` new page requests plus ``record.delay_s``."""
    base = series.segments[-1][0]
    deadline = started + RUN_TIMEOUT_S
    while proc.poll() is None:
        seen = sum(1 for r in series.server.requests[base:] if r.path.startswith(LISTING_PREFIX))
        if seen >= record.n:
            time.sleep(record.delay_s)  # a random moment within the next request interval
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
            break
        if time.monotonic() > deadline:
            raise RuntimeError(f"kill {record.index}: the run made no progress in {RUN_TIMEOUT_S:.0f} s:\n{series.log_tail()}")
        time.sleep(POLL_S)


@dataclass(frozen=True)
class _Work:
    """What the next run still has to do, counted from the stores (lower bounds of crash point hits)."""

    running: list[str]
    requests: int  # listing pages not yet done or failed: each is requested at least once more
    bodies: int  # page bodies not yet stored: one object write and one crawl.after_body_write each
    incomplete: int  # categories whose snapshot is not complete: one manifest write each to complete it
    to_load: int  # categories whose products are not loaded from their current parse (others are skipped)
    categories: int
    letter_writes: int = 0  # dead_letters.json writes dead_letters is sure to make (see _dead_letter_work)
    letter_loads: int = 0  # dead_letters table transactions it is sure to make

    def lower_bound(self, kind: str) -> int:
        """Hits of ``kind`` the next run is sure to reach (so that a crash point there lands)."""
        fetching = "raw_pages" in self.running
        if kind == "time":
            return self.requests if fetching else 0
        if kind == "crawl.after_body_write":
            return self.bodies if fetching else 0
        if kind.startswith("warehouse."):  # one transaction per category and table; unchanged ones skip it
            return self.letter_loads * ("dead_letters" in self.running) + self.to_load * ("products_table" in self.running)
        writes = self.bodies + self.incomplete if fetching else 0
        # parsed.json or parse_state.json per category; the sure dead_letters.json writes
        return writes + self.categories * ("parsed_products" in self.running) + self.letter_writes * ("dead_letters" in self.running)


def _choose(planned: str, work: _Work, kills_left: int, rng: random.Random) -> tuple[str, int] | None:
    """``(kind, n)`` for one kill: sure to land (n <= a lower bound of the hits left), spread over the
    kills. The planned kind, else a crash point the run is sure to reach; None when there is none."""
    for kind in (planned, "storage.after_temp_write", "warehouse.after_delete"):
        bound = work.lower_bound(kind)
        if bound > 0:
            upper = max(1, min(bound, (2 * bound) // (kills_left + 1)))
            return kind, rng.randint(1, upper)
    return None


def _dead_letter_work(series: Series, manifests: list, fetching: bool) -> tuple[int, int]:
    """``(dead_letters.json writes, dead_letters transactions)`` the next ``dead_letters`` is sure to make.

    It sees a category's snapshot once complete (already, or by this run's ``raw_pages``).
    A snapshot this run starts or completes was opened by it: its file is written. A
    snapshot with a failed page has dead letters: its file is written and its rows loaded
    (the series' dead page is a permanent 404, and a run on the same day keeps or resumes
    its snapshot, so the failed page stays). A complete snapshot's file is written unless
    it already lists none; rows left in the table are replaced. Cards the parser rejects
    are not counted (a lower bound).
    """
    from scrape_assets.defs.assets.dead_letters import lists_no_dead_letter

    table = {}
    if (series.data / "warehouse.db").exists():
        with Warehouse(f"sqlite:///{series.data / 'warehouse.db'}", create=False) as wh:
            if dead_letters.name in wh.existing_tables():
                table = wh.rows_by_category(dead_letters, series.categories)
    writes = len(series.categories) - len(manifests) if fetching else 0  # snapshots this run starts
    loads = 0
    for manifest in manifests:
        if not (manifest.is_complete or fetching):
            continue
        failed = manifest.counts()["failed"] > 0
        writes += failed or not manifest.is_complete or not lists_no_dead_letter(series.store, manifest)
        loads += failed or bool(table.get(manifest.category))
    return writes, loads


def _categories_to_load(series: Series) -> int:
    """Categories whose ``products`` rows were not loaded from their current parse."""
    if not (series.data / "warehouse.db").exists():
        return len(series.categories)
    try:
        from scrape_assets.extract import load_parse_state
    except ImportError:  # no incremental loads: every category is reloaded
        return len(series.categories)
    versions = Warehouse(f"sqlite:///{series.data / 'warehouse.db'}").loaded_versions(products, series.categories)
    to_load = 0
    for category in series.categories:
        state = load_parse_state(series.store, SITE, category)
        to_load += state is None or versions.get(category) != state.input_version
    return to_load


def run_kill_loop(
    workdir: Path,
    *,
    kills: int,
    seed: int,
    categories: list[str],
    concurrency: int = 4,
    requests_per_second: float = 8.0,
    plan: list[str] | None = None,
    day: datetime.date = DEMO_DAY,
    dead_page: str | None = "default",
) -> dict:
    """Run the reference and the killed series (see the module docstring) and compare them.

    Args:
        workdir: an empty or new folder; ``reference/`` and ``killed/`` are created in it (with
            each run's log, ``run-NN.log``).
        kills: K, the number of SIGKILLs.
        seed: seeds every random choice (kinds, moments, crash point hits).
        categories: consecutive demo categories (``sites/demo.yaml`` order), e.g.
            ``["romance", "fiction", "default"]``.
        concurrency: ``SCRAPE_MAX_CONCURRENCY``, the bound on page re-fetches per kill.
        requests_per_second: ``SCRAPE_REQUESTS_PER_SECOND``; low enough that a run fetches for seconds.
        plan: the kinds of the kills in order (``"time"`` or crash point names); default
            :func:`plan_kills`. A kind the next run is not sure to reach (e.g. ``"time"``
            once fetching is over) is replaced by ``storage.after_temp_write`` or
            ``warehouse.after_delete`` (the record keeps ``planned``).
        day: the demo catalogue's day (prices depend on it), the same for both series.
        dead_page: a listing path answering 404 for good; ``"default"`` picks one
            (:func:`default_dead_page`), None serves the plain catalogue.

    Returns:
        A JSON-serialisable dict: ``kills`` (one :class:`KillRecord` each), ``totals`` and
        ``checks`` (name -> bool), ``passed``.

    Raises:
        ValueError: bad categories or plan.
        RuntimeError: the reference or the final run failed (the message holds its log's tail).
    """
    wall_started = time.monotonic()
    rng = random.Random(seed)
    workdir = Path(workdir).resolve()
    partition_range(categories)  # validate early
    plan = list(plan) if plan is not None else plan_kills(kills, rng)
    if len(plan) != kills or any(k not in FETCH_KINDS + LOAD_KINDS for k in plan):
        raise ValueError(f"plan {plan} must list {kills} kinds out of {FETCH_KINDS + LOAD_KINDS}")
    dead = default_dead_page(categories, day) if dead_page == "default" else dead_page
    server = start_server(day, frozenset([dead] if dead else []))
    base_env = {k: v for k, v in os.environ.items() if not k.startswith("SCRAPE_") and k != "DAGSTER_HOME"}
    base_env.update(
        PYTHONPATH=os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])),
        SCRAPE_SITE=SITE,
        SCRAPE_BASE_URL=server.base_url,
        SCRAPE_MAX_CONCURRENCY=str(concurrency),
        SCRAPE_REQUESTS_PER_SECOND=str(requests_per_second),
        SCRAPE_MAX_ATTEMPTS=str(kills + 3),
        SCRAPE_DEMO_DATE=day.isoformat(),
    )
    try:
        reference = Series(workdir / "reference", base_env, server, categories)
        reference_wall_s = reference.run_to_end(list(ASSETS))
        reference_pages = {m.category: len(m.pages) for m in reference.manifests()}
        reference_bodies = {m.category: m.counts()["done"] for m in reference.manifests()}

        killed = Series(workdir / "killed", base_env, server, categories)
        records: list[KillRecord] = []
        notes: list[str] = []
        for index, planned in enumerate(plan, start=1):
            running = killed.remaining()
            if not running:
                notes.append(f"kill {index} ({planned}) not attempted: everything is materialized")
                break
            manifests = killed.manifests()
            letter_writes, letter_loads = _dead_letter_work(killed, manifests, "raw_pages" in running)
            work = _Work(
                running=running,
                requests=sum(reference_pages.values()) - sum(len(m.pages) - m.counts()["pending"] for m in manifests),
                bodies=sum(reference_bodies.values()) - sum(m.counts()["done"] for m in manifests),
                incomplete=len(categories) - sum(m.is_complete for m in manifests),
                to_load=_categories_to_load(killed),
                categories=len(categories),
                letter_writes=letter_writes,
                letter_loads=letter_loads,
            )
            choice = _choose(planned, work, kills - index + 1, rng)
            if choice is None:
                notes.append(f"kill {index} ({planned}) not attempted: the next run has no moment sure to be interrupted")
                break
            kind, n = choice
            delay = round(rng.uniform(0, 1 / requests_per_second), 3) if kind == "time" else 0.0
            record = KillRecord(index=index, planned=planned, kind=kind, n=n, delay_s=delay, running=running)
            started = time.monotonic()
            proc = killed.start(running, None if kind == "time" else f"{kind}:{n}")
            if kind == "time":
                _kill_at_time(killed, proc, record, started)
            record.exit_code = killed.wait(proc)
            record.when_s = round(time.monotonic() - started, 3)
            record.landed = record.exit_code == -signal.SIGKILL
            if record.exit_code not in (0, -signal.SIGKILL):
                raise RuntimeError(f"kill {index}: the run failed by itself (exit {record.exit_code}):\n{killed.log_tail()}")
            record.pages_done_at_kill = sum(m.counts()["done"] for m in killed.manifests())
            record.temp_files_after_kill = len(killed.temp_files())
            records.append(record)
        final_running = killed.remaining()
        final_wall_s = killed.run_to_end(final_running) if final_running else 0.0
        if killed.remaining():
            raise RuntimeError(f"after the final run, not materialized: {killed.remaining()}")
        for seg, record in enumerate(records):
            later = {path for s in range(seg + 1, len(killed.segments)) for path in killed.page_requests(s)}
            record.refetched = sorted(set(killed.page_requests(seg)) & later)
            record.pages_refetched = len(record.refetched)
        result = _compare(reference, killed, records, concurrency)
        result["notes"] = notes
        result["checks"]["all_kills_landed"] = result["checks"]["all_kills_landed"] and len(records) == kills
        result["passed"] = all(result["checks"].values())
    finally:
        server.shutdown()
        server.server_close()
    result["totals"].update(
        reference_wall_s=round(reference_wall_s, 2),
        final_run_wall_s=round(final_wall_s, 2),
        wall_s=round(time.monotonic() - wall_started, 2),
    )
    result["settings"] = {
        "kills": kills, "seed": seed, "categories": categories, "concurrency": concurrency,
        "requests_per_second": requests_per_second, "day": day.isoformat(), "dead_page": dead,
        "max_attempts": kills + 3, "workdir": str(workdir),
    }
    return result


def _rows(wh: Warehouse, table: sa.Table) -> list[dict]:
    ignored = IGNORED_COLUMNS[table.name]
    return sorted(({k: v for k, v in row.items() if k not in ignored} for row in wh.rows(table)), key=repr)


def _check_store(series: Series) -> dict:
    """Load every manifest; check completeness, bodies against hashes, orphan folders."""
    checked, incomplete, unloadable, bad_bodies, orphan_folders = 0, [], [], [], []
    snapshots: dict[str, int] = {}
    for category in series.categories:
        ids = list_snapshots(series.store, SITE, category)
        snapshots[category] = len(ids)
        for name in series.store.list_folders(f"{SITE}/{category}"):  # folders only: a dot file (a temp) is no key
            if name not in ids:
                orphan_folders.append(f"{SITE}/{category}/{name}")
        for snapshot_id in ids:
            checked += 1
            try:
                manifest = load_manifest(series.store, SITE, category, snapshot_id)
            except ManifestError as exc:
                unloadable.append(str(exc))
                continue
            if not manifest.is_complete or manifest.counts()["pending"]:
                incomplete.append(manifest.key)
            for number, entry in manifest.pages.items():
                if entry.status != "done":
                    continue
                key = manifest.body_key(number) if hasattr(manifest, "body_key") else manifest.page_key(number)
                try:
                    body = series.store.read_bytes(key)
                except FileNotFoundError:
                    bad_bodies.append(key)
                    continue
                if entry.content_hash != "sha256:" + hashlib.sha256(body).hexdigest():
                    bad_bodies.append(key)
    return {
        "manifests_checked": checked, "manifests_unloadable": unloadable, "manifests_incomplete": incomplete,
        "bodies_missing_or_wrong": bad_bodies, "orphan_snapshot_folders": orphan_folders, "snapshots": snapshots,
    }


def _compare(reference: Series, killed: Series, records: list[KillRecord], concurrency: int) -> dict:
    ref_wh = Warehouse(f"sqlite:///{reference.data / 'warehouse.db'}")
    wh = Warehouse(f"sqlite:///{killed.data / 'warehouse.db'}")
    tables = {}
    for table in (products, dead_letters):
        want, got = _rows(ref_wh, table), _rows(wh, table)
        tables[table.name] = {
            "rows_reference": len(want),
            "rows_killed": len(got),
            "equal": want == got,
            "only_in_reference": [r for r in want if r not in got][:5],
            "only_in_killed": [r for r in got if r not in want][:5],
        }
    ref_attempts = {(r["category"], r["url"], r["stage"]): r["attempts"] for r in ref_wh.rows(dead_letters)}
    fewer_attempts = [
        (r["url"], r["attempts"]) for r in wh.rows(dead_letters)
        if r["attempts"] < ref_attempts.get((r["category"], r["url"], r["stage"]), 0)
    ]
    dead_keys = Counter((r["category"], r["url"], r["stage"]) for r in wh.rows(dead_letters))
    duplicates = len(wh.duplicate_product_keys()) + sum(1 for n in dead_keys.values() if n > 1)
    store = _check_store(killed)
    temp_files = killed.temp_files()
    ref_requests = sum(len(reference.page_requests(s)) for s in range(len(reference.segments)))
    killed_requests = sum(len(killed.page_requests(s)) for s in range(len(killed.segments)))
    max_refetched = max((r.pages_refetched for r in records), default=0)
    checks = {
        "all_kills_landed": all(r.landed for r in records),
        "products_equal": tables["products"]["equal"],
        "dead_letters_equal": tables["dead_letters"]["equal"] and not fewer_attempts,
        "no_duplicate_keys": duplicates == 0,
        "manifests_loadable_and_complete": not (
            store["manifests_unloadable"] or store["manifests_incomplete"] or store["bodies_missing_or_wrong"]
        ),
        "no_temp_files_or_orphan_folders": not temp_files and not store["orphan_snapshot_folders"],
        "refetches_per_kill_within_concurrency": max_refetched <= concurrency,
    }
    return {
        "kills": [asdict(r) for r in records],
        "tables": tables,
        "store": store,
        "temp_files": temp_files,
        "totals": {
            "kills_landed": sum(r.landed for r in records),
            "rows_compared": sum(t["rows_reference"] for t in tables.values()),
            "duplicate_keys": duplicates,
            "manifests_checked": store["manifests_checked"],
            "temp_files_found": len(temp_files),
            "pages_refetched": sum(r.pages_refetched for r in records),
            "max_pages_refetched_per_kill": max_refetched,
            "page_requests_reference": ref_requests,
            "page_requests_killed_series": killed_requests,
            "runs_killed_series": killed.runs,
        },
        "checks": checks,
        "passed": all(checks.values()),
    }


def format_report(result: dict) -> str:
    """A readable table of the kills, then the totals and checks."""
    s = result["settings"]
    lines = [
        f"kill loop: {s['kills']} kills, seed {s['seed']}, categories {','.join(s['categories'])}, "
        f"concurrency {s['concurrency']}, {s['requests_per_second']:g} req/s, dead page {s['dead_page']}",
        "",
        f"{'#':>3}  {'kind':<26}{'n':>4}  {'run from':<17}{'killed at':>10}  {'pages done':>10}  {'tmp left':>8}  "
        f"{'refetched':>9}",
    ]
    for k in result["kills"]:
        kind = k["kind"] + ("" if k["kind"] == k["planned"] else f" (for {k['planned']})")
        when = f"{k['when_s']:.2f}s" + ("" if k["landed"] else " MISSED")
        lines.append(
            f"{k['index']:>3}  {kind:<26}{k['n']:>4}  {k['running'][0]:<17}{when:>10}  "
            f"{k['pages_done_at_kill']:>10}  {k['temp_files_after_kill']:>8}  {k['pages_refetched']:>9}"
        )
    lines += [
        "",
        "n: the crash point's hit, or for 'time' the new page request after which the group was killed;",
        "run from: the first asset the killed run was materializing (it ran that one and those downstream);",
        "pages done: in the manifests right after the kill; tmp left: orphaned temp files right after it;",
        "refetched: page paths the server saw before this kill and again after it.",
    ]
    t = result["totals"]
    lines += [
        "",
        f"rows compared {t['rows_compared']} (products {result['tables']['products']['rows_reference']}, "
        f"dead letters {result['tables']['dead_letters']['rows_reference']}); duplicate keys {t['duplicate_keys']}; "
        f"manifests checked {t['manifests_checked']}; temp files left {t['temp_files_found']}",
        f"page requests: reference {t['page_requests_reference']}, killed series {t['page_requests_killed_series']} "
        f"over {t['runs_killed_series']} runs; refetched {t['pages_refetched']} (max {t['max_pages_refetched_per_kill']} per kill)",
        f"wall time {t['wall_s']:.1f}s (reference run {t['reference_wall_s']:.1f}s)",
        "",
    ]
    lines += [f"note: {note}" for note in result.get("notes", [])]
    lines += [f"  {'ok  ' if ok else 'FAIL'} {name}" for name, ok in result["checks"].items()]
    lines.append("PASSED" if result["passed"] else "FAILED")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m reliability.kill_loop", description=__doc__.split("\n\n")[0])
    parser.add_argument("--kills", type=int, default=10, help="number of SIGKILLs (K)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--categories", default="romance,fiction,default", help="consecutive demo categories")
    parser.add_argument("--concurrency", type=int, default=4, help="SCRAPE_MAX_CONCURRENCY")
    parser.add_argument("--rps", type=float, default=8.0, help="SCRAPE_REQUESTS_PER_SECOND")
    parser.add_argument("--workdir", type=Path, default=None, help="default: a new folder under the system temp dir")
    parser.add_argument("--out", type=Path, default=None, help="write the figures as JSON here")
    args = parser.parse_args(argv)
    if args.kills < 0:
        parser.error("--kills must be >= 0")
    from scrape_assets.settings import MAX_ATTEMPTS

    if args.kills + 3 > MAX_ATTEMPTS:  # SCRAPE_MAX_ATTEMPTS is kills + 3 (see run_kill_loop)
        parser.error(f"--kills must be <= {MAX_ATTEMPTS - 3} (SCRAPE_MAX_ATTEMPTS = kills + 3 is at most {MAX_ATTEMPTS})")
    if args.workdir is None:
        import tempfile

        args.workdir = Path(tempfile.mkdtemp(prefix="kill-loop-"))
    args.workdir = args.workdir.resolve()  # the warehouse URLs built from it must be absolute
    categories = [c.strip() for c in args.categories.split(",") if c.strip()]
    try:
        result = run_kill_loop(
            args.workdir, kills=args.kills, seed=args.seed, categories=categories,
            concurrency=args.concurrency, requests_per_second=args.rps,
        )
    except (ValueError, RuntimeError) as exc:
        print(f"kill loop: error: {exc}", file=sys.stderr)
        return 2
    print(format_report(result))
    print(f"runs and logs in {args.workdir}")
    if args.out:
        args.out.write_text(json.dumps(result, indent=1, default=str))
        print(f"figures written to {args.out}")
    return 0 if result["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
