"""``scrape-assets demo``: one run on a real instance, progress, and a summary with figures."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import sqlite3
import subprocess
import sys
from importlib import resources as importlib_resources
from pathlib import Path

import dagster as dg
import yaml
from fsspec.registry import _registry as fsspec_classes  # protocol -> imported class

from scrape_assets import run_processes
from scrape_assets.warehouse import Warehouse, dead_letters, products
from scrape_assets_tests.conftest import REPO_ROOT


def test_demo_command_runs_all_categories_in_one_run_and_prints_summary(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("SCRAPE_") and k != "DAGSTER_HOME"}
    env.update(SCRAPE_DATA_DIR=str(tmp_path / "data"))
    cli = Path(sys.executable).with_name("scrape-assets")
    # Nothing scraped yet: the summary says so and where it looked, not "100%".
    empty = subprocess.run([str(cli), "summary"], env=env, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert empty.returncode == 0, empty.stderr[-3000:]
    assert (f"  success rate    n/a (no complete snapshot of demo in {tmp_path / 'data' / 'objects'} yet: is "
            "SCRAPE_DATA_DIR the one you scraped into, and SCRAPE_SITE (demo) the site?)") in empty.stdout
    warehouse_file = tmp_path / "data" / "warehouse.db"
    assert f"products loaded 0 (table `products`); no `products` table yet in sqlite:///{warehouse_file}" in empty.stdout
    assert not warehouse_file.exists()  # asking for a summary creates no warehouse
    # Without DAGSTER_HOME (outside `make demo`) the instance is ./.dagster_home, as the Makefile's.
    home = tmp_path / ".dagster_home"
    done = subprocess.run([str(cli), "demo"], env=env, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout
    assert f"12 categories in one run on the Dagster instance at {home}" in out
    # Outside the clone: the hint names this data folder and instance, not the clone's own.
    assert (f"  Dagster UI      SCRAPE_DATA_DIR={tmp_path / 'data'} make ui DAGSTER_HOME={home}  "
            "(then open http://127.0.0.1:3000)") in out
    assert (home / "dagster.yaml").read_text() == (REPO_ROOT / "dagster.yaml").read_text()  # the project's settings
    assert "  requests        38 (0 not modified: 304), 0 pages failed for good" in out
    assert "  parsed          38 pages re-parsed, 0 categories unchanged" in out
    assert "fewer cards" not in out  # every category holds as many cards as its page counts
    assert "  loaded          678 rows (re)loaded" in out
    assert "categories      12/12" in out
    assert "pages           38 done, 0 failed" in out
    assert "success rate    100.0%" in out
    assert "products loaded 678 (table `products`)" in out
    assert "dead letters    0 (table `dead_letters`)" in out
    assert f"raw pages       {tmp_path / 'data' / 'objects'}" in out
    assert "38/38 pages done, 0 failed for good; 12/12 categories complete;" in done.stderr  # the crawl's progress
    # The steps closed the warehouse: its last writes are in warehouse.db itself, no -wal file beside it.
    assert not (tmp_path / "data" / "warehouse.db-wal").exists()
    assert Warehouse(f"sqlite:///{tmp_path / 'data' / 'warehouse.db'}").count(products) == 678

    # The run is on the instance `make ui` opens: one run for all twelve categories.
    with dg.DagsterInstance.from_config(str(home)) as instance:
        runs = instance.get_runs()
        assert len(runs) == 1 and runs[0].job_name == "daily_scrape_job"
        assert runs[0].tags["dagster/asset_partition_range_end"] == "sequential-art"

    # A category dropped from the spec keeps its rows: the summary says whose and how many.
    assert "not in spec" not in out
    spec = yaml.safe_load(importlib_resources.files("scrape_assets.sites").joinpath("demo.yaml").read_text())
    spec_categories_travel = spec["categories"].pop("travel")
    (tmp_path / "demo_without_travel.yaml").write_text(yaml.safe_dump(spec))
    env["SCRAPE_SITE"] = str(tmp_path / "demo_without_travel.yaml")
    summary = subprocess.run([str(cli), "summary"], env=env, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert summary.returncode == 0, summary.stderr[-3000:]
    assert "categories      11/11" in summary.stdout and "products loaded 678 (table `products`)" in summary.stdout
    assert ("  not in spec     11 of those rows belong to categories no longer in the spec: travel (11) "
            "(README: 'Removing a category')") in summary.stdout

    # A category added to the spec since: named until it has a complete snapshot.
    spec_added = {**spec, "categories": {**spec["categories"], "travel-again": spec_categories_travel}}
    (tmp_path / "demo_added.yaml").write_text(yaml.safe_dump(spec_added))
    summary = subprocess.run([str(cli), "summary"], env={**env, "SCRAPE_SITE": str(tmp_path / "demo_added.yaml")},
                             capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert summary.returncode == 0, summary.stderr[-3000:]
    assert "  categories      11/12 (1 without a complete snapshot yet: travel-again)\n" in summary.stdout

    # Storage and warehouse named by their variables (passed to Dagster as EnvVar): the command uses the values.
    env.update(SCRAPE_STORAGE_URL=str(tmp_path / "data" / "objects"),
               SCRAPE_WAREHOUSE_URL=f"sqlite:///{tmp_path / 'data' / 'warehouse.db'}")
    summary = subprocess.run([str(cli), "summary"], env=env, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert summary.returncode == 0, summary.stderr[-3000:]
    assert "products loaded 678 (table `products`)" in summary.stdout
    assert f"warehouse       sqlite:///{tmp_path / 'data' / 'warehouse.db'}" in summary.stdout

    # Another site on the same warehouse: refused before a single request (its load would be).
    spec["name"] = "other_shop"
    (tmp_path / "other_shop.yaml").write_text(yaml.safe_dump(spec))
    env["SCRAPE_SITE"] = str(tmp_path / "other_shop.yaml")
    other = subprocess.run([str(cli), "demo"], env=env, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert other.returncode != 0
    assert "expected the warehouse of site 'other_shop' (this one holds site 'demo'" in other.stderr
    assert not (tmp_path / "data" / "objects" / "other_shop").exists()


def test_bad_settings_give_one_clear_error(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("SCRAPE_")}
    env.update(DAGSTER_HOME=str(tmp_path), SCRAPE_SITE="no_such_site")
    cli = Path(sys.executable).with_name("scrape-assets")
    done = subprocess.run([str(cli), "demo"], env=env, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1] == (
        "scrape-assets: error: SCRAPE_SITE='no_such_site' is invalid: expected a shipped spec name "
        "(books_toscrape, demo) or a path to a .yaml file"
    )
    env.update(SCRAPE_SITE="demo", SCRAPE_MAX_ATTEMPTS="zero")
    done = subprocess.run([str(cli), "demo"], env=env, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 2
    assert "SCRAPE_MAX_ATTEMPTS='zero' is invalid: expected an integer ≥ 1" in done.stderr


def _demo(tmp_path, **env_updates):
    env = {k: v for k, v in os.environ.items() if not k.startswith("SCRAPE_")}
    env.update({"DAGSTER_HOME": str(tmp_path / "home"), "SCRAPE_DATA_DIR": str(tmp_path / "data"), **env_updates})
    cli = Path(sys.executable).with_name("scrape-assets")
    return subprocess.run([str(cli), "demo"], env=env, capture_output=True, text=True, timeout=120, cwd=tmp_path)


def test_bad_inputs_each_give_one_clear_error_naming_the_input(tmp_path):
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("a regular file where a folder should be")
    malformed = tmp_path / "malformed.yaml"
    malformed.write_text("name: demo\nbase_url: [oops\n")
    utf16 = tmp_path / "utf16.yaml"
    utf16.write_bytes("name: demo\n".encode("utf-16"))
    cases = {
        "unwritable data dir": (
            {"SCRAPE_DATA_DIR": str(blocker / "data")},
            f"scrape-assets: error: SCRAPE_DATA_DIR='{blocker / 'data'}' is invalid: expected a folder this "
            f"process can write ({blocker} is a file, not a folder)",
        ),
        "unreachable storage URL": (
            {"SCRAPE_STORAGE_URL": "nosuchproto://key:secret-token@bucket/prefix"},
            "scrape-assets: error: SCRAPE_STORAGE_URL='nosuchproto://bucket/prefix' is invalid: expected object storage "
            "this process can write (cannot open object storage: Unsupported filesystem",
        ),
        "malformed spec": (
            {"SCRAPE_SITE": str(malformed)},
            f"scrape-assets: error: {malformed}: not valid YAML",
        ),
        "bad demo date": (
            {"SCRAPE_DEMO_DATE": "2026-13-01"},
            "scrape-assets: error: SCRAPE_DEMO_DATE='2026-13-01' is invalid: expected a date as YYYY-MM-DD",
        ),
        "demo date out of the catalogue's range": (  # year 1 has no 400 days before it: the demo overflowed
            {"SCRAPE_DEMO_DATE": "0001-01-01"},
            "scrape-assets: error: SCRAPE_DEMO_DATE='0001-01-01' is invalid: expected a date from 2000-01-01 to "
            "9998-12-31, e.g. 2026-12-01",
        ),
        "bad cron": (
            {"SCRAPE_SCHEDULE_CRON": "bogus"},
            "scrape-assets: error: SCRAPE_SCHEDULE_CRON='bogus' is invalid: expected a cron expression with 5 fields",
        ),
        "cron out of range": (
            {"SCRAPE_SCHEDULE_CRON": "99 99 * * *"},
            "scrape-assets: error: SCRAPE_SCHEDULE_CRON='99 99 * * *' is invalid: expected a cron expression Dagster's "
            "scheduler accepts: 5 fields, each in range",
        ),
        "cron that never fires": (
            {"SCRAPE_SCHEDULE_CRON": "0 0 31 4 *"},
            "scrape-assets: error: SCRAPE_SCHEDULE_CRON='0 0 31 4 *' is invalid: expected a cron expression that "
            "fires: its day of month must occur in its months",
        ),
        "bad event batch size": (  # Dagster's: read by the instance only once a run executes
            {"DAGSTER_EVENT_BATCH_SIZE": "abc"},
            "scrape-assets: error: DAGSTER_EVENT_BATCH_SIZE='abc' is invalid: expected an integer >= 0",
        ),
        "Dagster home under a file": (
            {"DAGSTER_HOME": str(blocker / "home")},
            f"scrape-assets: error: DAGSTER_HOME='{blocker / 'home'}' is invalid: expected a folder this process can "
            f"write (Not a directory: {blocker / 'home'})",
        ),
        "base URL without a host": (
            {"SCRAPE_BASE_URL": "http://"},
            "scrape-assets: error: SCRAPE_BASE_URL='http://' is invalid: expected an absolute http(s) URL with a host",
        ),
        "base URL with credentials": (  # every page would be refused, and the password stored with them
            {"SCRAPE_BASE_URL": "http://u:secret-token@127.0.0.1:8000/"},
            "scrape-assets: error: SCRAPE_BASE_URL='<hidden>' is invalid: expected a URL without user:password@",
        ),
        "spec not UTF-8": (
            {"SCRAPE_SITE": str(utf16)},
            f"scrape-assets: error: SCRAPE_SITE={str(utf16)!r} is invalid: expected a readable spec file; {utf16}: "
            "expected UTF-8 text, found byte 0xff at offset 0",
        ),
        "base URL unparsable, a token in it": (
            {"SCRAPE_BASE_URL": "http://[::1?token=secret-token"},
            "scrape-assets: error: SCRAPE_BASE_URL='<hidden>' is invalid: expected an absolute http(s) URL with a host",
        ),
        "warehouse query value refused": (
            {"SCRAPE_WAREHOUSE_URL": f"sqlite:///{tmp_path / 'w.db'}?timeout=soon"},
            f"scrape-assets: error: SCRAPE_WAREHOUSE_URL='sqlite:///{tmp_path / 'w.db'}?timeout=soon' is invalid: "
            "expected a SQLAlchemy URL whose query values its driver accepts (",
        ),
        "warehouse password with a '['": (  # urlsplit refuses it, SQLAlchemy parses it: the password is ***
            {"SCRAPE_WAREHOUSE_URL": "postgresql+pg8000://u:secret-token[@db.internal/shop"},
            "scrape-assets: error: SCRAPE_WAREHOUSE_URL='postgresql+pg8000://u:***@db.internal/shop' is invalid: "
            "expected a SQLAlchemy URL whose driver is installed",
        ),
        "warehouse port not a number": (  # the "port" may be the rest of a password with an unencoded '@'
            {"SCRAPE_WAREHOUSE_URL": "postgresql://u:secret-token@db.internal:abc/shop"},
            "scrape-assets: error: SCRAPE_WAREHOUSE_URL='postgresql://<hidden>' is invalid: expected a SQLAlchemy URL "
            "whose port, if any, is a number",
        ),
        "webhook not http": (
            {"SCRAPE_ALERT_WEBHOOK_URL": "ftp://secret-token@x"},
            "scrape-assets: error: SCRAPE_ALERT_WEBHOOK_URL='<hidden>' is invalid: expected an http(s) URL",
        ),
        "webhook httpx refuses (a CRLF .env file's \\r)": (
            {"SCRAPE_ALERT_WEBHOOK_URL": "https://hooks.example/T0/secret-token\r"},
            "scrape-assets: error: SCRAPE_ALERT_WEBHOOK_URL='<hidden>' is invalid: expected an http(s) URL with a host, "
            "a numeric port if any, and no space or control character",
        ),
        "proxy not http": (
            {"SCRAPE_PROXY_URL": "socks5://scraper:secret-token@proxy.internal:1080"},
            "scrape-assets: error: SCRAPE_PROXY_URL='<hidden>' is invalid: expected an http://[user:pass@]host:port proxy"
            " URL, e.g. http://user:pass@proxy.internal:3128 (the scheme must be http://)",
        ),
        "storage in memory": (  # would run, saving pages the next step's process cannot see
            {"SCRAPE_STORAGE_URL": "memory://objects"},
            "scrape-assets: error: SCRAPE_STORAGE_URL='memory://objects' is invalid: expected a folder or an object "
            "store URL such as s3://bucket/prefix (memory:// keeps nothing once the process ends",
        ),
        "storage URL without its colon": (  # else a folder ./s3/bucket/prefix, without a word
            {"SCRAPE_STORAGE_URL": "s3//key:secret-token@bucket/prefix"},
            "scrape-assets: error: SCRAPE_STORAGE_URL='s3//bucket/prefix' is invalid: expected an object store URL "
            "with '://' after its protocol, e.g. s3://bucket/prefix, or an absolute folder",
        ),
        "storage in a relative folder": (
            {"SCRAPE_STORAGE_URL": "objects"},
            f"scrape-assets: error: SCRAPE_STORAGE_URL='objects' is invalid: expected an absolute folder (this one is "
            f"{tmp_path / 'objects'} from this process's folder; the UI's code server and run workers may start in "
            "another) or an object store URL such as s3://bucket/prefix",
        ),
        "storage in memory behind a cache": (
            {"SCRAPE_STORAGE_URL": "simplecache::memory://objects"},
            "scrape-assets: error: SCRAPE_STORAGE_URL='simplecache::memory://objects' is invalid: expected a folder",
        ),
        "bad warehouse URL": (
            {"SCRAPE_WAREHOUSE_URL": "nosuchdb://x/y"},
            "scrape-assets: error: SCRAPE_WAREHOUSE_URL='nosuchdb://x/y' is invalid: expected a SQLAlchemy URL",
        ),
        "warehouse driver not installed": (  # a valid URL: the missing piece is the driver
            {"SCRAPE_WAREHOUSE_URL": "postgresql+pg8000://u:secret-token@db.internal/shop"},
            "scrape-assets: error: SCRAPE_WAREHOUSE_URL='postgresql+pg8000://u:***@db.internal/shop' is invalid: "
            "expected a SQLAlchemy URL whose driver is installed in this environment (No module named 'pg8000')",
        ),
    }
    home = tmp_path / "home"  # an instance the cases would leave a run in
    home.mkdir()
    shutil.copyfile(REPO_ROOT / "dagster.yaml", home / "dagster.yaml")
    subprocess.run([sys.executable, "-c", "import dagster; dagster.DagsterInstance.get().get_runs()"], check=True,
                   env={**os.environ, "DAGSTER_HOME": str(home)}, timeout=120)
    for name, (env, expected) in cases.items():
        done = _demo(tmp_path, **env)
        assert done.returncode == 2, (name, done.stderr[-2000:])
        lines = [line for line in done.stderr.splitlines() if line.startswith("scrape-assets: error:")]
        assert len(lines) == 1 and lines[0].startswith(expected), (name, done.stderr[-2000:])
        assert "Traceback" not in done.stderr, name
        assert "secret-token" not in done.stderr + done.stdout, name  # a webhook URL is a secret
    with contextlib.closing(sqlite3.connect(home / "history" / "runs.db")) as db:
        assert db.execute("SELECT status FROM runs").fetchall() == []  # no case left a run that never starts


def test_a_run_summary_names_the_steps_that_did_not_finish():
    import io

    from scrape_assets.cli import print_summary

    summary = {"site": "demo", "categories": 0, "categories_configured": 12, "pages_done": 0, "pages_failed": 0,
               "success_rate": 1.0, "products_loaded": 0, "dead_letters": 0, "object_storage": "/d/objects",
               "warehouse": "sqlite:////d/warehouse.db", "warehouse_site": None}
    run = {"success": False, "requests_made": 40, "pages_not_modified": 3, "pages_failed": 1, "pages_parsed": None,
           "partitions_unchanged": None, "rows_loaded": None, "rows_carried_forward": None, "dead_letters": None}
    out = io.StringIO()
    print_summary(summary, run, out=out)
    lines = out.getvalue().splitlines()
    assert lines[:2] == ["", "This run (FAILED: see the log above or `make ui`)"]  # parted from the run's log
    out = io.StringIO()  # the variables the command leaves out are named here too, as on the summary's last line
    print_summary({**summary, "ui_exports": ["SCRAPE_BASE_URL", "SCRAPE_WAREHOUSE_URL"]}, run, out=out)
    assert out.getvalue().splitlines()[1] == ("This run (FAILED: see the log above or `make ui` (with SCRAPE_BASE_URL "
                                              "and SCRAPE_WAREHOUSE_URL exported))")
    out = io.StringIO()  # why, when known; and no `make ui` while a daemon (and so a UI, likely) runs on the instance
    print_summary({**summary, "daemon_heartbeat_age_s": 4.0},
                  {**run, "failure": "raw_pages: ScrapeError: partition 'demo/classics' is being written by another run"},
                  out=out)
    assert out.getvalue().splitlines()[1:3] == [
        "This run (FAILED: see the log above or the Dagster UI serving this instance)",
        "  failed          raw_pages: ScrapeError: partition 'demo/classics' is being written by another run"]
    assert "  requests        40 (3 not modified: 304), 1 page failed for good" in lines
    assert "  parsed          parsed_products did not finish" in lines
    assert "  loaded          products_table did not finish" in lines
    assert "None" not in out.getvalue()
    out = io.StringIO()  # a load the schema check held back (the demo loads what passed after the run)
    print_summary(summary, {**run, "load_held_back": True}, out=out)
    assert ("  loaded          products_table held back: a schema check failed (the categories that passed are "
            "loaded below)"
            in out.getvalue().splitlines())
    # Pages adopted without a request (incremental.revalidate: sitemap or first_page) are said.
    out = io.StringIO()
    print_summary(summary, {**run, "requests_made": 12, "pages_not_modified": 10, "pages_failed": 0,
                            "pages_assumed_unchanged": 26}, out=out)
    assert "  requests        12 (10 not modified: 304; 26 pages kept without a request), 0 pages failed for good" in (
        out.getvalue().splitlines())
    out = io.StringIO()  # a sitemap that could not be used is said too
    print_summary(summary, {**run, "requests_made": 38, "pages_not_modified": 25, "pages_failed": 0,
                            "sitemap_error": "http://x/missing.xml: http_404"}, out=out)
    assert ("  requests        38 (25 not modified: 304; sitemap not used (http_404)), 0 pages failed for good"
            in out.getvalue().splitlines())


def test_the_summary_does_not_count_a_category_whose_every_page_failed(tmp_path, monkeypatch):
    import io

    from scrape_assets.cli import print_summary, summarize
    from scrape_assets.defs.resources import build_resources
    from scrape_assets.manifest import Manifest, PageEntry

    resources = build_resources({"SCRAPE_SITE": "demo", "SCRAPE_DATA_DIR": str(tmp_path / "data")},
                                secrets_as_env_vars=False)
    store = resources["store"].store()
    for category, status in (("travel", "failed"), ("mystery", "done")):
        url = f"http://demo.scrape-assets.invalid/catalogue/category/books/{category}/index.html"
        Manifest(site="demo", category=category, snapshot_id="2026-12-01T080000Z", fetch_config={},
                 fetch_config_hash="", start_url=url, completed_at="2026-12-01T08:01:00Z", discovery_complete=True,
                 total_pages=1, pages={1: PageEntry(url=url, status=status, attempts=3)}).save(store)
    monkeypatch.delenv("SCRAPE_SITE", raising=False)
    monkeypatch.setenv("SCRAPE_DATA_DIR", str(tmp_path / "data"))  # the data of the summary above...
    monkeypatch.setenv("SCRAPE_BASE_URL", "http://127.0.0.1:8001/")  # ...fetched from a mirror...
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "books_home"))  # ...by runs on another instance
    summary = summarize(resources)
    assert (summary["categories"], summary["categories_without_pages"]) == (1, ["travel"])
    assert summary["categories_failing_schema"] == {}
    assert (summary["pages_done"], summary["pages_failed"]) == (1, 1)
    out = io.StringIO()
    print_summary(summary, out=out)
    assert out.getvalue().splitlines()[0] == "Summary (demo, latest complete snapshots)"  # no blank line first
    assert summary["categories_without_snapshot"] == ["classics", "romance", "fiction", "default", "fantasy",
                                                      "science", "poetry", "history", "nonfiction", "sequential-art"]
    assert ("  categories      1/12 (1 whose latest snapshot has no page done: travel) (10 without a complete "
            "snapshot yet: classics, romance, fiction, default, fantasy, science, poetry, history, nonfiction, "
            "sequential-art)") in out.getvalue().splitlines()
    hint = (f"SCRAPE_DATA_DIR={tmp_path / 'data'} SCRAPE_BASE_URL=http://127.0.0.1:8001/ make ui "
            f"DAGSTER_HOME={tmp_path / 'books_home'}")
    assert out.getvalue().splitlines()[-1] == f"  Dagster UI      {hint}  (then open http://127.0.0.1:3000)"
    failed = io.StringIO()  # a failed run points at the same command
    print_summary(summary, {"success": False, "requests_made": 1, "pages_not_modified": 0, "pages_failed": 1,
                            "pages_parsed": None, "partitions_unchanged": None, "rows_loaded": None,
                            "rows_carried_forward": None}, out=failed)
    assert f"This run (FAILED: see the log above or `{hint}`)" in failed.getvalue().splitlines()


def test_a_damaged_manifest_is_one_line_of_the_summary_which_still_reports_the_rest(tmp_path, monkeypatch, capsys):
    """A manifest cut short stopped the whole summary; now its category is named with what to
    do, the other categories are counted as usual, and the command still exits 2."""
    import shutil

    from scrape_assets.cli import main
    from scrape_assets.manifest import Manifest, PageEntry
    from scrape_assets.storage import ObjectStore

    monkeypatch.setenv("SCRAPE_SITE", "demo")
    monkeypatch.setenv("SCRAPE_DATA_DIR", str(tmp_path / "data"))
    store = ObjectStore(str(tmp_path / "data" / "objects"))
    for category in ("travel", "mystery", "poetry"):
        url = f"http://demo.scrape-assets.invalid/catalogue/category/books/{category}/index.html"
        Manifest(site="demo", category=category, snapshot_id="2026-12-01T080000Z", fetch_config={},
                 fetch_config_hash="", start_url=url, completed_at="2026-12-01T08:01:00Z", discovery_complete=True,
                 total_pages=1, pages={1: PageEntry(url=url, status="done", attempts=1)}).save(store)
    key = "demo/mystery/2026-12-01T080000Z/manifest.json"
    store.write_bytes_atomic(key, store.read_bytes(key)[:40])
    assert main(["summary"]) == 2
    out, err = capsys.readouterr()
    lines = out.splitlines()
    assert lines[1].startswith("  categories      2/12 ")
    (unreadable,) = [line for line in lines if line.startswith("  unreadable ")]
    assert unreadable.startswith(f"  unreadable      1 not counted here, a manifest cannot be read: {key}: "
                                 "unreadable manifest: ")
    assert unreadable.endswith(f"; restore it, or move its folder out of {store.describe()}: mystery then goes on "
                               "from its previous complete snapshot, or crawls anew")
    assert "  pages           2 done, 0 failed" in lines
    assert err == ("scrape-assets: error: 1 category with a manifest that cannot be read (mystery): see the "
                   "`unreadable` line\n")
    shutil.move(tmp_path / "data" / "objects" / "demo" / "mystery" / "2026-12-01T080000Z", tmp_path / "moved")
    assert main(["summary"]) == 0  # as the line says: moved away, mystery has no snapshot (it crawls anew)
    assert "  unreadable " not in capsys.readouterr().out


def test_summary_of_an_unusable_warehouse_or_storage_is_one_line_naming_the_setting(tmp_path, monkeypatch, capsys):
    from scrape_assets.cli import main

    monkeypatch.setenv("SCRAPE_SITE", "demo")
    monkeypatch.setenv("SCRAPE_DATA_DIR", str(tmp_path / "data"))
    not_a_db, folder, foreign = tmp_path / "notes.db", tmp_path / "folder.db", tmp_path / "foreign.db"
    not_a_db.write_text("not a database")
    folder.mkdir()
    with Warehouse(f"sqlite:///{foreign}").engine.begin() as conn:  # someone else's `products`
        conn.exec_driver_sql("CREATE TABLE products (sku TEXT PRIMARY KEY, name TEXT)")
    cases = {
        not_a_db: "DatabaseError: file is not a database",
        folder: "OperationalError: unable to open database file",
        foreign: "OperationalError: no such column: products.category",
    }
    for path, reason in cases.items():
        monkeypatch.setenv("SCRAPE_WAREHOUSE_URL", f"sqlite:///{path}")
        assert main(["summary"]) == 2
        captured = capsys.readouterr()
        assert captured.err == (f"scrape-assets: error: cannot use the warehouse at sqlite:///{path} "
                                f"(SCRAPE_WAREHOUSE_URL): {reason}\n"), path
        assert captured.out == ""
    assert not_a_db.read_text() == "not a database"  # nothing written over it
    # Object storage whose filesystem driver is not installed (s3fs for s3://: the [s3] extra).
    monkeypatch.delenv("SCRAPE_WAREHOUSE_URL")
    monkeypatch.setenv("SCRAPE_STORAGE_URL", "s3://bucket/prefix")
    monkeypatch.setitem(sys.modules, "s3fs", None)  # import s3fs -> ImportError, installed or not
    for protocol in ("s3", "s3a"):  # ...and fsspec forgets a class it imported for an earlier test
        monkeypatch.delitem(fsspec_classes, protocol, raising=False)
    assert main(["summary"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("scrape-assets: error: SCRAPE_STORAGE_URL='s3://bucket/prefix' is invalid: expected object "
                          "storage this process can read (no filesystem driver for this URL: "), err
    assert err.endswith("(for S3: pip install -e '.[s3]'))\n") and err.count("\n") == 1, err
    # A data folder that is a file: said so, rather than an empty store (summary) or one error per category (prune).
    monkeypatch.delenv("SCRAPE_STORAGE_URL")
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("SCRAPE_DATA_DIR", str(blocker))
    for command, usable in ((["summary"], "can read"), (["prune", "--keep", "1"], "can write"),
                            (["prune", "--keep", "1", "--dry-run"], "can read")):  # the folder as set, not its objects/
        assert main(command) == 2
        captured = capsys.readouterr()
        assert captured.err == (f"scrape-assets: error: SCRAPE_DATA_DIR='{blocker}' is invalid: expected "
                                f"a folder this process {usable} ({blocker} is a file, not a folder)\n"), command
        assert captured.out == ""


def test_the_summary_creates_no_table_missing_from_an_older_warehouse(tmp_path):
    import io

    import sqlalchemy as sa

    from scrape_assets.cli import print_summary, summarize
    from scrape_assets.defs.resources import build_resources
    from scrape_assets.warehouse import dead_letters, warehouse_site

    url = f"sqlite:///{tmp_path / 'warehouse.db'}"
    wh = Warehouse(url)
    wh.load_products("travel", [{"category": "travel", "product_id": "1", "title": "T", "price": "9.99",
                                 "currency": "GBP", "rating": 3, "availability": "In stock", "url": "http://x/1",
                                 "page_number": 1, "snapshot_id": "s1", "fetched_at": "2026-12-01T08:00:00Z"}],
                     input_version="v", snapshot_id="s1", loaded_at="t", history_date="2026-12-01",
                     history_snapshot_id="s1")
    with wh.engine.begin() as conn:  # as a warehouse made before these tables existed
        conn.execute(sa.text(f"DROP TABLE {dead_letters.name}"))
        conn.execute(sa.text(f"DROP TABLE {warehouse_site.name}"))
    wh.close()
    before = wh.existing_tables()
    resources = build_resources({"SCRAPE_SITE": "demo", "SCRAPE_DATA_DIR": str(tmp_path / "data"),
                                 "SCRAPE_WAREHOUSE_URL": url}, secrets_as_env_vars=False)
    summary = summarize(resources)
    assert (summary["products_loaded"], summary["dead_letters"], summary["warehouse_exists"]) == (1, 0, True)
    assert Warehouse(url).existing_tables() == before and dead_letters.name not in before

    # A database without the tables (as a new PostgreSQL database is) is named as such, and left empty.
    empty_url = f"sqlite:///{tmp_path / 'empty.db'}"
    with Warehouse(empty_url, create=False) as empty, empty.engine.begin() as conn:
        conn.execute(sa.text("CREATE TABLE unrelated (id INTEGER)"))
    resources = build_resources({"SCRAPE_SITE": "demo", "SCRAPE_DATA_DIR": str(tmp_path / "data"),
                                 "SCRAPE_WAREHOUSE_URL": empty_url}, secrets_as_env_vars=False)
    out = io.StringIO()
    print_summary(summarize(resources), out=out)
    assert f"  products loaded 0 (table `products`); no `products` table yet in {empty_url}" in out.getvalue().splitlines()
    assert sa.inspect(sa.create_engine(empty_url)).get_table_names() == ["unrelated"]  # nothing created


def _demo_summary(tmp_path, warehouse_url: str) -> list[str]:
    """The lines `scrape-assets summary` prints for the demo site with that warehouse."""
    import io

    from scrape_assets.cli import print_summary, summarize
    from scrape_assets.defs.resources import build_resources

    resources = build_resources({"SCRAPE_SITE": "demo", "SCRAPE_DATA_DIR": str(tmp_path / "data"),
                                 "SCRAPE_WAREHOUSE_URL": warehouse_url}, secrets_as_env_vars=False)
    out = io.StringIO()
    print_summary(summarize(resources), out=out)
    return out.getvalue().splitlines()


def test_the_summary_counts_rows_carried_forward_from_pages_that_failed(tmp_path):
    """Rows kept from a page that failed are last-known values, not today's: the summary says
    how many, since when, and where."""
    url = f"sqlite:///{tmp_path / 'w.db'}"
    wh = Warehouse(url)

    def row(product_id: str, page: int, snapshot: str, fetched: str, category: str = "travel") -> dict:
        return {"category": category, "product_id": product_id, "title": "T", "price": "9.99", "currency": "GBP",
                "rating": 3, "availability": "In stock", "url": f"http://x/{product_id}", "page_number": page,
                "snapshot_id": snapshot, "fetched_at": fetched}

    day0, day1 = "2026-11-30T08:00:00Z", "2026-12-01T08:00:00Z"
    wh.load_products("travel", [row("1", 1, "s1", day1), row("2", 2, "s1", day1), row("3", 2, "s1", day1)],
                     input_version="v1", snapshot_id="s1", loaded_at=day1, history_date="2026-12-01",
                     history_snapshot_id="s1")
    wh.load_products("mystery", [row("4", 1, "s1", day1, "mystery"), row("5", 2, "s1", day0, "mystery")],
                     input_version="v1", snapshot_id="s1", loaded_at=day1, history_date="2026-12-01",
                     history_snapshot_id="s1")
    day2 = "2026-12-02T08:00:00Z"  # page 2 failed: its rows are carried forward
    for category, first in (("travel", "1"), ("mystery", "4")):
        wh.load_products(category, [row(first, 1, "s2", day2, category)], input_version="v2", snapshot_id="s2",
                         loaded_at=day2, history_date="2026-12-02", history_snapshot_id="s2", carry_unseen=True)
    assert wh.carried_forward() == {"mystery": (1, day0), "travel": (2, day1)}
    wh.close()
    assert ("  carried forward 3 of those rows were not seen in the snapshot last loaded (a page of their category failed, "
            "their card was rejected, or its listing changed while it was crawled; the oldest parsed from a body "
            f"fetched {day0}, later 304s not counted): mystery (1), travel (2); failed pages and rejected cards are in "
            "`dead_letters`") in _demo_summary(tmp_path, url)


def test_this_runs_loaded_line_counts_only_rows_this_runs_loads_kept():
    """A category left unchanged keeps its carried rows without a load: "This run" does not
    claim 0 kept while the Summary below counts them (the rows of earlier loads)."""
    import io

    from scrape_assets.cli import print_summary

    summary = {"site": "demo", "categories": 12, "categories_configured": 12, "pages_done": 37, "pages_failed": 1,
               "success_rate": 37 / 38, "products_loaded": 678, "dead_letters": 1, "object_storage": "/d",
               "warehouse": "sqlite:///w", "products_carried_forward": {"default": 20},
               "carried_forward_oldest_fetch": "2026-12-14T08:00:00Z"}
    run = {"success": True, "requests_made": 38, "pages_not_modified": 30, "pages_failed": 1, "pages_parsed": 7,
           "partitions_unchanged": 10, "rows_loaded": 94, "rows_carried_forward": 0, "dead_letters": 1}
    for carried, expected in ((0, "  loaded          94 rows (re)loaded"),
                              (1, "  loaded          94 rows (re)loaded, and 1 earlier row kept in those categories "
                                  "for pages that failed, cards rejected or a listing that moved"),
                              (20, "  loaded          94 rows (re)loaded, and 20 earlier rows kept in those "
                                   "categories for pages that failed, cards rejected or a listing that moved")):
        out = io.StringIO()
        print_summary(summary, {**run, "rows_carried_forward": carried}, out=out)
        assert expected in out.getvalue().splitlines()
        assert "  carried forward 20 of those rows" in out.getvalue()
    out = io.StringIO()  # a listing that moved during the crawl: said in the run's lines
    print_summary(summary, {**run, "categories_listing_moved": {"travel": "page 1 says 40 results, page 2 says 60"}},
                  out=out)
    assert ("  maybe missed    products in 1 category although every page was fetched: travel (page 1 says 40 "
            "results, page 2 says 60) (earlier rows of products not seen are kept)") \
        in out.getvalue().splitlines()


def test_serve_demo_refuses_a_bad_port_date_or_busy_address_in_one_line(monkeypatch, capsys):
    import socket

    import pytest

    from scrape_assets.cli import main

    with pytest.raises(SystemExit) as exit_info:  # argparse: usage and one error line
        main(["serve-demo", "--port", "99999"])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        "scrape-assets serve-demo: error: argument --port: expected a port number 0-65535, got 99999")
    monkeypatch.setenv("SCRAPE_DEMO_DATE", "2026-99-01")
    assert main(["serve-demo", "--port", "0"]) == 2
    assert capsys.readouterr().err == ("scrape-assets: error: SCRAPE_DEMO_DATE='2026-99-01' is invalid: expected a "
                                       "date as YYYY-MM-DD, e.g. 2026-12-01\n")
    monkeypatch.delenv("SCRAPE_DEMO_DATE")
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        assert main(["serve-demo", "--port", str(port)]) == 2
    assert capsys.readouterr().err == f"scrape-assets: error: cannot listen on 127.0.0.1:{port}: Address already in use\n"


def test_the_ui_hint_names_the_instance_the_runs_went_to(tmp_path, monkeypatch):
    from scrape_assets.cli import ui_command, ui_exports

    monkeypatch.chdir(REPO_ROOT)
    assert ui_command({}) == "make ui"
    # What `make demo` sets in the clone: its own instance and data folder, the demo site.
    assert ui_command({"DAGSTER_HOME": str(REPO_ROOT / ".dagster_home"), "SCRAPE_DATA_DIR": str(REPO_ROOT / "data"),
                       "SCRAPE_SITE": "demo"}) == "make ui"
    assert ui_command({"DAGSTER_HOME": ".dagster_home", "SCRAPE_DATA_DIR": "data"}) == "make ui"
    # The README's offline books.toscrape.com recipe: the UI needs the same site, data and mirror.
    books = tmp_path / "my homes" / ".dagster_home_books"
    assert ui_command({"DAGSTER_HOME": str(books), "SCRAPE_SITE": "books_toscrape", "SCRAPE_DATA_DIR": "data-books",
                       "SCRAPE_BASE_URL": "http://127.0.0.1:8001/", "SCRAPE_WAREHOUSE_URL": "postgresql://u:pw@db/w",
                       "SCRAPE_REQUESTS_PER_SECOND": "20"}) == (
        f"SCRAPE_SITE=books_toscrape SCRAPE_DATA_DIR={REPO_ROOT / 'data-books'} "
        f"SCRAPE_BASE_URL=http://127.0.0.1:8001/ SCRAPE_REQUESTS_PER_SECOND=20 make ui DAGSTER_HOME='{books}'"
    )  # quoted; no warehouse URL
    # The settings a killed snapshot resumes only under (User-Agent, attempts) and the rest of how
    # the run behaved (the demo's day, ...): the UI's runs get them too; a secret is only named.
    env = {"SCRAPE_USER_AGENT": "shopbot/1.0 (+mailto:ops@example.com)", "SCRAPE_MAX_ATTEMPTS": "5",
           "SCRAPE_DEMO_DATE": "2026-12-08", "SCRAPE_MAX_CONCURRENCY": " ", "SCRAPE_PROXY_URL": "http://u:pw@p:3128",
           "SCRAPE_ALERT_WEBHOOK_URL": "https://hooks.example/T0/secret", "SCRAPE_STORAGE_URL": "s3://b/p"}
    assert ui_command(env) == ("SCRAPE_USER_AGENT='shopbot/1.0 (+mailto:ops@example.com)' SCRAPE_MAX_ATTEMPTS=5 "
                               "SCRAPE_DEMO_DATE=2026-12-08 make ui")
    assert ui_exports(env) == ["SCRAPE_STORAGE_URL", "SCRAPE_PROXY_URL", "SCRAPE_ALERT_WEBHOOK_URL"]
    # As set: a User-Agent with a trailing space is what the run recorded, and a resume compares it whole.
    # The others stripped, as the settings read them (a \r left by a CRLF .env file would garble the line).
    assert ui_command({"SCRAPE_USER_AGENT": "bot/1.0 (+ops@x.example) ", "SCRAPE_MAX_ATTEMPTS": "4\r"}) == (
        "SCRAPE_USER_AGENT='bot/1.0 (+ops@x.example) ' SCRAPE_MAX_ATTEMPTS=4 make ui")
    # Elsewhere: the data folder of that folder (./data by default) is not the clone's.
    monkeypatch.chdir(tmp_path)
    spec = tmp_path / "shop.yaml"
    spec.write_text("name: shop\n")
    # A base URL redact_url would not show whole (here: user info, a query) is named, not printed nor cut.
    env = {"SCRAPE_SITE": "shop.yaml", "SCRAPE_BASE_URL": "http://u:secret@127.0.0.1:8001/?token=x"}
    assert ui_command(env) == f"SCRAPE_SITE={spec} SCRAPE_DATA_DIR={tmp_path / 'data'} make ui"
    assert ui_exports(env) == ["SCRAPE_BASE_URL"]
    # One with a port and an "@" in its path is hidden whole by redact_url: named too, never "http://<hidden>".
    env = {"SCRAPE_BASE_URL": "http://127.0.0.1:8000/shop@2024/"}
    assert "SCRAPE_BASE_URL" not in ui_command(env) and ui_exports(env) == ["SCRAPE_BASE_URL"]
    assert ui_command({"SCRAPE_DATA_DIR": str(REPO_ROOT / "data")}) == "make ui"  # no instance here: the clone's
    # DAGSTER_HOME unset in a folder with an instance: the one `scrape-assets demo` run there recorded into.
    home = tmp_path / ".dagster_home"
    home.mkdir()
    (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    assert ui_command({"SCRAPE_DATA_DIR": str(REPO_ROOT / "data")}) == f"make ui DAGSTER_HOME={home}"


def test_prune_of_storage_without_the_site_says_so_and_creates_nothing(tmp_path, monkeypatch, capsys):
    """A mistyped data folder: one error line naming it, exit 2, and no folder or lock file made there."""
    from scrape_assets.cli import main

    monkeypatch.setenv("SCRAPE_SITE", "demo")
    missing = tmp_path / "nothere" / "x"
    monkeypatch.setenv("SCRAPE_DATA_DIR", str(missing))
    for command in (["prune", "--keep", "1"], ["prune", "--keep", "1", "--dry-run"]):
        assert main(command) == 2
        captured = capsys.readouterr()
        assert captured.err == (f"scrape-assets: error: no snapshot of demo in {missing}: is SCRAPE_DATA_DIR the one "
                                "you scraped into, and SCRAPE_SITE (demo) the site? Nothing pruned\n"), command
        assert captured.out == ""
        assert not (tmp_path / "nothere").exists(), command
    # Unset, the data folder is ./data: named so, not as its objects/ subfolder.
    monkeypatch.delenv("SCRAPE_DATA_DIR")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "data").write_text("a file where the data folder should be")
    assert main(["summary"]) == 2
    assert capsys.readouterr().err == ("scrape-assets: error: SCRAPE_DATA_DIR='./data' is invalid: expected a folder this "
                                       f"process can read ({tmp_path / 'data'} is a file, not a folder)\n")


def test_the_command_line_help_describes_each_command_and_the_version(capsys):
    import pytest

    from scrape_assets.cli import main

    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0
    from importlib.metadata import version

    assert capsys.readouterr().out == f"scrape-assets {version('scrape_assets')}\n"
    with pytest.raises(SystemExit):
        main(["--help"])
    top = " ".join(capsys.readouterr().out.split())
    assert "Scrape a catalogue site's category listings into Dagster assets." in top
    assert "SCRAPE_* environment variables" in top and "DAGSTER_HOME" in top
    for command, description in (("demo", "Materialize every asset for every category of the site in one run"),
                                 ("summary", "Print what is stored now"),
                                 ("serve-demo", "another address exposes the demo to the network"),
                                 ("categories", "List the site's categories (the partition keys) in the spec's order")):
        with pytest.raises(SystemExit):
            main([command, "--help"])
        assert description in " ".join(capsys.readouterr().out.split()), command


def test_the_preflight_blames_the_data_folder_for_an_unusable_default_warehouse(tmp_path, monkeypatch):
    """SCRAPE_WAREHOUSE_URL unset: the warehouse is the data folder's warehouse.db, so the error
    names SCRAPE_DATA_DIR (the variable the user set), not a variable they never set."""
    import pytest

    from scrape_assets.cli import preflight
    from scrape_assets.defs.resources import build_resources
    from scrape_assets.errors import SettingsError

    data = tmp_path / "data"
    data.mkdir()
    (data / "warehouse.db").write_text("not a database")
    env = {"SCRAPE_SITE": "demo", "SCRAPE_DATA_DIR": str(data)}
    monkeypatch.delenv("SCRAPE_WAREHOUSE_URL", raising=False)
    monkeypatch.setenv("SCRAPE_DATA_DIR", str(data))
    with pytest.raises(SettingsError) as refused:
        preflight(build_resources(env, secrets_as_env_vars=False))
    assert str(refused.value) == (
        f"SCRAPE_DATA_DIR='{data}' is invalid: expected a folder whose warehouse.db is an SQLite database this "
        f"process can write, or SCRAPE_WAREHOUSE_URL set (sqlite:///{data / 'warehouse.db'}: DatabaseError: file is "
        "not a database)")
    assert (data / "warehouse.db").read_text() == "not a database"
    monkeypatch.setenv("SCRAPE_WAREHOUSE_URL", f"sqlite:///{data / 'warehouse.db'}")  # set: named as before
    with pytest.raises(SettingsError, match=r"^SCRAPE_WAREHOUSE_URL='sqlite:///.*' is invalid: expected a reachable"):
        preflight(build_resources({**env, "SCRAPE_WAREHOUSE_URL": f"sqlite:///{data / 'warehouse.db'}"},
                                  secrets_as_env_vars=False))


def test_the_summary_names_dead_letters_of_categories_no_longer_in_the_spec(tmp_path):
    from scrape_assets.warehouse import dead_letters

    url = f"sqlite:///{tmp_path / 'w.db'}"
    wh = Warehouse(url)

    def letters(category, n):
        return [{"category": category, "url": f"http://x/{category}/{i}", "stage": "fetch", "reason": "http_404",
                 "http_status": 404, "attempts": 1, "snapshot_id": "s1", "recorded_at": "t"} for i in range(n)]

    wh.replace_partition(dead_letters, "travel", letters("travel", 2))
    wh.replace_partition(dead_letters, "krimi", letters("krimi", 7))  # a category since removed from the spec
    wh.close()
    assert ("  dead letters    9 (table `dead_letters`); 7 of them of categories no longer in the spec: krimi (7)"
            in _demo_summary(tmp_path, url))


def test_summary_counts_have_thousands_separators_as_the_run_log_does():
    import io

    from scrape_assets.cli import print_summary

    out = io.StringIO()
    print_summary({"site": "books", "categories": 50, "categories_configured": 50, "pages_done": 1031,
                   "pages_failed": 1200, "success_rate": 0.462, "products_loaded": 20620, "dead_letters": 1205,
                   "object_storage": "data/objects", "warehouse": "sqlite:///w.db",
                   "products_of_categories_not_in_spec": {"old": 2400}}, out=out)
    lines = out.getvalue().splitlines()
    assert "  pages           1,031 done, 1,200 failed" in lines
    assert "  products loaded 20,620 (table `products`)" in lines
    assert "  dead letters    1,205 (table `dead_letters`)" in lines
    assert any(line.startswith("  not in spec     2,400 of those rows") and "old (2,400)" in line for line in lines)


def test_categories_lists_the_partition_keys_in_the_order_ranges_follow(monkeypatch, capsys):
    from scrape_assets.cli import main
    from scrape_assets.defs.partitions import build_category_partitions
    from scrape_assets.spec import load_spec

    monkeypatch.setenv("SCRAPE_SITE", "demo")
    assert main(["categories"]) == 0
    keys = capsys.readouterr().out.splitlines()
    assert keys == build_category_partitions(load_spec("demo")).get_partition_keys()
    assert (keys[0], keys[-1], len(keys)) == ("travel", "sequential-art", 12)

    monkeypatch.setenv("SCRAPE_SITE", "no_such_site")
    assert main(["categories"]) == 2
    assert capsys.readouterr().err == ("scrape-assets: error: SCRAPE_SITE='no_such_site' is invalid: expected a shipped "
                                       "spec name (books_toscrape, demo) or a path to a .yaml file\n")


def test_a_demo_killed_outright_leaves_no_run_started_after_the_next_demo(tmp_path):
    """kill -9 (here: SIGKILL at the 5th stored page) leaves the run "started"; the next demo marks it failed."""
    import socket

    env = {k: v for k, v in os.environ.items() if not k.startswith("SCRAPE_") and k != "DAGSTER_HOME"}
    env.update(SCRAPE_DATA_DIR=str(tmp_path / "data"), DAGSTER_HOME=str(tmp_path / "home"))
    cli = Path(sys.executable).with_name("scrape-assets")
    killed = subprocess.run([str(cli), "demo"], env={**env, "SCRAPE_CRASHPOINT": "crawl.after_body_write:5"},
                            capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert killed.returncode == -9, killed.stderr[-3000:]
    with dg.DagsterInstance.from_config(str(tmp_path / "home")) as instance:
        (dead,) = instance.get_runs()
        assert dead.status == dg.DagsterRunStatus.STARTED
        assert dead.tags["scrape/host"] == socket.gethostname() and dead.tags["scrape/pid"].isdigit()
        assert dead.tags["scrape/process"].split(":")[2] == dead.tags["scrape/pid"]
        # As with S3 storage, where raw_pages holds its host's pool slot: the dead run keeps it.
        instance.event_log_storage.set_concurrency_slots("scrape-host-example", 1)
        instance.event_log_storage.claim_concurrency_slot("scrape-host-example", dead.run_id, "raw_pages")
        assert instance.event_log_storage.get_concurrency_info("scrape-host-example").active_run_ids == {dead.run_id}
    again = subprocess.run([str(cli), "demo"], env=env, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert again.returncode == 0, again.stderr[-3000:]
    assert (f"scrape-assets: run {dead.run_id}, left started by a scrape-assets demo that is gone "
            f"(pid {dead.tags['scrape/pid']}), marked failed") in again.stderr
    with dg.DagsterInstance.from_config(str(tmp_path / "home")) as instance:
        statuses = {run.run_id: run.status for run in instance.get_runs()}
        assert statuses.pop(dead.run_id) == dg.DagsterRunStatus.FAILURE
        assert list(statuses.values()) == [dg.DagsterRunStatus.SUCCESS]
        (failure,) = instance.all_logs(dead.run_id, of_type=dg.DagsterEventType.RUN_FAILURE)
        assert "is gone: it was killed" in failure.message
        assert not instance.event_log_storage.get_concurrency_info("scrape-host-example").active_run_ids  # slot given back
    assert "38/38 pages done" in again.stderr  # the killed run's pages resumed, the day completed


def test_fail_run_marks_a_killed_run_failed_and_frees_its_pool_slot(tmp_path, monkeypatch, capsys):
    """Without the UI (CI sharing an instance): a run killed on S3 storage holds its host's
    pool slot while "started"; `scrape-assets fail-run` ends it and frees the slot, and
    refuses a demo run whose process still runs and a run that has not started."""
    from scrape_assets import cli

    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "home"))
    pool, other = "scrape-host-127.0.0.1:8000", "scrape-host-mirror.example"
    with cli._instance() as instance:
        def add(run_id: str, status=dg.DagsterRunStatus.STARTED, **tags) -> None:
            instance.add_run(dg.DagsterRun(job_name="daily_scrape_job", run_id=run_id, tags=tags, status=status))

        add("killed-run")
        add("stuck-canceling", dg.DagsterRunStatus.CANCELING)
        add("queued-run", dg.DagsterRunStatus.NOT_STARTED)  # a queued one needs a code location; the same answer
        add("live-demo-run", **{run_processes.PROCESS_TAG: run_processes.process_identity(), run_processes.PID_TAG: str(os.getpid()),
                                run_processes.PROCESS_RUN_TAG: "live-demo-run"})
        add("1a2b3c4d-5e6f-4a0b-8c1d-2e3f4a5b6c7d")  # as alerts name it: run 1a2b3c4d
        add("feedbeef-0000-4000-8000-000000000001")
        add("feedbeef-0000-4000-8000-000000000002")
        storage = instance.event_log_storage
        for key in (pool, other):
            storage.set_concurrency_slots(key, 1)
            assert storage.claim_concurrency_slot(key, "killed-run", "raw_pages").is_claimed
        assert not storage.claim_concurrency_slot(pool, "next-run", "raw_pages").is_claimed  # it would wait
        storage.free_concurrency_slot_for_step("next-run", "raw_pages")  # the pending claim, not a slot

    assert cli.main(["fail-run", "killed-run"]) == 0
    assert capsys.readouterr().out == (f"scrape-assets: run killed-run was started, now failed; freed its slots in "
                                       f"{pool}, {other}\n")
    assert cli.main(["fail-run", "stuck-canceling"]) == 0
    assert capsys.readouterr().out == "scrape-assets: run stuck-canceling was canceling, now canceled; it held no slot\n"
    with cli._instance() as instance:
        assert instance.get_run_by_id("killed-run").status == dg.DagsterRunStatus.FAILURE
        (failure,) = instance.all_logs("killed-run", of_type=dg.DagsterEventType.RUN_FAILURE)
        assert "ended with `scrape-assets fail-run`" in failure.message
        assert instance.get_run_by_id("stuck-canceling").status == dg.DagsterRunStatus.CANCELED
        assert instance.event_log_storage.claim_concurrency_slot(pool, "next-run", "raw_pages").is_claimed

    assert cli.main(["fail-run", "killed-run"]) == 0  # again: nothing left to do, and it says so
    assert capsys.readouterr().out == "scrape-assets: run killed-run had already ended (failure); it held no slot\n"
    assert cli.main(["fail-run", "live-demo-run"]) == 2
    assert capsys.readouterr().err == (
        f"scrape-assets: error: run live-demo-run is started and its process (pid {os.getpid()}) "
        "is still running: stop that process instead (Ctrl-C), or terminate the run from the UI\n")
    assert cli.main(["fail-run", "queued-run"]) == 2
    assert capsys.readouterr().err == (
        "scrape-assets: error: run queued-run is not_started: it has not started and holds no slot; delete it from the UI "
        "or with `dagster run delete queued-run` if it should not start\n")
    assert cli.main(["fail-run", "killed"]) == 2  # fewer characters than the short id the UI shows
    assert capsys.readouterr().err == (
        f"scrape-assets: error: no run killed on the Dagster instance at {tmp_path / 'home'} (DAGSTER_HOME): expected "
        "a run's id, full or its first 8 characters as the UI's run lists and the alerts show it (`dagster run list` "
        "shows full ids)\n")
    assert cli.main(["fail-run", "1a2b3c4d"]) == 0  # the short id of the alert or the UI's run list
    assert capsys.readouterr().out == ("scrape-assets: run 1a2b3c4d-5e6f-4a0b-8c1d-2e3f4a5b6c7d was started, now failed; "
                                       "it held no slot\n")
    assert cli.main(["fail-run", "feedbeef"]) == 2  # two runs begin so: neither is touched
    assert capsys.readouterr().err == (
        f"scrape-assets: error: 2 runs on the Dagster instance at {tmp_path / 'home'} (DAGSTER_HOME) have ids beginning "
        "feedbeef: feedbeef-0000-4000-8000-000000000001, feedbeef-0000-4000-8000-000000000002; give more of the id\n")
    with cli._instance() as instance:
        statuses = {run_id: instance.get_run_by_id(run_id).status
                    for run_id in ("live-demo-run", "queued-run", "feedbeef-0000-4000-8000-000000000001",
                                   "1a2b3c4d-5e6f-4a0b-8c1d-2e3f4a5b6c7d")}
        assert statuses == {"live-demo-run": dg.DagsterRunStatus.STARTED, "queued-run": dg.DagsterRunStatus.NOT_STARTED,
                            "feedbeef-0000-4000-8000-000000000001": dg.DagsterRunStatus.STARTED,
                            "1a2b3c4d-5e6f-4a0b-8c1d-2e3f4a5b6c7d": dg.DagsterRunStatus.FAILURE}


def test_a_demo_run_is_marked_failed_only_if_its_process_is_gone():
    """Exactly: the same boot, pid namespace, number and start time is the same process."""
    from scrape_assets import cli

    mine = run_processes.process_identity()
    boot, namespace, pid, ticks = mine.split(":")
    assert pid == str(os.getpid())
    assert run_processes.process_gone(mine) is False  # this process runs
    assert run_processes.process_gone(f"{boot}:{namespace}:{pid}:{int(ticks) + 1}") is True  # its number, reused
    assert run_processes.process_gone(f"{boot}:{namespace}:{2**22 + 12345}:{ticks}") is True  # above pid_max: gone
    # Another boot (another machine, or this one before a restart), another pid namespace
    # (a container sharing the instance), no identity: not to be told from here.
    for other in (f"another-boot:{namespace}:{pid}:{ticks}", f"{boot}:1:{2**22 + 12345}:{ticks}", "", "garbage"):
        assert run_processes.process_gone(other) is None


def test_make_demo_uses_an_exported_dagster_home(tmp_path):
    """`DAGSTER_HOME=... make demo` records the run there, as Dagster's own commands would (not in the clone's)."""
    home = tmp_path / "home"
    # Not the make that runs this suite's variables (`make test DAGSTER_HOME=...` passes them down).
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MAKELEVEL", "MAKEOVERRIDES", "MFLAGS")}
    env["DAGSTER_HOME"] = str(home)
    planned = subprocess.run(["make", "-n", "demo"], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert planned.returncode == 0, planned.stderr
    assert f"cp dagster.yaml {home}/dagster.yaml" in planned.stdout.splitlines()
    # Exported but empty, as Dagster reads it: unset (the clone's), not the root folder.
    env["DAGSTER_HOME"] = ""
    planned = subprocess.run(["make", "-n", "demo"], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert "cp dagster.yaml /dagster.yaml" not in planned.stdout and "mkdir -p \n" not in planned.stdout + "\n"


def test_the_summary_points_at_the_port_make_ui_uses():
    from scrape_assets.cli import ui_command, ui_url

    assert ui_url({}) == "http://127.0.0.1:3000"
    assert ui_url({"UI_PORT": "3001"}) == "http://127.0.0.1:3001"  # exported: `make ui` takes it as well
    assert ui_url({"UI_PORT": "oops"}) == ui_url({"UI_PORT": "３００１"}) == "http://127.0.0.1:3000"  # `make ui` refuses both
    assert ui_command({"UI_PORT": "3001"}).endswith("make ui UI_PORT=3001")  # `make demo UI_PORT=3001`: not exported
    assert "UI_PORT" not in ui_command({"UI_PORT": "3000"}) + ui_command({})


def test_the_ui_line_names_the_storage_and_warehouse_variables_it_leaves_out(tmp_path, monkeypatch):
    """Their values may hold credentials: the line names them, so the UI is not started on ./data by mistake."""
    import io

    from scrape_assets.cli import print_summary, summarize, ui_exports
    from scrape_assets.defs.resources import build_resources

    assert ui_exports({}) == ui_exports({"SCRAPE_STORAGE_URL": " ", "SCRAPE_WAREHOUSE_URL": ""}) == []
    assert ui_exports({"SCRAPE_WAREHOUSE_URL": "postgresql://u:pw@db/w"}) == ["SCRAPE_WAREHOUSE_URL"]
    monkeypatch.chdir(tmp_path)
    for name in ("SCRAPE_SITE", "SCRAPE_BASE_URL", "UI_PORT", "DAGSTER_HOME"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("SCRAPE_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("SCRAPE_STORAGE_URL", str(tmp_path / "store"))
    monkeypatch.setenv("SCRAPE_WAREHOUSE_URL", f"sqlite:///{tmp_path / 'w.db'}")
    out = io.StringIO()
    print_summary(summarize(build_resources(secrets_as_env_vars=False)), out=out)
    assert out.getvalue().splitlines()[-1] == (
        f"  Dagster UI      SCRAPE_DATA_DIR={tmp_path / 'data'} make ui  (then open http://127.0.0.1:3000); "
        "with SCRAPE_STORAGE_URL and SCRAPE_WAREHOUSE_URL exported as for the pipeline's runs")


def test_with_a_daemon_running_on_the_instance_the_ui_line_does_not_suggest_make_ui(tmp_path, monkeypatch):
    """`make ui` (dagster dev) starts a daemon of its own: beside a dagster-daemon service (or
    an open `make ui`) it would be a second one. A real daemon's heartbeats are what is read."""
    import io
    import shutil
    import signal
    import time

    from scrape_assets.cli import DAEMON_SEEN_S, daemon_heartbeat_age, print_summary, summarize
    from scrape_assets.defs.resources import build_resources

    home = tmp_path / "home"
    home.mkdir()
    shutil.copyfile(REPO_ROOT / "dagster.yaml", home / "dagster.yaml")
    monkeypatch.chdir(tmp_path)
    for name in ("SCRAPE_SITE", "SCRAPE_BASE_URL", "UI_PORT", "SCRAPE_STORAGE_URL", "SCRAPE_WAREHOUSE_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("SCRAPE_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    assert daemon_heartbeat_age(os.environ) is None  # an instance no daemon ever ran on...
    assert os.listdir(home) == ["dagster.yaml"]  # ...and reading it made no storage there

    daemon = subprocess.Popen([str(Path(sys.executable).with_name("dagster-daemon")), "run", "-w", "workspace.yaml"],
                              cwd=REPO_ROOT, env=dict(os.environ), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while (age := daemon_heartbeat_age(os.environ)) is None and daemon.poll() is None and time.monotonic() < deadline:
            time.sleep(0.5)
        assert age is not None and 0 <= age <= DAEMON_SEEN_S, f"no heartbeat (daemon exit code {daemon.poll()})"
        out = io.StringIO()
        print_summary(summarize(build_resources(secrets_as_env_vars=False)), out=out)
        line = out.getvalue().splitlines()[-1]
        assert line.startswith("  Dagster UI      not `make ui`: a Dagster daemon beat on this instance ")
        # and `make ui` asks first (scrape-assets daemon-check), refusing to start a second daemon
        cli = Path(sys.executable).with_name("scrape-assets")
        done = subprocess.run([str(cli), "daemon-check"], capture_output=True, text=True, timeout=120,
                              env={**os.environ, "UI_PORT": "18391"})
        assert done.returncode == 1 and f"scrape-assets: a Dagster daemon beat on the instance at {home} " in done.stderr
        # its commands name the instance and the port: pasted into another shell, they serve this one
        assert (f"`SCRAPE_DATA_DIR={tmp_path / 'data'} DAGSTER_HOME={home} .venv/bin/dagster-webserver -w "
                "workspace.yaml -p 18391`") in done.stderr  # the runs' data folder, not the clone's
        assert f"`SCRAPE_DATA_DIR={tmp_path / 'data'} make ui UI_FORCE=1 UI_PORT=18391 DAGSTER_HOME={home}`" in done.stderr
        assert line.endswith(" s ago (a dagster-daemon service, or `make ui` already open) and `make ui` would start a "
                             "second one; open the UI already serving the instance, or serve one without a daemon: "
                             "`.venv/bin/dagster-webserver -w workspace.yaml` in the clone, in the runs' environment "
                             "(README: A production setup)")
    finally:
        os.killpg(daemon.pid, signal.SIGTERM)
        daemon.wait(timeout=60)
    # A daemon stopped for longer than DAEMON_SEEN_S (40 s): `make ui` is the way to the UI
    # again, and the summary says so at the same moment make ui's own check lets it start.
    assert DAEMON_SEEN_S == 40
    assert daemon_heartbeat_age(os.environ, now=time.time() + DAEMON_SEEN_S + 1) is None
    out = io.StringIO()
    real_time = time.time
    monkeypatch.setattr(time, "time", lambda: real_time() + DAEMON_SEEN_S + 1)
    print_summary(summarize(build_resources(secrets_as_env_vars=False)), out=out)
    monkeypatch.setattr(time, "time", real_time)
    assert "not `make ui`" not in out.getvalue() and "make ui" in out.getvalue().splitlines()[-1]
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "nowhere"))  # no instance: nothing read, nothing made
    assert daemon_heartbeat_age(os.environ) is None and not (tmp_path / "nowhere").exists()

    # Storage elsewhere (a PostgreSQL server that accepts and never answers, say): not asked at all.
    import socket
    import threading

    import pytest

    with socket.create_server(("127.0.0.1", 0)) as silent:
        silent.listen()
        (home / "dagster.yaml").write_text(
            (REPO_ROOT / "dagster.yaml").read_text() + "storage:\n  postgres:\n    postgres_db:\n      hostname: "
            f"127.0.0.1\n      port: {silent.getsockname()[1]}\n      username: u\n      password: p\n      db_name: d\n")
        monkeypatch.setenv("DAGSTER_HOME", str(home))
        ages = []
        asking = threading.Thread(target=lambda: ages.append(daemon_heartbeat_age(os.environ)), daemon=True)
        asking.start()
        asking.join(timeout=60)
        assert ages == [None]
        silent.settimeout(0)
        with pytest.raises(BlockingIOError):
            silent.accept()  # no connection was made to it


def test_make_ui_checks_for_a_daemon_first_unless_told_not_to():
    def planned(*extra: str) -> list[str]:
        done = subprocess.run(["make", "-n", "ui", *extra], cwd=REPO_ROOT, capture_output=True, text=True, timeout=60,
                              env={**{k: v for k, v in os.environ.items() if k not in ("UI_PORT", "UI_FORCE")},
                                   "MAKEFLAGS": ""})
        assert done.returncode == 0, done.stderr
        return [line for line in done.stdout.splitlines() if "-check" in line or "dagster dev" in line]

    # The daemon first: a port taken by a `make ui` already open on the instance gets its advice
    # (open that UI), not "try UI_PORT=3001" which the daemon check would then refuse.
    assert planned() == [".venv/bin/scrape-assets daemon-check", ".venv/bin/scrape-assets port-check 3000",
                         ".venv/bin/dagster dev -w workspace.yaml -p 3000"]
    assert planned("UI_FORCE=1") == [".venv/bin/scrape-assets port-check 3000",
                                     ".venv/bin/dagster dev -w workspace.yaml -p 3000"]
    assert planned("UI_FORCE=0")[0] == ".venv/bin/scrape-assets daemon-check"
    assert planned("UI_PORT=3001")[1] == ".venv/bin/scrape-assets port-check 3001"


def test_port_check_refuses_a_port_another_program_listens_on(capsys, monkeypatch):
    """`dagster dev` on a taken port said it served there, then failed to bind, leaving its
    daemon running (the next `make ui` refused for 40 s): make ui now asks first."""
    import socket

    from scrape_assets.cli import main

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        assert main(["port-check", str(port)]) == 1
        assert capsys.readouterr().err == (
            f"scrape-assets: cannot serve the UI on 127.0.0.1:{port}: Address already in use (another program, or "
            f"another `make ui`, listens there): `make ui UI_PORT={port + 1}` serves it on another port\n")
    assert main(["port-check", str(port)]) == 0  # free again
    # Another refusal is not "someone listens there": a port below 1024 without the privilege.
    import errno

    from scrape_assets import cli

    class Refused(socket.socket):
        def bind(self, address):
            raise PermissionError(errno.EACCES, "Permission denied")

    monkeypatch.setattr(socket, "socket", Refused)
    assert cli.run_port_check(80) == 1
    assert capsys.readouterr().err == ("scrape-assets: cannot serve the UI on 127.0.0.1:80: Permission denied (a port "
                                       "below 1024 needs privileges): `make ui UI_PORT=3000` serves it on another port\n")


def test_make_refuses_a_python_older_than_3_11_before_making_the_venv(tmp_path):
    """pandas 3 needs 3.11: the refusal names the interpreter and its version, and leaves no .venv behind."""
    import shutil

    for name in ("Makefile", "pyproject.toml", "dagster.yaml"):
        shutil.copy(REPO_ROOT / name, tmp_path / name)
    old = tmp_path / "python3.10"  # answers like Python 3.10 would: a version, and "too old" to the check
    old.write_text('#!/bin/sh\n[ "$1" = --version ] && { echo "Python 3.10.13"; exit 0; }\nexit 1\n')
    old.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MAKELEVEL", "MAKEOVERRIDES", "MFLAGS")}
    for goal, python, version in (("demo", str(old), "Python 3.10.13"), ("test", "no-such-python", "not found")):
        done = subprocess.run(["make", goal, f"PYTHON={python}"], cwd=tmp_path, env=env, capture_output=True,
                              text=True, timeout=60)
        assert done.returncode != 0
        assert (f"make: {python} is not Python 3.11 or newer ({version}): give one, e.g. make {goal} "
                "PYTHON=python3.12") in done.stderr
        assert not (tmp_path / ".venv").exists()


def test_make_demo_installs_the_project_without_the_test_extra():
    """A demo user gets the pipeline's dependencies, not moto, pgserver's PostgreSQL and pytest."""
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MAKELEVEL", "MAKEOVERRIDES", "MFLAGS")}
    plans = {target: subprocess.run(["make", "-n", "-B", target], cwd=REPO_ROOT, env=env, capture_output=True,
                                    text=True, timeout=60).stdout.splitlines() for target in ("demo", "ui", "test")}
    assert ".venv/bin/pip install --quiet -e ." in plans["demo"] and ".venv/bin/pip install --quiet -e ." in plans["ui"]
    assert not any("[test]" in line for line in plans["demo"] + plans["ui"])
    assert '.venv/bin/pip install --quiet -e ".[test]"' in plans["test"]


def test_make_ui_takes_another_port_when_3000_is_taken():
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MAKELEVEL", "MAKEOVERRIDES", "MFLAGS")}
    for extra, port in (([], "3000"), (["UI_PORT=3001"], "3001"), (["UI_PORT="], "3000")):
        planned = subprocess.run(["make", "-n", "ui", *extra], cwd=REPO_ROOT, env=env, capture_output=True, text=True,
                                 timeout=60)
        assert planned.returncode == 0, planned.stderr
        assert planned.stdout.splitlines()[-1].endswith(f"/dagster dev -w workspace.yaml -p {port}")
    for bad in ("oops", "30 01", "3001x", "３００１"):  # refused before anything runs, naming the value
        planned = subprocess.run(["make", "-n", "ui", f"UI_PORT={bad}"], cwd=REPO_ROOT, env=env, capture_output=True,
                                 text=True, timeout=60)
        assert planned.returncode == 2
        assert f"UI_PORT={bad} is not a port number" in planned.stderr and "dagster dev" not in planned.stdout
    assert subprocess.run(["make", "-n", "demo", "UI_PORT=oops"], cwd=REPO_ROOT, env=env, capture_output=True,
                          timeout=60).returncode == 0  # only `make ui` serves on it


def test_make_serve_demo_takes_another_port_when_8000_is_taken():
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MAKELEVEL", "MAKEOVERRIDES", "MFLAGS", "DEMO_PORT")}
    for extra, port in (([], "8000"), (["DEMO_PORT=8001"], "8001"), (["DEMO_PORT="], "8000")):
        planned = subprocess.run(["make", "-n", "serve-demo", *extra], cwd=REPO_ROOT, env=env, capture_output=True,
                                 text=True, timeout=60)
        assert planned.returncode == 0, planned.stderr
        assert planned.stdout.splitlines()[-1].endswith(f"/scrape-assets serve-demo --port {port}")
    for bad in ("oops", "80 01", '8001"; echo RAN; echo "', "$$(echo 8001)"):  # refused before anything runs
        planned = subprocess.run(["make", "-n", "serve-demo", f"DEMO_PORT={bad}"], cwd=REPO_ROOT, env=env,
                                 capture_output=True, text=True, timeout=60)
        assert planned.returncode == 2 and "is not a port number" in planned.stderr and "DEMO_PORT=" in planned.stderr
        assert "serve-demo --port" not in planned.stdout


def test_categories_piped_into_head_ends_quietly(tmp_path):
    """`scrape-assets categories | head -1`: no BrokenPipeError traceback once the reader is gone."""
    spec = yaml.safe_load((REPO_ROOT / "scrape_assets" / "sites" / "demo.yaml").read_text())
    # More than a pipe's buffer (64 KB) of keys, so the writer is still writing when the reader leaves.
    spec["categories"] = {f"category-{i:05d}": f"catalogue/category/books/c_{i}/index.html" for i in range(8000)}
    path = tmp_path / "many.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    # Buffered, as in a shell (unbuffered, a write cut short by the reader leaving is dropped
    # by Python's text layer, unseen: the list is one write, so then it exits 0).
    env = {**{k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}, "SCRAPE_SITE": str(path)}
    proc = subprocess.Popen([sys.executable, "-m", "scrape_assets.cli", "categories"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=tmp_path)
    assert proc.stdout.readline() == b"category-00000\n"
    proc.stdout.close()  # what `head -1` does after its line
    stderr = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 1
    assert stderr == ""


def test_the_first_category_piped_into_head_exits_0_even_unbuffered(tmp_path):
    """The Runbook's `FIRST=$(scrape-assets categories | head -1)` under `set -o pipefail`, with
    PYTHONUNBUFFERED=1 (containers set it): a write per key failed once head had gone (exit 1,
    8 runs in 10 for the 52 books_toscrape categories)."""
    cli = Path(sys.executable).with_name("scrape-assets")
    env = {**os.environ, "SCRAPE_SITE": "books_toscrape", "PYTHONUNBUFFERED": "1"}
    for _ in range(10):
        done = subprocess.run(["bash", "-o", "pipefail", "-c", f"{cli} categories | head -1"], env=env,
                              capture_output=True, text=True, timeout=60, cwd=tmp_path)
        assert (done.returncode, done.stdout, done.stderr) == (0, "all\n", "")


def test_a_run_that_reached_nothing_says_so_in_its_summary():
    import io

    from scrape_assets.cli import print_summary

    summary = {"site": "books_toscrape", "categories": 0, "categories_configured": 50, "pages_done": 0,
               "pages_failed": 52, "success_rate": 0.0, "products_loaded": 0, "dead_letters": 52,
               "object_storage": "data/objects", "warehouse": "sqlite:///w.db"}
    run = {"success": True, "requests_made": 0, "pages_done": 0, "pages_not_modified": 0, "pages_failed": 52, "pages_parsed": 0,
           "partitions_unchanged": 0, "rows_loaded": 0, "rows_carried_forward": 0, "dead_letters": 52}
    hint = "  nothing fetched: every page failed before a request was made"
    out = io.StringIO()
    print_summary(summary, run, out=out)
    lines = out.getvalue().splitlines()
    assert lines[2] == "  requests        0 (0 not modified: 304), 52 pages failed for good"
    assert lines[3].startswith(hint) and "`dead_letters`" in lines[3]
    # Some requests; nothing to fetch; a snapshot resumed or adopted whose pages were done earlier.
    for reached in ({**run, "requests_made": 3}, {**run, "pages_failed": 0}, {**run, "pages_done": 10}):
        out = io.StringIO()
        print_summary(summary, reached, out=out)
        assert hint not in out.getvalue()


def test_s3_settings_the_client_refuses_before_any_request_are_one_line_each(tmp_path):
    """A malformed endpoint or an S3 URL without a bucket: no traceback, the setting to fix named."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SCRAPE_", "AWS_")) and k != "DAGSTER_HOME"}
    env.update(AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing", AWS_DEFAULT_REGION="us-east-1")
    cli = Path(sys.executable).with_name("scrape-assets")
    cases = {
        "endpoint without a scheme": (
            {"AWS_ENDPOINT_URL": "127.0.0.1:5123", "SCRAPE_STORAGE_URL": "s3://bucket/objects"},
            "scrape-assets: error: cannot use object storage at s3://bucket/objects: bucket check failed: Invalid "
            "endpoint: 127.0.0.1:5123 (set AWS_ENDPOINT_URL (or the profile's endpoint_url) to an http(s)://host[:port] URL)",
        ),
        "one slash: no bucket": (
            {"SCRAPE_STORAGE_URL": "s3:/bucket"},
            "scrape-assets: error: SCRAPE_STORAGE_URL='s3:/bucket' is invalid: expected object storage this process can "
            "read (cannot open object storage: non key-like path provided (bucket/container missing): expected "
            "s3://bucket[/prefix])",
        ),
    }
    for name, (extra, expected) in cases.items():
        done = subprocess.run([str(cli), "summary"], env={**env, **extra}, capture_output=True, text=True, timeout=120,
                              cwd=tmp_path)
        assert done.returncode == 2, (name, done.stderr[-2000:])
        assert done.stderr == expected + "\n", name
    assert not (tmp_path / "data").exists()


def test_the_demo_says_up_front_which_run_holds_the_host_pool_it_will_wait_for(instance):
    """On S3 a SIGKILLed run keeps the host pool's slot; Dagster's executor then waits silently."""
    from scrape_assets.cli import pool_holders_notice

    pool = "scrape-host-127.0.0.1:8000"
    assert pool_holders_notice(instance, None) is None  # local storage: the host flock, no pool
    instance.event_log_storage.set_concurrency_slots(pool, 1)
    assert pool_holders_notice(instance, pool) is None  # a free slot: nothing to say
    instance.event_log_storage.claim_concurrency_slot(pool, "0f0f0f0f-dead-run", "raw_pages")
    assert pool_holders_notice(instance, pool) == (
        "scrape-assets: raw_pages will wait for the pool scrape-host-127.0.0.1:8000 (one fetching step per host), held "
        "by run 0f0f0f0f-dead-run (not a run of this instance): if that run was killed, free its slot from its page in "
        "the UI (`make ui`, \"Free concurrency slots\") or with `scrape-assets fail-run RUN_ID`; until then this process "
        "waits, using a core (Ctrl-C does not stop it: kill it)")
    instance.event_log_storage.free_concurrency_slots_for_run("0f0f0f0f-dead-run")
    assert pool_holders_notice(instance, pool) is None


def test_the_held_back_load_line_says_its_figures_leave_out_a_failed_range():
    from scrape_assets.cli import held_back_load_line

    assert held_back_load_line(1, ["travel"], 11, 0, any_failed=False) == (
        "  loaded the 1 category that passed it, held back with them: travel: 11 rows (re)loaded")
    assert held_back_load_line(5, ["travel...romance (FAILED: run 0f0f)", "default...poetry"], 300, 2,
                               any_failed=True) == (
        "  loaded the 5 categories that passed it, held back with them: travel...romance (FAILED: run 0f0f), "
        "default...poetry: 300 rows (re)loaded by the runs that succeeded, 2 earlier rows kept for pages that failed "
        "or cards rejected")


def test_the_held_back_load_line_counts_the_rows_it_loaded_and_kept(tmp_path):
    """After a run held back by a failed schema check, the follow-up load's line says how
    many rows it loaded and how many earlier rows it kept (a page that failed), so the
    table can be reconciled with the output."""
    from scrape_assets.faults import FaultSpec, make_fault_server
    from scrape_assets_tests.conftest import serving

    def demo(rules: list[dict]) -> subprocess.CompletedProcess:
        spec = FaultSpec.model_validate({"rules": rules})
        with serving(make_fault_server(spec, "127.0.0.1", 0)) as server:
            env = {k: v for k, v in os.environ.items() if not k.startswith("SCRAPE_") and k != "DAGSTER_HOME"}
            env.update(SCRAPE_DATA_DIR=str(tmp_path / "data"), SCRAPE_BASE_URL=server.base_url,
                       DAGSTER_HOME=str(tmp_path / "home"))
            cli = Path(sys.executable).with_name("scrape-assets")
            return subprocess.run([str(cli), "demo"], env=env, capture_output=True, text=True, timeout=300,
                                  cwd=tmp_path)

    assert demo([]).returncode == 0
    done = demo([{"match": "fiction_10/", "fault": "layout_changed"},
                 {"match": r"mystery_3/page-2\.html$", "fault": "http_error", "status": 404}])
    assert done.returncode == 1, done.stderr[-3000:]
    wh = Warehouse(f"sqlite:///{tmp_path / 'data' / 'warehouse.db'}")
    mystery = wh.rows(products, "mystery")
    latest = max(r["snapshot_id"] for r in mystery)
    seen, kept = (sum(r["snapshot_id"] == latest for r in mystery), sum(r["snapshot_id"] != latest for r in mystery))
    assert seen and kept  # page 1 loaded again, page 2's rows kept from the first day
    (line,) = [line for line in done.stdout.splitlines() if line.startswith("  loaded the 11 categories")]
    assert line.endswith(f": {seen} rows (re)loaded, {kept} earlier rows kept for pages that failed or cards rejected")


def test_demo_loads_the_categories_that_passed_when_one_fails_the_schema_check(tmp_path):
    """One run holds back every category's load when one fails its blocking check; the command
    then loads those that passed (as held_back_load_sensor does for the daemon's runs) and says
    which one failed."""
    from scrape_assets.faults import FaultSpec, make_fault_server
    from scrape_assets_tests.conftest import serving

    spec = FaultSpec.model_validate({"rules": [{"match": "fiction_10/", "fault": "layout_changed"}]})
    with serving(make_fault_server(spec, "127.0.0.1", 0)) as server:
        env = {k: v for k, v in os.environ.items() if not k.startswith("SCRAPE_") and k != "DAGSTER_HOME"}
        env.update(SCRAPE_DATA_DIR=str(tmp_path / "data"), SCRAPE_BASE_URL=server.base_url,
                   DAGSTER_HOME=str(tmp_path / "home"))
        cli = Path(sys.executable).with_name("scrape-assets")
        done = subprocess.run([str(cli), "demo"], env=env, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert done.returncode == 1, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert ("Schema check failed for fiction: its rows are not loaded (the error above says why, per category; the "
            "table keeps its earlier rows)") in lines
    # ... and it does: which checks, on which pages, and what stopped parsing (not only counts)
    why = next(line for line in (done.stdout + done.stderr).splitlines() if line.startswith("  fiction: reject reasons: "))
    assert "pages: layout_guard x" in why and "the layout may have changed" in why and "pages 1, 2, 3, ..." in why
    assert "reject reasons: \"price: no element matches 'p.price_color'\" x" in why
    assert ("  loaded the 11 categories that passed it, held back with them: travel...romance, "
            "default...sequential-art: 613 rows (re)loaded") in lines
    assert ("  loaded          products_table held back: a schema check failed (the categories that passed are "
            "loaded below)") in lines
    rows = Warehouse(f"sqlite:///{tmp_path / 'data' / 'warehouse.db'}").rows_by_category(products)
    assert "fiction" not in rows and sum(rows.values()) == 678 - 65 and len(rows) == 11
    # The failing category's dead letters were held back too: recorded after, one per rejected card.
    assert "  recorded the dead letters of the 1 category that failed it (table `dead_letters`): fiction" in lines
    letters = Warehouse(f"sqlite:///{tmp_path / 'data' / 'warehouse.db'}").rows(dead_letters)
    assert {(r["category"], r["stage"], r["reason"]) for r in letters} == {
        ("fiction", "parse", "price: no element matches 'p.price_color'")} and len(letters) == 65
    assert "  dead letters    65 (table `dead_letters`)" in lines
    # Every run of the demo, the follow-up loads too, carries its own process tag: killed, each
    # could be told dead (fail_dead_runs); untagged, a killed follow-up stayed "started" for good.
    from scrape_assets.run_processes import PROCESS_RUN_TAG, process_gone, run_process

    with dg.instance_for_test(temp_dir=env["DAGSTER_HOME"]) as instance:
        runs = instance.get_runs()
        assert len(runs) == 4  # the demo's run, its two loads (two ranges) and its dead letters
        assert all(r.tags[PROCESS_RUN_TAG] == r.run_id and process_gone(run_process(r)) for r in runs)
    # ... and the summary (of this run, and `scrape-assets summary` on later days) says which one is failing
    assert [line for line in lines if line.startswith("  schema failed ")] == [
        "  schema failed   1 whose latest parse failed the schema check, `products` holding their earlier rows, "
        "if any: "
        f"fiction (parsed from snapshot {_latest_snapshot(tmp_path / 'data' / 'objects', 'fiction')}) (why: the "
        "parsed_products_match_schema check in the UI)"]
    assert not [line for line in lines if line.startswith("  not loaded yet")]  # the follow-ups loaded the others


def _latest_snapshot(objects: Path, category: str) -> str:
    from scrape_assets.manifest import latest_manifest
    from scrape_assets.storage import ObjectStore

    return latest_manifest(ObjectStore(str(objects)), "demo", category, complete=True).snapshot_id


def test_a_relative_dagster_home_is_taken_from_the_current_folder(tmp_path, monkeypatch):
    """Dagster itself refuses a relative DAGSTER_HOME with a traceback; the command resolves it."""
    from scrape_assets.cli import _instance

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("DAGSTER_HOME", "home")
    with _instance() as instance:
        assert instance.root_directory == str(tmp_path / "home")
    assert os.environ["DAGSTER_HOME"] == str(tmp_path / "home") and (tmp_path / "home" / "dagster.yaml").is_file()


def test_min_success_rate_makes_a_site_that_is_down_fail_the_command(tmp_path):
    """A run whose pages all failed succeeds (failures are data): CI that wants a red build
    for it gives --min-success-rate to demo or summary, which then exit 1 saying why."""
    import socket

    with socket.socket() as probe:  # a port nothing listens on: the site is down
        probe.bind(("127.0.0.1", 0))
        down = f"http://127.0.0.1:{probe.getsockname()[1]}/"
    env = {k: v for k, v in os.environ.items() if not k.startswith("SCRAPE_")}
    env.update(DAGSTER_HOME=str(tmp_path / "home"), SCRAPE_DATA_DIR=str(tmp_path / "data"), SCRAPE_MAX_ATTEMPTS="1")
    cli = [str(Path(sys.executable).with_name("scrape-assets"))]

    def run(*args, **more):
        return subprocess.run(cli + list(args), env={**env, **more}, capture_output=True, text=True, timeout=300,
                              cwd=tmp_path)

    outage = run("demo", "--min-success-rate", "90", SCRAPE_BASE_URL=down)
    assert outage.returncode == 1, outage.stderr[-3000:]
    assert "  success rate    0.0%" in outage.stdout
    assert outage.stderr.rstrip().splitlines()[-1] == (
        "scrape-assets: success rate 0.0% (0 pages done, 12 failed in the latest complete snapshots) is below "
        "--min-success-rate 90.0%; the failed pages' reasons are in `dead_letters`")
    assert run("summary").returncode == 0  # without the option: the summary's old contract
    summary = run("summary", "--min-success-rate", "90%")
    assert summary.returncode == 1 and "is below --min-success-rate 90.0%" in summary.stderr
    assert "  success rate    0.0%" in summary.stdout  # printed all the same
    healthy = run("demo", "--min-success-rate", "100")  # the in-process demo site: every page done
    assert healthy.returncode == 0, healthy.stderr[-3000:]
    assert run("summary", "--min-success-rate", "100").returncode == 0
    bad = run("summary", "--min-success-rate", "150")
    assert bad.returncode == 2 and "expected a percentage from 0 to 100, e.g. 90 or 99.5%, got '150'" in bad.stderr


def test_min_success_rate_of_a_storage_without_snapshots_is_not_met():
    from scrape_assets.cli import below_success_rate

    empty = {"site": "demo", "object_storage": "/d/objects", "pages_done": 0, "pages_failed": 0, "success_rate": 1.0}
    assert below_success_rate(empty, None) is None
    assert below_success_rate(empty, 0.0).startswith("no complete snapshot of demo in /d/objects yet")
    some = {**empty, "pages_done": 9, "pages_failed": 1, "success_rate": 0.9}
    assert below_success_rate(some, 0.9) is None
    assert below_success_rate(some, 0.95).startswith("success rate 90.0% (9 pages done, 1 failed")


def test_bad_settings_stop_dagster_asset_materialize_before_it_creates_a_run(tmp_path):
    """A mistyped warehouse URL, or a data folder under a file, is found when the definitions
    load: the command ends with the line naming the variable, and the instance has no run."""
    import dagster as dg

    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    dagster = str(Path(sys.executable).with_name("dagster"))
    cases = {
        "SCRAPE_WAREHOUSE_URL": ("nosuchdb://u:secret-token@x/y",
                                 "SCRAPE_WAREHOUSE_URL='nosuchdb://x/y' is invalid: expected a SQLAlchemy URL"),
        "SCRAPE_DATA_DIR": (str(blocker / "data"), f"SCRAPE_DATA_DIR='{blocker / 'data'}' is invalid: expected a "
                                                   f"folder this process can write ({blocker} is a file, not a folder)"),
    }
    for name, (value, expected) in cases.items():
        home = tmp_path / f"home-{name}"
        home.mkdir()
        env = {k: v for k, v in os.environ.items() if not k.startswith("SCRAPE_")}
        env.update({"DAGSTER_HOME": str(home), "SCRAPE_DATA_DIR": str(tmp_path / "data"), name: value})
        done = subprocess.run([dagster, "asset", "materialize", "-m", "scrape_assets.definitions", "--select",
                               "raw_pages", "--partition", "travel"], env=env, capture_output=True, text=True,
                              timeout=300, cwd=tmp_path)
        assert done.returncode != 0, name
        assert expected in done.stderr, (name, done.stderr[-2000:])
        assert "secret-token" not in done.stderr + done.stdout, name
        with dg.DagsterInstance.from_config(str(home)) as instance:
            assert instance.get_runs() == [], name  # stopped before a run was created


def test_this_runs_figures_take_the_304s_not_the_unchanged_pages():
    """cli.py run_figures: 'This run' counts pages answered 304 (pages_not_modified), which
    differs from pages whose body came back unchanged (pages_unchanged)."""
    import types

    from scrape_assets.cli import run_figures

    raw = {"requests_made": 40, "pages_done": 38, "pages_failed": 0, "pages_not_modified": 5,
           "pages_unchanged": 30, "pages_assumed_unchanged": 0}
    event = types.SimpleNamespace(materialization=dg.AssetMaterialization(
        "raw_pages", partition="travel", metadata=raw))
    result = types.SimpleNamespace(success=True, get_asset_materialization_events=lambda: [event],
                                   get_asset_check_evaluations=lambda: [])
    figures = run_figures(result)
    assert (figures["requests_made"], figures["pages_not_modified"], figures["pages_done"]) == (40, 5, 38)


def test_a_summary_of_nothing_crawled_does_not_name_every_category_as_without_a_snapshot():
    """Before the first crawl the success rate line says where it looked; the categories line
    names the categories without a snapshot only once some have one."""
    import io

    from scrape_assets.cli import print_summary

    keys = ["travel", "mystery", "classics"]
    summary = {"site": "demo", "categories": 0, "categories_configured": 3, "categories_without_snapshot": keys,
               "pages_done": 0, "pages_failed": 0, "success_rate": 1.0, "products_loaded": 0, "dead_letters": 0,
               "object_storage": "/d/objects", "warehouse": "sqlite:////d/warehouse.db", "warehouse_site": None}
    out = io.StringIO()
    print_summary(summary, out=out)
    assert out.getvalue().splitlines()[1] == "  categories      0/3"
    out = io.StringIO()
    print_summary({**summary, "categories": 1, "categories_without_snapshot": keys[1:], "pages_done": 1}, out=out)
    assert out.getvalue().splitlines()[1] == "  categories      1/3 (2 without a complete snapshot yet: mystery, classics)"


def test_a_daemon_that_beat_this_very_second_still_counts_as_running():
    """An age of 0 s (its beat newer than this clock: clamped) is a daemon running, not none."""
    import io

    from scrape_assets.cli import print_summary

    summary = {"site": "demo", "categories": 0, "categories_configured": 12, "pages_done": 0, "pages_failed": 0,
               "success_rate": 1.0, "products_loaded": 0, "dead_letters": 0, "object_storage": "/d/objects",
               "warehouse": "sqlite:////d/warehouse.db", "warehouse_site": None, "daemon_heartbeat_age_s": 0.0}
    run = {"success": False, "requests_made": 1, "pages_not_modified": 0, "pages_failed": 1, "pages_parsed": None,
           "partitions_unchanged": None, "rows_loaded": None, "rows_carried_forward": None}
    out = io.StringIO()
    print_summary(summary, run, out=out)
    lines = out.getvalue().splitlines()
    assert lines[1] == "This run (FAILED: see the log above or the Dagster UI serving this instance)"
    assert lines[-1].startswith("  Dagster UI      not `make ui`: a Dagster daemon beat on this instance 0 s ago ")


def test_the_daemon_window_takes_the_newest_beat_and_includes_its_40th_second(tmp_path):
    """Read from a real instance's runs.db: each daemon loop beats on its own, the newest beat
    counts; exactly DAEMON_SEEN_S old still counts; a clock behind the beat gives 0 s, not a
    negative age; a run_storage block (another database) is not read."""
    import shutil

    from dagster._daemon.types import DaemonHeartbeat

    from scrape_assets.cli import DAEMON_SEEN_S, daemon_heartbeat_age

    home = tmp_path / "home"
    home.mkdir()
    shutil.copyfile(REPO_ROOT / "dagster.yaml", home / "dagster.yaml")
    beat = 1_800_000_000.0
    with dg.DagsterInstance.from_config(str(home)) as instance:
        instance.add_daemon_heartbeat(DaemonHeartbeat(beat - 100, "SENSOR", "d1", []))  # an older loop's beat
        instance.add_daemon_heartbeat(DaemonHeartbeat(beat, "SCHEDULER", "d1", []))
    env = {"DAGSTER_HOME": str(home)}
    assert daemon_heartbeat_age(env, now=beat + 5) == 5.0
    assert daemon_heartbeat_age(env, now=beat + DAEMON_SEEN_S) == DAEMON_SEEN_S
    assert daemon_heartbeat_age(env, now=beat + DAEMON_SEEN_S + 0.5) is None
    assert daemon_heartbeat_age(env, now=beat - 3) == 0.0  # this clock behind the daemon's
    (home / "dagster.yaml").write_text((REPO_ROOT / "dagster.yaml").read_text() + (
        "run_storage:\n  module: dagster_postgres.run_storage\n  class: PostgresRunStorage\n  config:\n"
        "    postgres_url: postgresql://u:p@127.0.0.1:9/d\n"))
    assert daemon_heartbeat_age(env, now=beat + 5) is None  # the runs.db left here is not that instance's


def test_a_percentage_that_is_not_a_number_is_refused_naming_it(tmp_path, monkeypatch, capsys):
    import pytest

    from scrape_assets.cli import main

    monkeypatch.setenv("SCRAPE_DATA_DIR", str(tmp_path / "data"))
    for bad in ("abc", "nan", "-1", "100.5%"):
        with pytest.raises(SystemExit) as exit_info:
            main(["summary", "--min-success-rate", bad])
        assert exit_info.value.code == 2, bad
        assert capsys.readouterr().err.splitlines()[-1] == (
            "scrape-assets summary: error: argument --min-success-rate: expected a percentage from 0 to 100, e.g. 90 "
            f"or 99.5%, got {bad!r}")
    assert not (tmp_path / "data").exists()
    # A fraction, as the spec's collapse.floor is written, would mean 0.9%: a CI gate that never closes.
    with pytest.raises(SystemExit):
        main(["summary", "--min-success-rate", "0.9"])
    assert capsys.readouterr().err.splitlines()[-1] == (
        "scrape-assets summary: error: argument --min-success-rate: expected a percentage from 0 to 100, e.g. 90 "
        "or 99.5%, got '0.9': for 90% write 90; for 0.9% write 0.9%")
    from scrape_assets.cli import _percent

    assert [_percent(v) for v in ("0.9%", "0", "1", "90")] == pytest.approx([0.009, 0.0, 0.01, 0.9])


def test_summary_refuses_a_cron_the_schedule_would_refuse(tmp_path, monkeypatch, capsys):
    """The README's pre-flight check (`scrape-assets summary`) says what `make demo` and the
    definitions would: a cron Dagster's scheduler refuses is an error, not a clean summary."""
    from scrape_assets.cli import main

    monkeypatch.setenv("SCRAPE_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("SCRAPE_SCHEDULE_CRON", "0 25 * * *")
    assert main(["summary"]) == 2
    assert capsys.readouterr().err.startswith(
        "scrape-assets: error: SCRAPE_SCHEDULE_CRON='0 25 * * *' is invalid: expected a cron expression Dagster's "
        "scheduler accepts: 5 fields, each in range (minute 0-59, hour 0-23, ")
    monkeypatch.setenv("SCRAPE_SCHEDULE_CRON", "0 2 * * *")
    assert main(["summary"]) == 0


def test_serve_demo_takes_every_port_from_0_to_65535():
    import argparse

    import pytest

    from scrape_assets.cli import _port

    assert (_port("0"), _port("65535"), _port("8000")) == (0, 65535, 8000)
    for bad, shown in (("-1", "-1"), ("65536", "65536"), ("http", "'http'")):
        with pytest.raises(argparse.ArgumentTypeError) as refused:
            _port(bad)
        assert str(refused.value) == f"expected a port number 0-65535, got {shown}"


def test_prune_keep_must_be_a_whole_number_of_at_least_one(tmp_path, monkeypatch, capsys):
    import pytest

    from scrape_assets.cli import main

    monkeypatch.setenv("SCRAPE_DATA_DIR", str(tmp_path / "data"))
    for bad, why in (("0", "expected an integer >= 1 (the newest complete snapshot is always kept), got 0"),
                     ("-2", "expected an integer >= 1 (the newest complete snapshot is always kept), got -2"),
                     ("two", "expected an integer >= 1, got 'two'")):
        with pytest.raises(SystemExit) as exit_info:
            main(["prune", "--keep", bad])
        assert exit_info.value.code == 2
        assert capsys.readouterr().err.splitlines()[-1] == f"scrape-assets prune: error: argument --keep: {why}"
    assert not (tmp_path / "data").exists()


def test_serve_demo_on_an_address_not_of_this_machine_is_one_line(capsys):
    from scrape_assets.cli import main

    assert main(["serve-demo", "--host", "192.0.2.1", "--port", "0"]) == 2  # TEST-NET-1: no interface has it
    assert capsys.readouterr().err == ("scrape-assets: error: cannot listen on 192.0.2.1:0: Cannot assign requested "
                                       "address\n")


def test_serve_demo_on_a_host_name_that_does_not_resolve_is_one_line(capsys):
    from scrape_assets.cli import main

    assert main(["serve-demo", "--host", "no-such-host.invalid", "--port", "0"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("scrape-assets: error: cannot listen on no-such-host.invalid:0: ") and err.count("\n") == 1


def test_categories_into_a_pipe_already_closed_ends_quietly(tmp_path):
    """A reader gone before the first line (`... | true`): the output fits stdout's buffer, so
    the failure shows only at the flush; it must be the command's (exit 1, nothing on stderr),
    not the interpreter's at exit ("Exception ignored ... BrokenPipeError", exit 120)."""
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader is gone before the command writes
    try:
        done = subprocess.run([sys.executable, "-m", "scrape_assets.cli", "categories"], stdout=write_end,
                              stderr=subprocess.PIPE, text=True, timeout=60, cwd=tmp_path,
                              env={**{k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"},  # buffered,
                                   "SCRAPE_SITE": "demo"})  # as in a shell
    finally:
        os.close(write_end)
    assert (done.returncode, done.stderr) == (1, "")


def test_fail_run_ends_a_demo_run_whose_process_cannot_be_checked_from_here(tmp_path, monkeypatch, capsys):
    """A demo run of another machine, boot or container: the operator's word that it is gone is taken."""
    from scrape_assets import cli

    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "home"))
    boot, namespace, pid, ticks = run_processes.process_identity().split(":")
    with cli._instance() as instance:
        instance.add_run(dg.DagsterRun(job_name="daily_scrape_job", run_id="other-boot-run",
                                       status=dg.DagsterRunStatus.STARTED,
                                       tags={run_processes.PROCESS_TAG: f"another-boot:{namespace}:{pid}:{ticks}",
                                             run_processes.PID_TAG: pid, run_processes.PROCESS_RUN_TAG: "other-boot-run"}))
    assert cli.main(["fail-run", "other-boot-run"]) == 0
    assert capsys.readouterr().out == "scrape-assets: run other-boot-run was started, now failed; it held no slot\n"
    with cli._instance() as instance:
        assert instance.get_run_by_id("other-boot-run").status == dg.DagsterRunStatus.FAILURE


def test_the_next_demo_fails_only_the_runs_whose_process_it_can_tell_is_gone(instance):
    """Runs of another boot or pid namespace, of a live process, or untagged stay started; a
    run of this boot whose process is gone (a demo's, or one raw_pages tagged) is failed and
    its slot freed."""
    import subprocess as sp

    from scrape_assets import cli

    boot, namespace, pid, ticks = run_processes.process_identity().split(":")
    child = sp.Popen([sys.executable, "-c", "pass"])
    child.wait()  # a process that ran and is gone: its number, no longer its start time
    gone = f"{boot}:{namespace}:{child.pid}:{ticks}"
    demo = {cli.LAUNCHED_BY_TAG: cli.DEMO_LAUNCHER, run_processes.HOST_TAG: "here"}
    runs = {
        "dead": {**demo, run_processes.PROCESS_TAG: gone, run_processes.PID_TAG: str(child.pid)},
        "other-boot": {**demo, run_processes.PROCESS_TAG: f"another-boot:{namespace}:{child.pid}:{ticks}"},
        "other-namespace": {**demo, run_processes.PROCESS_TAG: f"{boot}:1:{child.pid}:{ticks}"},
        "alive": {**demo, run_processes.PROCESS_TAG: run_processes.process_identity()},
        "untagged": dict(demo),
        "not-a-demo": {run_processes.PROCESS_TAG: gone},
        # a live re-execution (Dagster copies the parent's tags) of a run whose process is gone
        "re-execution": {run_processes.PROCESS_TAG: gone, run_processes.PROCESS_RUN_TAG: "dead", "dagster/parent_run_id": "dead"},
    }
    for run_id, tags in runs.items():
        tags = {run_processes.PROCESS_RUN_TAG: run_id, **tags}  # the tag names the run it was set for
        instance.add_run(dg.DagsterRun(job_name="daily_scrape_job", run_id=run_id, tags=tags,
                                       status=dg.DagsterRunStatus.STARTED))
    pool = "scrape-host-127.0.0.1:8000"
    instance.event_log_storage.set_concurrency_slots(pool, 1)
    assert instance.event_log_storage.claim_concurrency_slot(pool, "dead", "raw_pages").is_claimed
    assert sorted(dead.line for dead in run_processes.fail_dead_runs(instance)) == [
        f"scrape-assets: run dead, left started by a scrape-assets demo that is gone (pid {child.pid}), marked "
        f"failed; its slot in {pool} freed",
        f"scrape-assets: run not-a-demo, left started by a process that is gone (pid {child.pid}), marked failed"]
    statuses = {run_id: instance.get_run_by_id(run_id).status for run_id in runs}
    assert statuses.pop("dead") == statuses.pop("not-a-demo") == dg.DagsterRunStatus.FAILURE
    assert set(statuses.values()) == {dg.DagsterRunStatus.STARTED}
    assert not instance.event_log_storage.get_concurrency_info(pool).active_run_ids
    assert run_processes.fail_dead_runs(instance) == []  # once


def test_a_process_number_reused_by_a_process_started_at_another_time_is_gone():
    """The start time compared is the process's (proc(5) field 22), not a field every process shares."""
    import subprocess as sp

    from scrape_assets import cli

    boot, namespace, _pid, ticks = run_processes.process_identity().split(":")
    child = sp.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=sp.PIPE)
    try:
        theirs = run_processes._start_ticks(child.pid)
        assert int(theirs) > int(ticks)  # started after this test process, seconds after, in clock ticks
        assert run_processes.process_gone(f"{boot}:{namespace}:{child.pid}:{theirs}") is False
        assert run_processes.process_gone(f"{boot}:{namespace}:{child.pid}:{ticks}") is True  # the number, another start
    finally:
        child.communicate(timeout=30)


def test_an_instance_folder_keeps_its_own_dagster_yaml_and_home_may_start_with_a_tilde(tmp_path, monkeypatch):
    """Only a missing dagster.yaml is copied in: one the user edited (another run limit, say) is used as is."""
    from scrape_assets.cli import _instance

    home = tmp_path / "home"
    home.mkdir()
    own = "telemetry:\n  enabled: false\nconcurrency:\n  runs:\n    max_concurrent_runs: 7\n"
    (home / "dagster.yaml").write_text(own)
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    with _instance() as instance:
        assert instance.get_concurrency_config().run_queue_config.max_concurrent_runs == 7  # not the shipped 4
    assert (home / "dagster.yaml").read_text() == own
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.chdir(tmp_path / "home")
    monkeypatch.setenv("DAGSTER_HOME", "~/tilde-home")
    with _instance() as instance:
        assert instance.root_directory == str(tmp_path / "tilde-home")
    assert os.environ["DAGSTER_HOME"] == str(tmp_path / "tilde-home") and not (home / "~").exists()


def test_the_unreadable_line_shows_two_errors_and_names_the_rest():
    import io

    from scrape_assets.cli import print_summary

    broken = {c: f"demo/{c}/s/manifest.json: unreadable manifest" for c in ("travel", "mystery", "poetry")}
    summary = {"site": "demo", "categories": 9, "categories_configured": 12, "categories_unreadable": broken,
               "pages_done": 9, "pages_failed": 0, "success_rate": 1.0, "products_loaded": 0, "dead_letters": 0,
               "object_storage": "/d/objects", "warehouse": "sqlite:////d/warehouse.db", "warehouse_site": None}
    out = io.StringIO()
    print_summary(summary, out=out)
    assert out.getvalue().splitlines()[2] == (
        "  unreadable      3 not counted here, a manifest cannot be read: demo/travel/s/manifest.json: unreadable "
        "manifest | demo/mystery/s/manifest.json: unreadable manifest | and 1 more: poetry")
    out = io.StringIO()
    print_summary({**summary, "categories_unreadable": dict(list(broken.items())[:2])}, out=out)
    assert out.getvalue().splitlines()[2].endswith("demo/mystery/s/manifest.json: unreadable manifest")


def test_fewer_cards_blames_the_selector_only_when_no_category_found_a_card():
    import io

    from scrape_assets.cli import print_summary

    summary = {"site": "demo", "categories": 2, "categories_configured": 12, "pages_done": 6, "pages_failed": 0,
               "success_rate": 1.0, "products_loaded": 60, "dead_letters": 0, "object_storage": "/d/objects",
               "warehouse": "sqlite:////d/warehouse.db", "warehouse_site": None}
    run = {"success": True, "requests_made": 6, "pages_not_modified": 0, "pages_failed": 0, "pages_parsed": 6,
           "partitions_unchanged": 0, "rows_loaded": 60, "rows_carried_forward": 0, "dead_letters": 0,
           "categories_short_of_site_count": {"default": {"cards_found": 60, "site_says": 232},
                                              "poetry": {"cards_found": 0, "site_says": 19}}}
    out = io.StringIO()
    print_summary(summary, run, out=out)
    assert ("  fewer cards     than the site counts in 2 categories: default (60 of 232), poetry (0 of 19) (pages the "
            "crawl did not reach: pagination, the spec's max_pages?)") in out.getvalue().splitlines()


def test_prune_of_a_storage_url_with_a_query_refuses_it_without_showing_the_query(tmp_path, monkeypatch, capsys):
    """SCRAPE_STORAGE_URL may carry a token in its query: fsspec would make it part of the
    folder's name, so the URL is refused, and the error line names it without the token
    (marked where the query was), as every other line names a store."""
    from scrape_assets.cli import main

    monkeypatch.setenv("SCRAPE_SITE", "demo")
    monkeypatch.setenv("SCRAPE_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("SCRAPE_STORAGE_URL", f"simplecache::file://{tmp_path / 'objects'}?token=secret-token")
    assert main(["prune", "--keep", "1"]) == 2
    captured = capsys.readouterr()
    assert captured.err.splitlines()[-1].startswith(
        f"scrape-assets: error: SCRAPE_STORAGE_URL='simplecache::file://{tmp_path / 'objects'}?<hidden>' is invalid: "
        "expected a storage URL with no query or fragment")
    assert "secret-token" not in captured.err + captured.out
    assert not (tmp_path / "objects").exists()
    assert "secret-token" not in captured.out + captured.err


def test_demo_new_snapshot_starts_afresh_beside_an_incomplete_snapshot_of_another_config(tmp_path, monkeypatch, capsys):
    """What the fetch-config refusal tells the user to run: `scrape-assets demo --new-snapshot`
    leaves the incomplete snapshot alone and completes a new one."""
    from scrape_assets.cli import main
    from scrape_assets.manifest import latest_manifest, list_snapshots
    from scrape_assets.storage import ObjectStore
    from scrape_assets_tests.conftest import one_page_snapshot

    for name in [k for k in os.environ if k.startswith("SCRAPE_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("SCRAPE_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "home"))
    store = ObjectStore(str(tmp_path / "data" / "objects"))
    old = one_page_snapshot(store, "2026-11-28T000000Z", complete=False)  # fetched with another config
    assert main(["demo", "--new-snapshot"]) == 0, capsys.readouterr().err[-3000:]
    assert "  requests        38 (0 not modified: 304), 0 pages failed for good" in capsys.readouterr().out
    snapshots = list_snapshots(store, "demo", "travel")
    assert len(snapshots) == 2 and snapshots[0] == old.snapshot_id
    assert latest_manifest(store, "demo", "travel", complete=True).snapshot_id == snapshots[1]


def test_a_storage_url_exported_empty_counts_as_unset_in_the_messages(tmp_path, monkeypatch, capsys):
    """SCRAPE_STORAGE_URL= (an .env template's empty line): the store is the data folder's, so
    the messages name SCRAPE_DATA_DIR, as the settings do."""
    from scrape_assets.cli import main

    monkeypatch.setenv("SCRAPE_SITE", "demo")
    monkeypatch.setenv("SCRAPE_STORAGE_URL", "")
    missing = tmp_path / "nothere"
    monkeypatch.setenv("SCRAPE_DATA_DIR", str(missing))
    assert main(["prune", "--keep", "1"]) == 2
    assert capsys.readouterr().err == (f"scrape-assets: error: no snapshot of demo in {missing}: is SCRAPE_DATA_DIR the "
                                       "one you scraped into, and SCRAPE_SITE (demo) the site? Nothing pruned\n")
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("SCRAPE_DATA_DIR", str(blocker))
    assert main(["summary"]) == 2
    assert capsys.readouterr().err == (f"scrape-assets: error: SCRAPE_DATA_DIR='{blocker}' is invalid: expected a folder "
                                       f"this process can read ({blocker} is a file, not a folder)\n")


def test_daemon_check_lets_make_ui_start_unless_a_daemon_beat_just_now(tmp_path, monkeypatch, capsys):
    """`make ui`'s first step: 0 on an instance no daemon beats on (or none at all); 1 with the
    commands that serve this instance and port instead."""
    import shutil
    import time

    from dagster._daemon.types import DaemonHeartbeat

    from scrape_assets.cli import main

    home = tmp_path / "home"
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    monkeypatch.setenv("UI_PORT", "3005")
    for name in [n for n in os.environ if n.startswith("SCRAPE_")]:  # the clone's own settings: the demo
        monkeypatch.delenv(name)
    monkeypatch.chdir(REPO_ROOT)
    assert main(["daemon-check"]) == 0  # no instance there yet
    home.mkdir()
    shutil.copyfile(REPO_ROOT / "dagster.yaml", home / "dagster.yaml")
    with dg.DagsterInstance.from_config(str(home)) as instance:
        assert main(["daemon-check"]) == 0  # an instance no daemon ever ran on
        assert capsys.readouterr() == ("", "")
        instance.add_daemon_heartbeat(DaemonHeartbeat(time.time(), "SENSOR", "d1", []))
    assert main(["daemon-check"]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"scrape-assets: a Dagster daemon beat on the instance at {home} ")
    assert f"`DAGSTER_HOME={home} .venv/bin/dagster-webserver -w workspace.yaml -p 3005`" in err
    assert err.rstrip().endswith(f"`make ui UI_FORCE=1 UI_PORT=3005 DAGSTER_HOME={home}`.")
    # Another site's: the commands carry its settings (they served the demo's spec), and name the secret ones.
    spec = tmp_path / "shop.yaml"
    spec.write_text("x")
    monkeypatch.setenv("SCRAPE_SITE", str(spec))
    monkeypatch.setenv("SCRAPE_DATA_DIR", str(tmp_path / "shop-data"))
    monkeypatch.setenv("SCRAPE_WAREHOUSE_URL", "postgresql://u:pw@db/shop")
    assert main(["daemon-check"]) == 1
    err = capsys.readouterr().err
    settings = f"SCRAPE_SITE={spec} SCRAPE_DATA_DIR={tmp_path / 'shop-data'}"
    assert f"`{settings} DAGSTER_HOME={home} .venv/bin/dagster-webserver -w workspace.yaml -p 3005`" in err
    assert err.rstrip().endswith(f"`{settings} make ui UI_FORCE=1 UI_PORT=3005 DAGSTER_HOME={home}` (with "
                                 "SCRAPE_WAREHOUSE_URL exported as for the pipeline's runs).")
    assert "pw@" not in err


def test_fail_run_takes_the_beginning_of_an_id_not_any_part_of_it(tmp_path, monkeypatch, capsys):
    """Eight characters from the middle of a run's id are not its short id: no run is touched."""
    from scrape_assets import cli

    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "home"))
    run_id = "1a2b3c4d-5e6f-4a0b-8c1d-2e3f4a5b6c7d"
    with cli._instance() as instance:
        instance.add_run(dg.DagsterRun(job_name="daily_scrape_job", run_id=run_id, status=dg.DagsterRunStatus.STARTED))
    assert cli.main(["fail-run", "5e6f-4a0b"]) == 2
    assert capsys.readouterr().err.startswith(f"scrape-assets: error: no run 5e6f-4a0b on the Dagster instance at "
                                              f"{tmp_path / 'home'} (DAGSTER_HOME): ")
    with cli._instance() as instance:
        assert instance.get_run_by_id(run_id).status == dg.DagsterRunStatus.STARTED


def test_the_ui_line_names_a_dagster_home_given_with_a_tilde_as_the_folder_it_is(tmp_path, monkeypatch):
    """DAGSTER_HOME=~/... is the user's home's folder (as the command itself took it), not ./~/..."""
    from scrape_assets.cli import ui_command

    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.chdir(REPO_ROOT)
    assert ui_command({"DAGSTER_HOME": "~/dagster-home"}) == f"make ui DAGSTER_HOME={tmp_path / 'dagster-home'}"


def test_fail_run_refuses_a_bad_event_batch_size_before_touching_the_run(tmp_path, monkeypatch, capsys):
    """Every command opening the instance checks DAGSTER_EVENT_BATCH_SIZE first (as `demo` does),
    rather than only once a run executes: one line naming it, and the run left as it was."""
    from scrape_assets import cli

    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "home"))
    with cli._instance() as instance:
        instance.add_run(dg.DagsterRun(job_name="daily_scrape_job", run_id="killed-run",
                                       status=dg.DagsterRunStatus.STARTED))
    monkeypatch.setenv("DAGSTER_EVENT_BATCH_SIZE", "abc")
    assert cli.main(["fail-run", "killed-run"]) == 2
    assert capsys.readouterr().err.startswith(
        "scrape-assets: error: DAGSTER_EVENT_BATCH_SIZE='abc' is invalid: expected an integer >= 0")
    monkeypatch.delenv("DAGSTER_EVENT_BATCH_SIZE")
    with cli._instance() as instance:
        assert instance.get_run_by_id("killed-run").status == dg.DagsterRunStatus.STARTED


def test_demo_on_a_warehouse_that_is_not_a_database_stops_before_a_run(tmp_path, monkeypatch, capsys):
    """The preflight: one line naming SCRAPE_WAREHOUSE_URL, exit 2, no run created and nothing
    fetched, rather than a run that crawls every page and then fails to load them."""
    from scrape_assets.cli import main

    for name in [k for k in os.environ if k.startswith("SCRAPE_")]:
        monkeypatch.delenv(name)
    notes = tmp_path / "notes.db"
    notes.write_text("not a database")
    monkeypatch.setenv("SCRAPE_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("SCRAPE_WAREHOUSE_URL", f"sqlite:///{notes}")
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "home"))
    assert main(["demo"]) == 2
    captured = capsys.readouterr()
    assert captured.err.splitlines()[-1] == (
        f"scrape-assets: error: SCRAPE_WAREHOUSE_URL='sqlite:///{notes}' is invalid: expected a reachable, writable "
        "database (DatabaseError: file is not a database)")
    assert not (tmp_path / "data" / "objects" / "demo").exists() and notes.read_text() == "not a database"
    if (tmp_path / "home" / "dagster.yaml").exists():
        with dg.DagsterInstance.from_config(str(tmp_path / "home")) as instance:
            assert instance.get_runs() == []


def test_an_s3_storage_url_with_credentials_in_it_is_refused_without_echoing_them(tmp_path, monkeypatch, capsys):
    """s3fs reads no user:password@ from a URL: the bucket would be "KEY:secret@bucket", and the
    S3 client's refusal of that name repeated the secret in the error line (found by the 13th
    mutation audit). Refused before any client call, the URL named redacted, what to use instead."""
    from scrape_assets.cli import main

    monkeypatch.setenv("SCRAPE_SITE", "demo")
    monkeypatch.setenv("SCRAPE_DATA_DIR", str(tmp_path / "data"))
    for name, value in (("AWS_ACCESS_KEY_ID", "testing"), ("AWS_SECRET_ACCESS_KEY", "testing"),
                        ("AWS_DEFAULT_REGION", "us-east-1"), ("AWS_EC2_METADATA_DISABLED", "true")):
        monkeypatch.setenv(name, value)
    # the second secret holds a "/", as AWS secret keys often do: the "bucket" ends before the "@"
    # (a secret starting with "/", or all digits before its "/": urlsplit reads a host and a port)
    for url in ("s3://AKIAEXAMPLE:secret-token@bucket/objects", "s3://AKIAEXAMPLE:secret/token@bucket/objects",
                "s3://AKIAEXAMPLE:/secret-token@bucket/objects", "s3://AKIAEXAMPLE:1234/secret-token@bucket/objects"):
        shown = "s3://<hidden>"
        monkeypatch.setenv("SCRAPE_STORAGE_URL", url)
        for command, needs in ((["summary"], "read"), (["prune", "--keep", "1"], "write")):
            assert main(command) == 2, command
            captured = capsys.readouterr()
            assert captured.err == (
                f"scrape-assets: error: SCRAPE_STORAGE_URL='{shown}' is invalid: expected object storage this process"
                f" can {needs} (cannot open object storage: an s3:// URL names a bucket only, credentials"
                " (user:password@) and ports are not read: expected s3://bucket[/prefix], credentials from"
                " AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY or an AWS profile, an endpoint from AWS_ENDPOINT_URL)\n"), command
            assert "secret" not in captured.out, command


def test_a_process_hidden_by_procfs_is_not_taken_for_gone(monkeypatch):
    """With /proc mounted hidepid=2 (or systemd's ProtectProc=invisible) another user's live
    process has no /proc/PID: it read as gone, and its live run would have been failed and its
    host slot freed. kill(pid, 0) tells: it exists (can't tell -> None) or not (gone)."""
    import subprocess as sp

    from scrape_assets import run_processes

    boot, namespace, pid, ticks = run_processes.process_identity().split(":")
    monkeypatch.setattr(run_processes, "_start_ticks", lambda pid: None)  # /proc hides every process
    assert run_processes.process_gone(f"{boot}:{namespace}:{pid}:{ticks}") is None  # this one runs
    child = sp.Popen([sys.executable, "-c", "pass"])
    child.wait()
    assert run_processes.process_gone(f"{boot}:{namespace}:{child.pid}:{ticks}") is True  # no such process


def test_a_refused_process_tag_is_logged_and_the_run_goes_on(caplog):
    """The tag is bookkeeping: an instance that refuses the write (database is locked) failed
    the whole run before its first step."""
    from scrape_assets import run_processes

    class Refusing:
        def add_run_tags(self, run_id, tags):
            raise RuntimeError("database is locked")

    run = dg.DagsterRun(job_name="daily_scrape_job", run_id="r1", tags={})
    with caplog.at_level("WARNING", logger="scrape_assets.run_processes"):
        assert run_processes.tag_run_process(Refusing(), run) is False
    assert "run r1: could not tag it with its process (RuntimeError: database is locked)" in caplog.text


def test_a_failed_schema_check_of_a_command_line_run_says_how_to_load_what_it_held_back(tmp_path):
    """No sensor sees a `dagster asset materialize` run (CI, cron): when one category fails
    the blocking check, the others' load is held back with it, and the step's error line
    gives the commands that load them and the failing one's dead letters. Run as printed,
    they load exactly those."""
    import shlex
    import threading

    from scrape_assets.demo_site import catalogue
    from scrape_assets.faults import make_fault_server, parse_fault_spec

    server = make_fault_server(parse_fault_spec(
        "rules:\n  - {match: 'mystery_3/page-2\\.html$', fault: layout_changed}\n", "test"), "127.0.0.1", 0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    dagster = str(Path(sys.executable).with_name("dagster"))
    home = tmp_path / "home"
    home.mkdir()
    (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("SCRAPE_")}
    env.update(DAGSTER_HOME=str(home), SCRAPE_DATA_DIR=str(tmp_path / "data"), SCRAPE_BASE_URL=server.base_url)
    try:
        failed = subprocess.run([dagster, "asset", "materialize", "-m", "scrape_assets.definitions", "--select", "*",
                                 "--partition-range", "travel...classics"], env=env, capture_output=True, text=True,
                                timeout=300, cwd=tmp_path)
        assert failed.returncode != 0
        assert ("2 other categories of this run passed and are held back with the failing ones (whose dead letters "
                "are held back too): after a run launched by the schedule, the UI or a backfill, "
                "held_back_load_sensor loads them; after a command-line run, load them with:") in failed.stderr
        commands = [line.strip() for line in failed.stderr.splitlines() if line.startswith("  dagster asset materialize")]
        assert commands == [
            "dagster asset materialize -m scrape_assets.definitions --select products_table,dead_letters --partition travel",
            "dagster asset materialize -m scrape_assets.definitions --select products_table,dead_letters --partition classics",
            "dagster asset materialize -m scrape_assets.definitions --select dead_letters --partition mystery",
        ]
        wh = Warehouse(f"sqlite:///{tmp_path / 'data' / 'warehouse.db'}")
        assert wh.rows_by_category(products) == {}  # nothing loaded: the check held every category back
        for command in commands:
            done = subprocess.run([dagster, *shlex.split(command)[1:]], env=env, capture_output=True, text=True,
                                  timeout=300, cwd=tmp_path)
            assert done.returncode == 0, (command, done.stderr[-2000:])
    finally:
        server.shutdown()
        server.server_close()
    assert wh.rows_by_category(products) == {
        "travel": len(catalogue().category("travel").products), "classics": len(catalogue().category("classics").products)}
    assert {(r["category"], r["stage"]) for r in wh.rows(dead_letters)} == {("mystery", "parse")}


def test_the_summary_names_categories_whose_latest_snapshot_is_not_loaded_yet(tmp_path, instance, monkeypatch):
    """A run killed after raw_pages completed a snapshot leaves it neither parsed nor loaded:
    its pages count as done, and the summary says which categories' rows are still the
    earlier ones, instead of passing them off as today's."""
    import io

    from scrape_assets.cli import print_summary, summarize
    from scrape_assets.demo_site import DATE_ENV_VAR
    from scrape_assets_tests.conftest import make_resources, materialize

    monkeypatch.setenv(DATE_ENV_VAR, "2026-12-01")  # one catalogue day, however long the test runs (midnight)

    res = make_resources(tmp_path)

    def waiting() -> list[str]:
        out = io.StringIO()
        print_summary(summarize(res), out=out)
        return [line for line in out.getvalue().splitlines() if line.startswith("  not loaded yet")]

    assert materialize(instance, res, ["travel", "mystery"]).success
    assert waiting() == []
    out = io.StringIO()
    print_summary(summarize(res), out=out)
    (completed,) = [line for line in out.getvalue().splitlines() if line.startswith("  completed ")]
    assert re.fullmatch(r"  completed       20\d\d-\d\d-\d\dT\d\d:\d\d:\d\dZ( to 20\S+Z)? \(UTC: when the "
                        r"oldest and the newest of those snapshots were completed\)", completed), completed
    fresh = {"ops": {"raw_pages": {"config": {"new_snapshot": True}}}}
    assert materialize(instance, res, ["travel"], selection=["raw_pages"], run_config=fresh).success  # then killed
    expected = ["  not loaded yet  1 whose latest snapshot is not parsed or not loaded yet (a run stopped after "
                "fetching it, or one still going), `products` holding their earlier rows, if any: travel; the next "
                "daily run loads them (or re-parse them: README, Runbook)"]
    assert waiting() == expected
    # Parsed: its pages were all 304s, so its rows are the ones `products` holds (the same input).
    assert materialize(instance, res, ["travel"], selection=["parsed_products"]).success
    assert waiting() == []
    # Parsed rows the table never got (as after a parse with new rules whose load was killed).
    with sqlite3.connect(tmp_path / "warehouse.db") as db:
        db.execute("DELETE FROM partition_loads WHERE category = 'travel'")
    assert waiting() == expected


def test_the_summary_says_nothing_is_waiting_for_a_load_in_another_sites_warehouse(tmp_path, instance):
    """SCRAPE_WAREHOUSE_URL naming another site's tables: this site's categories are not "not
    loaded yet" there (no run stopped; the next run refuses that warehouse); the warehouse
    line says whose tables they are."""
    import io

    from scrape_assets.cli import print_summary, summarize
    from scrape_assets_tests.conftest import make_resources, materialize
    from scrape_assets_tests.test_revalidation import Runs, Site, card, compliant, listing, serve

    demo = make_resources(tmp_path / "demo")
    assert materialize(instance, demo, ["travel"]).success
    site = Site()
    site.routes["/cat/index.html"] = compliant(listing(1, 1, [card(1, "Book one", "£10.00")]), etag='"a"')
    with serve(site) as base:
        (tmp_path / "rev").mkdir()
        runs = Runs(instance, tmp_path / "rev", base)
        runs.run()
    out = io.StringIO()
    print_summary(summarize(dict(runs.resources, warehouse=demo["warehouse"])), out=out)
    lines = out.getvalue().splitlines()
    assert not [line for line in lines if line.startswith("  not loaded yet")], lines
    assert any(line.startswith("  warehouse ") and "tables of site 'demo', not 'rev'" in line for line in lines), lines
