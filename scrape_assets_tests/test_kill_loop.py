"""Crash and resume, proven by killing real processes: crash points, orphan sweeping, the kill loop."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import textwrap
from decimal import Decimal
from pathlib import Path

import pytest

from reliability.kill_loop import run_kill_loop
from scrape_assets import crashpoints, crawl
from scrape_assets.manifest import latest_manifest, list_snapshots
from scrape_assets.storage import PROBE_MIN_AGE_S, TEMP_SUFFIX, ObjectStore, _pid_namespace_tag
from scrape_assets.warehouse import Warehouse, products
from scrape_assets_tests.conftest import REPO_ROOT


def _python(code: str, *, crashpoint: str | None, cwd: Path) -> subprocess.CompletedProcess:
    """Run ``code`` in a fresh interpreter with ``SCRAPE_CRASHPOINT`` set (or unset)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SCRAPE_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    if crashpoint:
        env[crashpoints.ENV_VAR] = crashpoint
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], env=env, cwd=cwd, capture_output=True, text=True, timeout=120
    )


def _temp_files(root: Path) -> list[Path]:
    return sorted(root.rglob(f".*{TEMP_SUFFIX}"))


# -- crashpoint() ---------------------------------------------------------------------------

HITS = """
    from scrape_assets.crashpoints import crashpoint
    for i in range(1, 6):
        print(f"before {i}", flush=True)
        crashpoint("storage.after_replace")  # another point: never counts
        crashpoint("warehouse.after_delete")
        print(f"after {i}", flush=True)
    print("finished", flush=True)
"""


def test_crashpoint_sigkills_the_process_at_the_nth_hit(tmp_path):
    result = _python(HITS, crashpoint="warehouse.after_delete:3", cwd=tmp_path)
    assert result.returncode == -signal.SIGKILL
    assert result.stdout.split() == "before 1 after 1 before 2 after 2 before 3".split()


def test_crashpoint_is_a_no_op_when_unset(tmp_path):
    result = _python(HITS, crashpoint=None, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split()[-1] == "finished"


@pytest.mark.parametrize(
    ("raw", "expected"),
    [(None, None), ("", None), ("storage.after_temp_write:1", ("storage.after_temp_write", 1)),
     ("warehouse.after_delete:12", ("warehouse.after_delete", 12))],
)
def test_crashpoint_spec_parses(raw, expected):
    assert crashpoints.parse_spec(raw) == expected


@pytest.mark.parametrize("raw", ["storage.after_temp_write", "nowhere:1", "storage.after_replace:0", "crawl.after_body_write:x"])
def test_bad_crashpoint_spec_names_the_variable_and_the_points(raw):
    with pytest.raises(ValueError, match=r"SCRAPE_CRASHPOINT=.*storage\.after_temp_write"):
        crashpoints.parse_spec(raw)


# -- a kill inside an object write -------------------------------------------------------------


def test_kill_after_temp_write_keeps_the_previous_object_and_leaves_an_orphan(tmp_path):
    code = f"""
        from scrape_assets.storage import ObjectStore
        store = ObjectStore({str(tmp_path / "objects")!r})
        store.write_bytes_atomic("demo/travel/s1/manifest.json", b"version 1")
        store.write_bytes_atomic("demo/travel/s1/manifest.json", b"version 2")
        print("not reached", flush=True)
    """
    result = _python(code, crashpoint="storage.after_temp_write:2", cwd=tmp_path)
    assert result.returncode == -signal.SIGKILL, result.stderr
    assert "not reached" not in result.stdout
    folder = tmp_path / "objects" / "demo" / "travel" / "s1"
    assert (folder / "manifest.json").read_bytes() == b"version 1"
    [orphan] = _temp_files(tmp_path)
    assert orphan.parent == folder and orphan.name.startswith(".manifest.json.")
    assert orphan.read_bytes() == b"version 2"  # written and fsynced, never renamed


CRAWL = """
    import asyncio, logging, sys
    from scrape_assets.defs.assets.raw_pages import crawl_partitions
    from scrape_assets.defs.resources import ObjectStoreResource, SiteResource
    logging.basicConfig(level=logging.INFO, stream=sys.stdout, format="%(message)s")
    reports = asyncio.run(crawl_partitions(
        SiteResource(site="demo"), ObjectStoreResource(url={store!r}), ["default"],
        new_snapshot=False, log=logging.getLogger("crawl"),
    ))
    print("pages done", reports[0].pages_done, "resumed", reports[0].resumed, flush=True)
"""


def _killed_crawl(tmp_path: Path, crashpoint: str) -> tuple[Path, str]:
    """Run CRAWL into ``tmp_path/objects`` until ``crashpoint`` SIGKILLs it: ``(store root, code to resume)``."""
    root = tmp_path / "objects"
    code = CRAWL.format(store=str(root))
    killed = _python(code, crashpoint=crashpoint, cwd=tmp_path)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    return root, code


def test_orphan_from_a_killed_crawl_is_swept_by_the_next_crawl(tmp_path):
    """End to end over the in-process demo catalogue: kill inside a manifest or page write, resume."""
    root, code = _killed_crawl(tmp_path, "storage.after_temp_write:6")
    store = ObjectStore(str(root))
    before = latest_manifest(store, "demo", "default")
    assert before is not None and not before.is_complete  # the last good manifest loads
    assert len(_temp_files(root)) == 1

    resumed = _python(code, crashpoint=None, cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    assert "pages done 12 resumed True" in resumed.stdout
    assert "1 orphaned temp files removed" in resumed.stdout
    assert _temp_files(root) == []
    assert list_snapshots(store, "demo", "default") == [before.snapshot_id]
    after = latest_manifest(store, "demo", "default")
    assert after.is_complete and after.counts()["done"] == 12


def test_a_done_page_whose_body_was_lost_is_fetched_again_on_resume(tmp_path):
    """As after a power loss: page renames are not folder-fsynced one by one, so a body may vanish."""
    root, code = _killed_crawl(tmp_path, "crawl.after_body_write:6")
    store = ObjectStore(str(root))
    before = latest_manifest(store, "demo", "default")
    done = sorted(n for n, p in before.pages.items() if p.status == "done")
    assert len(done) == 5
    lost = done[-1]
    (root / before.page_key(lost)).unlink()
    kept_mtime = (root / before.page_key(done[0])).stat().st_mtime_ns

    resumed = _python(code, crashpoint=None, cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    assert "1 done pages without their body fetched again" in resumed.stdout
    assert "pages done 12 resumed True" in resumed.stdout
    after = latest_manifest(store, "demo", "default")
    assert after.snapshot_id == before.snapshot_id and after.is_complete
    body = store.read_bytes(after.page_key(lost))  # fetched and stored again
    assert "sha256:" + hashlib.sha256(body).hexdigest() == after.pages[lost].content_hash == before.pages[lost].content_hash
    assert (root / before.page_key(done[0])).stat().st_mtime_ns == kept_mtime  # the others were not


def test_a_snapshot_folder_killed_in_its_first_write_is_removed_by_the_next_crawl(tmp_path):
    # Write 1 is the new snapshot's first manifest (raw_pages probes storage before it crawls).
    root, code = _killed_crawl(tmp_path, "storage.after_temp_write:1")
    [orphan] = _temp_files(root)
    assert orphan.name.startswith(".manifest.json.") and not (orphan.parent / "manifest.json").exists()

    assert _python(code, crashpoint=None, cwd=tmp_path).returncode == 0
    store = ObjectStore(str(root))
    snapshots = list_snapshots(store, "demo", "default")
    assert len(snapshots) == 1 and _temp_files(root) == []
    assert sorted(p.name for p in (root / "demo" / "default").iterdir() if p.is_dir()) == snapshots


def test_an_orphan_of_parsed_json_is_swept_when_the_snapshot_is_parsed_again(tmp_path):
    root = tmp_path / "objects"
    assert _python(CRAWL.format(store=str(root)), crashpoint=None, cwd=tmp_path).returncode == 0
    parse = f"""
        from scrape_assets.extract import extract_snapshot, save_parsed
        from scrape_assets.manifest import latest_manifest
        from scrape_assets.spec import load_spec
        from scrape_assets.storage import ObjectStore
        store = ObjectStore({str(root)!r})
        manifest = latest_manifest(store, "demo", "default", complete=True)
        save_parsed(store, manifest, extract_snapshot(store, manifest, load_spec("demo"), fetch_base_url=load_spec("demo").base_url))
    """
    assert _python(parse, crashpoint="storage.after_temp_write:1", cwd=tmp_path).returncode == -signal.SIGKILL
    [orphan] = _temp_files(root)
    assert orphan.name.startswith(".parsed.json.") and not (orphan.parent / "parsed.json").exists()
    assert _python(parse, crashpoint=None, cwd=tmp_path).returncode == 0
    assert _temp_files(root) == [] and (orphan.parent / "parsed.json").exists()


@pytest.mark.skipif(not os.path.exists("/proc/self/ns/pid"), reason="PID namespaces: Linux")
@pytest.mark.parametrize("point", ["storage.after_temp_write", "storage.after_replace"])
def test_a_storage_probe_left_by_a_killed_process_is_removed_at_the_next_start(tmp_path, point):
    code = f"""
        from scrape_assets.storage import ObjectStore
        ObjectStore({str(tmp_path / "objects")!r}).ensure_writable()
    """
    assert _python(code, crashpoint=f"{point}:1", cwd=tmp_path).returncode == -signal.SIGKILL
    [left] = list((tmp_path / "objects").iterdir())
    assert "write-probe-" in left.name and f"-ns{_pid_namespace_tag()}-" in left.name
    ObjectStore(str(tmp_path / "objects")).ensure_writable()  # its process was of this PID namespace: gone
    assert list((tmp_path / "objects").iterdir()) == []


@pytest.mark.skipif(not os.path.exists("/proc/self/ns/pid"), reason="PID namespaces: Linux")
def test_a_write_probe_of_another_pid_namespace_is_removed_only_once_it_cannot_be_live(tmp_path):
    """A container sharing the folder has its own process ids: its probe, which lives for
    milliseconds, is removed only once PROBE_MIN_AGE_S old; so is a probe named before the
    namespace was part of the name."""
    objects = tmp_path / "objects"
    objects.mkdir()
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    pid = int(dead.stdout)  # a process id no process here holds now
    assert _pid_namespace_tag() not in (None, "0123456789ab")
    others = [objects / f"write-probe-{pid}-ns0123456789ab-{'a' * 32}",
              objects / f".write-probe-{pid}-{'b' * 32}.{'c' * 32}.tmp"]
    for item in others:
        item.write_bytes(b"ok")
    ObjectStore(str(objects)).ensure_writable()  # too recent: maybe live in their namespace
    assert sorted(objects.iterdir()) == sorted(others)
    for item in others:
        os.utime(item, (item.stat().st_atime, item.stat().st_mtime - PROBE_MIN_AGE_S))
    ObjectStore(str(objects)).ensure_writable()
    assert list(objects.iterdir()) == []


def test_a_body_stored_on_the_last_attempt_before_a_kill_is_asked_once_more(tmp_path):
    """max_attempts 1, killed between storing travel's only page and recording it: the resume
    asks it again (it ends done, not an attempts_exhausted dead letter); killed at the same
    point once more, the page fails for good rather than being asked after every kill."""
    def crawl_code(root: Path) -> str:
        code = CRAWL.format(store=str(root)).replace('["default"]', '["travel"]')
        return code.replace('SiteResource(site="demo")', 'SiteResource(site="demo", max_attempts=1)')

    def page(root: Path) -> tuple:
        entry = latest_manifest(ObjectStore(str(root)), "demo", "travel").pages[1]
        return entry.status, entry.attempts, entry.last_error

    once, twice = tmp_path / "once", tmp_path / "twice"
    for root in (once, twice):
        assert _python(crawl_code(root), crashpoint="crawl.after_body_write:1", cwd=tmp_path).returncode == -signal.SIGKILL
        assert page(root) == ("pending", 1, None)
    resumed = _python(crawl_code(once), crashpoint=None, cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    assert "pages done 1 resumed True" in resumed.stdout
    assert page(once) == ("done", 1, None)

    code = crawl_code(twice)
    resumed = _python(code, crashpoint="crawl.after_body_write:1", cwd=tmp_path)  # asked again, killed again
    assert resumed.returncode == -signal.SIGKILL
    assert page(twice) == ("pending", 1, crawl.STORED_THEN_INTERRUPTED)
    resumed = _python(code, crashpoint=None, cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    assert "pages done 0 resumed True" in resumed.stdout
    assert page(twice) == ("failed", 1, "attempts_exhausted: interrupted on the last attempt (the one before: "
                                   f"{crawl.STORED_THEN_INTERRUPTED})")


def test_pages_still_waiting_for_a_politeness_slot_are_not_charged_an_attempt(tmp_path):
    """A kill counts against the pages in flight only: queued pages keep their attempts."""
    root = tmp_path / "objects"
    code = CRAWL.format(store=str(root)).replace('SiteResource(site="demo")', 'SiteResource(site="demo", requests_per_second=4)')
    killed = _python(code, crashpoint="crawl.after_body_write:2", cwd=tmp_path)  # page 1, then one of 2..12
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    manifest = latest_manifest(ObjectStore(str(root)), "demo", "default")
    pending = [p for p in manifest.pages.values() if p.status == "pending"]
    assert len(manifest.pages) == 12 and len(pending) == 11
    charged = [p.url for p in pending if p.attempts > 0]
    assert len(charged) <= 4  # at most the per-host concurrency was in flight
    assert len(pending) - len(charged) >= 7


# -- a kill inside a table load -----------------------------------------------------------------


@pytest.mark.parametrize("point", ["warehouse.after_delete", "warehouse.after_insert"])
def test_kill_inside_a_table_load_leaves_the_previous_rows(tmp_path, point):
    url = f"sqlite:///{tmp_path / 'warehouse.db'}"
    code = f"""
        from decimal import Decimal
        from scrape_assets.warehouse import Warehouse, products

        def _product(product_id, price):
            return {{
                "category": "romance", "product_id": product_id, "title": "Book " + product_id,
                "price": Decimal(price), "currency": "GBP", "rating": 3, "availability": "In stock",
                "url": "http://x/" + product_id, "page_number": 1, "snapshot_id": "s1",
                "fetched_at": "2026-01-15T00:00:00Z",
            }}

        wh = Warehouse({url!r})
        wh.replace_partition(products, "romance", [_product("1", "10.00"), _product("2", "12.50")])
        print("first load committed", flush=True)
        wh.replace_partition(products, "romance", [_product("3", "99.00")])
        print("not reached", flush=True)
    """
    result = _python(code, crashpoint=f"{point}:2", cwd=tmp_path)
    assert result.returncode == -signal.SIGKILL, result.stderr
    assert result.stdout.split("\n")[0] == "first load committed" and "not reached" not in result.stdout
    wh = Warehouse(url)
    rows = wh.rows(products)
    assert [(r["product_id"], r["price"]) for r in rows] == [("1", Decimal("10.00")), ("2", Decimal("12.50"))]
    # The database is usable at once: no lock left behind, the next load replaces the partition.
    row = {**rows[0], "product_id": "3", "price": Decimal("99.00")}
    assert wh.replace_partition(products, "romance", [row]) == 1
    assert [r["product_id"] for r in wh.rows(products)] == ["3"]


# -- the kill loop --------------------------------------------------------------------------------


def test_kill_loop_ends_with_the_same_tables_as_an_uninterrupted_run(tmp_path):
    """Three SIGKILLs: a random moment while fetching, inside a write, inside a table load."""
    plan = ["time", "storage.after_temp_write", "warehouse.after_delete"]
    result = run_kill_loop(
        tmp_path, kills=3, seed=7, categories=["romance", "fiction", "default"], concurrency=4, plan=plan
    )
    kills, totals, checks = result["kills"], result["totals"], result["checks"]
    assert [k["kind"] for k in kills] == plan
    assert all(k["landed"] and k["exit_code"] == -signal.SIGKILL for k in kills), kills
    assert kills[0]["running"][0] == "raw_pages"  # the time kill lands while fetching
    # Tables: row for row as the reference (20 + 65 + 232 products; page 2 of romance is a dead letter).
    assert result["tables"]["products"] == {**result["tables"]["products"], "rows_reference": 317, "equal": True}
    assert result["tables"]["dead_letters"]["rows_killed"] == 1 and checks["dead_letters_equal"]
    assert totals["duplicate_keys"] == 0
    # Every manifest loads and is complete; one snapshot per category: nothing was re-scraped.
    assert result["store"]["snapshots"] == {"romance": 1, "fiction": 1, "default": 1}
    assert checks["manifests_loadable_and_complete"] and totals["manifests_checked"] == 3
    # The write kill left an orphan; the next start swept it.
    assert kills[1]["temp_files_after_kill"] >= 1
    assert totals["temp_files_found"] == 0 and result["store"]["orphan_snapshot_folders"] == []
    # At most the pages in flight are fetched twice.
    assert all(k["pages_refetched"] <= 4 for k in kills), [(k["kind"], k["refetched"]) for k in kills]
    assert totals["page_requests_killed_series"] - totals["page_requests_reference"] == totals["pages_refetched"]
    assert result["passed"], checks


# -- the kill loop's verdict, on stores and tables built by hand (pinned by a mutation audit) --------


class _RequestLog:
    """What :class:`reliability.kill_loop.Series` reads of the demo server: its request log."""

    def __init__(self):
        self.requests = []


def _dead_letter(attempts: int = 3) -> dict:
    return {"category": "travel", "url": "http://demo/travel/page-2.html", "stage": "fetch", "reason": "http_404",
            "http_status": 404, "attempts": attempts, "snapshot_id": "s1", "recorded_at": "2026-01-15T00:00:00Z"}


def _product() -> dict:
    return {"category": "travel", "product_id": "1", "title": "Book 1", "price": Decimal("10.00"), "currency": "GBP",
            "rating": 3, "availability": "In stock", "url": "http://demo/1", "page_number": 1, "snapshot_id": "s1",
            "fetched_at": "2026-01-15T00:00:00Z"}


@pytest.fixture(scope="module")
def crawled_travel(tmp_path_factory) -> Path:
    """An object store holding one complete snapshot of the demo's travel category (1 page)."""
    root = tmp_path_factory.mktemp("travel") / "objects"
    code = CRAWL.format(store=str(root)).replace('["default"]', '["travel"]')
    assert _python(code, crashpoint=None, cwd=root.parent).returncode == 0
    return root


def _compared(tmp_path: Path, crawled: Path, *, killed_letters: list[dict] | None = None, records=(),
              spoil=None) -> dict:
    """``_compare`` of a reference and a killed series that agree, except for what the arguments change."""
    import shutil

    from reliability.kill_loop import Series, _compare
    from scrape_assets.warehouse import dead_letters

    log = _RequestLog()
    reference, killed = (Series(tmp_path / name, {}, log, ["travel"]) for name in ("reference", "killed"))
    for series, letters in ((reference, [_dead_letter()]), (killed, killed_letters or [_dead_letter()])):
        wh = Warehouse(f"sqlite:///{series.data / 'warehouse.db'}")
        wh.replace_partition(products, "travel", [_product()])
        wh.replace_partition(dead_letters, "travel", letters)
    shutil.copytree(crawled, killed.data / "objects")
    if spoil:
        spoil(killed.data / "objects")
    return _compare(reference, killed, list(records), concurrency=4)


def _failed_checks(result: dict) -> list[str]:
    return [name for name, ok in result["checks"].items() if not ok]


def test_the_kill_loop_passes_two_series_that_agree(tmp_path, crawled_travel):
    result = _compared(tmp_path, crawled_travel)
    assert _failed_checks(result) == [] and result["passed"]
    assert result["totals"]["manifests_checked"] == 1 and result["totals"]["duplicate_keys"] == 0


def test_each_kill_loop_check_fails_on_what_it_names(tmp_path, crawled_travel):
    from reliability.kill_loop import KillRecord

    def body_changed(objects: Path) -> None:
        (body,) = [p for p in objects.rglob("*.html")]
        body.write_bytes(body.read_bytes() + b"<!-- torn -->")

    def pending_in_a_complete_snapshot(objects: Path) -> None:
        import dataclasses

        store = ObjectStore(str(objects))
        manifest = latest_manifest(store, "demo", "travel")
        manifest.pages[1] = dataclasses.replace(manifest.pages[1], status="pending")
        manifest.save(store)
        assert manifest.is_complete and latest_manifest(store, "demo", "travel").counts()["pending"] == 1

    def temp_left(objects: Path) -> None:
        (snapshot,) = (objects / "demo" / "travel").iterdir()
        (snapshot / f".manifest.json.0123{TEMP_SUFFIX}").write_bytes(b"{")

    def probe_left(objects: Path) -> None:
        (objects / "write-probe-123-abc").write_bytes(b"ok")

    def temp_left_beside_parse_state(objects: Path) -> None:  # category level: no key segment, no folder
        (objects / "demo" / "travel" / f".parse_state.json.0123{TEMP_SUFFIX}").write_bytes(b"{")

    record = KillRecord(index=1, planned="time", kind="time", n=3, delay_s=0.0, running=["raw_pages"], landed=True,
                        pages_refetched=5)
    cases = {
        "duplicate dead letter": ({"killed_letters": [_dead_letter(), _dead_letter()]},
                                  ["dead_letters_equal", "no_duplicate_keys"]),
        "fewer attempts than the reference": ({"killed_letters": [_dead_letter(attempts=1)]}, ["dead_letters_equal"]),
        "body not matching its hash": ({"spoil": body_changed}, ["manifests_loadable_and_complete"]),
        "complete snapshot with a pending page": ({"spoil": pending_in_a_complete_snapshot},
                                                  ["manifests_loadable_and_complete"]),
        "temp file left": ({"spoil": temp_left}, ["no_temp_files_or_orphan_folders"]),
        "storage probe left": ({"spoil": probe_left}, ["no_temp_files_or_orphan_folders"]),
        "temp file beside parse_state.json": ({"spoil": temp_left_beside_parse_state},
                                              ["no_temp_files_or_orphan_folders"]),
        "more pages refetched than the concurrency": ({"records": [record]}, ["refetches_per_kill_within_concurrency"]),
    }
    for i, (case, (changes, failing)) in enumerate(cases.items()):
        result = _compared(tmp_path / str(i), crawled_travel, **changes)
        assert (_failed_checks(result), result["passed"]) == (failing, False), case
    result = _compared(tmp_path / "as many as the concurrency", crawled_travel,
                       records=[KillRecord(**{**record.__dict__, "pages_refetched": 4})])
    assert result["passed"]  # as many refetched as the concurrency: within the bound


def test_the_kill_loop_report_says_failed_and_names_the_failed_check(tmp_path, crawled_travel):
    from reliability.kill_loop import format_report
    from reliability.report import render

    def report_of(result: dict) -> dict:
        result["totals"].update(reference_wall_s=1.0, final_run_wall_s=1.0, wall_s=3.0)
        result["settings"] = {"kills": 0, "seed": 1, "categories": ["travel"], "concurrency": 4, "requests_per_second": 8.0,
                              "day": "2026-01-15", "dead_page": None}
        return result

    good = report_of(_compared(tmp_path / "good", crawled_travel))
    assert format_report(good).splitlines()[-1] == "PASSED"
    bad = report_of(_compared(tmp_path / "bad", crawled_travel, killed_letters=[_dead_letter(attempts=1)]))
    lines = format_report(bad).splitlines()
    assert lines[-1] == "FAILED" and "  FAIL dead_letters_equal" in lines and "  ok   products_equal" in lines
    faults = [{"kind": "http_error", "scenario": s, "pages_done": 3, "pages_failed": 0, "reasons": {}, "http_status": {},
               "attempts": {}, "waits_ok": w, "success_rate": 1.0, "run_succeeded": True, "schema_check_passed": True}
              for s, w in (("a", None), ("b", True), ("c", False))]
    text = render(faults, bad, [], ["python -m reliability.report"], 10.0)
    assert "(products and dead letters, row for row): DIFFERENCES" in text
    # of the runs whose server sent a Retry-After (b and c; a sent none): one kept it, one broke it
    assert "at least the server's Retry-After in 1 of the 2 runs whose server sent one" in text
    assert "(products and dead letters, row for row): all equal" in render(faults, good, [], ["x"], 10.0)


def test_the_reliability_report_says_what_failed_never_a_fixed_pass():
    """The bullets and the bad-inputs sentence come from the figures: a failed manifest check,
    an input that exited 1 and one that wrote outside its data folder are said, not hidden."""
    from reliability.report import render

    kills = {"kills": [], "tables": {"products": {"rows_reference": 1}, "dead_letters": {"rows_reference": 0}},
             "totals": {"rows_compared": 1, "duplicate_keys": 0, "manifests_checked": 3, "temp_files_found": 0,
                        "pages_refetched": 0, "max_pages_refetched_per_kill": 0, "page_requests_reference": 1,
                        "page_requests_killed_series": 1, "runs_killed_series": 1, "reference_wall_s": 1.0,
                        "wall_s": 2.0},
             "checks": {"all_kills_landed": True, "products_equal": True, "dead_letters_equal": True,
                        "manifests_loadable_and_complete": False},
             "passed": False,
             "settings": {"kills": 0, "seed": 1, "categories": ["travel"], "concurrency": 4,
                          "requests_per_second": 8.0, "dead_page": None}}
    good = {"input": "rate", "exit_code": 2, "one_clear_error": True, "message": "m", "written_outside": []}
    bad = [good, {**good, "input": "partition key with ../", "exit_code": 1,
                  "written_outside": ["bad/data/objects/escape"]}]
    text = render([], kills, bad, ["python -m reliability.report"], 1.0)
    assert "manifests checked: **3**, **NOT all loadable and complete**; temp files left: **0**" in text
    assert ("with one bad setting each: **not every input exited 2** and one error line naming the input, "
            "**something was written outside the data folder** (see the table).") in text
    assert "| partition key with ../ | 1 | yes | bad/data/objects/escape | `m` |" in text
    kills["checks"]["manifests_loadable_and_complete"] = True
    text = render([], kills, [good], ["python -m reliability.report"], 1.0)
    assert "manifests checked: **3**, all loadable and complete;" in text
    assert ("with one bad setting each: exit code 2 and one error line naming the input, nothing written "
            "outside the data folder.") in text


def test_the_reliability_report_exits_non_zero_when_the_kill_loop_failed(tmp_path, monkeypatch):
    import reliability.fault_matrix
    import reliability.kill_loop
    from reliability import report

    def kills(passed: bool):
        def run(workdir, **kwargs) -> dict:
            checks = {"all_kills_landed": True, "products_equal": passed, "dead_letters_equal": True,
                      "manifests_loadable_and_complete": True}
            return {"kills": [], "tables": {"products": {"rows_reference": 1}, "dead_letters": {"rows_reference": 0}},
                    "totals": {"rows_compared": 1, "duplicate_keys": 0, "manifests_checked": 1, "temp_files_found": 0,
                               "pages_refetched": 0, "max_pages_refetched_per_kill": 0, "page_requests_reference": 1,
                               "page_requests_killed_series": 1, "runs_killed_series": 1, "reference_wall_s": 1.0,
                               "wall_s": 2.0},
                    "checks": checks, "passed": passed,
                    "settings": {"kills": 0, "seed": 1, "categories": ["travel"], "concurrency": 4,
                                 "requests_per_second": 8.0, "dead_page": None}}
        return run

    monkeypatch.setattr(reliability.fault_matrix, "run_fault_matrix", lambda workdir: [])
    monkeypatch.setattr(report, "bad_inputs", lambda workdir: [])
    for passed, code in ((True, 0), (False, 1)):
        monkeypatch.setattr(reliability.kill_loop, "run_kill_loop", kills(passed))
        assert report.main(["--kills", "0", "--out", str(tmp_path / "RELIABILITY.md")]) == code
    # a bad input that did not exit 2, or wrote outside its data folder, fails the report too
    good = {"input": "rate", "exit_code": 2, "one_clear_error": True, "message": "m", "written_outside": []}
    monkeypatch.setattr(reliability.kill_loop, "run_kill_loop", kills(True))
    for row, code in ((good, 0), ({**good, "exit_code": 1}, 1), ({**good, "written_outside": ["escape"]}, 1)):
        monkeypatch.setattr(report, "bad_inputs", lambda workdir, row=row: [row])
        assert report.main(["--kills", "0", "--out", str(tmp_path / "RELIABILITY.md")]) == code, row
    assert (tmp_path / "RELIABILITY.md").read_text().splitlines()[-1] != "PASSED"


def test_a_kill_loop_with_fewer_kills_than_asked_does_not_pass(tmp_path, monkeypatch):
    """A kill not attempted (everything already materialized) must not count as a landed one."""
    from reliability import kill_loop

    class Server(_RequestLog):
        base_url = "http://127.0.0.1:49002/"

        def shutdown(self):
            pass

        server_close = shutdown

    monkeypatch.setattr(kill_loop, "start_server", lambda day, dead: Server())
    monkeypatch.setattr(kill_loop.Series, "run_to_end", lambda self, select: 0.0)
    monkeypatch.setattr(kill_loop.Series, "remaining", lambda self: [])
    monkeypatch.setattr(kill_loop.Series, "manifests", lambda self: [])
    monkeypatch.setattr(kill_loop, "_compare", lambda reference, killed, records, concurrency: {
        "checks": {"all_kills_landed": True, "products_equal": True}, "totals": {}, "passed": True})
    result = run_kill_loop(tmp_path, kills=2, seed=1, categories=["romance"])
    (note,) = result["notes"]
    assert note.startswith("kill 1 (") and note.endswith(") not attempted: everything is materialized")
    assert result["checks"]["all_kills_landed"] is False and result["passed"] is False


def test_a_kill_is_planned_only_where_the_next_run_is_sure_to_reach():
    import random

    from reliability.kill_loop import _choose, _Work

    parsing = _Work(running=["parsed_products", "dead_letters", "products_table"], requests=40, bodies=30, incomplete=2,
                    to_load=3, categories=3)
    assert parsing.lower_bound("time") == 0 and parsing.lower_bound("crawl.after_body_write") == 0
    assert parsing.lower_bound("warehouse.after_delete") == 3
    fetching = _Work(running=["raw_pages", "parsed_products", "dead_letters", "products_table"], requests=40, bodies=30,
                     incomplete=2, to_load=3, categories=3)
    rng = random.Random(1)
    for kind in ("time", "crawl.after_body_write", "storage.after_temp_write", "warehouse.after_insert"):
        for kills_left in (1, 2, 10):
            for _ in range(50):
                chosen, n = _choose(kind, fetching, kills_left, rng)
                assert chosen == kind and 1 <= n <= fetching.lower_bound(kind), (kind, kills_left, n)
    assert _choose("time", parsing, 3, rng)[0] == "storage.after_temp_write"  # not fetching: no moment to kill by time
