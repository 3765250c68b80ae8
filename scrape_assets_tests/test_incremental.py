"""Incremental refresh: conditional GET, unchanged pages stored once, unchanged partitions skipped."""

from __future__ import annotations

import datetime
from pathlib import Path

import dagster as dg

from scrape_assets.manifest import latest_manifest, list_snapshots, load_manifest
from scrape_assets.storage import ObjectStore
from scrape_assets.warehouse import Warehouse, price_history, products
from scrape_assets_tests.conftest import (
    ALL_ASSETS,
    assert_later_pages_adopted,
    crawl_demo,
    make_resources,
    materialize,
    run_metadata,
)

PAGES = {"travel": 1, "mystery": 2}


def _page_requests(server):
    return [r for r in server.requests if r.path.startswith("/catalogue/")]


def test_second_snapshot_uses_conditional_get_and_stores_nothing_new(tmp_path, instance, demo_server):
    res = make_resources(tmp_path, base_url=demo_server.base_url)
    assert materialize(instance, res, ["travel", "mystery"], selection=["raw_pages"]).success
    first_requests = _page_requests(demo_server)
    assert len(first_requests) == 3 and not any("if-none-match" in r.headers for r in first_requests)
    store = ObjectStore(str(tmp_path / "objects"))
    first = {c: latest_manifest(store, "demo", c) for c in PAGES}

    demo_server.clear_requests()
    result = materialize(instance, res, ["travel", "mystery"], selection=["raw_pages"])
    assert result.success
    second_requests = _page_requests(demo_server)
    assert len(second_requests) == 3
    assert [r.status for r in first_requests] == [200] * 3 and [r.status for r in second_requests] == [304] * 3
    # Every request carried the validators recorded in the first snapshot's manifest.
    for request in second_requests:
        category = "travel" if "travel" in request.path else "mystery"
        n = 1 if request.path.endswith("index.html") else 2
        assert request.headers["if-none-match"] == first[category].pages[n].etag
        assert request.headers["if-modified-since"] == first[category].pages[n].last_modified

    for category, pages in PAGES.items():
        second = latest_manifest(store, "demo", category)
        assert second.snapshot_id != first[category].snapshot_id
        for n in range(1, pages + 1):
            entry = second.pages[n]
            assert (entry.status, entry.http_status, entry.not_modified) == ("done", 304, True)
            assert entry.body_key == first[category].page_key(n)  # reuses the stored body
            assert entry.content_hash == first[category].pages[n].content_hash
        assert not store.exists(f"{second.prefix}/pages")  # nothing stored again
        assert second.data_version == first[category].data_version

    md = result.get_asset_materialization_events()[0].materialization.metadata
    assert md["pages_not_modified"].value == 3 and md["bytes_stored"].value == 0


def test_next_day_refetches_only_the_categories_that_changed(tmp_path, instance):
    import threading

    from scrape_assets.demo_site import changed_categories, make_server

    day1, day2 = datetime.date(2026, 11, 30), datetime.date(2026, 12, 1)
    keys = ["travel", "mystery", "classics", "romance", "fiction", "default"]
    changed = changed_categories(day2) & set(keys)
    assert changed, "the seeded schedule changes at least one of these on day 2"
    store = ObjectStore(str(tmp_path / "objects"))
    wh = Warehouse(f"sqlite:///{tmp_path / 'warehouse.db'}")
    results, prices, port = {}, {}, 0
    for day in (day1, day2):  # the same address both days, as a real site would have
        server = make_server("127.0.0.1", port, day=day)
        port = server.server_address[1]
        threading.Thread(target=server.serve_forever, daemon=True).start()
        try:
            res = make_resources(tmp_path, base_url=server.base_url)
            results[day] = materialize(instance, res, keys)
            assert results[day].success
            prices[day] = {(r["category"], r["product_id"]): r["price"] for r in wh.rows(products)}
            answered = [r for r in server.requests if r.path.startswith("/catalogue/")]  # the server's own log
        finally:
            server.shutdown()
            server.server_close()
    md = run_metadata(results[day2])
    by_category = md["raw_pages"]["by_category"]
    for key in keys:
        first, second = (load_manifest(store, "demo", key, s) for s in list_snapshots(store, "demo", key))
        pages = len(second.pages)
        if key in changed:
            assert by_category[key]["pages_not_modified"] == 0, key
            assert all(p.http_status == 200 and p.body_key is None for p in second.pages.values())
            assert second.data_version != first.data_version
        else:
            assert by_category[key]["pages_not_modified"] == pages, key
            assert second.data_version == first.data_version
    # As the server counted them: one request per page, a 304 for each page of an unchanged category.
    latest = {k: load_manifest(store, "demo", k, list_snapshots(store, "demo", k)[-1]) for k in keys}
    assert len(answered) == sum(len(m.pages) for m in latest.values())
    assert sum(r.status == 304 for r in answered) == sum(len(latest[k].pages) for k in keys if k not in changed)
    assert sum(r.status == 200 for r in answered) == sum(len(latest[k].pages) for k in changed)
    assert md["raw_pages"]["pages_not_modified"] == sum(r.status == 304 for r in answered)
    parsed = md["parsed_products"]["by_category"]
    assert {k for k in keys if not parsed[k]["unchanged"]} == changed
    reloaded = md["products_table"]["rows_loaded_by_category"]
    assert {k for k in keys if reloaded[k]} == changed
    # Prices moved exactly in the categories that changed.
    for key in keys:
        moved = [k for k, price in prices[day2].items() if k[0] == key and price != prices[day1][k]]
        assert bool(moved) == (key in changed), key
    # Both runs happened on the same real (UTC) day: one price_history row per product, the latest price.
    history = wh.rows(price_history)
    assert len(history) == len(prices[day2])
    assert {(r["category"], r["product_id"]): r["price"] for r in history} == prices[day2]


def test_unchanged_second_run_reparses_nothing_reloads_nothing_and_history_has_no_duplicates(tmp_path, instance, demo_server):
    from scrape_assets.warehouse import partition_loads

    res = make_resources(tmp_path, base_url=demo_server.base_url)
    first = materialize(instance, res, ["travel", "mystery"])
    assert first.success
    wh = Warehouse(f"sqlite:///{tmp_path / 'warehouse.db'}")
    table_before = wh.rows(products)
    loads_before = wh.rows(partition_loads)

    second = materialize(instance, res, ["travel", "mystery"])
    assert second.success
    md = run_metadata(second)
    assert md["parsed_products"]["pages_parsed"] == 0
    assert md["parsed_products"]["partitions_unchanged"] == 2
    # Nothing parsed, so no worker count in the summary line (none was started).
    assert any(e.message.startswith("2 categories: 0 pages parsed, 2 categories unchanged, ")
               for e in instance.all_logs(second.run_id))
    assert any(e.message.startswith("2 categories: 0 rows loaded into products (0 categories reloaded, 0 earlier "
                                    "rows kept in them; 2 unchanged, their rows as they were)")
               for e in instance.all_logs(second.run_id))
    assert md["products_table"]["rows_loaded"] == 0
    assert md["products_table"]["partitions_reloaded"] == 0
    assert md["products_table"]["rows_by_category"] == {"travel": 11, "mystery": 32}
    assert wh.rows(products) == table_before  # untouched, not even re-stamped
    assert wh.rows(partition_loads) == loads_before

    # One price per (day, category, product), however often the day is re-run.
    history = wh.rows(price_history)
    assert len(history) == 11 + 32
    assert {r["snapshot_date"] for r in history} == {latest_manifest(ObjectStore(str(tmp_path / "objects")), "demo", "travel").snapshot_id[:10]}
    assert {(r["category"], r["product_id"], r["price"]) for r in history} == {
        (r["category"], r["product_id"], r["price"]) for r in table_before
    }
    assert materialize(instance, res, ["travel", "mystery"], selection=["parsed_products", "products_table"]).success
    assert len(wh.rows(price_history)) == 11 + 32


def test_parser_version_change_reparses_saved_pages_without_requests(tmp_path, instance, demo_server, monkeypatch):
    import scrape_assets.extract as extract

    res = make_resources(tmp_path, base_url=demo_server.base_url)
    first = materialize(instance, res, ["travel"])
    assert first.success
    event = [e for e in first.get_asset_materialization_events() if e.asset_key.path[0] == "parsed_products"][0]
    from scrape_assets.defs.partitions import site_spec

    assert event.materialization.tags["dagster/code_version"] == extract.parser_code_version(site_spec)
    assert event.materialization.tags["dagster/code_version"].startswith(f"{extract.PARSER_VERSION}+spec")
    requests = demo_server.request_count()

    unchanged = materialize(instance, res, ["travel"], selection=["parsed_products", "products_table"])
    md = run_metadata(unchanged)
    assert md["parsed_products"]["pages_parsed"] == 0

    monkeypatch.setattr(extract, "PARSER_VERSION", "test-bump")  # as after a parser fix
    reparse = materialize(instance, res, ["travel"], selection=["parsed_products", "products_table"])
    md = run_metadata(reparse)
    assert md["parsed_products"]["pages_parsed"] == 1
    assert md["products_table"]["rows_loaded"] == 11
    assert demo_server.request_count() == requests  # zero HTTP requests


def test_a_reparse_keeps_the_time_each_body_was_fetched_not_the_304s_since(tmp_path, instance, demo_server, monkeypatch):
    """Rows' ``fetched_at`` is when the body they were parsed from was fetched: the 304s of
    later snapshots move the manifest's ``fetched_at`` (how fresh the copy is known to be)
    but not the rows, even when a parser fix re-parses the latest snapshot."""
    import scrape_assets.crawl as crawl
    import scrape_assets.extract as extract

    res = make_resources(tmp_path, base_url=demo_server.base_url)
    assert materialize(instance, res, ["travel", "mystery"]).success
    store = ObjectStore(str(tmp_path / "objects"))
    first = {c: latest_manifest(store, "demo", c) for c in PAGES}
    wh = Warehouse(f"sqlite:///{tmp_path / 'warehouse.db'}")
    fetched = {(r["category"], r["product_id"]): r["fetched_at"] for r in wh.rows(products)}
    assert set(fetched.values()) <= {e.fetched_at for m in first.values() for e in m.pages.values()}

    # Two later days, every page answered 304 (the second 304 confirms a copy already reused).
    for day in ("2099-01-02T03:04:05Z", "2099-01-03T03:04:05Z"):
        monkeypatch.setattr(crawl, "utc_now_iso", lambda day=day: day)
        assert materialize(instance, res, ["travel", "mystery"], selection=["raw_pages"]).success
        for category in PAGES:
            entries = latest_manifest(store, "demo", category).pages
            assert {(e.not_modified, e.fetched_at) for e in entries.values()} == {(True, day)}
            assert {n: e.body_fetched_at for n, e in entries.items()} == {
                n: e.fetched_at for n, e in first[category].pages.items()}
    # Then the spec opts in to `revalidate: first_page`: page 1 a 304, mystery's page 2 adopted
    # without a request from a snapshot that had it as a 304 (its confirmation time kept, and
    # the time of its body).
    spec_file = tmp_path / "demo-first-page.yaml"
    spec_file.write_text((Path(__file__).resolve().parents[1] / "scrape_assets" / "sites" / "demo.yaml").read_text()
                         + "incremental:\n  revalidate: first_page\n")
    monkeypatch.setattr(crawl, "utc_now_iso", lambda: "2099-01-04T03:04:05Z")
    first_page = make_resources(tmp_path, site=str(spec_file), base_url=demo_server.base_url)
    assert materialize(instance, first_page, ["travel", "mystery"], selection=["raw_pages"]).success
    adopted = latest_manifest(store, "demo", "mystery").pages[2]
    assert (adopted.assumed_unchanged, adopted.fetched_at) == (True, "2099-01-03T03:04:05Z")
    assert adopted.body_fetched_at == first["mystery"].pages[2].fetched_at

    monkeypatch.setattr(extract, "PARSER_VERSION", "test-bump")  # a parser fix: the 304 snapshots re-parsed
    reparse = materialize(instance, res, ["travel", "mystery"], selection=["parsed_products", "products_table"])
    assert run_metadata(reparse)["products_table"]["rows_loaded"] == 11 + 32
    rows = wh.rows(products)
    assert {r["snapshot_id"] for r in rows} == {latest_manifest(store, "demo", c).snapshot_id for c in PAGES}
    assert {(r["category"], r["product_id"]): r["fetched_at"] for r in rows} == fetched


def test_first_page_revalidation_asks_one_page_per_unchanged_category(tmp_path, instance):
    """Spec opt-in ``incremental.revalidate: first_page``: page 1 unchanged -> pages 2..N adopted, no request."""
    import threading

    from scrape_assets.demo_site import changed_categories, make_server
    from scrape_assets.spec import load_spec

    spec_file = tmp_path / "demo-first-page.yaml"
    demo = (Path(__file__).resolve().parents[1] / "scrape_assets" / "sites" / "demo.yaml").read_text()
    spec_file.write_text(demo + "incremental:\n  revalidate: first_page\n")
    assert load_spec(str(spec_file)).incremental.revalidate == "first_page"
    day1, day2 = datetime.date(2026, 11, 30), datetime.date(2026, 12, 1)
    keys = ["fiction", "default", "fantasy", "science", "poetry"]  # 4, 12, 3, 1, 1 pages
    assert changed_categories(day2) & set(keys) == {"default", "poetry"}
    store = ObjectStore(str(tmp_path / "objects"))
    wh = Warehouse(f"sqlite:///{tmp_path / 'warehouse.db'}")
    requests, results, port = {}, {}, 0
    for day in (day1, day2):
        server = make_server("127.0.0.1", port, day=day)
        port = server.server_address[1]
        threading.Thread(target=server.serve_forever, daemon=True).start()
        try:
            res = make_resources(tmp_path, site=str(spec_file), base_url=server.base_url)
            results[day] = materialize(instance, res, keys)
            assert results[day].success
            requests[day] = sorted(r.path for r in server.requests if r.path.startswith("/catalogue/"))
        finally:
            server.shutdown()
            server.server_close()
    assert len(requests[day1]) == 4 + 12 + 3 + 1 + 1
    # Day 2: page 1 of each category, and every page of the two that changed.
    assert len(requests[day2]) == 1 + 12 + 1 + 1 + 1
    assert sum("/fiction_10/" in p for p in requests[day2]) == 1

    md = run_metadata(results[day2])
    by_category = md["raw_pages"]["by_category"]
    assert {k: by_category[k]["pages_assumed_unchanged"] for k in keys} == {
        "fiction": 3, "default": 0, "fantasy": 2, "science": 0, "poetry": 0}
    assert sum("/fantasy_19/" in p for p in requests[day2]) == 1  # fantasy: page 1 only
    for key in ("fiction", "fantasy"):
        assert_later_pages_adopted(store, key)
    parsed = md["parsed_products"]["by_category"]
    assert {k for k in keys if not parsed[k]["unchanged"]} == {"default", "poetry"}
    assert md["products_table"]["rows_by_category"] == {"fiction": 65, "default": 232, "fantasy": 48,
                                                              "science": 14, "poetry": 19}
    assert len(wh.rows(products)) == 65 + 232 + 48 + 14 + 19


def test_first_page_revalidation_fetches_every_page_when_the_previous_snapshot_had_a_failed_page(
    tmp_path, instance, demo_server
):
    """The opt-in adopts pages only from a previous snapshot with every page done."""
    from scrape_assets.manifest import latest_manifest

    spec_file = tmp_path / "demo-first-page.yaml"
    demo = (Path(__file__).resolve().parents[1] / "scrape_assets" / "sites" / "demo.yaml").read_text()
    spec_file.write_text(demo + "incremental:\n  revalidate: first_page\n")
    res = make_resources(tmp_path, site=str(spec_file), base_url=demo_server.base_url)
    assert materialize(instance, res, ["fiction"], selection=["raw_pages"]).success  # 4 pages
    store = ObjectStore(str(tmp_path / "objects"))
    previous = latest_manifest(store, "demo", "fiction", complete=True)
    previous.pages[3].status, previous.pages[3].last_error = "failed", "http_503: as if it had failed"
    previous.save(store)

    demo_server.clear_requests()
    result = materialize(instance, res, ["fiction"], selection=["raw_pages"])
    assert result.success
    assert len(_page_requests(demo_server)) == 4  # nothing adopted: every page asked again
    second = latest_manifest(store, "demo", "fiction", complete=True)
    assert not any(p.assumed_unchanged for p in second.pages.values())
    assert [p.status for p in second.pages.values()] == ["done"] * 4
    md = result.get_asset_materialization_events()[0].materialization.metadata
    assert md["pages_assumed_unchanged"].value == 0


DEMO_SPEC = Path(__file__).resolve().parents[1] / "scrape_assets" / "sites" / "demo.yaml"


def _code_version_when_loaded_with(spec_file: Path) -> str:
    """``parsed_products``' code version in definitions loaded afresh with ``SCRAPE_SITE=spec_file``
    (as the UI's "Reload definitions" or a new run's process loads them)."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if not k.startswith("SCRAPE_")} | {"SCRAPE_SITE": str(spec_file)}
    code = ("from scrape_assets.defs.assets.parsed_products import parsed_products; "
            "print(parsed_products.code_versions_by_key[parsed_products.key])")
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          check=True).stdout.strip()


def test_an_edit_of_the_specs_parsing_rules_changes_the_parser_code_version(tmp_path):
    """A selector edited in the spec is a parser change (the UI shows parsed_products stale
    once the definitions are reloaded); a politeness edit is not."""
    from scrape_assets.extract import PARSER_VERSION, parser_code_version
    from scrape_assets.spec import load_spec

    selector = tmp_path / "demo-selector.yaml"
    selector.write_text(DEMO_SPEC.read_text().replace("availability: {css: p.availability}",
                                                      "availability: {css: p.instock.availability}"))
    polite = tmp_path / "demo-polite.yaml"
    polite.write_text(DEMO_SPEC.read_text().replace("requests_per_second: 50.0", "requests_per_second: 5.0"))
    demo = parser_code_version(load_spec("demo"))
    assert demo.startswith(f"{PARSER_VERSION}+spec")
    assert _code_version_when_loaded_with(DEMO_SPEC) == demo
    edited = _code_version_when_loaded_with(selector)
    assert edited == parser_code_version(load_spec(str(selector))) != demo
    assert _code_version_when_loaded_with(polite) == demo


def test_ui_staleness_follows_page_hashes_and_the_parser_code_version(tmp_path, instance, demo_server):
    """What the UI shows (Dagster's own stale-status resolver): an unchanged crawl keeps
    downstream assets fresh; a parser code_version change (a ``PARSER_VERSION`` bump, or an
    edit of the spec's selectors) marks ``parsed_products`` stale."""
    from dagster._core.definitions.data_version import StaleCauseCategory, StaleStatus
    from dagster._utils.test.data_versions import get_stale_status_resolver

    from scrape_assets.defs.assets.dead_letters import dead_letters
    from scrape_assets.defs.assets.parsed_products import parsed_products
    from scrape_assets.defs.assets.products_table import products_table
    from scrape_assets.defs.assets.raw_pages import raw_pages

    def status(assets, key):
        return get_stale_status_resolver(instance, assets).get_status(dg.AssetKey(key), "travel")

    res = make_resources(tmp_path, base_url=demo_server.base_url)
    assert materialize(instance, res, ["travel"]).success
    graph = [raw_pages, parsed_products, products_table, dead_letters]
    assert status(graph, "parsed_products") == StaleStatus.FRESH

    assert materialize(instance, res, ["travel"], selection=["raw_pages"]).success  # same pages: 304s
    assert status(graph, "parsed_products") == StaleStatus.FRESH
    assert status(graph, "products_table") == StaleStatus.FRESH

    # The definitions reloaded after an edit of a selector in the spec.
    edited_spec = tmp_path / "demo-edited.yaml"
    edited_spec.write_text(DEMO_SPEC.read_text().replace("availability: {css: p.availability}",
                                                         "availability: {css: p.instock.availability}"))
    reloaded = _code_version_when_loaded_with(edited_spec)
    bumped = parsed_products.map_asset_specs(lambda spec: spec.replace_attributes(code_version=reloaded))
    graph = [raw_pages, bumped, products_table, dead_letters]
    assert status(graph, "parsed_products") == StaleStatus.STALE
    causes = get_stale_status_resolver(instance, graph).get_stale_causes(dg.AssetKey("parsed_products"), "travel")
    assert [c.category for c in causes] == [StaleCauseCategory.CODE]


def test_a_snapshot_left_incomplete_days_ago_is_not_resumed_by_todays_run(tmp_path, instance, demo_server):
    """Resuming it would date today's pages (and prices) by the day it started."""
    from scrape_assets.defs.resources import ObjectStoreResource
    from scrape_assets.manifest import open_snapshot

    res = make_resources(tmp_path, base_url=demo_server.base_url)
    store = ObjectStore(str(tmp_path / "objects"))
    site = res["site"]
    two_days_ago = datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(days=2)
    stale, _ = open_snapshot(store, site="demo", category="travel", now=two_days_ago,
                             start_url=site.spec().start_url("travel", site.fetch_base_url()),
                             fetch_config=site.fetch_config())
    result = materialize(instance, res, ["travel"])
    assert result.success
    snapshots = list_snapshots(store, "demo", "travel")
    assert snapshots[0] == stale.snapshot_id and len(snapshots) == 2
    assert load_manifest(store, "demo", "travel", stale.snapshot_id).is_complete is False
    today = latest_manifest(store, "demo", "travel", complete=True)
    assert today.snapshot_id == snapshots[1] and today.counts()["done"] == len(today.pages)
    logs = [e.message for e in instance.all_logs(result.run_id)]
    # One category, one page: the summary lines count in the singular.
    assert any(m.startswith("1 category: 1 page done (0 not modified: 304), 0 failed, 1 request\n") for m in logs)
    assert any(m.startswith("1 category: 1 page parsed (up to ") and ", 0 categories unchanged, 11 products, " in m
               for m in logs)
    assert any(f"travel: parsed 11 products from 1 page of snapshot {today.snapshot_id}" in m for m in logs)
    assert any(m.startswith("1 category: 11 rows loaded into products (1 category reloaded, 0 earlier rows kept in "
                            "them; 0 unchanged, their rows as they were)") for m in logs)
    assert any(f"travel: not resuming snapshot {stale.snapshot_id}: started {stale.created_at}, more than 20 h ago" in m
               for m in logs)
    history = Warehouse(f"sqlite:///{tmp_path / 'warehouse.db'}").rows(price_history)
    assert {r["snapshot_date"] for r in history} == {today.snapshot_id[:10]} and len(history) == 11

    # The same situation with the limit lifted (resume_max_age_h=None): that snapshot is resumed.
    other = tmp_path / "other"
    res = {**make_resources(other, base_url=demo_server.base_url),
           "store": ObjectStoreResource(url=str(other / "objects"), resume_max_age_h=None)}
    store = ObjectStore(str(other / "objects"))
    stale, _ = open_snapshot(store, site="demo", category="travel", now=two_days_ago,
                             start_url=site.spec().start_url("travel", site.fetch_base_url()),
                             fetch_config=site.fetch_config())
    assert materialize(instance, res, ["travel"], selection=["raw_pages"]).success
    assert list_snapshots(store, "demo", "travel") == [stale.snapshot_id]
    assert latest_manifest(store, "demo", "travel", complete=True).snapshot_id == stale.snapshot_id


def test_a_crawl_reads_each_partitions_latest_manifest_once(tmp_path, monkeypatch):
    """The preflight's read serves opening the snapshot and revalidating its pages (one GET each on S3)."""
    import collections

    categories = ["travel", "mystery", "classics"]
    pages = {r.category: r.pages_done for r in crawl_demo(tmp_path / "objects", categories)}
    assert pages == {"travel": 1, "mystery": 2, "classics": 1}
    reads = collections.Counter()
    original = ObjectStore.read_bytes

    def counting(self, key):
        if key.endswith("/manifest.json"):
            reads[key.split("/")[1]] += 1
        return original(self, key)

    monkeypatch.setattr(ObjectStore, "read_bytes", counting)
    second = {r.category: r for r in crawl_demo(tmp_path / "objects", categories)}  # unchanged: every page revalidated
    assert reads == {category: 1 for category in categories}
    # The validators came from that one read: every page asked conditionally, every answer a 304.
    assert {c: (r.requests_made, r.pages_not_modified) for c, r in second.items()} == {c: (n, n) for c, n in pages.items()}


def test_a_corrupt_manifest_stops_a_new_snapshot_run_before_any_snapshot_opens(tmp_path):
    """new_snapshot=True: the up-front read fails first, so no other category gets a stray new snapshot."""
    import pytest

    from scrape_assets.errors import ManifestError

    categories = ["travel", "mystery"]
    crawl_demo(tmp_path / "objects", categories)
    store = ObjectStore(str(tmp_path / "objects"))
    broken = latest_manifest(store, "demo", "mystery")
    store.write_bytes_atomic(broken.key, b'{"format": 1, "pages": ')
    with pytest.raises(ManifestError, match="mystery/.*manifest.json: unreadable manifest"):
        crawl_demo(tmp_path / "objects", categories, new_snapshot=True)
    assert [len(list_snapshots(store, "demo", c)) for c in categories] == [1, 1]


def _server_without(*dropped: str):
    """The demo catalogue over real sockets, its responses stripped of the ``dropped`` headers."""
    from scrape_assets.demo_site import DemoRequestHandler, DemoResponse, DemoServer

    class Handler(DemoRequestHandler):
        def send_demo_response(self, response):
            kept = {k: v for k, v in response.headers.items() if k.lower() not in dropped}
            super().send_demo_response(DemoResponse(response.status, kept, response.body))

    return DemoServer(("127.0.0.1", 0), Handler)


def test_without_validators_the_content_hash_decides_and_an_unchanged_body_is_not_stored_again(tmp_path, instance):
    from scrape_assets_tests.conftest import serving

    with serving(_server_without("etag", "last-modified")) as server:
        res = make_resources(tmp_path, base_url=server.base_url)
        assert materialize(instance, res, ["travel", "mystery"]).success
        store = ObjectStore(str(tmp_path / "objects"))
        first = {c: latest_manifest(store, "demo", c) for c in PAGES}
        assert all(p.etag is None and p.last_modified is None for m in first.values() for p in m.pages.values())
        server.clear_requests()
        second_run = materialize(instance, res, ["travel", "mystery"])
        assert second_run.success
        requests = _page_requests(server)
    # Nothing to validate with: plain GETs, full 200s.
    assert len(requests) == 3 and [r.status for r in requests] == [200] * 3
    assert not any("if-none-match" in r.headers or "if-modified-since" in r.headers for r in requests)
    for category, pages in PAGES.items():
        second = latest_manifest(store, "demo", category)
        assert second.snapshot_id != first[category].snapshot_id
        for n in range(1, pages + 1):
            entry = second.pages[n]
            assert (entry.http_status, entry.not_modified) == (200, False)
            assert entry.content_hash == first[category].pages[n].content_hash
            assert entry.body_key == first[category].page_key(n)  # the body stored the first time
            assert entry.body_fetched_at == first[category].pages[n].fetched_at  # and fetched then
        assert not store.exists(f"{second.prefix}/pages")
        assert second.data_version == first[category].data_version
    md = run_metadata(second_run)
    assert (md["raw_pages"]["pages_unchanged"], md["raw_pages"]["pages_not_modified"], md["raw_pages"]["bytes_stored"]) == (3, 0, 0)
    assert (md["parsed_products"]["pages_parsed"], md["products_table"]["rows_loaded"]) == (0, 0)


def test_after_the_base_url_changes_unchanged_pages_are_asked_whole_but_not_stored_again(tmp_path, instance, demo_server):
    """A mirror (another SCRAPE_BASE_URL): no saved copy has the pages' new URLs, so no validator
    is sent (they belong to the other URLs), and the content hash finds the bytes already saved."""
    from scrape_assets.demo_site import make_server
    from scrape_assets_tests.conftest import serving

    assert materialize(instance, make_resources(tmp_path, base_url=demo_server.base_url), list(PAGES)).success
    store = ObjectStore(str(tmp_path / "objects"))
    first = {c: latest_manifest(store, "demo", c) for c in PAGES}
    with serving(make_server("127.0.0.1", 0)) as mirror:
        second_run = materialize(instance, make_resources(tmp_path, base_url=mirror.base_url), list(PAGES))
        requests = _page_requests(mirror)
    assert second_run.success
    assert len(requests) == 3 and [r.status for r in requests] == [200] * 3
    assert not any("if-none-match" in r.headers or "if-modified-since" in r.headers for r in requests)
    for category, pages in PAGES.items():
        second = latest_manifest(store, "demo", category)
        for n in range(1, pages + 1):
            entry = second.pages[n]
            assert entry.url.startswith(mirror.base_url) and not first[category].pages[n].url.startswith(mirror.base_url)
            assert (entry.http_status, entry.not_modified) == (200, False)
            assert entry.body_key == first[category].page_key(n)  # the body stored from the other address
            assert entry.body_fetched_at == first[category].pages[n].fetched_at  # and fetched then
            assert entry.etag is not None and entry.bytes == first[category].pages[n].bytes
        assert not store.exists(f"{second.prefix}/pages")
        assert second.data_version == first[category].data_version
    md = run_metadata(second_run)
    assert (md["raw_pages"]["pages_unchanged"], md["raw_pages"]["bytes_stored"]) == (3, 0)
    assert (md["parsed_products"]["pages_parsed"], md["products_table"]["rows_loaded"]) == (0, 0)

    # A prune keeps what the mirror's snapshots read: the first snapshot, whose parse stands for them.
    from scrape_assets.retention import prune

    plans = prune(store, "demo", list(PAGES), keep=1, owner="test")
    assert [(p.category, p.kept_for_parse, p.deleted) for p in plans] == [
        (c, [first[c].snapshot_id], []) for c in ("travel", "mystery")]
    for category, pages in PAGES.items():
        latest = latest_manifest(store, "demo", category)
        assert all(len(store.read_bytes(latest.body_key(n))) == latest.pages[n].bytes for n in range(1, pages + 1))


def test_last_modified_alone_is_revalidated_with_if_modified_since(tmp_path, instance):
    from scrape_assets_tests.conftest import serving

    with serving(_server_without("etag")) as server:
        res = make_resources(tmp_path, base_url=server.base_url)
        assert materialize(instance, res, ["mystery"], selection=["raw_pages"]).success
        store = ObjectStore(str(tmp_path / "objects"))
        first = latest_manifest(store, "demo", "mystery")
        server.clear_requests()
        assert materialize(instance, res, ["mystery"], selection=["raw_pages"]).success
        requests = _page_requests(server)
    assert [r.status for r in requests] == [304, 304]
    for request in requests:
        assert "if-none-match" not in request.headers
        assert request.headers["if-modified-since"] == first.pages[1].last_modified
    second = latest_manifest(store, "demo", "mystery")
    assert all(e.not_modified and e.body_key == first.page_key(n) for n, e in second.pages.items())


def test_an_etag_that_cannot_be_sent_back_is_not_kept_and_later_runs_still_revalidate(tmp_path, instance):
    """RFC 9110 allows obs-text in an entity tag; the client sends ASCII only. A run that kept
    ``"café"`` would fail every later request of that page (UnicodeEncodeError), day after day."""
    from scrape_assets.demo_site import DemoRequestHandler, DemoResponse, DemoServer
    from scrape_assets_tests.conftest import serving

    class Handler(DemoRequestHandler):
        def send_demo_response(self, response):
            headers = {**response.headers, "ETag": '"café"'}  # sent as latin-1 bytes by http.server
            super().send_demo_response(DemoResponse(response.status, headers, response.body))

    with serving(DemoServer(("127.0.0.1", 0), Handler)) as server:
        res = make_resources(tmp_path, base_url=server.base_url)
        assert materialize(instance, res, ["mystery"], selection=["raw_pages"]).success
        store = ObjectStore(str(tmp_path / "objects"))
        first = latest_manifest(store, "demo", "mystery")
        assert [(e.etag, e.last_modified is not None) for e in first.pages.values()] == [(None, True)] * 2
        # A manifest written before this rule (or by hand) still holds one: it is not sent either.
        first.pages[1].etag = '"café"'
        first.save(store)
        server.clear_requests()
        assert materialize(instance, res, ["mystery"], selection=["raw_pages"]).success
        requests = _page_requests(server)
    assert [r.status for r in requests] == [304, 304]  # revalidated with If-Modified-Since alone
    assert not any("if-none-match" in r.headers for r in requests)
    assert all(r.headers["if-modified-since"] == first.pages[2].last_modified for r in requests)


def test_a_changed_page_served_without_validators_does_not_keep_the_old_ones(tmp_path, instance):
    """The saved copy's ETag belongs to the saved body: a 304 to it must never stand for a new body."""
    from scrape_assets.demo_site import DemoRequestHandler, DemoResponse, DemoServer, respond
    from scrape_assets_tests.conftest import serving

    class Handler(DemoRequestHandler):
        def send_demo_response(self, response):
            if self.server.changed:  # new content, and no validators at all
                fresh = respond(self.command, self.path)
                body = fresh.body + b"<!-- changed -->"
                headers = {k: v for k, v in fresh.headers.items() if k not in ("ETag", "Last-Modified")}
                response = DemoResponse(200, {**headers, "Content-Length": str(len(body))}, body)
            super().send_demo_response(response)

    server = DemoServer(("127.0.0.1", 0), Handler)
    server.changed = False
    with serving(server):
        res = make_resources(tmp_path, base_url=server.base_url)
        assert materialize(instance, res, ["travel"], selection=["raw_pages"]).success
        server.changed = True
        assert materialize(instance, res, ["travel"], selection=["raw_pages"]).success
        store = ObjectStore(str(tmp_path / "objects"))
        entry = latest_manifest(store, "demo", "travel").pages[1]
        assert (entry.http_status, entry.etag, entry.last_modified) == (200, None, None)
        server.clear_requests()
        assert materialize(instance, res, ["travel"], selection=["raw_pages"]).success
        (request,) = _page_requests(server)
    assert "if-none-match" not in request.headers and "if-modified-since" not in request.headers


def _next_day_pair():
    """Two neighbouring categories (partition order) of which only the first changes on day 2."""
    from scrape_assets.defs.partitions import category_partitions
    from scrape_assets.demo_site import changed_categories

    day2 = datetime.date(2026, 12, 1)
    keys = category_partitions.get_partition_keys()
    changed = changed_categories(day2)
    for a, b in zip(keys, keys[1:]):
        if (a in changed) != (b in changed):
            return (a, b) if a in changed else (b, a), [a, b]
    raise AssertionError("the seeded schedule changes some but not all categories on day 2")


def _on_day(day, port, run):
    """``run(base_url)`` against the demo catalogue of ``day`` served on ``port`` (0: any); returns the port."""
    from scrape_assets.demo_site import make_server
    from scrape_assets_tests.conftest import serving

    with serving(make_server("127.0.0.1", port, day=day)) as server:
        run(server.base_url)
        return server.server_address[1]


def test_staleness_follows_each_category_in_runs_of_one_category(tmp_path, instance):
    """The UI (Dagster's stale-status resolver) after a crawl of the next day, one run per
    category: the changed category's parsed_products is stale (new data), the unchanged one
    fresh; raw_pages' Dagster data version is its snapshot's, derived from the pages' hashes."""
    from dagster._core.definitions.data_version import DATA_VERSION_TAG, StaleCauseCategory, StaleStatus
    from dagster._utils.test.data_versions import get_stale_status_resolver

    from scrape_assets.defs.assets.dead_letters import dead_letters
    from scrape_assets.defs.assets.parsed_products import parsed_products
    from scrape_assets.defs.assets.products_table import products_table
    from scrape_assets.defs.assets.raw_pages import raw_pages

    (changed, unchanged), _ = _next_day_pair()
    graph = [raw_pages, parsed_products, products_table, dead_letters]
    store = ObjectStore(str(tmp_path / "objects"))
    versions = {}

    def crawl(selection):
        def run(base_url):
            res = make_resources(tmp_path, base_url=base_url)
            for key in (changed, unchanged):
                result = materialize(instance, res, [key], selection=selection or ALL_ASSETS)
                assert result.success
                event = next(e for e in result.get_asset_materialization_events() if e.asset_key == dg.AssetKey("raw_pages"))
                versions.setdefault(key, []).append(event.materialization.tags[DATA_VERSION_TAG])
                assert versions[key][-1] == latest_manifest(store, "demo", key).data_version
        return run

    port = _on_day(datetime.date(2026, 11, 30), 0, crawl(None))
    resolver = get_stale_status_resolver(instance, graph)
    assert {k: resolver.get_status(dg.AssetKey("parsed_products"), k) for k in (changed, unchanged)} == {
        changed: StaleStatus.FRESH, unchanged: StaleStatus.FRESH}

    _on_day(datetime.date(2026, 12, 1), port, crawl(["raw_pages"]))
    assert versions[changed][0] != versions[changed][1] and versions[unchanged][0] == versions[unchanged][1]
    resolver = get_stale_status_resolver(instance, graph)
    assert resolver.get_status(dg.AssetKey("parsed_products"), unchanged) == StaleStatus.FRESH
    assert resolver.get_status(dg.AssetKey("products_table"), unchanged) == StaleStatus.FRESH
    assert resolver.get_status(dg.AssetKey("parsed_products"), changed) == StaleStatus.STALE
    causes = resolver.get_stale_causes(dg.AssetKey("parsed_products"), changed)
    assert [(c.category, c.dependency.asset_key, c.dependency.partition_key) for c in causes] == [
        (StaleCauseCategory.DATA, dg.AssetKey("raw_pages"), changed)]


def test_a_run_over_several_categories_marks_all_of_them_stale_when_one_changed(tmp_path, instance):
    """The documented limit (README, Incremental refresh): Dagster gives a run over a range
    one output, so one data version for all its partitions. What is re-parsed still follows
    each category's own version: only the changed one."""
    from dagster._core.definitions.data_version import StaleStatus
    from dagster._utils.test.data_versions import get_stale_status_resolver

    from scrape_assets.defs.assets.dead_letters import dead_letters
    from scrape_assets.defs.assets.parsed_products import parsed_products
    from scrape_assets.defs.assets.products_table import products_table
    from scrape_assets.defs.assets.raw_pages import raw_pages

    (changed, unchanged), pair = _next_day_pair()
    graph = [raw_pages, parsed_products, products_table, dead_letters]
    results = []

    def run(selection):
        return lambda base_url: results.append(materialize(instance, make_resources(tmp_path, base_url=base_url), pair,
                                                           selection=selection or ALL_ASSETS))

    port = _on_day(datetime.date(2026, 11, 30), 0, run(None))
    _on_day(datetime.date(2026, 12, 1), port, run(["raw_pages"]))
    resolver = get_stale_status_resolver(instance, graph)
    assert {k: resolver.get_status(dg.AssetKey("parsed_products"), k) for k in pair} == {k: StaleStatus.STALE for k in pair}

    _on_day(datetime.date(2026, 12, 1), port, run(None))
    parsed = run_metadata(results[-1])["parsed_products"]["by_category"]
    assert {k for k in pair if not parsed[k]["unchanged"]} == {changed}
    resolver = get_stale_status_resolver(instance, graph)
    assert {k: resolver.get_status(dg.AssetKey("parsed_products"), k) for k in pair} == {k: StaleStatus.FRESH for k in pair}


def test_a_snapshot_completed_after_midnight_files_its_prices_under_that_day(tmp_path, instance):
    """A run killed late one evening and resumed by the next morning's run completes its
    snapshot the next day: its prices are that day's in price_history (the day it started
    has no complete snapshot), not the start's, which would leave the next day empty."""
    res = make_resources(tmp_path)
    assert materialize(instance, res, ["travel"], selection=["raw_pages"]).success
    store = ObjectStore(str(tmp_path / "objects"))
    manifest = latest_manifest(store, "demo", "travel")
    # as if started on 2031-01-01 at 22:00 and completed on resume after midnight
    manifest.completed_at = "2031-01-02T02:03:04Z"
    manifest.save(store)
    assert materialize(instance, res, ["travel"], selection=["parsed_products", "products_table"]).success
    history = Warehouse(f"sqlite:///{tmp_path / 'warehouse.db'}").rows(price_history)
    assert {r["snapshot_date"] for r in history} == {"2031-01-02"} and len(history) == 11
    assert {r["snapshot_id"] for r in history} == {manifest.snapshot_id}


def test_an_unchanged_day_files_its_prices_under_its_own_day_and_snapshot(tmp_path, instance):
    """The usual day: every page 304, nothing re-parsed. The parse state must still stand for
    the new snapshot, or the day's prices would overwrite the previous day's rows under the
    previous snapshot and today would have none."""
    import dataclasses

    from scrape_assets.extract import load_parse_state, save_parse_state

    res = make_resources(tmp_path)
    assert materialize(instance, res, ["travel"]).success
    store = ObjectStore(str(tmp_path / "objects"))
    first = latest_manifest(store, "demo", "travel", complete=True)
    # As if the first run had been on 2031-01-01 (its snapshot, the parse state standing for it, its prices).
    first.completed_at = "2031-01-01T02:00:00Z"
    first.save(store)
    state = load_parse_state(store, "demo", "travel")
    save_parse_state(store, "demo", "travel", dataclasses.replace(state, latest_completed_at=first.completed_at))
    wh = Warehouse(f"sqlite:///{tmp_path / 'warehouse.db'}")
    with wh.engine.begin() as conn:
        conn.execute(price_history.update().values(snapshot_date="2031-01-01"))
    second = materialize(instance, res, ["travel"])
    assert second.success and run_metadata(second)["parsed_products"]["partitions_unchanged"] == 1
    today = latest_manifest(store, "demo", "travel", complete=True)
    assert today.snapshot_id != first.snapshot_id
    by_day = {}
    for r in wh.rows(price_history):
        by_day.setdefault(r["snapshot_date"], set()).add(r["snapshot_id"])
    assert by_day == {"2031-01-01": {first.snapshot_id}, today.completed_at[:10]: {today.snapshot_id}}
    assert len(wh.rows(price_history)) == 2 * 11
