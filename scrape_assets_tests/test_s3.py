"""Object storage on S3: the pipeline against a real S3 API on 127.0.0.1 (moto's server), through s3fs.

Production keeps raw pages on S3 (``SCRAPE_STORAGE_URL=s3://bucket/prefix``). These tests
run the same code there: every object goes through s3fs and HTTP to an S3 server, as it
would to AWS (or MinIO, R2): the credentials and the endpoint come from the environment
(``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``, ...), as the README says.
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
from contextlib import contextmanager

import pytest

from scrape_assets.defs.assets.raw_pages import storage_refused
from scrape_assets.errors import StorageError
from scrape_assets.manifest import has_snapshot, latest_manifest, list_snapshots
from scrape_assets.storage import ObjectStore
from scrape_assets.warehouse import Warehouse, products
from scrape_assets_tests.conftest import make_resources, materialize, one_page_snapshot, run_metadata

PAGES = {"travel": 1, "mystery": 2}  # listing pages per category in the demo catalogue


def _keys(client, bucket: str, prefix: str = "") -> dict[str, bytes]:
    """Every object under ``prefix`` in the bucket, key -> body, read with boto3 (not through our code)."""
    out = {}
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        for item in page.get("Contents", []):
            out[item["Key"]] = client.get_object(Bucket=bucket, Key=item["Key"])["Body"].read()
    return out


def test_the_pipeline_on_s3_stores_pages_manifests_and_rows_and_an_unchanged_day_stores_no_page(
    tmp_path, instance, demo_server, bucket
):
    name, client = bucket
    res = {**make_resources(tmp_path, base_url=demo_server.base_url)}
    from scrape_assets.defs.resources import ObjectStoreResource

    res["store"] = ObjectStoreResource(url=f"s3://{name}/objects")
    assert materialize(instance, res, list(PAGES)).success

    objects = _keys(client, name, "objects/")
    store = ObjectStore(f"s3://{name}/objects")
    first = {}
    for category, pages in PAGES.items():
        manifest = first[category] = latest_manifest(store, "demo", category, complete=True)
        snapshot = f"objects/{manifest.prefix}"
        assert manifest.counts()["done"] == pages
        bodies = {k: v for k, v in objects.items() if k.startswith(f"{snapshot}/pages/")}
        assert sorted(bodies) == sorted(f"objects/{manifest.page_key(n)}" for n in range(1, pages + 1))
        for n in range(1, pages + 1):  # what the manifest says it stored is what S3 holds
            body = objects[f"objects/{manifest.page_key(n)}"]
            assert manifest.pages[n].content_hash == "sha256:" + hashlib.sha256(body).hexdigest()
        assert {f"{snapshot}/manifest.json", f"{snapshot}/parsed.json", f"{snapshot}/dead_letters.json",
                f"objects/demo/{category}/parse_state.json"} <= set(objects)
    # One PUT per object: no temp files, no journal (nothing can be appended to on S3).
    assert not [k for k in objects if k.endswith((".tmp", ".journal"))]
    wh = Warehouse(f"sqlite:///{tmp_path / 'warehouse.db'}")
    assert {c: wh.count(products, c) for c in PAGES} == {"travel": 11, "mystery": 32}
    table = wh.rows(products)

    # The next run on the unchanged catalogue: conditional GETs, 304s, no page stored again.
    demo_server.clear_requests()
    second = materialize(instance, res, list(PAGES))
    assert second.success
    assert run_metadata(second)["raw_pages"]["pages_not_modified"] == 3
    after = _keys(client, name, "objects/")
    for category, pages in PAGES.items():
        manifest = latest_manifest(store, "demo", category, complete=True)
        assert manifest.snapshot_id != first[category].snapshot_id
        assert list_snapshots(store, "demo", category) == sorted([first[category].snapshot_id, manifest.snapshot_id])
        assert [manifest.body_key(n) for n in range(1, pages + 1)] == [
            first[category].page_key(n) for n in range(1, pages + 1)]
        assert not [k for k in after if k.startswith(f"objects/{manifest.prefix}/pages/")]
    assert wh.rows(products) == table


def test_a_long_lived_process_sees_what_other_processes_write_to_s3_later(bucket):
    """A sensor's code server outlives many runs: it must not answer from a listing cached before them.

    fsspec's filesystems cache a folder's listing for the life of the process by default;
    with it, a snapshot written by a later run was invisible here, and an object rewritten
    by another process could not be read at all (s3fs: "FileExpired").
    """
    name, _ = bucket
    url = f"s3://{name}/objects"
    store = ObjectStore(url)
    _crawl_in_child(url, new_snapshot=False)
    first = latest_manifest(store, "demo", "travel", complete=True)
    store.write_bytes_atomic("demo/travel/notes.json", b"old")
    assert store.list_names("demo/travel") == [first.snapshot_id, "notes.json"]  # listed here, as a sensor would

    _crawl_in_child(url, new_snapshot=True)  # another process: a second snapshot...
    _in_child(f"ObjectStore({url!r}).write_bytes_atomic('demo/travel/notes.json', b'rewritten, longer')")  # ...a rewrite
    second = latest_manifest(store, "demo", "travel", complete=True)
    assert second is not None and second.snapshot_id > first.snapshot_id
    assert store.list_names("demo/travel") == [first.snapshot_id, second.snapshot_id, "notes.json"]
    assert store.read_bytes("demo/travel/notes.json") == b"rewritten, longer"


def _in_child(statement: str) -> None:
    """Run ``statement`` (ObjectStore imported) in another Python process, with this one's environment."""
    code = f"from scrape_assets.storage import ObjectStore\n{statement}\n"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def _crawl_in_child(url: str, *, new_snapshot: bool) -> None:
    """raw_pages' crawl of demo/travel into ``url`` in another Python process."""
    code = (
        "import asyncio, logging\n"
        "from scrape_assets.defs.assets.raw_pages import crawl_partitions\n"
        "from scrape_assets.defs.resources import ObjectStoreResource, SiteResource\n"
        f"asyncio.run(crawl_partitions(SiteResource(site='demo'), ObjectStoreResource(url={url!r}), ['travel'],"
        f" new_snapshot={new_snapshot}, log=logging.getLogger('child')))\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


@contextmanager
def _s3_calls(store: ObjectStore):
    """The S3 API operations ``store`` sends in the block, in order (botocore's ``before-call`` event)."""
    fs = store.root.fs
    fs.connect()
    calls: list[str] = []

    def record(model, **_):
        calls.append(model.name)

    fs.s3.meta.events.register("before-call.s3", record)
    try:
        yield calls
    finally:
        fs.s3.meta.events.unregister("before-call.s3", record)


def test_a_read_is_one_get_a_write_one_put_and_the_latest_manifest_one_listing_and_one_read(bucket):
    """Requests are what S3 bills and what each step waits for: none beyond what the operation needs."""
    name, _ = bucket
    store = ObjectStore(f"s3://{name}/objects")
    for snapshot_id, complete in [("2026-11-28T000000Z", True), ("2026-11-29T000000Z", True),
                                  ("2026-11-30T000000Z", False)]:
        one_page_snapshot(store, snapshot_id, complete=complete)
    store.write_bytes_atomic("demo/travel/parse_state.json", b"{}")  # a file beside the snapshot folders

    with _s3_calls(store) as calls:
        store.write_bytes_atomic("demo/travel/notes.json", b"new")
    assert calls == ["PutObject"]  # no folder to create, no existence check first
    with _s3_calls(store) as calls:
        assert store.read_bytes("demo/travel/notes.json") == b"new"
    assert calls == ["GetObject"]  # not a HEAD for the size first
    with _s3_calls(store) as calls, pytest.raises(FileNotFoundError):
        store.read_bytes("demo/travel/missing.json")
    assert calls == ["GetObject"]
    with _s3_calls(store) as calls:
        assert latest_manifest(store, "demo", "travel").snapshot_id == "2026-11-30T000000Z"
    assert calls == ["ListObjectsV2", "GetObject"]  # however many snapshots are kept
    with _s3_calls(store) as calls:
        assert latest_manifest(store, "demo", "travel", complete=True).snapshot_id == "2026-11-29T000000Z"
    assert calls == ["ListObjectsV2", "GetObject", "GetObject"]
    assert list_snapshots(store, "demo", "travel") == ["2026-11-28T000000Z", "2026-11-29T000000Z",
                                                        "2026-11-30T000000Z"]  # parse_state.json is no snapshot


def test_prune_on_s3_deletes_the_old_snapshot_but_the_bodies_the_newest_reads(bucket, monkeypatch, capsys):
    """``scrape-assets prune`` on S3: one listing, deletes through s3fs, and the newest snapshot still re-parses."""
    import asyncio
    import logging

    from scrape_assets.cli import main
    from scrape_assets.defs.assets.raw_pages import crawl_partitions
    from scrape_assets.defs.resources import ObjectStoreResource, SiteResource
    from scrape_assets.extract import extract_snapshot
    from scrape_assets.spec import load_spec

    name, client = bucket
    url = f"s3://{name}/objects"
    monkeypatch.setenv("SCRAPE_STORAGE_URL", url)
    for new_snapshot in (False, True):  # the second day's pages are 304s: it reads the first day's bodies
        asyncio.run(crawl_partitions(SiteResource(site="demo"), ObjectStoreResource(url=url), ["travel", "mystery"],
                                     new_snapshot=new_snapshot, log=logging.getLogger("test")))
    store = ObjectStore(url)
    first, newest = (list_snapshots(store, "demo", "mystery")[i] for i in (0, 1))
    latest = latest_manifest(store, "demo", "mystery", complete=True)
    assert latest.snapshot_id == newest and all(e.body_key for e in latest.pages.values())

    assert main(["prune", "--keep", "1"]) == 0
    out, err = capsys.readouterr()
    assert out.splitlines()[-1].startswith(f"deleted 2 snapshots (0.0 MB) across 12 categories of demo at {url}")
    assert "warning: remote storage has no partition locks" in err
    left = set(_keys(client, name, "objects/demo/mystery/"))
    assert left == {f"objects/demo/mystery/{newest}/manifest.json",
                    *(f"objects/{latest.body_key(n)}" for n in latest.pages)}  # bodies stay, first manifest gone
    assert all(key.startswith(f"objects/demo/mystery/{first}/pages/") for key in left - {
        f"objects/demo/mystery/{newest}/manifest.json"})
    assert list_snapshots(store, "demo", "mystery") == [newest]
    parsed = extract_snapshot(store, latest, load_spec("demo"), fetch_base_url=latest.fetch_config["base_url"])
    assert len(parsed.products) == 32  # a re-parse needs no request


def test_an_unreachable_endpoint_or_a_missing_bucket_is_a_storage_error_naming_the_location(bucket):
    """botocore's own errors are not OSErrors: they must still arrive as StorageError (one line, the location).

    The crawl gives an attempt back on a StorageError instead of counting it against the page,
    and the CLI's preflight turns it into one line; a raw EndpointConnectionError did neither.
    """
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        closed = probe.getsockname()[1]  # nothing listens here once the socket is closed
    store = ObjectStore(f"s3://{bucket[0]}/objects", {
        "client_kwargs": {"endpoint_url": f"http://127.0.0.1:{closed}"},
        "config_kwargs": {"retries": {"max_attempts": 1}},  # fail in a second, not after botocore's retries
    })
    location = f"s3://{bucket[0]}/objects"
    for call, action in [(lambda: store.write_bytes_atomic("demo/travel/x.json", b"{}"), "demo/travel/x.json: write"),
                         (lambda: store.read_bytes("demo/travel/x.json"), "demo/travel/x.json: read"),
                         (lambda: store.list_folders("demo/travel"), "demo/travel: listing"),
                         (lambda: store.exists("demo/travel/x.json"), "demo/travel/x.json: existence check"),
                         (lambda: store.list_names("demo/travel"), "demo/travel: listing"),
                         (lambda: store.list_files("demo/travel"), "demo/travel: listing"),
                         (lambda: store.delete("demo/travel/x.json"), "demo/travel/x.json: delete"),
                         (lambda: store.delete_listed("demo/travel/.x.json.1.tmp"), "demo/travel/.x.json.1.tmp: delete")]:
        with pytest.raises(StorageError) as caught:
            call()
        assert str(caught.value).startswith(f"{location}/{action} failed: EndpointConnectionError: Could not connect "
                                            f"to the endpoint URL: \"http://127.0.0.1:{closed}/"), str(caught.value)

    # Whether a snapshot is this site's (the warehouse's claim check): an outage is raised, not taken for "no".
    with pytest.raises(StorageError, match="EndpointConnectionError"):
        has_snapshot(store, "demo")("travel", "2026-12-01T000000Z")
    assert has_snapshot(store, "demo")("travel", "not a snapshot id") is False  # not even a key: not ours

    name, client = bucket
    missing = ObjectStore(f"s3://{name}-missing/objects")
    with pytest.raises(StorageError) as caught:
        missing.ensure_writable()
    assert str(caught.value) == (f"s3://{name}-missing/objects: bucket '{name}-missing' does not exist: create it, "
                                 "or fix the URL")
    assert storage_refused(caught.value)  # raw_pages fails at once: its RetryPolicy would not create the bucket
    with pytest.raises(StorageError, match=r"write failed"):
        missing.write_bytes_atomic("demo/travel/x.json", b"{}")
    assert f"{name}-missing" not in [b["Name"] for b in client.list_buckets()["Buckets"]]  # no bucket made by mistake


def test_summary_and_prune_say_in_one_line_when_the_bucket_endpoint_or_credentials_are_wrong(
    bucket, monkeypatch, capsys
):
    """A typo in the bucket must not read as an empty store (summary 0/12, prune "0 snapshots", exit 0)."""
    from s3fs import S3FileSystem

    from scrape_assets.cli import main

    name, _ = bucket
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")  # botocore: fail in a second, not after its retries
    cases = {
        "no such bucket": ({"SCRAPE_STORAGE_URL": f"s3://{name}-typo/raw"}, [],
                           f"SCRAPE_STORAGE_URL='s3://{name}-typo/raw' is invalid: expected object storage this "
                           f"process can {{usable}} (bucket '{name}-typo' does not exist: create it, or fix the URL)"),
        "wrong endpoint": ({"SCRAPE_STORAGE_URL": f"s3://{name}/raw", "AWS_ENDPOINT_URL": "http://127.0.0.1:9"}, [],
                           f"cannot use object storage at s3://{name}/raw: bucket check failed: "
                           "EndpointConnectionError: Could not connect to the endpoint URL: "
                           f"\"http://127.0.0.1:9/{name}\" (check the endpoint (AWS_ENDPOINT_URL, or the profile's) "
                           "and the network)"),
        "no credentials": ({"SCRAPE_STORAGE_URL": f"s3://{name}/raw", "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent",
                            "AWS_CONFIG_FILE": "/nonexistent"}, ["AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"],
                           f"cannot use object storage at s3://{name}/raw: bucket check failed: NoCredentialsError: "
                           "Unable to locate credentials (give credentials: AWS_ACCESS_KEY_ID and "
                           "AWS_SECRET_ACCESS_KEY, AWS_PROFILE, or an instance role)"),
    }
    for case, (env, unset, expected) in cases.items():
        with monkeypatch.context() as patch:
            for key, value in env.items():
                patch.setenv(key, value)
            for key in unset:
                patch.delenv(key)
            S3FileSystem.clear_instance_cache()  # fsspec reuses a client built with the earlier environment
            try:
                for command, usable in ((["summary"], "read"), (["prune", "--keep", "1"], "write")):
                    assert main(command) == 2, case
                    captured = capsys.readouterr()
                    assert captured.err == f"scrape-assets: error: {expected.format(usable=usable)}\n", case
                    assert captured.out == ""
            finally:
                S3FileSystem.clear_instance_cache()


def test_a_refused_bucket_check_is_let_through_only_when_the_root_can_be_listed(bucket, monkeypatch):
    """S3 answers 403 both to a policy that grants a prefix but not HeadBucket and to wrong keys."""
    name, _ = bucket
    store = ObjectStore(f"s3://{name}/objects")
    store.write_bytes_atomic("demo/travel/notes.json", b"{}")

    def refused(*_args, **_kwargs):
        raise PermissionError("Forbidden")

    monkeypatch.setattr(store.root.fs, "info", refused)  # HeadBucket refused, the listing allowed: fine
    store.check_root()
    store.ensure_writable()
    monkeypatch.setattr(store.root.fs, "ls", refused)  # both refused: wrong keys, or no right to list at all
    with pytest.raises(StorageError) as caught:
        store.check_root()
    assert str(caught.value) == (f"s3://{name}/objects: Forbidden (S3 refused both the bucket and the listing: "
                                 "check the credentials and the policy)")
    assert caught.value.root == f"s3://{name}/objects"
