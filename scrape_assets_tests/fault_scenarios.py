"""Fault scenarios: one table shared by ``test_faults.py`` and ``reliability/fault_matrix.py``.

Each :class:`Scenario` is a fault spec for the faulty demo server (:mod:`scrape_assets.faults`)
and the exact outcome the pipeline must reach when it crawls ``travel`` (1 page) and
``mystery`` (2 pages) from it through Dagster: every page's status, attempts, HTTP status and
dead-letter reason, whether the run succeeds and whether the blocking schema check passes.
:func:`run_scenario` runs one and gathers what happened (:class:`Outcome`); the storage
scenarios (:func:`run_storage_heals_on_retry`, ...) break object storage instead of the site.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from scrape_assets.defs.resources import ObjectStoreResource
from scrape_assets.demo_site import catalogue, respond
from scrape_assets.errors import StorageError
from scrape_assets.faults import FaultSpec, FaultyDemoServer, content_body, make_fault_server, retry_after_waits
from scrape_assets.manifest import Manifest, latest_manifest, list_snapshots
from scrape_assets.spec import load_spec
from scrape_assets.storage import ObjectStore
from scrape_assets.warehouse import Warehouse, dead_letters, products
from scrape_assets_tests.conftest import make_resources, materialize, run_metadata, serving

DAY = datetime.date(2026, 11, 30)  # the catalogue's day, fixed so expected bytes never drift at midnight
CATEGORIES = ("travel", "mystery")  # consecutive in demo.yaml: one run, 3 listing pages
SITE = load_spec("demo")
P2 = r"mystery_3/page-2\.html$"  # the page most scenarios break
LISTINGS = r"^/catalogue/category/"
WAIT_TOLERANCE_S = 0.05  # scheduler noise allowed when comparing a measured wait with Retry-After


def page_path(category: str, n: int) -> str:
    """Request path of listing page ``n`` of ``category``, e.g. ``/catalogue/.../mystery_3/page-2.html``."""
    start = "/" + SITE.categories[category]
    return start if n == 1 else start.replace("index.html", f"page-{n}.html")


@dataclass(frozen=True)
class Expect:
    """One page's exact outcome. ``reason`` is the dead-letter reason code (before the first ':');
    ``detail``, when given, is the rest, with ``{url}`` and ``{base}`` standing for the page URL
    and the server's base URL."""

    status: str = "done"
    attempts: int = 1
    http_status: int | None = 200
    reason: str | None = None
    detail: str | None = None

    def full_reason(self, url: str, base: str) -> str | None:
        if self.detail is None:
            return None
        return f"{self.reason}: {self.detail.format(url=url, base=base)}" if self.detail else self.reason


DONE = Expect()
ALL_DONE = {"travel/1": DONE, "mystery/1": DONE, "mystery/2": DONE}


def _p2(outcome: Expect) -> dict[str, Expect]:
    return {**ALL_DONE, "mystery/2": outcome}


@dataclass(frozen=True)
class Scenario:
    """One fault spec and the exact outcome of crawling :data:`CATEGORIES` from it.

    Attributes:
        name: test id, ``<kind>-<variant>``.
        kind: the fault kind exercised (``rates`` for the seeded random mode).
        spec: the fault spec, as it would be written in YAML.
        pages: every page the snapshots hold, ``"category/n"`` -> outcome (pages never
            discovered are absent).
        run_succeeded: whether the Dagster run succeeds.
        schema_check_passed: the blocking ``parsed_products_match_schema`` check's result.
        requests: expected server requests per page key when not equal to its attempts.
        retry_after_s: the Retry-After the server sends; every wait is checked against it.
        bounded_by_deadline: each attempt must end within the fetcher's request deadline.
    """

    name: str
    kind: str
    spec: dict
    pages: dict[str, Expect]
    run_succeeded: bool = True
    schema_check_passed: bool = True
    requests: dict[str, int] = field(default_factory=dict)
    retry_after_s: float | None = None
    bounded_by_deadline: bool = False
    max_attempts: int = 3
    timeout_s: float = 0.5

    @property
    def fault_spec(self) -> FaultSpec:
        return FaultSpec.model_validate(self.spec)

    @property
    def success_rate(self) -> float:
        done = sum(e.status == "done" for e in self.pages.values())
        return round(done / len(self.pages), 4)


def _rule(fault: str, match: str = P2, **options) -> dict:
    return {"rules": [{"match": match, "fault": fault, **options}]}


_TIMEOUT_DETAIL = "no complete response from {url} within the 1.5 s deadline"

SCENARIOS: tuple[Scenario, ...] = (
    Scenario("http_error-500-recovers", "http_error", _rule("http_error", status=500, first_n=2),
             _p2(Expect(attempts=3))),
    Scenario("http_error-502-always", "http_error", _rule("http_error", status=502),
             _p2(Expect("failed", 3, 502, "http_502", ""))),
    Scenario("http_error-503-retry-after", "http_error", _rule("http_error", status=503, first_n=1, retry_after_s=1),
             _p2(Expect(attempts=2)), retry_after_s=1),
    Scenario("http_error-robots-txt-503", "http_error", _rule("http_error", match=r"^/robots\.txt$", status=503),
             {"travel/1": Expect("failed", 0, None, "robots_unreachable", "robots.txt answered HTTP 503; robots.txt requested 3 times"),
              "mystery/1": Expect("failed", 0, None, "robots_unreachable", "robots.txt answered HTTP 503; robots.txt requested 3 times")}),
    Scenario("http_error-robots-txt-503-recovers", "http_error",
             _rule("http_error", match=r"^/robots\.txt$", status=503, first_n=2), ALL_DONE),
    Scenario("http_429-seconds-always", "http_429", _rule("http_429", retry_after_s=1),
             _p2(Expect("failed", 3, 429, "http_429", "")), retry_after_s=1),
    Scenario("http_429-http-date", "http_429", _rule("http_429", retry_after_s=2, retry_after_form="http-date", first_n=1),
             _p2(Expect(attempts=2)), retry_after_s=2),
    Scenario("reset_mid_body-always", "reset_mid_body", _rule("reset_mid_body"),
             _p2(Expect("failed", 3, 200, "incomplete_body"))),
    Scenario("short_body-recovers", "short_body", _rule("short_body", first_n=2), _p2(Expect(attempts=3))),
    Scenario("trickle-always", "trickle", _rule("trickle", bytes_per_s=2000),
             _p2(Expect("failed", 3, 200, "timeout", _TIMEOUT_DETAIL)), bounded_by_deadline=True),
    Scenario("stall_after_headers-always", "stall_after_headers", _rule("stall_after_headers"),
             _p2(Expect("failed", 3, 200, "timeout")), bounded_by_deadline=True),
    Scenario("bad_gzip-always", "bad_gzip", _rule("bad_gzip"), _p2(Expect("failed", 3, 200, "decoding_error"))),
    Scenario("oversize_body-declared", "oversize_body", _rule("oversize_body"),
             _p2(Expect("failed", 1, 200, "body_too_large", "Content-Length 10000001 > max_body_bytes 10000000"))),
    Scenario("oversize_body-streamed", "oversize_body", _rule("oversize_body", declare_length=False),
             _p2(Expect("failed", 1, 200, "body_too_large", "more than max_body_bytes 10000000 bytes received"))),
    Scenario("gzip_bomb", "gzip_bomb", _rule("gzip_bomb"),
             _p2(Expect("failed", 1, 200, "body_too_large",
                        "Content-Encoding gzip decodes to more than 10000000 bytes (max_body_bytes)"))),
    Scenario("redirect_loop", "redirect_loop", _rule("redirect_loop"),
             _p2(Expect("failed", 1, 302, "redirect_loop", "{url}?loop=1 -> {url} was visited")),
             requests={"mystery/2": 2}),
    Scenario("redirect_offsite", "redirect_offsite", _rule("redirect_offsite"),
             _p2(Expect("failed", 1, 302, "offsite_redirect",
                        "{url} -> http://offsite.scrape-assets.invalid/catalogue/category/books/mystery_3/page-2.html"))),
    Scenario("charset_missing", "charset_missing", _rule("charset_missing", match=LISTINGS), ALL_DONE),
    Scenario("charset_wrong", "charset_wrong", _rule("charset_wrong", match=LISTINGS), ALL_DONE),
    Scenario("layout_changed", "layout_changed", _rule("layout_changed"), ALL_DONE,
             run_succeeded=False, schema_check_passed=False),
    Scenario("zero_products-broken-page", "zero_products", _rule("zero_products"), ALL_DONE,
             run_succeeded=False, schema_check_passed=False),
    Scenario("zero_products-empty-category", "zero_products",
             _rule("zero_products", match=r"travel_2/index\.html$", keep_counts=False), ALL_DONE),
    Scenario("robots_disallow", "robots_disallow",
             {"rules": [{"fault": "robots_disallow", "prefix": "/catalogue/category/books/mystery_3/"}]},
             {"travel/1": DONE, "mystery/1": Expect("failed", 0, None, "robots_disallowed", "disallowed by {base}robots.txt")}),
    # Seed 38 draws: travel/1 clean; mystery/1 reset, 503, clean; mystery/2 503, reset, 503.
    Scenario("rates-seed-38", "rates", {"rates": {"seed": 38, "http_error": 0.35, "reset_mid_body": 0.2}},
             {"travel/1": DONE, "mystery/1": Expect(attempts=3), "mystery/2": Expect("failed", 3, 503, "http_503", "")}),
)
SCENARIOS_BY_NAME = {s.name: s for s in SCENARIOS}


# --- running a scenario ----------------------------------------------------------------------


@contextlib.contextmanager
def fault_server(spec: FaultSpec) -> Iterator[FaultyDemoServer]:
    """A faulty demo server on 127.0.0.1 (any free port) for the fixed :data:`DAY`, stopped on exit."""
    with serving(make_fault_server(spec, "127.0.0.1", 0, day=DAY)) as server:
        yield server


@dataclass
class Outcome:
    """What one scenario run did, read back from Dagster, storage, the warehouse and the server."""

    name: str
    kind: str
    result: object  # dagster ExecuteInProcessResult
    server: FaultyDemoServer
    store: ObjectStore
    manifests: dict[str, Manifest]
    duration_s: float
    warehouse: Warehouse
    seen: dict[str, int]  # requests per path the server had received when the run ended

    @property
    def pages(self) -> dict[str, Expect]:
        """The snapshots' pages as :class:`Expect` values (reason code and detail split)."""
        out = {}
        for category, manifest in self.manifests.items():
            for n, entry in sorted(manifest.pages.items()):
                reason, detail = None, None
                if entry.status == "failed":
                    reason, _, detail = (entry.last_error or "").partition(": ")
                out[f"{category}/{n}"] = Expect(entry.status, entry.attempts, entry.http_status, reason, detail)
        return out

    def materialization(self, asset: str) -> dict | None:
        return run_metadata(self.result).get(asset)

    @property
    def checks(self) -> dict[str, object]:
        return {c.check_name: c for c in self.result.get_asset_check_evaluations()}

    def dead_letter_rows(self) -> list[dict]:
        return self.warehouse.rows(dead_letters)

    def product_rows(self) -> list[dict]:
        return self.warehouse.rows(products)

    def requests_for(self, key: str) -> int:
        """Requests the server had received for page ``"category/n"`` when the run ended."""
        category, n = key.split("/")
        return self.seen.get(page_path(category, int(n)), 0)

    def waits_ok(self, asked_s: float | None) -> bool | None:
        """Every wait after a Retry-After at least what was asked (and ``asked_s``); None if none."""
        waits = retry_after_waits(self.server)
        if not waits:
            return None
        return all(w.waited_s >= max(w.asked_s, asked_s or 0) - WAIT_TOLERANCE_S for w in waits)

    def row(self) -> dict:
        """One line of the fault matrix."""
        pages = self.pages
        raw = self.materialization("raw_pages") or {}
        check = self.checks.get("parsed_products_match_schema")
        return {
            "kind": self.kind,
            "scenario": self.name,
            "pages_done": sum(p.status == "done" for p in pages.values()),
            "pages_failed": sum(p.status == "failed" for p in pages.values()),
            "reasons": {k: p.reason for k, p in pages.items() if p.status == "failed"},
            "http_status": {k: p.http_status for k, p in pages.items()},
            "attempts": {k: p.attempts for k, p in pages.items()},
            "waits_ok": self.waits_ok(None),
            "success_rate": raw.get("success_rate"),
            "schema_check_passed": None if check is None else check.passed,
            "run_succeeded": self.result.success,
            "duration_s": round(self.duration_s, 2),
        }


def collect(name: str, kind: str, result, server, store: ObjectStore, workdir: Path, started: float,
            categories=CATEGORIES) -> Outcome:
    manifests = {c: latest_manifest(store, SITE.name, c) for c in categories}
    return Outcome(name, kind, result, server, store, {c: m for c, m in manifests.items() if m is not None},
                   time.monotonic() - started, Warehouse(f"sqlite:///{workdir / 'warehouse.db'}"),
                   server.attempt_counts)


def run_scenario(scenario: Scenario, workdir: Path, instance) -> Outcome:
    """Serve ``scenario``'s faults, run every asset for :data:`CATEGORIES` in one Dagster run, collect."""
    workdir.mkdir(parents=True, exist_ok=True)
    with fault_server(scenario.fault_spec) as server:
        resources = make_resources(
            workdir, base_url=server.base_url, max_attempts=scenario.max_attempts, timeout_s=scenario.timeout_s
        )
        started = time.monotonic()
        result = materialize(instance, resources, list(CATEGORIES), raise_on_error=False)
        return collect(scenario.name, scenario.kind, result, server, ObjectStore(str(workdir / "objects")),
                       workdir, started)


def expected_body(spec: FaultSpec, path: str, attempt: int) -> bytes:
    """The bytes a page must be stored with when its ``attempt``-th request succeeded."""
    return content_body(spec.choose(path, attempt), respond("GET", path, day=DAY).body)


def expected_products(pages: dict[str, Expect], spec: FaultSpec) -> set[tuple]:
    """``(category, product_id, title, price)`` of every product the done pages show (a page
    served with ``zero_products`` on its last attempt shows none)."""
    cat = catalogue(DAY)
    rows = set()
    for key, outcome in pages.items():
        category, n = key.split("/")
        last = spec.choose(page_path(category, int(n)), outcome.attempts)
        if outcome.status == "done" and getattr(last, "fault", None) != "zero_products":
            rows |= {(category, str(p.id), p.title, p.price) for p in cat.category(category).page_products(int(n))}
    return rows


# --- storage faults ---------------------------------------------------------------------------

_FLAKY_BUDGET: dict[str, int] = {}
_FLAKY_LOCK = threading.Lock()


class _FlakyStore(ObjectStore):
    """Fails the manifest write (full rewrite or journal line) that records the first attempt on
    page ``page``, i.e. right before that page's request is sent, while the token's budget lasts."""

    def __init__(self, url: str, token: str, page: int):
        super().__init__(url)
        self.token, self.page = token, page

    def _records_first_attempt(self, key: str, data: bytes) -> bool:
        if key.endswith("/manifest.json"):
            entry = json.loads(data)["pages"].get(str(self.page))
        elif key.endswith("/manifest.journal"):
            line = json.loads(data)
            entry = line["entry"] if line["page"] == self.page else None
        else:
            return False
        return bool(entry) and entry["status"] == "pending" and entry["attempts"] >= 1

    def _maybe_fail(self, key: str, data: bytes) -> None:
        if not self._records_first_attempt(key, data):
            return
        with _FLAKY_LOCK:
            if _FLAKY_BUDGET.get(self.token, 0) <= 0:
                return
            _FLAKY_BUDGET[self.token] -= 1
        raise StorageError(f"{self.describe()}/{key}", "write failed: [Errno 28] No space left on device")

    def write_bytes_atomic(self, key: str, data: bytes, *, sync_folder: bool = True) -> int:
        self._maybe_fail(key, data)
        return super().write_bytes_atomic(key, data, sync_folder=sync_folder)

    def append_bytes(self, key: str, data: bytes) -> None:
        self._maybe_fail(key, data)
        return super().append_bytes(key, data)


class FlakyObjectStoreResource(ObjectStoreResource):
    """Test-only store whose manifest write before page ``page``'s first request fails ``failures`` times."""

    token: str
    page: int = 2

    def store(self) -> ObjectStore:
        return _FlakyStore(self.url, self.token, self.page)


def run_storage_flaky_manifest(workdir: Path, instance, failures: int = 1) -> Outcome:
    """Storage fails once right before mystery page 2 is requested; the step's RetryPolicy resumes."""
    token = f"flaky-{id(workdir)}-{time.monotonic_ns()}"
    with _FLAKY_LOCK:
        _FLAKY_BUDGET[token] = failures
    with fault_server(FaultSpec()) as server:
        resources = make_resources(workdir, base_url=server.base_url, timeout_s=0.5)
        resources["store"] = FlakyObjectStoreResource(url=str(workdir / "objects"), token=token)
        started = time.monotonic()
        result = materialize(instance, resources, ["mystery"], raise_on_error=False)
        return collect("storage-flaky-manifest-write", "storage_unwritable", result, server,
                       ObjectStore(str(workdir / "objects")), workdir, started, categories=("mystery",))


def squat_page(store_root: Path, category: str, n: int) -> Callable[[], None]:
    """Block page ``n``'s key in the incomplete snapshot with a folder (writes there fail, even as
    root); return the function that removes the folder again."""
    store = ObjectStore(str(store_root))
    manifest = latest_manifest(store, SITE.name, category)
    blocker = store_root / manifest.page_key(n)
    (blocker / "squatter").mkdir(parents=True)
    return lambda: shutil.rmtree(blocker)


def run_storage_heals_on_retry(workdir: Path, instance) -> Outcome:
    """mystery page 2's key is unwritable when its body arrives; it is freed when the step's
    RetryPolicy retry asks for the page again. One run, one retry, same snapshot."""
    root = workdir / "objects"
    p2 = page_path("mystery", 2)
    with fault_server(FaultSpec()) as server:
        heal: list[Callable[[], None]] = []

        def on_request(path: str, attempt: int) -> None:
            if path == p2 and attempt == 1:
                heal.append(squat_page(root, "mystery", 2))
            elif path == p2 and attempt == 2:
                heal.pop()()

        server.on_request = on_request
        resources = make_resources(workdir, base_url=server.base_url, timeout_s=0.5)
        started = time.monotonic()
        result = materialize(instance, resources, ["mystery"], raise_on_error=False)
        return collect("storage-heals-on-retry", "storage_unwritable", result, server, ObjectStore(str(root)),
                       workdir, started, categories=("mystery",))


def run_storage_fails_then_resumes(workdir: Path, instance) -> tuple[Outcome, Outcome]:
    """mystery page 2's key stays unwritable: the step fails, its RetryPolicy retries three times
    (Dagster's delays, about 22 s) and the run fails. The key is freed and the next run resumes
    the same snapshot."""
    root = workdir / "objects"
    p2 = page_path("mystery", 2)
    with fault_server(FaultSpec()) as server:
        heal: list[Callable[[], None]] = []

        def on_request(path: str, attempt: int) -> None:
            if path == p2 and not heal:
                heal.append(squat_page(root, "mystery", 2))

        server.on_request = on_request
        resources = make_resources(workdir, base_url=server.base_url, timeout_s=0.5)
        started = time.monotonic()
        failed = materialize(instance, resources, ["mystery"], raise_on_error=False)
        first = collect("storage-unwritable-run-fails", "storage_unwritable", failed, server, ObjectStore(str(root)),
                        workdir, started, categories=("mystery",))
        server.on_request = None
        heal.pop()()
        started = time.monotonic()
        resumed = materialize(instance, resources, ["mystery"], raise_on_error=False)
        second = collect("storage-fixed-run-resumes", "storage_unwritable", resumed, server, ObjectStore(str(root)),
                         workdir, started, categories=("mystery",))
    return first, second


def snapshot_ids(outcome: Outcome, category: str) -> list[str]:
    return list_snapshots(outcome.store, SITE.name, category)
