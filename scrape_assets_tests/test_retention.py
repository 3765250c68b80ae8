"""Snapshot retention: old snapshots go, everything the kept ones read stays, runs go on as before."""

from __future__ import annotations

import datetime
import os
import shutil
import threading
from pathlib import Path

import pytest

from scrape_assets.cli import main
from scrape_assets.demo_site import changed_categories, make_server
from scrape_assets.extract import (
    PARSER_VERSION,
    ParsedSnapshot,
    ParseState,
    extract_snapshot,
    load_current,
    load_parse_state,
    parsed_key,
    save_parse_state,
    save_parsed,
)
from scrape_assets.locks import partition_lock
from scrape_assets.manifest import latest_manifest, list_snapshots, load_manifest
from scrape_assets.retention import WRITER_SCOPES, plan_prune, prune
from scrape_assets.spec import load_spec
from scrape_assets.errors import StorageError
from scrape_assets.storage import ObjectStore
from scrape_assets.warehouse import Warehouse, products
from scrape_assets_tests.conftest import make_resources, materialize, one_page_snapshot

KEYS = ["travel", "mystery", "classics", "romance", "fiction", "default"]  # consecutive in demo.yaml
DAYS = [datetime.date(2026, 11, 28) + datetime.timedelta(days=i) for i in range(4)]


def _files(root: Path) -> dict[str, int]:
    return {str(p.relative_to(root)): p.stat().st_size for p in root.rglob("*") if p.is_file() and p.suffix != ".lock"}


def _run_day(tmp_path, instance, day, port):
    server = make_server("127.0.0.1", port, day=day)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        result = materialize(instance, make_resources(tmp_path, base_url=server.base_url), KEYS)
        assert result.success
        conditional = [r for r in server.requests if "if-none-match" in r.headers]
        return server.server_address[1], len(conditional)
    finally:
        server.shutdown()
        server.server_close()


def _spec_with_max_pages(tmp_path, n: int) -> str:
    """The demo spec with another parsing rule: every partition's parse input changes (a parser fix)."""
    demo = (Path(__file__).resolve().parents[1] / "scrape_assets" / "sites" / "demo.yaml").read_text()
    path = tmp_path / f"demo-{n}.yaml"
    path.write_text(demo.replace("pagination:\n", f"pagination:\n  max_pages: {n}\n", 1))
    return str(path)


def test_prune_keeps_what_the_newest_snapshots_read_and_the_next_day_runs_as_before(tmp_path, instance):
    unchanged = set(KEYS) - set().union(*(changed_categories(d) for d in DAYS[1:3]))
    assert unchanged and set(KEYS) - unchanged, "the seeded schedule leaves some categories unchanged for 3 days"
    port = 0
    for day in DAYS[:3]:
        port, _ = _run_day(tmp_path, instance, day, port)
    # A parser fix re-parses day 3's snapshot: its unchanged pages are day 1's bodies (304s).
    fix = make_resources(tmp_path, site=_spec_with_max_pages(tmp_path, 999))
    assert materialize(instance, fix, KEYS, selection=["parsed_products", "products_table"]).success
    root = tmp_path / "objects"
    store, spec = ObjectStore(str(root)), load_spec("demo")
    table = sorted(tuple(r.values()) for r in Warehouse(f"sqlite:///{tmp_path / 'warehouse.db'}").rows(products))
    before = _files(root)

    dry = prune(store, "demo", KEYS, keep=1, owner="test", dry_run=True)
    assert _files(root) == before  # a dry run deletes nothing
    plans = prune(store, "demo", KEYS, keep=1, owner="test")
    assert [(p.kept, p.deleted, p.objects, p.bytes_freed) for p in plans] == [
        (p.kept, p.deleted, p.objects, p.bytes_freed) for p in dry]  # ...and says exactly what a prune does

    after = _files(root)
    assert set(before) - set(after) == {key for p in plans for key in p.objects}
    assert sum(before.values()) - sum(after.values()) == sum(p.bytes_freed for p in plans) > 0
    for plan in plans:
        category, state = plan.category, load_parse_state(store, "demo", plan.category)
        latest = latest_manifest(store, "demo", category, complete=True)
        assert list_snapshots(store, "demo", category) == plan.kept == [latest.snapshot_id] == [state.snapshot_id]
        assert len(plan.deleted) == 2
        # Every body the newest snapshot reads is there: a re-parse needs no request.
        assert len(extract_snapshot(store, latest, spec, fetch_base_url=latest.fetch_config["base_url"]).products) > 0
        assert store.exists(parsed_key(latest))
        if category in unchanged:  # day 3 reads all of day 1's bodies: kept, day 1's manifest gone
            assert plan.bodies_kept == len(latest.pages) and all(e.body_key for e in latest.pages.values())
    assert sum(p.bodies_kept for p in plans) >= sum(len(p.kept) for p in plans if p.category in unchanged)

    # A re-parse backfill and the next day work on what is left.
    refix = make_resources(tmp_path, site=_spec_with_max_pages(tmp_path, 998))
    reparse = materialize(instance, refix, KEYS, selection=["parsed_products", "products_table"])
    assert reparse.success
    assert sum(e.materialization.metadata["pages_parsed"].value for e in reparse.get_asset_materialization_events()
               if e.asset_key.path[0] == "parsed_products") > 0
    assert sorted(tuple(r.values()) for r in Warehouse(f"sqlite:///{tmp_path / 'warehouse.db'}").rows(products)) == table
    _, conditional = _run_day(tmp_path, instance, DAYS[3], port)
    assert conditional > 0  # validators of the kept snapshots are still used
    assert prune(store, "demo", KEYS, keep=1, owner="test")  # and a prune after it finds a consistent store


def test_in_flight_and_abandoned_snapshots_locks_and_leftovers(tmp_path):
    store = ObjectStore(str(tmp_path / "objects"))
    one_page_snapshot(store, "2026-11-27T000000Z", complete=False)  # abandoned: a newer one completed
    one_page_snapshot(store, "2026-11-28T000000Z", complete=True)
    one_page_snapshot(store, "2026-11-29T000000Z", complete=True, body_from="2026-11-28T000000Z")  # a 304
    one_page_snapshot(store, "2026-11-30T000000Z", complete=False, body_from="2026-11-28T000000Z")  # in flight
    (tmp_path / "objects/demo/travel/2026-11-26T000000Z/pages").mkdir(parents=True)  # left by a crashed prune
    (tmp_path / "objects/demo/travel/2026-11-26T000000Z/pages/page-0001.html").write_bytes(b"old")
    (tmp_path / "objects/demo/travel/2026-11-27T000000Z/.parsed.json.0f1e2d.tmp").write_bytes(b"{")  # a killed write

    [plan] = prune(store, "demo", ["travel"], keep=1, owner="test")
    assert plan.kept == ["2026-11-29T000000Z", "2026-11-30T000000Z"]
    assert plan.deleted == ["2026-11-27T000000Z", "2026-11-28T000000Z"]
    assert plan.objects == [
        "demo/travel/2026-11-27T000000Z/manifest.json",  # the manifests first: the snapshots are gone at once
        "demo/travel/2026-11-28T000000Z/manifest.json",
        "demo/travel/2026-11-26T000000Z/pages/page-0001.html",
        "demo/travel/2026-11-27T000000Z/.parsed.json.0f1e2d.tmp",
        "demo/travel/2026-11-27T000000Z/pages/page-0001.html",
    ]
    assert plan.bodies_kept == 1  # 2026-11-28's page, read by the two kept snapshots
    assert store.read_bytes("demo/travel/2026-11-28T000000Z/pages/page-0001.html") == b"<html>2026-11-28T000000Z</html>"
    assert sorted(n for n in os.listdir(tmp_path / "objects/demo/travel") if not n.endswith(".lock")) == [
        "2026-11-28T000000Z", "2026-11-29T000000Z", "2026-11-30T000000Z"]  # empty folders removed
    assert os.listdir(tmp_path / "objects/demo/travel/2026-11-28T000000Z") == ["pages"]
    assert plan.line() == ("travel: kept 2 snapshots (newest complete 2026-11-29T000000Z, 1 in flight), deleted 2 "
                           "(5 objects, 0.0 MB); "
                           "1 page body of deleted snapshots kept: newer snapshots read them")
    # Nothing is deleted twice, and the body stays while a kept snapshot reads it.
    [again] = prune(store, "demo", ["travel"], keep=1, owner="test")
    assert (again.deleted, again.objects, again.bodies_kept) == ([], [], 1)
    # A category never scraped here: an empty plan, and no lock file (nor folder) made for it.
    [never] = prune(store, "demo", ["mystery"], keep=1, owner="test")
    assert (never.kept, never.objects, never.skipped, never.line()) == ([], [], None, "mystery: no snapshots")
    assert not (tmp_path / "objects/demo/mystery").exists()


def test_a_body_only_an_in_flight_snapshot_reads_outlives_its_deleted_snapshot(tmp_path):
    """The snapshot a run resumes reads a page body (a 304 before it was cut short) that no
    kept complete snapshot reads: its deleted snapshot's folder keeps that body, or the resume
    would finish a snapshot with a page it can no longer read."""
    store = ObjectStore(str(tmp_path / "objects"))
    one_page_snapshot(store, "2026-11-27T000000Z", complete=True)
    one_page_snapshot(store, "2026-11-28T000000Z", complete=True)
    in_flight = one_page_snapshot(store, "2026-11-29T000000Z", complete=False, body_from="2026-11-27T000000Z")
    in_flight.pages[1].status = "done"  # its page was confirmed (304) before the run stopped
    in_flight.save(store)
    [plan] = prune(store, "demo", ["travel"], keep=1, owner="test")
    assert (plan.kept, plan.in_flight, plan.deleted) == (
        ["2026-11-28T000000Z", "2026-11-29T000000Z"], ["2026-11-29T000000Z"], ["2026-11-27T000000Z"])
    assert plan.objects == ["demo/travel/2026-11-27T000000Z/manifest.json"] and plan.bodies_kept == 1
    assert store.read_bytes(in_flight.body_key(1)) == b"<html>2026-11-27T000000Z</html>"


def test_a_body_only_the_parsed_snapshot_reads_outlives_its_deleted_snapshot(tmp_path):
    """The snapshot holding the current parsed.json (kept for the parse state) reads a body of
    an older snapshot that prune deletes: that body stays, so the parsed snapshot can still be
    parsed again (a parser fix re-parses the latest complete snapshot, and dead_letters and
    products_table read its manifest)."""
    store = ObjectStore(str(tmp_path / "objects"))
    one_page_snapshot(store, "2026-11-26T000000Z", complete=True)
    one_page_snapshot(store, "2026-11-27T000000Z", complete=True, body_from="2026-11-26T000000Z")
    one_page_snapshot(store, "2026-11-28T000000Z", complete=True)
    _parsed_at(store, "2026-11-27T000000Z", latest_snapshot_id="2026-11-27T000000Z")
    [plan] = prune(store, "demo", ["travel"], keep=1, owner="test")
    assert plan.kept_for_parse == ["2026-11-27T000000Z"] and plan.deleted == ["2026-11-26T000000Z"]
    assert plan.bodies_kept == 1
    manifest = load_manifest(store, "demo", "travel", "2026-11-27T000000Z")
    assert store.read_bytes(manifest.body_key(1)) == b"<html>2026-11-26T000000Z</html>"


def _parsed_at(store: ObjectStore, snapshot_id: str, latest_snapshot_id: str) -> None:
    """Record ``snapshot_id`` as the snapshot holding demo/travel's current parsed.json."""
    manifest = load_manifest(store, "demo", "travel", snapshot_id)
    save_parsed(store, manifest, ParsedSnapshot("travel", snapshot_id, PARSER_VERSION, [], [], []))
    save_parse_state(store, "demo", "travel", ParseState(snapshot_id=snapshot_id, input_version="v",
                                                         latest_snapshot_id=latest_snapshot_id, validated=True))


def test_more_than_ten_snapshots_in_one_second_are_pruned_in_time_order(tmp_path):
    # As text "-10" sorts before "-9": the in-flight "-10" would have looked older than the newest complete one.
    store = ObjectStore(str(tmp_path / "objects"))
    ids = ["2026-11-30T084512Z"] + [f"2026-11-30T084512Z-{n}" for n in range(1, 11)]
    for snapshot_id in ids:
        one_page_snapshot(store, snapshot_id, complete=snapshot_id != ids[-1])
    [plan] = prune(store, "demo", ["travel"], keep=2, owner="test")
    assert plan.kept == ["2026-11-30T084512Z-8", "2026-11-30T084512Z-9", "2026-11-30T084512Z-10"]
    assert plan.deleted == ids[:8]  # oldest first
    assert plan.line().startswith("travel: kept 3 snapshots (newest complete 2026-11-30T084512Z-9, 1 in flight), "
                                  "deleted 8")
    assert list_snapshots(store, "demo", "travel") == plan.kept
    # Only a snapshot in flight: kept, and not called complete.
    lone = ObjectStore(str(tmp_path / "lone"))
    one_page_snapshot(lone, ids[-1], complete=False)
    [plan] = prune(lone, "demo", ["travel"], keep=1, owner="test")
    assert plan.line() == "travel: kept 1 snapshot (none complete yet, 1 in flight), deleted 0 (0 objects, 0.0 MB)"


def test_an_unchanged_categorys_older_parsed_snapshot_is_kept_for_the_table_load(tmp_path):
    store = ObjectStore(str(tmp_path / "objects"))
    for day in ("26", "27", "28", "29"):
        one_page_snapshot(store, f"2026-11-{day}T000000Z", complete=True)
    _parsed_at(store, "2026-11-26T000000Z", latest_snapshot_id="2026-11-28T000000Z")  # same input since the 26th
    [plan] = prune(store, "demo", ["travel"], keep=1, owner="test")
    assert plan.kept == ["2026-11-26T000000Z", "2026-11-28T000000Z", "2026-11-29T000000Z"]
    assert plan.kept_for_parse == ["2026-11-26T000000Z", "2026-11-28T000000Z"]
    assert plan.deleted == ["2026-11-27T000000Z"]
    assert plan.line().endswith("; kept 2026-11-26T000000Z, 2026-11-28T000000Z for the parse state (current parsed.json)")
    parsed, state = load_current(store, "demo", "travel")  # what products_table and dead_letters read
    assert parsed.snapshot_id == state.snapshot_id == "2026-11-26T000000Z"


@pytest.mark.parametrize("scope", WRITER_SCOPES)
def test_a_run_holding_any_writer_lock_keeps_prune_away_but_not_a_dry_run(tmp_path, scope):
    store = ObjectStore(str(tmp_path / "objects"))
    for day in ("28", "29"):
        one_page_snapshot(store, f"2026-11-{day}T000000Z", complete=True)
    with partition_lock(store, "demo", "travel", owner="run-1", scope=scope):
        [dry] = prune(store, "demo", ["travel"], keep=1, owner="test", dry_run=True)
        locks = sorted(p.name for p in (tmp_path / "objects/demo/travel").glob("*.lock"))
        [locked] = prune(store, "demo", ["travel"], keep=1, owner="test")
    assert dry.skipped is None and dry.deleted == ["2026-11-28T000000Z"]
    assert locks == [f"{scope}.lock"]  # the dry run took no lock (and created no lock file)
    assert locked.skipped.startswith(f"being written by {scope} of run run-1") and not locked.objects
    assert len(list_snapshots(store, "demo", "travel")) == 2


def test_a_category_that_cannot_be_planned_or_deleted_is_skipped_and_the_others_go_on(tmp_path, monkeypatch):
    store = ObjectStore(str(tmp_path / "objects"))
    for day in ("28", "29"):
        one_page_snapshot(store, f"2026-11-{day}T000000Z", complete=True)
    (tmp_path / "objects/demo/travel/parse_state.json").write_text("{not json")
    mystery = tmp_path / "objects/demo/mystery"
    shutil.copytree(tmp_path / "objects/demo/travel", mystery, ignore=shutil.ignore_patterns("parse_state.json"))
    for manifest_file in mystery.rglob("manifest.json"):
        manifest_file.write_text(manifest_file.read_text().replace('"travel"', '"mystery"'))
    (tmp_path / "objects/demo/classics").mkdir()
    shutil.copytree(mystery, tmp_path / "objects/demo/classics", dirs_exist_ok=True)
    for manifest_file in (tmp_path / "objects/demo/classics").rglob("manifest.json"):
        manifest_file.write_text(manifest_file.read_text().replace('"mystery"', '"classics"'))
    _refuse_deleting_bodies_of(monkeypatch, "classics")
    plans = prune(store, "demo", ["travel", "mystery", "classics"], keep=1, owner="test")
    assert plans[0].skipped.startswith("not pruned, to be safe: ") and "unreadable parse state" in plans[0].skipped
    assert plans[1].skipped is None and plans[1].deleted == ["2026-11-28T000000Z"]
    assert plans[2].skipped.startswith("partly pruned (1 of 2 objects deleted): storage failed (PermissionError: ")
    assert list_snapshots(store, "demo", "classics") == ["2026-11-29T000000Z"]  # the manifest first: no half snapshot
    assert len(list_snapshots(store, "demo", "travel")) == 2  # untouched


def test_stray_files_in_an_old_snapshot_are_deleted_too(tmp_path):
    store = ObjectStore(str(tmp_path / "objects"))
    for day in ("28", "29"):
        one_page_snapshot(store, f"2026-11-{day}T000000Z", complete=True)
    old = tmp_path / "objects/demo/travel/2026-11-28T000000Z"
    for stray in (".DS_Store", "pages/page-0001.html~", ".nfs000000000123"):
        (old / stray).write_bytes(b"x")
    [dry] = prune(store, "demo", ["travel"], keep=1, owner="test", dry_run=True)
    [plan] = prune(store, "demo", ["travel"], keep=1, owner="test")
    assert plan.skipped is None and plan.objects == dry.objects and len(plan.objects) == 5
    assert plan.objects_deleted == 5 and not old.exists()


def test_keep_must_be_at_least_one(tmp_path):
    with pytest.raises(ValueError, match="keep must be >= 1"):
        plan_prune(ObjectStore(str(tmp_path)), "demo", "travel", 0)


def test_cli_prune_reports_and_exits_nonzero_when_a_category_was_skipped(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("SCRAPE_DATA_DIR", str(tmp_path / "unused"))
    monkeypatch.setenv("SCRAPE_STORAGE_URL", str(tmp_path / "objects"))  # a Dagster EnvVar in the definitions
    store = ObjectStore(str(tmp_path / "objects"))
    one_page_snapshot(store, "2026-11-28T000000Z", complete=True)
    one_page_snapshot(store, "2026-11-29T000000Z", complete=True)

    assert main(["prune", "--keep", "1", "--dry-run"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("travel: kept 1 snapshot (newest complete 2026-11-29T000000Z), would delete 1 (2 objects")
    assert out[-1].startswith("dry run: would delete 1 snapshot (0.0 MB) across 12 categories of demo at ")
    assert len(list_snapshots(store, "demo", "travel")) == 2

    with partition_lock(store, "demo", "travel", owner="run-9", scope="raw_pages"):
        assert main(["prune", "--keep", "1"]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[-1].endswith("; skipped 1: travel")

    assert main(["prune", "--keep", "1"]) == 0
    assert list_snapshots(store, "demo", "travel") == ["2026-11-29T000000Z"]
    assert capsys.readouterr().out.splitlines()[-1].startswith("deleted 1 snapshot ")


def test_cli_prune_totals_the_megabytes_of_the_categories_it_pruned(tmp_path, monkeypatch, capsys):
    """The last line's total is in MB of 10**6 bytes, as each category's line, and leaves out a
    category only partly pruned (its own line says what went)."""
    monkeypatch.setenv("SCRAPE_DATA_DIR", str(tmp_path / "unused"))
    monkeypatch.setenv("SCRAPE_STORAGE_URL", str(tmp_path / "objects"))
    store = ObjectStore(str(tmp_path / "objects"))
    for day in ("28", "29"):
        one_page_snapshot(store, f"2026-11-{day}T000000Z", complete=True)
    (tmp_path / "objects/demo/travel/2026-11-28T000000Z/pages/page-0001.html").write_bytes(b"x" * 1_500_000)
    classics = tmp_path / "objects/demo/classics"
    shutil.copytree(tmp_path / "objects/demo/travel", classics)
    for manifest_file in classics.rglob("manifest.json"):
        manifest_file.write_text(manifest_file.read_text().replace('"travel"', '"classics"'))

    assert main(["prune", "--keep", "1", "--dry-run"]) == 0
    assert capsys.readouterr().out.splitlines()[-1].startswith(
        "dry run: would delete 2 snapshots (3.0 MB) across 12 categories of demo at ")
    _refuse_deleting_bodies_of(monkeypatch, "classics")
    assert main(["prune", "--keep", "1"]) == 1
    last = capsys.readouterr().out.splitlines()[-1]
    assert last.startswith("deleted 1 snapshot (1.5 MB) across 12 categories of demo at ") and last.endswith(
        "; skipped 1: classics")


def test_cli_prune_names_the_folders_of_categories_no_longer_in_the_spec(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("SCRAPE_DATA_DIR", str(tmp_path / "unused"))
    monkeypatch.setenv("SCRAPE_STORAGE_URL", str(tmp_path / "objects"))
    store = ObjectStore(str(tmp_path / "objects"))
    one_page_snapshot(store, "2026-11-28T000000Z", complete=True)
    one_page_snapshot(store, "2026-11-29T000000Z", complete=True)
    site = tmp_path / "objects" / "demo"
    shutil.copytree(site / "travel", site / "old-travel")  # a category since removed from the spec
    shutil.copytree(site / "travel", site / "zines")
    (site / "empty-folder").mkdir()  # no snapshot in it: nothing to say
    shutil.copytree(site / "travel", site / ".Trash-1000")  # not partition keys: not ours
    shutil.copytree(site / "travel", site / "travel.bak")

    for argv in (["prune", "--keep", "1", "--dry-run"], ["prune", "--keep", "1"]):
        assert main(argv) == 0
        assert capsys.readouterr().out.splitlines()[-1] == (
            "left alone: 2 folders of categories not in the spec, which prune does not visit: old-travel, zines "
            "(README: Removing a category)")
    assert len(list_snapshots(store, "demo", "old-travel")) == 2  # untouched
    assert list_snapshots(store, "demo", "travel") == ["2026-11-29T000000Z"]

    # A listing that fails only loses the note: prune's own work and exit status stand.
    def refused(*_args):
        raise StorageError(str(site), "listing failed: AccessDenied")

    monkeypatch.setattr("scrape_assets.retention.categories_left_alone", refused)
    assert main(["prune", "--keep", "1"]) == 0
    captured = capsys.readouterr()
    assert "left alone" not in captured.out and captured.out.splitlines()[-1].startswith("deleted 0 snapshots ")
    assert captured.err.splitlines()[-1].startswith(
        "warning: could not look for folders of categories not in the spec: ")
    assert "AccessDenied" in captured.err
    monkeypatch.undo()
    monkeypatch.setenv("SCRAPE_DATA_DIR", str(tmp_path / "unused"))
    monkeypatch.setenv("SCRAPE_STORAGE_URL", str(tmp_path / "objects"))

    # Every category of the spec renamed: the error names what is there instead of a wrong-folder hint.
    shutil.rmtree(site / "travel")
    assert main(["prune", "--keep", "1"]) == 2
    assert capsys.readouterr().err.strip() == (
        f"scrape-assets: error: no snapshot of demo in {tmp_path / 'objects'}: it holds 2 folders of categories not "
        "in the spec, which prune does not visit: old-travel, zines (README: Removing a category). Nothing pruned")

    shutil.rmtree(site / "old-travel")
    shutil.rmtree(site / "zines")
    shutil.copytree(site / "travel.bak", site / "travel")
    assert main(["prune", "--keep", "1"]) == 0
    assert "left alone" not in capsys.readouterr().out


def test_a_prune_cut_short_leaves_no_snapshot_reading_a_deleted_body(tmp_path, monkeypatch):
    """Day 28 read its page from day 27's body (a 304); both go with keep=1. The delete of
    day 28's manifest fails: day 27's body must still be there (every manifest goes first)."""
    store = ObjectStore(str(tmp_path / "objects"))
    one_page_snapshot(store, "2026-11-27T000000Z", complete=True)
    one_page_snapshot(store, "2026-11-28T000000Z", complete=True, body_from="2026-11-27T000000Z")
    one_page_snapshot(store, "2026-11-29T000000Z", complete=True)
    real_delete = ObjectStore.delete_listed

    def failing_delete(self, key):
        if key.endswith("2026-11-28T000000Z/manifest.json"):
            raise OSError(5, "Input/output error", key)
        real_delete(self, key)

    monkeypatch.setattr(ObjectStore, "delete_listed", failing_delete)
    [plan] = prune(store, "demo", ["travel"], keep=1, owner="test")
    assert plan.skipped.startswith("partly pruned (1 of ")
    left = [s for s in list_snapshots(store, "demo", "travel") if load_manifest(store, "demo", "travel", s).is_complete]
    assert left == ["2026-11-28T000000Z", "2026-11-29T000000Z"]
    for snapshot_id in left:  # every snapshot left reads its bodies
        manifest = load_manifest(store, "demo", "travel", snapshot_id)
        assert all(store.exists(manifest.body_key(n)) for n in manifest.pages), snapshot_id


def _refuse_deleting_bodies_of(monkeypatch, category: str) -> None:
    """Storage refuses to delete ``category``'s objects other than manifests (EACCES): a prune of it
    goes only as far as its manifests."""
    real_delete = ObjectStore.delete_listed

    def failing_delete(self, key):
        if f"/{category}/" in key and not key.endswith("/manifest.json"):  # after the manifest went
            raise PermissionError(13, "Permission denied", key)
        real_delete(self, key)

    monkeypatch.setattr(ObjectStore, "delete_listed", failing_delete)
