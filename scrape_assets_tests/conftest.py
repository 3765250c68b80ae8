"""Shared fixtures: isolated settings, real Dagster instances, real HTTP servers on 127.0.0.1."""

from __future__ import annotations

import os
import signal
import tempfile
import threading
import uuid
from contextlib import contextmanager
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

# Tests never read the developer's SCRAPE_* settings or write into ./data.
for _name in [n for n in os.environ if n.startswith("SCRAPE_")]:
    del os.environ[_name]
os.environ["SCRAPE_DATA_DIR"] = tempfile.mkdtemp(prefix="scrape-assets-tests-")

# A shell without job control (a CI script, `nohup make test &`) starts the suite with SIGINT
# ignored, which every child inherits, and a Python started so never raises KeyboardInterrupt:
# the tests that stop a child with Ctrl-C (serve-demo) would wait for it in vain. With a
# handler here, children start with SIGINT's default disposition, as at a terminal.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

REPO_ROOT = Path(__file__).resolve().parents[1]
REALDATA = REPO_ROOT.parent / "shared" / "realdata" / "books.toscrape.com"

ALL_ASSETS = ("raw_pages", "parsed_products", "products_table", "dead_letters")


def make_resources(tmp_path: Path, **site_overrides) -> dict:
    """Resources like production's, rooted in ``tmp_path``."""
    from scrape_assets.defs.resources import AlertsResource, ObjectStoreResource, SiteResource, WarehouseResource

    return {
        "site": SiteResource(**{"site": "demo", **site_overrides}),
        "store": ObjectStoreResource(url=str(tmp_path / "objects")),
        "warehouse": WarehouseResource(url=f"sqlite:///{tmp_path / 'warehouse.db'}"),
        "alerts": AlertsResource(webhook_url=None),
    }


def crawl_demo(objects: Path, categories: list[str], *, new_snapshot: bool = False) -> list:
    """raw_pages's crawl (no Dagster run) of the in-process demo catalogue into ``objects``; its CrawlReports."""
    import asyncio
    import logging

    from scrape_assets.defs.assets.raw_pages import crawl_partitions
    from scrape_assets.defs.resources import ObjectStoreResource, SiteResource

    return asyncio.run(crawl_partitions(SiteResource(site="demo"), ObjectStoreResource(url=str(objects)), categories,
                                        new_snapshot=new_snapshot, log=logging.getLogger("test")))


def run_metadata(result) -> dict[str, dict]:
    """Each asset's metadata in a run (plain values), its partitions' per-category tables merged."""
    from scrape_assets.defs.assets.partition_metadata import metadata_by_asset

    return metadata_by_asset(event.materialization for event in result.get_asset_materialization_events())


def materialize(instance, resources: dict, partitions: list[str], selection=ALL_ASSETS, run_config=None, raise_on_error=True,
                tags=None):
    """Materialize ``selection`` for ``partitions`` (consecutive keys) in ONE run, like the schedule."""
    import dagster as dg

    from scrape_assets.defs.assets.dead_letters import dead_letters
    from scrape_assets.defs.assets.parsed_products import parsed_products
    from scrape_assets.defs.assets.products_table import products_table
    from scrape_assets.defs.assets.raw_pages import raw_pages

    assets = [raw_pages, parsed_products, products_table, dead_letters]
    return dg.materialize(
        assets,
        selection=list(selection),
        instance=instance,
        resources=resources,
        run_config=run_config,
        tags={
            "dagster/asset_partition_range_start": partitions[0],
            "dagster/asset_partition_range_end": partitions[-1],
            **(tags or {}),
        },
        raise_on_error=raise_on_error,
    )


def assert_later_pages_adopted(store, category: str) -> None:
    """Of ``category``'s two demo snapshots, the newer revalidated page 1 (a 304) and adopted
    pages 2..N from the older without a request (same body, hash and validators)."""
    from scrape_assets.manifest import list_snapshots, load_manifest

    older, newer = (load_manifest(store, "demo", category, s) for s in list_snapshots(store, "demo", category))
    assert newer.pages[1].not_modified and not newer.pages[1].assumed_unchanged
    for n in range(2, len(newer.pages) + 1):
        entry, old = newer.pages[n], older.pages[n]
        assert (entry.status, entry.assumed_unchanged, entry.body_key) == ("done", True, older.page_key(n))
        assert (entry.content_hash, entry.fetched_at, entry.last_modified) == (old.content_hash, old.fetched_at,
                                                                               old.last_modified)
    assert newer.data_version == older.data_version


def one_page_snapshot(store, snapshot_id: str, *, complete: bool, body_from: str | None = None):
    """A one-page snapshot of demo/travel saved in ``store``: its body stored, or read from ``body_from``'s snapshot."""
    from scrape_assets.manifest import Manifest, PageEntry

    manifest = Manifest(site="demo", category="travel", snapshot_id=snapshot_id, fetch_config={},
                        fetch_config_hash="h", start_url="http://x/", pages={1: PageEntry(url="http://x/")})
    entry = manifest.pages[1]
    if body_from is None:
        store.write_bytes_atomic(manifest.page_key(1), b"<html>" + snapshot_id.encode() + b"</html>")
    else:
        entry.body_key = f"demo/travel/{body_from}/pages/page-0001.html"
    entry.status = "done" if complete else "pending"
    manifest.completed_at = "2026-11-30T00:00:00Z" if complete else None
    manifest.save(store)
    return manifest


@pytest.fixture
def instance():
    import dagster as dg

    with dg.instance_for_test() as inst:
        yield inst


@contextmanager
def serving(server):
    """Run ``server.serve_forever()`` in a daemon thread for the block, then shut it down."""
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def demo_server():
    """The demo catalogue over real sockets on 127.0.0.1 (with a request log)."""
    from scrape_assets.demo_site import make_server

    with serving(make_server("127.0.0.1", 0)) as server:
        yield server


class _LoggingStaticHandler(SimpleHTTPRequestHandler):
    def log_message(self, format, *args):  # noqa: A002 - keep test output quiet
        pass

    def do_GET(self):
        with self.server.lock:
            self.server.paths.append(self.path)
        super().do_GET()


@pytest.fixture
def realdata_server():
    """A plain static file server rooted at ../shared/realdata/books.toscrape.com/."""
    if not REALDATA.is_dir():
        pytest.skip(f"real saved pages not found at {REALDATA} (../shared/realdata is provided next to the repo)")
    server = ThreadingHTTPServer(("127.0.0.1", 0), partial(_LoggingStaticHandler, directory=str(REALDATA)))
    server.daemon_threads = True
    server.paths = []
    server.lock = threading.Lock()
    server.base_url = f"http://127.0.0.1:{server.server_address[1]}/"
    with serving(server):
        yield server


class _WebhookHandler(__import__("http.server").server.BaseHTTPRequestHandler):
    def log_message(self, format, *args):  # noqa: A002
        pass

    def do_POST(self):
        import json

        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        with self.server.lock:
            self.server.received.append(json.loads(body))
            self.server.content_types.append(self.headers.get("Content-Type"))
        status = self.server.status
        self.send_response(status(json.loads(body)) if callable(status) else status)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")


@pytest.fixture
def webhook_server():
    """A real HTTP endpoint on 127.0.0.1 collecting alert POSTs in ``.received``."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _WebhookHandler)
    server.daemon_threads = True
    server.received = []  # every POST, accepted or not
    server.content_types = []  # their Content-Type headers
    server.status = 200  # what it answers (set 500 to refuse; or a function of the posted JSON)
    server.lock = threading.Lock()
    server.url = f"http://127.0.0.1:{server.server_address[1]}/hooks/SECRET-TOKEN"
    with serving(server):
        yield server


AWS_ENV = {"AWS_ACCESS_KEY_ID": "test-key", "AWS_SECRET_ACCESS_KEY": "test-secret", "AWS_DEFAULT_REGION": "us-east-1"}


@pytest.fixture(scope="session")
def s3_endpoint():
    """An S3 server on 127.0.0.1 (moto's) for the session; its URL (tests use it through :func:`bucket`)."""
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    try:
        yield f"http://{host}:{port}"
    finally:
        server.stop()


@pytest.fixture
def bucket(s3_endpoint, monkeypatch):
    """A new, empty bucket: ``(name, boto3 client)``; for the test, AWS_* point s3fs (and children) at it."""
    import boto3

    for key, value in {**AWS_ENV, "AWS_ENDPOINT_URL": s3_endpoint}.items():
        monkeypatch.setenv(key, value)
    client = boto3.client("s3", endpoint_url=s3_endpoint, aws_access_key_id=AWS_ENV["AWS_ACCESS_KEY_ID"],
                          aws_secret_access_key=AWS_ENV["AWS_SECRET_ACCESS_KEY"], region_name="us-east-1")
    name = f"scrape-{uuid.uuid4().hex[:12]}"
    client.create_bucket(Bucket=name)
    return name, client
