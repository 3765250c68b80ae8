"""The whole graph through a real Dagster instance on the demo catalogue."""

from __future__ import annotations

import http.client
import json
import logging
import os
import re
import shutil
import sqlite3
import sys
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from decimal import Decimal
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources as importlib_resources
from pathlib import Path
from urllib.parse import urlsplit

import dagster as dg
import pytest
import yaml

from scrape_assets.demo_site import catalogue
from scrape_assets.manifest import latest_manifest, list_snapshots
from scrape_assets.storage import ObjectStore
from scrape_assets.warehouse import Warehouse, dead_letters, price_history, products
from scrape_assets_tests.conftest import make_resources, materialize, run_metadata, serving

CATEGORIES = ["travel", "mystery", "classics"]  # consecutive in demo.yaml, so one range
BUSINESS_COLUMNS = ("category", "product_id", "title", "price", "currency", "rating", "availability", "url", "page_number")


def _table(tmp_path, columns=None):
    rows = Warehouse(f"sqlite:///{tmp_path / 'warehouse.db'}").rows(products)
    return [tuple(r[c] for c in (columns or r.keys())) for r in rows]


def test_whole_graph_loads_expected_rows_and_rerun_gives_same_table(tmp_path, instance):
    res = make_resources(tmp_path)
    result = materialize(instance, res, CATEGORIES)
    assert result.success
    materialized = Counter(e.asset_key.path[0] for e in result.get_asset_materialization_events())
    assert materialized == {"raw_pages": 3, "parsed_products": 3, "products_table": 3, "dead_letters": 3}
    checks = {c.check_name: c.passed for c in result.get_asset_check_evaluations()}
    assert checks == {"parsed_products_match_schema": True, "parsed_products_match_site_count": True,
                      "products_table_matches_parsed": True}

    # Each partition's materialization carries the run totals and only its own category's
    # row of the per-category tables (the event log grows with N categories, not N²).
    tables = {"raw_pages": "by_category", "parsed_products": "by_category", "products_table": "rows_by_category",
              "dead_letters": "by_category"}
    for e in result.get_asset_materialization_events():
        table = e.materialization.metadata[tables[e.asset_key.path[0]]].value
        assert list(table) == [e.materialization.partition], e.asset_key
    md = run_metadata(result)["raw_pages"]
    assert md["pages_done"] == 1 + 2 + 1 and md["pages_failed"] == 0 and md["categories"] == 3
    assert md["success_rate"] == 1.0
    assert md["products_expected"] == 11 + 32 + 19
    assert {c: v["pages_done"] for c, v in md["by_category"].items()} == {"travel": 1, "mystery": 2, "classics": 1}

    # Every product of the demo catalogue for these categories, with today's prices.
    demo = catalogue()
    expected = {
        (key, str(p.id), p.title, p.price) for key in CATEGORIES for p in demo.category(key).products
    }
    first = _table(tmp_path)
    assert {(r[0], r[1], r[2], r[3]) for r in first} == expected
    assert len(first) == 62
    assert all(r[4] == "GBP" for r in first)
    assert all(r[7].startswith("http://demo.scrape-assets.invalid/catalogue/") for r in first)

    # A full rerun fetches a new snapshot and produces the same table (business columns).
    again = materialize(instance, res, CATEGORIES)
    assert again.success
    store = ObjectStore(str(tmp_path / "objects"))
    assert len(list_snapshots(store, "demo", "travel")) == 2
    assert _table(tmp_path, BUSINESS_COLUMNS) == [tuple(r[:9]) for r in first]

    # Re-parsing the same snapshot gives a byte-for-byte identical table (all columns).
    before = _table(tmp_path)
    reparse = materialize(instance, res, CATEGORIES, selection=["parsed_products", "products_table", "dead_letters"])
    assert reparse.success
    assert _table(tmp_path) == before
    assert Warehouse(f"sqlite:///{tmp_path / 'warehouse.db'}").duplicate_product_keys() == []


def test_products_check_reports_a_partition_whose_rows_did_not_all_arrive(tmp_path, instance, monkeypatch):
    """The check compares each reloaded partition's rows in the table with the rows parsed."""
    from scrape_assets import warehouse

    loader = warehouse.insert_many

    def loses_a_mystery_row(conn, table, rows):  # a loader bug: one row of one partition goes missing
        loader(conn, table, rows[:-1] if table is products and rows and rows[0]["category"] == "mystery" else rows)

    monkeypatch.setattr(warehouse, "insert_many", loses_a_mystery_row)
    result = materialize(instance, make_resources(tmp_path), CATEGORIES)
    check = {c.check_name: c for c in result.get_asset_check_evaluations()}["products_table_matches_parsed"]
    assert not check.passed
    assert check.metadata["problems"].value == [
        {"category": "mystery", "rows_parsed": 32, "rows_carried_forward": 0, "rows_in_table": 31, "duplicates": 0}
    ]
    assert check.metadata["categories_checked"].value == 3
    assert run_metadata(result)["products_table"]["rows_by_category"] == {"travel": 11, "mystery": 31, "classics": 19}


def test_backfill_with_server_stopped_reparses_without_any_request(tmp_path, instance, demo_server):
    res = make_resources(tmp_path, base_url=demo_server.base_url)
    assert materialize(instance, res, ["travel", "mystery"]).success
    requests_before = demo_server.request_count()
    assert requests_before == 1 + 1 + 2  # robots.txt + travel + mystery x2
    table_before = _table(tmp_path)
    # Product URLs are canonical (the spec's base), even though fetched from 127.0.0.1.
    assert all(r[7].startswith("http://demo.scrape-assets.invalid/") for r in table_before)
    demo_server.shutdown()
    demo_server.server_close()

    backfill = materialize(instance, res, ["travel", "mystery"], selection=["parsed_products", "products_table"])
    assert backfill.success
    assert _table(tmp_path) == table_before
    assert demo_server.request_count() == requests_before


def _broken_spec(tmp_path, field: str = "price", css: str = "p.price_tag") -> str:
    """The demo spec with a selector changed, as if the site's layout changed overnight."""
    data = yaml.safe_load(importlib_resources.files("scrape_assets.sites").joinpath("demo.yaml").read_text())
    data["selectors"][field] = {**data["selectors"][field], "css": css}
    path = tmp_path / f"demo_changed_{field}.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


_DIE_MARKER: Path | None = None  # set by the test below; forked parse workers inherit it


def _dies_once_on_mystery(store, manifest, spec):  # module level: the pool pickles it by name
    from scrape_assets import parse_run

    if manifest.category == "mystery" and not _DIE_MARKER.exists():
        _DIE_MARKER.touch()
        classics_done = _DIE_MARKER.with_name("classics-done")
        deadline = time.monotonic() + 60
        while not classics_done.exists() and time.monotonic() < deadline:  # the other worker's
            time.sleep(0.01)
        time.sleep(0.3)  # its result on its way to the step's process
        os._exit(137)  # as the kernel's OOM killer ends a worker
    result = parse_run._parse_and_validate.__wrapped__(store, manifest, spec)
    if manifest.category == "classics" and _DIE_MARKER is not None:
        _DIE_MARKER.with_name("classics-done").touch()
    return result


def test_a_parse_worker_killed_mid_parse_retries_the_step_which_parses_only_the_unfinished(tmp_path, instance,
                                                                                           monkeypatch):
    """Step-level retries cover crashes: a worker killed by the system (out of memory) failed
    parsed_products for good although a retry would finish it; now the step tries again."""
    from scrape_assets import parse_run
    from scrape_assets.defs.assets import parsed_products as module

    res = make_resources(tmp_path)
    assert materialize(instance, res, CATEGORIES, selection=["raw_pages"]).success
    monkeypatch.setattr(sys.modules[__name__], "_DIE_MARKER", tmp_path / "died")
    real = parse_run._parse_and_validate
    monkeypatch.setattr(parse_run, "_parse_and_validate", _dies_once_on_mystery)
    monkeypatch.setattr(_dies_once_on_mystery, "__wrapped__", real, raising=False)
    monkeypatch.setattr(module, "WORKER_DIED_WAIT_S", 0.0)
    result = materialize(instance, res, CATEGORIES, selection=["parsed_products", "products_table"],
                         run_config={"ops": {"parsed_products": {"config": {"parse_workers": 2}}}})
    assert result.success and (tmp_path / "died").exists()
    retried = [e for e in result.all_events if e.event_type_value == "STEP_UP_FOR_RETRY"]
    assert [e.step_key for e in retried] == ["parsed_products"]
    md = run_metadata(result)["parsed_products"]
    assert (md["pages_parsed"], md["partitions_unchanged"]) == (2, 2)  # the retry parsed mystery's 2 pages only
    assert Counter(r[0] for r in _table(tmp_path)) == {"travel": 11, "mystery": 32, "classics": 19}


def test_a_parse_worker_that_keeps_dying_fails_the_step_after_its_retries(tmp_path, instance, monkeypatch):
    from scrape_assets import parse_run
    from scrape_assets.defs.assets import parsed_products as module

    def dies(*args, **kwargs):
        raise parse_run.ParseWorkerDied("a parse worker process died (killed by the system: out of memory?) while "
                                        "parsing one of mystery")
        yield  # a generator, as parse_partitions is

    res = make_resources(tmp_path)
    assert materialize(instance, res, CATEGORIES, selection=["raw_pages"]).success
    monkeypatch.setattr(parse_run, "parse_partitions", dies)
    monkeypatch.setattr(module, "WORKER_DIED_WAIT_S", 0.0)
    result = materialize(instance, res, CATEGORIES, selection=["parsed_products", "products_table"],
                         raise_on_error=False)
    assert not result.success
    assert len([e for e in result.all_events if e.event_type_value == "STEP_UP_FOR_RETRY"]) == module.WORKER_DIED_RETRIES
    (failure,) = [e for e in result.all_events if e.event_type_value == "STEP_FAILURE"]
    assert failure.step_failure_data.user_failure_data.description == (
        "a parse worker process died (killed by the system: out of memory?) while parsing one of mystery "
        "(after 2 retries)")


def test_a_category_with_fewer_cards_than_its_site_counts_is_a_warning_not_a_failure(tmp_path, instance):
    """max_pages (or a pager the spec misreads) stops the crawl early: the rows load, but the
    non-blocking count check says the site shows more results than the pages held."""
    data = yaml.safe_load(importlib_resources.files("scrape_assets.sites").joinpath("demo.yaml").read_text())
    data["pagination"]["max_pages"] = 3
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(data))
    result = materialize(instance, make_resources(tmp_path, site=str(tmp_path / "spec.yaml")), ["default"])
    assert result.success
    check = {c.check_name: c for c in result.get_asset_check_evaluations()}["parsed_products_match_site_count"]
    assert (check.passed, check.severity) == (False, dg.AssetCheckSeverity.WARN)
    assert check.metadata["mismatched"].value == {"default": {"cards_found": 60, "site_says": 232}}
    assert check.metadata["categories_compared"].value == 1
    assert len(_table(tmp_path)) == 60  # loaded all the same
    warnings = [e.user_message for e in instance.all_logs(result.run_id) if e.level == logging.WARNING]
    assert ("default: 60 product cards found on its pages, the site says 232 results: pages the crawl did not reach "
            "(pagination, the spec's max_pages)?") in warnings
    # and `scrape-assets demo`'s account of the run says so beside its other figures
    import io

    from scrape_assets.cli import print_summary, run_figures

    run = run_figures(result)
    assert run["categories_short_of_site_count"] == {"default": {"cards_found": 60, "site_says": 232}}
    out = io.StringIO()
    print_summary({"site": "demo", "categories": 1, "categories_configured": 12, "pages_done": 3, "pages_failed": 0,
                   "success_rate": 1.0, "products_loaded": 60, "dead_letters": 0, "object_storage": "/d/objects",
                   "warehouse": "sqlite:////d/warehouse.db", "warehouse_site": "demo"}, run, out=out)
    assert ("  fewer cards     than the site counts in 1 category: default (60 of 232) (pages the crawl did not reach: "
            "pagination, the spec's max_pages?)") in out.getvalue().splitlines()
    out = io.StringIO()  # no card at all: the product selector, not the pagination
    print_summary({"site": "demo", "categories": 1, "categories_configured": 12, "pages_done": 3, "pages_failed": 0,
                   "success_rate": 1.0, "products_loaded": 0, "dead_letters": 0, "object_storage": "/d/objects",
                   "warehouse": "sqlite:////d/warehouse.db", "warehouse_site": "demo"},
                  {**run, "categories_short_of_site_count": {"default": {"cards_found": 0, "site_says": 232}}}, out=out)
    assert ("  fewer cards     than the site counts in 1 category: default (0 of 232) (no card at all: does the spec's "
            "selectors.product still match the site's markup?)") in out.getvalue().splitlines()


def test_a_product_selector_matching_nothing_without_a_results_count_is_named_in_the_log(tmp_path, instance):
    """Without pagination.results_count (or a pager) an empty listing and an unreadable one look
    alike, so the schema passes; the category's parse line says what to check."""
    data = yaml.safe_load(importlib_resources.files("scrape_assets.sites").joinpath("demo.yaml").read_text())
    data["selectors"]["product"] = "li.products"
    del data["pagination"]["results_count"]
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(data))
    result = materialize(instance, make_resources(tmp_path, site=str(tmp_path / "spec.yaml")), ["travel"])
    assert result.success
    assert any("travel: parsed 0 products from 1 page of snapshot " in e.user_message and e.user_message.endswith(
        "(0 rejected cards; schema passed): no product card found; if the category is not empty, check the spec's "
        "selectors.product (with pagination.results_count the schema check tells an empty listing from one it "
        "cannot read)") for e in instance.all_logs(result.run_id))


def test_blocking_check_stops_products_table_and_earlier_rows_stay(tmp_path, instance):
    good = make_resources(tmp_path)
    assert materialize(instance, good, ["travel"]).success
    before = _table(tmp_path)
    assert len(before) == 11

    broken = make_resources(tmp_path, site=_broken_spec(tmp_path))
    result = materialize(instance, broken, ["travel"], raise_on_error=False)
    checks = {c.check_name: c for c in result.get_asset_check_evaluations()}
    check = checks["parsed_products_match_schema"]
    assert check.passed is False
    cases = check.metadata["failure_cases"].value
    guard = [case for case in cases if case["check"] == "layout_guard"]
    assert guard and "zero products" in guard[0]["message"]
    assert guard[0]["failure_case"]["category"] == "travel" and guard[0]["failure_case"]["page_number"] == 1
    assert check.metadata["failure_count"].value >= 1
    materialized = {e.asset_key.path[0] for e in result.get_asset_materialization_events()}
    assert "products_table" not in materialized
    # Held back by the blocking check, never started (its own guard against unvalidated rows is a second line).
    started = [e.step_key for e in result.all_events if e.event_type_value == "STEP_START"]
    assert started == ["raw_pages", "parsed_products"]
    assert _table(tmp_path) == before  # the earlier rows of the partition stay
    # `scrape-assets demo` says why in its summary, in the words of the run-failure alert
    from scrape_assets.cli import run_failure_reason

    assert run_failure_reason(instance, result).startswith(
        "parsed_products_match_schema failed for travel (reject reasons: \"price: no element matches 'p.price_tag'\" x11; "
        "pages: layout_guard x1 (page 1; ")

    # products_table launched alone (the UI, the CLI) refuses the partition its check held back.
    assert _products_table_alone_refused(instance, broken, ["travel"]) == (
        "parsed rows of travel failed the schema (see the parsed_products_match_schema check); products_table not "
        "changed")
    assert _table(tmp_path) == before


def _products_table_alone_refused(instance, resources, categories) -> str:
    """products_table launched alone (the UI, the CLI) over ``categories``: the run fails; its step failure's text."""
    alone = materialize(instance, resources, categories, selection=["products_table"], raise_on_error=False)
    assert not alone.success
    (failure,) = [e for e in alone.all_events if e.event_type_value == "STEP_FAILURE"]
    return failure.step_failure_data.user_failure_data.description


def test_products_table_over_several_categories_refuses_them_all_when_one_failed_the_schema(tmp_path, instance):
    """A range launched on products_table alone (the UI, the CLI) where one category's rows failed
    the schema: nothing of the range is loaded, not even the categories that passed, and the
    failure names the one that failed."""
    good = make_resources(tmp_path)
    assert materialize(instance, good, ["travel", "mystery"]).success
    before = _table(tmp_path)
    broken = make_resources(tmp_path, site=_broken_spec(tmp_path))
    parsed = materialize(instance, broken, ["mystery"], selection=["parsed_products"], raise_on_error=False)
    assert {c.check_name: c.passed for c in parsed.get_asset_check_evaluations()}["parsed_products_match_schema"] is False
    # travel's input changed too (a parser fix): it would be reloaded if the range were loaded
    parsed = materialize(instance, make_resources(tmp_path, site=_broken_spec(tmp_path, "availability", "p.instock.availability")),
                         ["travel"], selection=["parsed_products"])
    assert parsed.success and run_metadata(parsed)["parsed_products"]["pages_parsed"] == 1
    assert _products_table_alone_refused(instance, good, ["travel", "mystery"]) == (
        "parsed rows of mystery failed the schema (see the parsed_products_match_schema check); products_table not "
        "changed")
    assert _table(tmp_path) == before
    wh = Warehouse(f"sqlite:///{tmp_path / 'warehouse.db'}")
    assert len(wh.rows(price_history)) == 11 + 32  # no day written for travel either


def test_rejected_cards_count_as_cards_found_against_the_sites_results_count(tmp_path, instance):
    """Cards the parser rejected were on the pages: the count check (pages not reached) counts
    them, so a selector that stops matching some cards fails the schema, not the count."""
    partial = make_resources(tmp_path, site=_broken_spec(tmp_path, "rating", "p.star-rating:not(.Five)"))
    result = materialize(instance, partial, ["mystery"], raise_on_error=False)
    checks = {c.check_name: c for c in result.get_asset_check_evaluations()}
    assert checks["parsed_products_match_schema"].passed is False
    parsed = run_metadata(result)["parsed_products"]["by_category"]["mystery"]
    assert parsed["rejects"] > 0 and parsed["products"] + parsed["rejects"] == 32
    count = checks["parsed_products_match_site_count"]
    assert count.passed and count.metadata["mismatched"].value == {}
    assert count.metadata["categories_compared"].value == 1


def test_a_selector_that_stops_matching_some_cards_blocks_the_load(tmp_path, instance):
    """Five-star cards lose their rating element: their products must not silently leave the table."""
    assert materialize(instance, make_resources(tmp_path), ["travel", "mystery"]).success
    before = _table(tmp_path)
    partial = make_resources(tmp_path, site=_broken_spec(tmp_path, "rating", "p.star-rating:not(.Five)"))
    result = materialize(instance, partial, ["travel", "mystery"], raise_on_error=False)
    check = {c.check_name: c for c in result.get_asset_check_evaluations()}["parsed_products_match_schema"]
    assert check.passed is False
    cases = check.metadata["failure_cases"].value
    assert {c["check"] for c in cases} == {"rejected_share"}  # every page still has products: no layout_guard
    assert all(c["failure_case"]["products_parsed"] < c["failure_case"]["cards_found"] for c in cases)
    # Which field stopped parsing, counted per category (its dead letters are not written: the check blocks).
    reasons = {c["failure_case"]["category"]: c["reject_reasons"] for c in cases}
    for category, by_reason in reasons.items():
        assert list(by_reason) == ["rating: no element matches 'p.star-rating:not(.Five)'"], category
        assert by_reason[list(by_reason)[0]] == sum(
            c["failure_case"]["cards_found"] - c["failure_case"]["products_parsed"]
            for c in cases if c["failure_case"]["category"] == category)
    assert "products_table" not in {e.asset_key.path[0] for e in result.get_asset_materialization_events()}
    assert _table(tmp_path) == before  # nothing dropped

    # A site where such cards are expected: the spec raises the allowed share, and the next run
    # validates the saved rows again (no re-parse, no request) and loads them.
    spec = yaml.safe_load(Path(partial["site"].site).read_text())
    spec["validation"] = {"max_rejected_share": 0.5}
    Path(partial["site"].site).write_text(yaml.safe_dump(spec))
    result = materialize(instance, partial, ["travel", "mystery"], selection=["parsed_products", "products_table"])
    assert result.success
    assert run_metadata(result)["parsed_products"]["pages_parsed"] == 0
    lines = [e.user_message for e in instance.all_logs(result.run_id) if "validated again" in e.user_message]
    assert any(re.search(r"  mystery: unchanged since snapshot \S+: 0 pages re-parsed; its \d+ products and \d+ "
                         r"rejected cards? validated again under validation.max_rejected_share 0.5 \(was 0.05\) "
                         r"\(schema passed\)", line) for line in lines), lines
    assert any("2 categories unchanged (2 of them validated again)" in line for line in lines), lines
    # The five-star products are still listed, their cards rejected: their earlier rows stay,
    # carried forward (older snapshot_id), as for a page that failed.
    table = run_metadata(result)["products_table"]
    assert 0 < table["rows_carried_forward"] == len(before) - table["rows_loaded"]
    assert {r[:2] for r in _table(tmp_path)} == {r[:2] for r in before}
    loaded = _table(tmp_path)

    # Lowered back to the default: the same saved rows are judged again (not left passed
    # under the old share until their pages change), fail, and the table stays as it was.
    del spec["validation"]
    Path(partial["site"].site).write_text(yaml.safe_dump(spec))
    result = materialize(instance, partial, ["travel", "mystery"], selection=["parsed_products", "products_table"],
                         raise_on_error=False)
    check = {c.check_name: c for c in result.get_asset_check_evaluations()}["parsed_products_match_schema"]
    assert check.passed is False and check.metadata["rows_checked"].value > 0
    assert {c["check"] for c in check.metadata["failure_cases"].value} == {"rejected_share"}
    assert run_metadata(result)["parsed_products"]["pages_parsed"] == 0
    assert any(re.search(r"  mystery: unchanged since snapshot \S+: 0 pages re-parsed; its \d+ products and \d+ rejected "
                         r"cards? validated again under validation.max_rejected_share 0.05 \(was 0.5\) \(schema FAILED\)",
                         e.user_message) for e in instance.all_logs(result.run_id)), "no re-validation line"
    assert "products_table" not in {e.asset_key.path[0] for e in result.get_asset_materialization_events()}
    assert _table(tmp_path) == loaded


def test_a_card_whose_product_id_cannot_be_read_keeps_every_earlier_row_not_seen(tmp_path, instance):
    """The site changes the URLs of some products overnight (here: ids with an odd last digit
    no longer match product_id.regex): their cards are rejected without an id, so which row
    each one stands for is unknown. The next snapshot keeps every earlier row it did not see
    rather than deleting those products, and says how many it kept."""
    assert materialize(instance, make_resources(tmp_path), ["mystery"]).success
    before = {r[0]: r for r in _table(tmp_path, ["product_id", "title", "price", "snapshot_id"])}
    odd = {pid for pid in before if int(pid[-1]) % 2}
    assert len(before) == 32 and 0 < len(odd) < 32
    data = yaml.safe_load(importlib_resources.files("scrape_assets.sites").joinpath("demo.yaml").read_text())
    data["product_id"]["regex"] = r"_(\d*[02468])/index\.html$"
    data["validation"] = {"max_rejected_share": 0.9}
    (tmp_path / "odd_ids_unreadable.yaml").write_text(yaml.safe_dump(data))
    changed = make_resources(tmp_path, site=str(tmp_path / "odd_ids_unreadable.yaml"))
    result = materialize(instance, changed, ["mystery"],
                         run_config={"ops": {"raw_pages": {"config": {"new_snapshot": True}}}})
    assert result.success
    parsed = run_metadata(result)["parsed_products"]["by_category"]["mystery"]
    assert (parsed["products"], parsed["rejects"]) == (32 - len(odd), len(odd))
    table = run_metadata(result)["products_table"]
    assert (table["rows_loaded"], table["rows_carried_forward"]) == (32 - len(odd), len(odd))
    after = {r[0]: r for r in _table(tmp_path, ["product_id", "title", "price", "snapshot_id"])}
    assert set(after) == set(before)
    assert {pid: after[pid] for pid in odd} == {pid: before[pid] for pid in odd}  # as last seen, older snapshot
    assert all(after[pid][3] != before[pid][3] for pid in set(before) - odd)
    assert any(f"mystery: loaded {32 - len(odd)} rows into products (parsed from snapshot " in e.user_message
               and f"kept {len(odd)} earlier rows not seen this time" in e.user_message
               for e in instance.all_logs(result.run_id))


def _other_shop_fails(tmp_path, instance) -> dict[str, str]:
    """Run every asset for travel of site other_shop (the demo spec renamed) into tmp_path's
    storage and warehouse; the run fails: ``{step: error message}``."""
    data = yaml.safe_load(importlib_resources.files("scrape_assets.sites").joinpath("demo.yaml").read_text())
    data["name"] = "other_shop"
    (tmp_path / "other_shop.yaml").write_text(yaml.safe_dump(data))
    result = materialize(instance, make_resources(tmp_path, site=str(tmp_path / "other_shop.yaml")), ["travel"],
                         raise_on_error=False)
    assert not result.success
    return {e.step_key: e.event_specific_data.error.message for e in result.get_step_failure_events()}


def test_a_second_site_cannot_load_into_the_first_sites_tables(tmp_path, instance):
    """Both specs have a `travel`: one warehouse per site, refused with a clear error, rows untouched."""
    assert materialize(instance, make_resources(tmp_path), ["travel"]).success
    before = _table(tmp_path)
    failures = _other_shop_fails(tmp_path, instance)
    assert set(failures) == {"raw_pages"}  # before any request: its load would be refused
    assert "expected the warehouse of site 'other_shop' (this one holds site 'demo'" in failures["raw_pages"]
    assert not ObjectStore(str(tmp_path / "objects")).exists("other_shop")  # nothing fetched or stored
    assert _table(tmp_path) == before
    assert Warehouse(f"sqlite:///{tmp_path / 'warehouse.db'}").rows(dead_letters) == []


def test_a_warehouse_loaded_before_claims_by_another_site_is_refused_before_the_crawl(tmp_path, instance):
    """No claim recorded (tables older than claims) and none of its loads is other_shop's:
    raw_pages refuses before any request, as the load step would refuse after the crawl."""
    assert materialize(instance, make_resources(tmp_path), ["travel"]).success
    with sqlite3.connect(tmp_path / "warehouse.db") as db:
        db.execute("DELETE FROM warehouse_site")  # as before sites were recorded
    before = _table(tmp_path)
    failures = _other_shop_fails(tmp_path, instance)
    assert set(failures) == {"raw_pages"}
    assert "this one was loaded before sites were recorded, and none of its 1 loads is a snapshot of 'other_shop'" in (
        failures["raw_pages"])
    assert not ObjectStore(str(tmp_path / "objects")).exists("other_shop")  # nothing fetched or stored
    assert _table(tmp_path) == before
    assert materialize(instance, make_resources(tmp_path), ["travel"]).success  # its own site still loads


def test_fetch_config_change_refuses_resume_until_new_snapshot(tmp_path, instance):
    from scrape_assets.manifest import load_manifest

    res = make_resources(tmp_path)
    categories = ["travel", "mystery", "classics"]
    assert materialize(instance, res, categories, selection=["raw_pages"]).success
    store = ObjectStore(str(tmp_path / "objects"))
    manifest = latest_manifest(store, "demo", "travel")
    manifest.completed_at = None  # as if the run had died
    manifest.pages[1].status = "pending"
    manifest.save(store)
    before = {c: list_snapshots(store, "demo", c) for c in categories}

    # The changed config stops the run before any snapshot opens: the other categories do not
    # start snapshots under it (which would in turn refuse the earlier config).
    changed = make_resources(tmp_path, max_attempts=5)
    refused = materialize(instance, changed, categories, selection=["raw_pages"], raise_on_error=False)
    assert not refused.success
    failure = [e for e in refused.all_events if e.event_type_value == "STEP_FAILURE"][0]
    message = failure.step_failure_data.error.message
    assert "differing keys: max_attempts" in message
    assert "restore the earlier settings to resume it" in message and "scrape-assets demo --new-snapshot" in message
    assert load_manifest(store, "demo", "travel", manifest.snapshot_id).completed_at is None
    assert {c: list_snapshots(store, "demo", c) for c in categories} == before
    # A mirror (SCRAPE_BASE_URL) is part of the fetch config too: the saved pages came from elsewhere.
    mirror = materialize(instance, make_resources(tmp_path, base_url="http://127.0.0.1:9/"), categories,
                         selection=["raw_pages"], raise_on_error=False)
    assert not mirror.success
    failure = [e for e in mirror.all_events if e.event_type_value == "STEP_FAILURE"][0]
    assert "differing keys: base_url" in failure.step_failure_data.error.message
    assert {c: list_snapshots(store, "demo", c) for c in categories} == before

    # Back to the earlier config, the snapshot resumes, also with the spec named by a path:
    # a copy of the shipped demo spec file is the same fetch config as SCRAPE_SITE=demo.
    import scrape_assets

    copy = tmp_path / "my-demo.yaml"
    copy.write_bytes((Path(scrape_assets.__file__).parent / "sites" / "demo.yaml").read_bytes())
    by_path = make_resources(tmp_path, site=str(copy))
    assert materialize(instance, by_path, ["travel"], selection=["raw_pages"]).success
    assert latest_manifest(store, "demo", "travel").snapshot_id == manifest.snapshot_id
    assert latest_manifest(store, "demo", "travel").fetch_config["site"] == "demo"
    manifest.completed_at = None  # died again
    manifest.pages[1].status = "pending"
    manifest.save(store)

    fresh = materialize(
        instance, changed, ["travel"], selection=["raw_pages"],
        run_config={"ops": {"raw_pages": {"config": {"new_snapshot": True}}}},
    )
    assert fresh.success
    assert len(list_snapshots(store, "demo", "travel")) == 2
    assert latest_manifest(store, "demo", "travel").fetch_config["max_attempts"] == 5


def _serve(spec_text: str, port: int = 0):
    import threading

    from scrape_assets.faults import make_fault_server, parse_fault_spec

    server = make_fault_server(parse_fault_spec(spec_text, "test"), "127.0.0.1", port)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def test_a_page_that_lost_every_card_is_a_dead_letter_of_the_held_back_category(tmp_path, instance):
    """Travel's page comes back with no product card but its results count: the blocking
    check holds the load back, and the follow-up's dead_letters records the page itself
    (it has no rejected card that could stand for it), then forgets it once it parses."""
    broken = _serve("rules:\n  - {match: 'travel_2/index\\.html$', fault: zero_products}\n")
    try:
        res = make_resources(tmp_path, base_url=broken.base_url)
        result = materialize(instance, res, ["travel", "mystery"], raise_on_error=False)
        assert not result.success
        checks = {c.check_name: c.passed for c in result.get_asset_check_evaluations()}
        assert checks["parsed_products_match_schema"] is False
        # what held_back_load_sensor (and scrape-assets demo) run for the failing category
        assert materialize(instance, res, ["travel"], selection=["dead_letters"]).success
        letters = Warehouse(f"sqlite:///{tmp_path / 'warehouse.db'}").rows(dead_letters)
        assert [(r["category"], r["stage"], r["http_status"], r["attempts"], r["url"].rsplit("/", 2)[-2:])
                for r in letters] == [("travel", "parse", 200, 1, ["travel_2", "index.html"])]
        assert letters[0]["reason"].startswith("layout_guard: no product card matched selectors.product while the "
                                               "site says the page lists products")
        time.sleep(1.1)  # recorded_at has whole seconds
        # run again (another follow-up, a re-parse backfill): the time it was first recorded stays
        assert materialize(instance, res, ["travel"], selection=["dead_letters"]).success
        assert Warehouse(f"sqlite:///{tmp_path / 'warehouse.db'}").rows(dead_letters) == letters
    finally:
        broken.shutdown()
        broken.server_close()
    healthy = _serve("rules: []\n", broken.server_address[1])
    try:
        assert materialize(instance, res, ["travel", "mystery"]).success
    finally:
        healthy.shutdown()
        healthy.server_close()
    assert Warehouse(f"sqlite:///{tmp_path / 'warehouse.db'}").rows(dead_letters) == []


def test_rejected_cards_keep_the_snapshot_they_were_parsed_from_until_the_next_parse(tmp_path, instance):
    """A new snapshot fetched (``raw_pages`` alone) but not parsed yet: ``dead_letters`` still
    lists the last parse's rejected cards, stamped with the snapshot that parse read, never
    with the newer one (whose pages, fixed here, hold no such card)."""
    broken = _serve("rules:\n  - {match: 'mystery_3/page-2\\.html$', fault: layout_changed}\n")
    try:
        res = make_resources(tmp_path, base_url=broken.base_url)
        materialize(instance, res, ["mystery"], raise_on_error=False)
        assert materialize(instance, res, ["mystery"], selection=["dead_letters"]).success
    finally:
        broken.shutdown()
        broken.server_close()
    store = ObjectStore(str(tmp_path / "objects"))
    first = latest_manifest(store, "demo", "mystery").snapshot_id
    letters = Warehouse(f"sqlite:///{tmp_path / 'warehouse.db'}").rows(dead_letters)
    assert [(r["stage"], r["snapshot_id"]) for r in letters] == [("parse", first)] * 12
    healthy = _serve("rules: []\n", broken.server_address[1])
    try:
        assert materialize(instance, res, ["mystery"], selection=["raw_pages"],
                           run_config={"ops": {"raw_pages": {"config": {"new_snapshot": True}}}}).success
        second = latest_manifest(store, "demo", "mystery", complete=True).snapshot_id
        assert second != first
        assert materialize(instance, res, ["mystery"], selection=["dead_letters"]).success
        letters = Warehouse(f"sqlite:///{tmp_path / 'warehouse.db'}").rows(dead_letters)
        assert [(r["stage"], r["snapshot_id"]) for r in letters] == [("parse", first)] * 12
        assert materialize(instance, res, ["mystery"]).success  # parsed: the fixed page's cards pass
    finally:
        healthy.shutdown()
        healthy.server_close()
    assert Warehouse(f"sqlite:///{tmp_path / 'warehouse.db'}").rows(dead_letters) == []


def test_dead_letters_of_pages_name_what_the_schema_refused():
    from scrape_assets.defs.assets.dead_letters import NO_CARD_REASON, UNRECOGNISED_REASON, page_parse_failure

    page = {"site_claims_products": True, "cards_found": 20, "products_parsed": 0, "listing_recognised": True}
    assert page_parse_failure(page) is None  # every card rejected: the cards are the dead letters
    assert page_parse_failure({**page, "cards_found": 0}) == NO_CARD_REASON
    assert page_parse_failure({**page, "cards_found": 0, "site_claims_products": False}) is None  # an empty listing
    assert page_parse_failure({**page, "cards_found": 0, "listing_recognised": False}) == UNRECOGNISED_REASON


def test_a_dead_letters_time_is_its_failures_and_stays_the_first_recorded():
    from scrape_assets.defs.assets.dead_letters import dead_letter_rows, keep_recorded_at
    from scrape_assets.manifest import Manifest, PageEntry

    manifest = Manifest(site="demo", category="travel", snapshot_id="2026-12-03T190000Z", fetch_config={},
                        fetch_config_hash="h", start_url="http://x/t/index.html")
    manifest.pages[1] = PageEntry(url="http://x/t/index.html", status="failed", attempts=3, http_status=503,
                                  last_error="http_503", failed_at="2020-01-01T00:00:00Z")
    [fetch, parse] = dead_letter_rows(manifest, [{"url": "http://x/p/1", "reason": "price: no number"}])
    assert fetch["recorded_at"] == "2020-01-01T00:00:00Z"  # the manifest's, not the run's
    earlier = [{**parse, "recorded_at": t} for t in ("2026-12-01T00:00:09Z", "2026-12-01T00:00:01Z")]
    assert [r["recorded_at"] for r in keep_recorded_at([fetch, parse], earlier)] == [
        "2020-01-01T00:00:00Z", "2026-12-01T00:00:01Z"]  # the earliest of the same dead letter
    assert keep_recorded_at([parse], [{**parse, "snapshot_id": "other", "recorded_at": "x"}]) == [parse]


def test_a_failed_fetch_never_deletes_rows_loaded_earlier(tmp_path, instance):
    """Pages that fail (or are never reached) keep their earlier rows, carried forward."""
    healthy = _serve("rules: []\n")
    port = healthy.server_address[1]
    res = make_resources(tmp_path, base_url=healthy.base_url, max_attempts=1)
    assert materialize(instance, res, ["travel", "mystery"]).success
    before = {(r[0], r[1]): r for r in _table(tmp_path)}
    assert len(before) == 11 + 32
    healthy.shutdown()
    healthy.server_close()

    # Next day: mystery page 2 answers 404, travel's only page 500 (so nothing of it is seen).
    broken = _serve(
        "rules:\n"
        "  - {match: 'mystery_3/page-2\\.html$', fault: http_error, status: 404}\n"
        "  - {match: 'travel_2/index\\.html$', fault: http_error, status: 500}\n",
        port,
    )
    try:
        result = materialize(instance, res, ["travel", "mystery"])
    finally:
        broken.shutdown()
        broken.server_close()
    assert result.success
    after = {(r[0], r[1]): r for r in _table(tmp_path)}
    assert set(after) == set(before)  # no row lost
    md = run_metadata(result)
    assert md["products_table"]["rows_carried_forward"] == 11 + 12
    # travel reloaded no row of its own (its page failed): still a category reloaded, its rows kept.
    assert (md["products_table"]["rows_loaded"], md["products_table"]["partitions_reloaded"]) == (20, 2)
    assert any(e.message.startswith("2 categories: 20 rows loaded into products (2 categories reloaded, 23 earlier "
                                    "rows kept in them; 0 unchanged, their rows as they were)")
               for e in instance.all_logs(result.run_id))
    store = ObjectStore(str(tmp_path / "objects"))
    new_snapshot = latest_manifest(store, "demo", "mystery").snapshot_id
    for key, row in after.items():
        carried = key[0] == "travel" or row[8] == 2  # travel, and mystery's page 2
        assert (row[9] != new_snapshot) == carried, key  # carried rows keep their older snapshot_id
    # Both runs on the same (UTC) day: the day's prices are what some run saw that day; the
    # carried rows' prices were seen by the first run only, and keep its row.
    history = Warehouse(f"sqlite:///{tmp_path / 'warehouse.db'}").rows(price_history)
    assert len(history) == 11 + 32
    for r in history:
        carried = r["category"] == "travel" or after[(r["category"], r["product_id"])][8] == 2
        assert (r["snapshot_id"] != new_snapshot) == carried, r
    letters = Warehouse(f"sqlite:///{tmp_path / 'warehouse.db'}").rows(dead_letters)
    assert sorted((r["category"], r["http_status"]) for r in letters) == [("mystery", 404), ("travel", 500)]
    # each one's time is when its page was recorded failed, in the manifest
    failed_at = {(c, latest_manifest(store, "demo", c).pages[n].failed_at) for c, n in (("mystery", 2), ("travel", 1))}
    assert {(r["category"], r["recorded_at"]) for r in letters} == failed_at
    # raw_pages warns of each page lost (the run itself succeeds): it stands out in the log
    lost = sorted((e.level, e.user_message.split(" failed for good ")[0]) for e in instance.all_logs(result.run_id)
                  if e.step_key == "raw_pages" and " failed for good (" in (e.user_message or ""))
    assert lost == [(logging.WARNING, "mystery: page 2"), (logging.WARNING, "travel: page 1")]
    checks = {c.check_name: c.passed for c in result.get_asset_check_evaluations()}
    assert checks == {"parsed_products_match_schema": True, "parsed_products_match_site_count": True,
                      "products_table_matches_parsed": True}


def test_dead_letters_leaves_a_partition_without_dead_letters_as_it_is(tmp_path, instance, monkeypatch):
    """None before and none now: no transaction, and no write of a re-parsed snapshot's file."""
    from scrape_assets.defs.assets import dead_letters as asset_module

    reads, transactions = [], []
    lists_none, replace_partition = asset_module.lists_no_dead_letter, Warehouse.replace_partition
    monkeypatch.setattr(asset_module, "lists_no_dead_letter",
                        lambda store, manifest: reads.append(manifest.category) or lists_none(store, manifest))
    monkeypatch.setattr(Warehouse, "replace_partition",
                        lambda self, table, category, rows: transactions.append(category) or replace_partition(self, table, category, rows))
    res = make_resources(tmp_path)
    assert materialize(instance, res, ["travel"]).success
    assert (reads, transactions) == ([], [])  # a snapshot this run opened: written without a read first
    store = ObjectStore(str(tmp_path / "objects"))
    letters_file = tmp_path / "objects" / latest_manifest(store, "demo", "travel").prefix / "dead_letters.json"
    assert json.loads(letters_file.read_text()) == []
    written = letters_file.stat()

    def run_dead_letters(*, read: bool = True):
        reads.clear()
        transactions.clear()
        result = materialize(instance, res, ["travel"], selection=["dead_letters"])
        assert result.success
        assert reads == (["travel"] if read else [])  # with dead letters now, written without a read
        return result.get_asset_materialization_events()[0].materialization.metadata["dead_letters"].value

    assert run_dead_letters() == 0
    assert transactions == []
    again = letters_file.stat()
    assert (again.st_ino, again.st_mtime_ns) == (written.st_ino, written.st_mtime_ns)  # not written again

    # A file that lists a dead letter (hand-edited), is unreadable or is missing is written again ...
    for damage in (lambda: letters_file.write_text('[{"url": "http://x/", "reason": "stale"}]'),
                   lambda: letters_file.write_text("["), letters_file.unlink):
        damage()
        assert run_dead_letters() == 0
        assert json.loads(letters_file.read_text()) == []
        assert transactions == []

    # ... and so is one listing nothing when there is a dead letter now, with its row loaded ...
    letter = {"category": "travel", "url": "http://x/", "stage": "parse", "reason": "no price", "http_status": None,
              "attempts": 0, "snapshot_id": "s0", "recorded_at": "2026-01-01T00:00:00+00:00"}
    with monkeypatch.context() as patched:
        patched.setattr(asset_module, "dead_letter_rows", lambda manifest, rejects, pages=(), parsed_from=None: [letter])
        assert run_dead_letters(read=False) == 1
    assert json.loads(letters_file.read_text()) == [letter]
    assert transactions == ["travel"]

    # ... and a table that still holds the partition's rows is emptied.
    assert run_dead_letters() == 0
    assert json.loads(letters_file.read_text()) == []
    assert transactions == ["travel"]
    assert Warehouse(f"sqlite:///{tmp_path / 'warehouse.db'}").rows(dead_letters) == []


def test_a_complete_snapshot_is_adopted_only_when_its_run_died_before_recording_it(instance, monkeypatch):
    from scrape_assets.defs.assets.raw_pages import InterruptedRunSnapshots
    from scrape_assets.manifest import Manifest

    def manifest(category: str, run_id: str | None, snapshot_id: str = "s2") -> Manifest:
        return Manifest(site="demo", category=category, snapshot_id=snapshot_id, fetch_config={},
                        fetch_config_hash="h", start_url="http://x/", run_id=run_id)

    for run_id, status in (("ok", dg.DagsterRunStatus.SUCCESS), ("died", dg.DagsterRunStatus.FAILURE)):
        instance.add_run(dg.DagsterRun(job_name="daily_scrape_job", run_id=run_id, status=status))
    instance.report_runless_asset_event(dg.AssetMaterialization(
        "raw_pages", partition="travel", metadata={"by_category": dg.MetadataValue.json({"travel": {"snapshot_id": "s1"}})}))
    instance.report_runless_asset_event(dg.AssetMaterialization(
        "raw_pages", partition="poetry", metadata={"by_category": dg.MetadataValue.json({"poetry": {"snapshot_id": "s2"}})}))
    asked = Counter()
    get_run_by_id = instance.get_run_by_id
    monkeypatch.setattr(instance, "get_run_by_id", lambda run_id: asked.update([run_id]) or get_run_by_id(run_id))

    adopt = InterruptedRunSnapshots(instance)
    assert adopt(manifest("travel", "died"))  # latest record names s1: s2 was never recorded
    assert adopt(manifest("mystery", "died"))  # never recorded at all
    assert not adopt(manifest("poetry", "died"))  # recorded before the run died
    assert not adopt(manifest("travel", "ok"))  # a successful run recorded what it completed
    assert not adopt(manifest("travel", "unknown-run"))  # not this instance's run
    assert not adopt(manifest("travel", None))
    assert asked == {"died": 1, "ok": 1, "unknown-run": 1}  # each run asked once per step


def test_merged_metadata_joins_per_partition_tables_and_reads_older_whole_table_events():
    from scrape_assets.defs.assets.partition_metadata import merged_metadata

    per_partition = [{"pages_done": 3, "by_category": dg.MetadataValue.json({"a": {"pages_done": 1}})},
                     {"pages_done": 3, "by_category": dg.MetadataValue.json({"b": {"pages_done": 2}})}]
    expected = {"pages_done": 3, "by_category": {"a": {"pages_done": 1}, "b": {"pages_done": 2}}}
    assert merged_metadata(per_partition) == expected
    whole_table = {"pages_done": 3, "by_category": expected["by_category"]}
    assert merged_metadata([whole_table, whole_table]) == expected


class _ForwardingProxy(BaseHTTPRequestHandler):
    """A minimal HTTP forward proxy: absolute-form GETs relayed to ``server.origin`` (host:port)."""

    protocol_version = "HTTP/1.1"

    def log_message(self, format, *args):  # noqa: A002 - keep test output quiet
        pass

    def do_GET(self):
        target = urlsplit(self.path)
        self.server.seen.append((self.path, self.headers.get("Proxy-Authorization")))
        if self.path.endswith(self.server.broken):  # the proxy's own failure, e.g. its upstream timed out
            self.send_response(502)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        upstream = http.client.HTTPConnection(self.server.origin, timeout=5)
        headers = {k: v for k, v in self.headers.items() if k.lower() not in ("proxy-authorization", "connection")}
        upstream.request("GET", target.path + (f"?{target.query}" if target.query else ""), headers=headers)
        reply = upstream.getresponse()
        body = reply.read()
        self.send_response(reply.status)
        for name, value in reply.getheaders():
            if name.lower() not in ("content-length", "connection", "transfer-encoding"):
                self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
        upstream.close()


def test_raw_pages_fetch_through_the_configured_proxy(tmp_path, instance, demo_server):
    proxy = ThreadingHTTPServer(("127.0.0.1", 0), _ForwardingProxy)
    proxy.origin, proxy.seen, proxy.broken = urlsplit(demo_server.base_url).netloc, [], "mystery_3/page-2.html"
    proxy_url = f"http://scraper:s3cret@127.0.0.1:{proxy.server_address[1]}"
    # shop.invalid cannot resolve: every page must come through the proxy.
    res = make_resources(tmp_path, base_url="http://shop.invalid/", proxy_url=proxy_url)
    with serving(proxy):
        result = materialize(instance, res, ["travel", "mystery"])
    assert result.success
    md = run_metadata(result)["raw_pages"]
    assert (md["pages_done"], md["pages_failed"]) == (2, 1)
    assert _table(tmp_path, ["category"]).count(("travel",)) == 11
    targets = [path for path, _ in proxy.seen]
    assert targets[0] == "http://shop.invalid/robots.txt"
    assert sorted(set(targets[1:])) == sorted(
        f"http://shop.invalid/{path}" for path in (
            "catalogue/category/books/travel_2/index.html", "catalogue/category/books/mystery_3/index.html",
            "catalogue/category/books/mystery_3/page-2.html"))
    assert targets.count("http://shop.invalid/catalogue/category/books/mystery_3/page-2.html") == 3  # 502: retried
    assert {auth for _, auth in proxy.seen} == {"Basic c2NyYXBlcjpzM2NyZXQ="}  # base64("scraper:s3cret")
    logs = [e.message for e in instance.all_logs(result.run_id)]
    assert any(f"from http://shop.invalid/ through proxy http://127.0.0.1:{proxy.server_address[1]}" in m for m in logs)
    assert not any("s3cret" in m for m in logs)  # the proxy's credentials never reach the logs...
    letters = Warehouse(f"sqlite:///{tmp_path / 'warehouse.db'}").rows(dead_letters)
    assert [(r["category"], r["http_status"], r["attempts"]) for r in letters] == [("mystery", 502, 3)]
    objects = tmp_path / "objects"
    stored = b"".join(p.read_bytes() for p in objects.rglob("*.json*"))  # manifests, journals, dead_letters.json
    assert b"s3cret" not in stored and b"scraper" not in stored  # ...nor the manifests and dead letters
    for category in ("travel", "mystery"):  # a snapshot may resume through another proxy
        manifest = latest_manifest(ObjectStore(str(objects)), "demo", category, complete=True)
        assert str(proxy.server_address[1]) not in json.dumps(manifest.fetch_config)


def test_a_malformed_proxy_url_fails_raw_pages_once_without_retries_or_echoing_it(tmp_path, instance):
    res = make_resources(tmp_path, base_url="http://shop.invalid/", proxy_url="http://user:hunter2@egress.corp")
    result = materialize(instance, res, ["travel"], selection=["raw_pages"], raise_on_error=False)
    assert not result.success
    [failure] = [e for e in result.all_events if e.event_type_value == "STEP_FAILURE"]
    assert "SCRAPE_PROXY_URL='<hidden>' is invalid" in failure.event_specific_data.error.message
    assert not any(e.event_type_value in ("STEP_UP_FOR_RETRY", "STEP_RESTARTED") for e in result.all_events)
    assert not any("hunter2" in (e.message or "") for e in instance.all_logs(result.run_id))


def test_rows_deleted_by_hand_are_loaded_again_although_the_input_is_unchanged(tmp_path, instance):
    """An unchanged input is not reloaded, but only while the table still holds what its load
    inserted: a hand edit (a partial restore, a DELETE) must not leave a category empty for
    as long as its pages stay the same, with the row check green."""
    res = make_resources(tmp_path)
    assert materialize(instance, res, CATEGORIES).success
    first = _table(tmp_path)
    with sqlite3.connect(tmp_path / "warehouse.db") as conn:
        conn.execute("DELETE FROM products WHERE category = 'classics'")
        conn.execute("DELETE FROM products WHERE category = 'mystery' AND product_id IN "
                     "(SELECT product_id FROM products WHERE category = 'mystery' LIMIT 5)")
    again = materialize(instance, res, CATEGORIES)  # the same day: every page a 304, every input unchanged
    assert again.success
    md = run_metadata(again)["products_table"]
    assert md["rows_loaded"] == 19 + 32 and md["partitions_reloaded"] == 2  # classics and mystery; travel untouched
    assert _table(tmp_path) == first
    checks = {c.check_name: c.passed for c in again.get_asset_check_evaluations()}
    assert checks["products_table_matches_parsed"] is True
    logs = "\n".join(e.message or "" for e in instance.all_logs(again.run_id))
    assert "classics: unchanged input, but the table holds 0 rows of the 19 rows loaded from it" in logs
    assert "mystery: unchanged input, but the table holds 27 rows of the 32 rows loaded from it" in logs
    assert "travel: unchanged input: products not reloaded" in logs


def test_a_partition_range_given_backwards_fails_with_the_spec_order(tmp_path, instance):
    """Dagster runs a reversed range as an empty one: a run that does nothing must not look green."""
    result = materialize(instance, make_resources(tmp_path), ["mystery", "travel"], raise_on_error=False)
    assert not result.success
    failures = {e.step_key: e.event_specific_data.error.message for e in result.get_step_failure_events()}
    assert set(failures) == {"raw_pages"}
    assert not [e for e in result.all_events if e.event_type_value == "STEP_UP_FOR_RETRY"]  # not worth retrying
    assert ("the partition range mystery...travel selects no category: a range follows the order of the spec's "
            "categories (travel, mystery, classics,") in failures["raw_pages"]
    assert not (tmp_path / "objects" / "demo").exists()
    reparse = materialize(instance, make_resources(tmp_path), ["mystery", "travel"],
                          selection=["parsed_products", "products_table", "dead_letters"], raise_on_error=False)
    assert {e.step_key for e in reparse.get_step_failure_events()} == {"parsed_products"}
    load = materialize(instance, make_resources(tmp_path), ["mystery", "travel"],
                       selection=["products_table", "dead_letters"], raise_on_error=False)
    assert {e.step_key for e in load.get_step_failure_events()} == {"products_table", "dead_letters"}
    assert not (tmp_path / "warehouse.db").exists()  # not opened, so not claimed by a site either


def test_a_range_naming_a_category_the_spec_lacks_fails_saying_to_reload_the_code_location():
    """A category renamed in the spec while `dagster dev` kept the old definitions: the run was
    created from the old partitions, and the step's process, which loads the spec anew, no
    longer has the range's first key. Dagster's own error there names the key only; the
    step's failure (not retried) says what to do. (Unit test: inside one process the run and
    its steps share one set of definitions, and Dagster refuses such a range at run creation.)"""
    from scrape_assets.defs.partitions import run_categories

    keys = ["voyages", "mystery", "classics"]

    class _Context:  # what run_categories reads of a step's context
        assets_def = type("A", (), {"partitions_def": dg.StaticPartitionsDefinition(keys)})()

        @property
        def partition_keys(self):
            return dg.StaticPartitionsDefinition(keys).get_partition_keys_in_range(
                dg.PartitionKeyRange("travel", "mystery"))

    with pytest.raises(dg.Failure) as failure:
        run_categories(_Context())
    assert failure.value.allow_retries is False
    message = failure.value.description
    assert message.startswith("the run's categories are not the spec's (renamed or removed since the code location "
                              "loaded?): reload the code location (restart `make ui` or `dagster dev`")
    assert "Partition range travel to mystery is not a valid range. Nonexistent partition keys: ['travel']." in message
    assert message.endswith("The spec's categories, as this run's process read it: voyages, mystery, classics")


@pytest.mark.skipif(not Path("/sys/kernel").is_dir(), reason="needs Linux's sysfs: a folder nobody may create in")
def test_object_storage_this_process_may_not_write_fails_raw_pages_once_before_anything_else(tmp_path, instance, demo_server):
    """Permissions or a read-only mount do not pass with time: one failure naming the folder, no retry.

    sysfs refuses a new folder to every user, root included (EPERM, EACCES or, mounted
    read-only as in containers, EROFS), as a data folder of another user or on a read-only
    mount does.
    """
    from scrape_assets.defs.resources import ObjectStoreResource

    refused = "/sys/kernel/scrape-assets-test/objects"
    res = {**make_resources(tmp_path, base_url=demo_server.base_url), "store": ObjectStoreResource(url=refused)}
    result = materialize(instance, res, ["travel"], raise_on_error=False)
    assert not result.success
    assert not any(e.event_type_value in ("STEP_UP_FOR_RETRY", "STEP_RESTARTED") for e in result.all_events)
    (failure,) = [e for e in result.all_events if e.event_type_value == "STEP_FAILURE"]
    assert failure.step_key == "raw_pages"
    description = failure.step_failure_data.user_failure_data.description
    assert description.startswith(f"{refused}: object storage is not writable: [Errno ")
    assert description.endswith("; nothing fetched")
    assert demo_server.requests == []  # not even robots.txt
    assert not (tmp_path / "warehouse.db").exists()  # checked after storage: not opened


@pytest.mark.skipif(not Path("/sys/kernel").is_dir(), reason="needs Linux's sysfs: a folder nobody may write in")
def test_an_existing_folder_this_process_may_not_write_in_is_named_as_such():
    """The folder exists but refuses files (another user's, a read-only mount): the same one line.

    It names the folder, not the probe object the check tried to write; the cause is kept,
    so raw_pages does not retry it.
    """
    from scrape_assets.defs.assets.raw_pages import storage_refused
    from scrape_assets.errors import StorageError
    from scrape_assets.storage import ObjectStore

    with pytest.raises(StorageError) as info:
        ObjectStore("/sys/kernel").ensure_writable()
    assert str(info.value).startswith("/sys/kernel: object storage is not writable: [Errno ")
    assert "write-probe" not in str(info.value).split(": [Errno ")[0]
    assert storage_refused(info.value)
    assert not list(Path("/sys/kernel").glob("*write-probe-*"))


def test_a_write_probe_that_may_pass_later_is_not_called_unwritable(tmp_path, monkeypatch):
    """A full disk (or an I/O error, a store not answering): "its write probe failed", retried."""
    import errno

    from scrape_assets.defs.assets.raw_pages import storage_refused
    from scrape_assets.errors import StorageError
    from scrape_assets.storage import ObjectStore

    store = ObjectStore(str(tmp_path / "objects"))

    def full_disk(key, data, **_kw):
        try:
            raise OSError(errno.ENOSPC, "No space left on device")
        except OSError as exc:
            raise StorageError(f"{store.describe()}/{key}", f"write failed: {exc}") from exc

    monkeypatch.setattr(store, "write_bytes_atomic", full_disk)
    with pytest.raises(StorageError) as info:
        store.ensure_writable()
    assert str(info.value) == f"{tmp_path / 'objects'}: its write probe failed: [Errno 28] No space left on device"
    assert not storage_refused(info.value)


def test_which_storage_errors_raw_pages_retries():
    import errno

    from scrape_assets.defs.assets.raw_pages import storage_refused
    from scrape_assets.errors import StorageError

    def failure(cause):
        try:
            raise StorageError("s3://bucket/objects", "object storage is not writable") from cause
        except StorageError as exc:
            return exc

    for refused in (PermissionError(errno.EACCES, "Permission denied"), PermissionError("Access Denied"),  # s3fs: no errno
                    OSError(errno.EROFS, "Read-only file system"), NotADirectoryError(errno.ENOTDIR, "Not a directory"),
                    FileExistsError(errno.EEXIST, "File exists"), ImportError("No module named 's3fs'")):
        assert storage_refused(failure(refused)), refused
    for passing in (OSError(errno.ENOSPC, "No space left on device"), ConnectionError("endpoint not answering"),
                    TimeoutError(), None):
        assert not storage_refused(failure(passing)), passing


@pytest.mark.timeout(120)
def test_an_unreadable_warehouse_stops_raw_pages_before_any_request_and_the_retry_policy_tries_again(tmp_path, instance):
    """A warehouse that cannot be used is met before the crawl, in one line; retried only when it may come back."""
    from scrape_assets.defs.resources import WarehouseResource

    folder = tmp_path / "folder.db"
    folder.mkdir()  # SQLite cannot open a folder: like a server that is down, the error comes on connecting
    res = {**make_resources(tmp_path), "warehouse": WarehouseResource(url=f"sqlite:///{folder}")}
    result = materialize(instance, res, ["travel"], selection=["raw_pages"], raise_on_error=False)
    assert not result.success
    assert len([e for e in result.all_events if e.event_type_value == "STEP_UP_FOR_RETRY"]) == 3
    (failure,) = [e for e in result.all_events if e.event_type_value == "STEP_FAILURE"]
    assert failure.step_failure_data.user_failure_data.description == (
        f"cannot use the warehouse at sqlite:///{folder} (SCRAPE_WAREHOUSE_URL): OperationalError: unable to open "
        "database file; nothing fetched")
    assert not (tmp_path / "objects" / "demo").exists()  # no snapshot opened, no page stored
    # A file that is not a database: no retry can help, the step fails at once.
    not_a_db = tmp_path / "notes.db"
    not_a_db.write_text("not a database")
    res["warehouse"] = WarehouseResource(url=f"sqlite:///{not_a_db}")
    result = materialize(instance, res, ["travel"], selection=["raw_pages"], raise_on_error=False)
    assert [e.event_type_value for e in result.all_events if e.event_type_value.startswith("STEP_")][-1] == "STEP_FAILURE"
    assert not any(e.event_type_value == "STEP_UP_FOR_RETRY" for e in result.all_events)
    (failure,) = [e for e in result.all_events if e.event_type_value == "STEP_FAILURE"]
    assert failure.step_failure_data.user_failure_data.description == (
        f"cannot use the warehouse at sqlite:///{not_a_db} (SCRAPE_WAREHOUSE_URL): DatabaseError: file is not a "
        "database; nothing fetched")
    assert not_a_db.read_text() == "not a database" and not (tmp_path / "objects" / "demo").exists()
    # Tables of another shape: SQLite says "no such column" every time, so no retry either;
    # a `products` table someone else made is refused before the crawl too, not by the load after it.
    for name, create, missing in [("other.db", "CREATE TABLE warehouse_site (id INTEGER PRIMARY KEY, owner TEXT)",
                                   "warehouse_site.site"),
                                  ("theirs.db", "CREATE TABLE products (sku TEXT PRIMARY KEY, name TEXT)",
                                   "products.category")]:
        other_shape = tmp_path / name
        with sqlite3.connect(other_shape) as conn:
            conn.execute(create)
        conn.close()
        res["warehouse"] = WarehouseResource(url=f"sqlite:///{other_shape}")
        result = materialize(instance, res, ["travel"], selection=["raw_pages"], raise_on_error=False)
        assert not any(e.event_type_value == "STEP_UP_FOR_RETRY" for e in result.all_events)
        (failure,) = [e for e in result.all_events if e.event_type_value == "STEP_FAILURE"]
        assert failure.step_failure_data.user_failure_data.description == (
            f"cannot use the warehouse at sqlite:///{other_shape} (SCRAPE_WAREHOUSE_URL): OperationalError: no such "
            f"column: {missing}; nothing fetched")
        assert not (tmp_path / "objects" / "demo").exists()


def test_a_manifest_of_another_format_stops_raw_pages_once_before_any_request(tmp_path, instance):
    """A manifest written by another version reads the same on every attempt: the step fails
    at once naming it (no RetryPolicy retries), and no category of the run fetches a page."""
    res = make_resources(tmp_path)
    assert materialize(instance, res, ["travel"], selection=["raw_pages"]).success
    store = ObjectStore(str(tmp_path / "objects"))
    manifest = latest_manifest(store, "demo", "travel")
    raw = store.read_bytes(manifest.key)
    store.write_bytes_atomic(manifest.key, raw.replace(b'"format": 1', b'"format": 99', 1))
    result = materialize(instance, res, ["travel", "mystery"], selection=["raw_pages"], raise_on_error=False)
    assert not result.success
    assert not any(e.event_type_value == "STEP_UP_FOR_RETRY" for e in result.all_events)
    (failure,) = [e for e in result.all_events if e.event_type_value == "STEP_FAILURE"]
    assert failure.step_failure_data.user_failure_data.description == (
        f"{manifest.key}: format 99, expected 1; restore it, or move its folder out of {store.describe()}: travel then "
        "goes on from its previous complete snapshot, or crawls anew")
    assert list_snapshots(store, "demo", "mystery") == [] and list_snapshots(store, "demo", "travel") == [
        manifest.snapshot_id]


def test_a_damaged_manifest_names_its_folder_and_moving_it_away_lets_the_next_run_go_on(tmp_path, instance):
    """A manifest cut short by hand (or by a disk) stops the run before any request, naming
    the folder to move; moved out of the storage as the message says, the next run goes on
    from the category's previous complete snapshot (its pages answered 304: nothing lost)."""
    res = make_resources(tmp_path)
    assert materialize(instance, res, ["travel"], selection=["raw_pages"]).success
    store = ObjectStore(str(tmp_path / "objects"))
    first = latest_manifest(store, "demo", "travel")
    assert materialize(instance, res, ["travel"], selection=["raw_pages"], run_config={
        "ops": {"raw_pages": {"config": {"new_snapshot": True}}}}).success
    second = latest_manifest(store, "demo", "travel")
    assert second.snapshot_id != first.snapshot_id
    store.write_bytes_atomic(second.key, store.read_bytes(second.key)[:300])
    result = materialize(instance, res, ["travel", "mystery"], selection=["raw_pages"], raise_on_error=False)
    (failure,) = [e for e in result.all_events if e.event_type_value == "STEP_FAILURE"]
    description = failure.step_failure_data.user_failure_data.description
    folder = f"demo/travel/{second.snapshot_id}/"
    assert description.startswith(f"{second.key}: unreadable manifest: ") and description.endswith(
        f"; restore it, or move its folder out of {store.describe()}: travel then goes on from its previous complete "
        "snapshot, or crawls anew")
    assert second.key == f"{folder}manifest.json"  # the folder the message names
    assert list_snapshots(store, "demo", "mystery") == []  # nothing fetched for any category
    shutil.move(tmp_path / "objects" / folder, tmp_path / "moved")
    assert materialize(instance, res, ["travel", "mystery"], selection=["raw_pages"]).success
    (kept, new) = list_snapshots(store, "demo", "travel")  # new: a new snapshot (within the second, the moved one's id)
    latest = latest_manifest(store, "demo", "travel", complete=True)
    assert kept == first.snapshot_id and latest.snapshot_id == new and latest.run_id not in (first.run_id, second.run_id)
    # Conditional GETs with the previous complete snapshot's validators: its copies are reused.
    pages = latest.pages
    assert pages.keys() == first.pages.keys() and all(p.not_modified and p.body_key for p in pages.values())
    assert latest_manifest(store, "demo", "mystery", complete=True).counts()["done"] == 2


def test_a_corrupt_parse_state_stops_the_parse_naming_the_file_and_the_remedy(tmp_path, instance):
    from scrape_assets.storage import ObjectStore

    res = make_resources(tmp_path)
    assert materialize(instance, res, ["travel"]).success
    store = ObjectStore(str(tmp_path / "objects"))
    store.write_bytes_atomic("demo/travel/parse_state.json", b'{"snapshot_id": "2027')  # torn by hand
    result = materialize(instance, res, ["travel"], selection=["parsed_products"], raise_on_error=False)
    assert not result.success
    (failure,) = result.get_step_failure_events()
    error = failure.event_specific_data.error
    message = (error.cause or error).message  # Dagster wraps the step's exception
    assert message.startswith(
        f"scrape_assets.errors.ManifestError: {tmp_path / 'objects'}/demo/travel/parse_state.json: unreadable parse "
        "state (")
    assert "delete it, and the next parsed_products run parses this category again" in message
    store.delete("demo/travel/parse_state.json")  # the remedy it names
    assert materialize(instance, res, ["travel"], selection=["parsed_products"]).success


def test_each_partition_carries_its_own_figures_beside_the_runs_totals(tmp_path, instance):
    """The UI plots a partition's numbers: category_* are that category's, the others the run's."""
    from scrape_assets.demo_site import catalogue

    result = materialize(instance, make_resources(tmp_path), ["travel", "mystery"])
    assert result.success
    figures: dict[tuple[str, str], dict] = {}
    for event in result.get_asset_materialization_events():
        m = event.materialization
        figures[(m.asset_key.to_user_string(), m.partition)] = {k: v.value for k, v in m.metadata.items()}
    for category in ("travel", "mystery"):
        expected = catalogue().category(category)
        raw = figures[("raw_pages", category)]
        assert (raw["category_pages_done"], raw["category_pages_failed"], raw["category_success_rate"]) == (
            expected.page_count, 0, 1.0)
        assert raw["pages_done"] == 3  # the run's: travel's 1 page and mystery's 2
        assert figures[("parsed_products", category)]["category_products"] == len(expected.products)
        table = figures[("products_table", category)]
        assert table["category_rows"] == table["category_rows_loaded"] == len(expected.products)
        assert figures[("dead_letters", category)]["category_dead_letters"] == 0
    assert not any(k.startswith("category_") for md in run_metadata(result).values() for k in md)  # not merged


def test_a_run_on_a_temporary_instance_says_so_once(tmp_path, instance):
    """`dagster asset materialize` without DAGSTER_HOME runs on an ephemeral instance: the run
    vanishes with the command, unseen by the UI and sensors. It warns, once per run."""
    import dagster as dg

    temporary = dg.DagsterInstance.ephemeral()
    result = materialize(temporary, make_resources(tmp_path), ["travel"])
    warned = [e.user_message for e in temporary.all_logs(result.run_id)
              if e.level == logging.WARNING and "temporary Dagster instance" in e.user_message]
    assert warned == ["this run is on a temporary Dagster instance (DAGSTER_HOME is not set): nothing of it is kept "
                      "when the command ends, and the UI, the sensors and the schedule never see it; set DAGSTER_HOME "
                      "to the instance's folder (the clone's .dagster_home, or the server's)"]
    result = materialize(instance, make_resources(tmp_path), ["travel"])  # a lasting instance: no word of it
    assert not [e for e in instance.all_logs(result.run_id) if "temporary Dagster instance" in e.user_message]
    # What the CLI does without DAGSTER_HOME: a persistent instance to Dagster, in a folder it deletes at exit.
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "DAGSTER_HOME" and not k.startswith("SCRAPE_")}
    done = subprocess.run([str(Path(sys.executable).with_name("dagster")), "asset", "materialize", "-m",
                           "scrape_assets.definitions", "--select", "raw_pages", "--partition", "travel"],
                          env={**env, "SCRAPE_DATA_DIR": str(tmp_path / "cli-data")}, cwd=tmp_path, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stderr.count("this run is on a temporary Dagster instance (DAGSTER_HOME is not set)") == 1


def test_a_locked_warehouse_retries_the_load_steps_and_a_broken_one_does_not(tmp_path, instance, monkeypatch):
    """products_table and dead_letters meet a warehouse another writer holds locked (longer
    than SQLite's busy timeout): each step is retried (RetryRequested, 2 s later) and
    loads once the lock is gone; held past the last retry, the step fails in one line
    saying so. Tables of another shape are not retried."""
    import threading

    import scrape_assets.defs.resources as resources_module
    import scrape_assets.warehouse as warehouse_module
    from scrape_assets.defs.resources import WarehouseResource

    res = make_resources(tmp_path)
    assert materialize(instance, res, ["travel"], selection=["raw_pages", "parsed_products"]).success
    Warehouse(f"sqlite:///{tmp_path / 'warehouse.db'}").create_tables()
    monkeypatch.setattr(warehouse_module, "SQLITE_BUSY_TIMEOUT_MS", 100)  # the runs' connections wait 0.1 s

    def retries() -> list[str]:
        events = instance.get_event_records(dg.EventRecordsFilter(event_type=dg.DagsterEventType.STEP_UP_FOR_RETRY))
        return sorted(e.event_log_entry.step_key for e in events)

    holder = sqlite3.connect(tmp_path / "warehouse.db", isolation_level=None, check_same_thread=False)
    holder.execute("BEGIN EXCLUSIVE")

    def release_after_both_failed() -> None:  # the other writer is done once each step met its lock
        deadline = time.monotonic() + 60
        while retries() != ["dead_letters", "products_table"] and time.monotonic() < deadline:
            time.sleep(0.05)
        holder.rollback()

    release = threading.Thread(target=release_after_both_failed)
    release.start()
    try:
        result = materialize(instance, res, ["travel"], selection=["products_table", "dead_letters"])
    finally:
        release.join()
    assert result.success
    assert sorted(e.step_key for e in result.all_events if e.event_type_value == "STEP_UP_FOR_RETRY") == [
        "dead_letters", "products_table"]
    assert Warehouse(f"sqlite:///{tmp_path / 'warehouse.db'}").rows_by_category(products) == {"travel": 11}

    # Locked past the last retry (1 here): one line, no SQL, saying the retries ran out.
    monkeypatch.setattr(resources_module, "DATABASE_RETRIES", 1)
    holder.execute("BEGIN EXCLUSIVE")
    try:
        result = materialize(instance, res, ["travel"], selection=["products_table"], raise_on_error=False)
    finally:
        holder.rollback()
        holder.close()
    (failure,) = [e for e in result.all_events if e.event_type_value == "STEP_FAILURE"]
    assert failure.step_failure_data.user_failure_data.description == (
        f"cannot use the warehouse at sqlite:///{tmp_path / 'warehouse.db'} (SCRAPE_WAREHOUSE_URL): "
        "OperationalError: database is locked (after 1 retry)")

    other_shape = tmp_path / "other.db"  # what the same database answers every time: no retry
    with sqlite3.connect(other_shape) as conn:
        conn.execute("CREATE TABLE products (category TEXT)")
    conn.close()
    res["warehouse"] = WarehouseResource(url=f"sqlite:///{other_shape}")
    result = materialize(instance, res, ["travel"], selection=["products_table"], raise_on_error=False)
    assert not any(e.event_type_value == "STEP_UP_FOR_RETRY" for e in result.all_events)
    (failure,) = [e for e in result.all_events if e.event_type_value == "STEP_FAILURE"]
    assert failure.step_failure_data.user_failure_data.description.startswith(
        f"cannot use the warehouse at sqlite:///{other_shape} (SCRAPE_WAREHOUSE_URL): OperationalError: ")


@contextmanager
def locked_after_the_first_load(instance, db: Path, monkeypatch) -> Iterator[list[tuple[str, bool]]]:
    """Patch ``Warehouse.load_products``: once its first call committed, another connection
    holds ``db`` exclusively (busy timeout 0.1 s) until the step asks for a retry. Yields the
    calls made, ``(category, rows given)``."""
    import threading

    import scrape_assets.warehouse as warehouse_module

    monkeypatch.setattr(warehouse_module, "SQLITE_BUSY_TIMEOUT_MS", 100)
    holder = sqlite3.connect(db, isolation_level=None, check_same_thread=False)
    loads, original = [], Warehouse.load_products

    def release_after_the_retry_was_asked() -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not instance.get_event_records(
                dg.EventRecordsFilter(event_type=dg.DagsterEventType.STEP_UP_FOR_RETRY)):
            time.sleep(0.05)
        holder.rollback()

    release = threading.Thread(target=release_after_the_retry_was_asked)

    def load_then_lock(self, category, rows, **kwargs):
        result = original(self, category, rows, **kwargs)
        loads.append((category, rows is not None))
        if len(loads) == 1:  # the first load is committed: another writer takes the database now
            holder.execute("BEGIN EXCLUSIVE")
            release.start()
        return result

    monkeypatch.setattr(Warehouse, "load_products", load_then_lock)
    try:
        yield loads
    finally:
        if release.is_alive():
            release.join()
        holder.close()


def test_a_retried_load_counts_what_its_earlier_attempt_committed(tmp_path, instance, monkeypatch):
    """The lock arrives after travel's load committed and before mystery's: the retry loads
    mystery only, and its figures and log count travel's load as this run's (not as an
    unchanged input)."""
    res = make_resources(tmp_path)
    assert materialize(instance, res, ["travel", "mystery"], selection=["raw_pages", "parsed_products"]).success
    Warehouse(f"sqlite:///{tmp_path / 'warehouse.db'}").create_tables()
    with locked_after_the_first_load(instance, tmp_path / "warehouse.db", monkeypatch) as loads:
        result = materialize(instance, res, ["travel", "mystery"], selection=["products_table"])
    assert result.success
    assert loads == [("travel", True), ("travel", False), ("mystery", True)]  # the retry did not load travel again
    rows = Warehouse(f"sqlite:///{tmp_path / 'warehouse.db'}").rows_by_category(products)
    assert rows == {"mystery": 32, "travel": 11}
    by_partition = {m.partition: m.metadata for m in result.asset_materializations_for_node("products_table")}
    assert {p: (m["rows_loaded"].value, m["partitions_reloaded"].value, m["category_rows_loaded"].value)
            for p, m in by_partition.items()} == {"travel": (43, 2, 11), "mystery": (43, 2, 32)}
    logged = [e.user_message for e in instance.all_logs(result.run_id) if e.user_message]
    assert any("travel: loaded 11 rows into products by an earlier attempt of this step" in m for m in logged)
    assert any("2 categories: 43 rows loaded into products (2 categories reloaded, 1 of them by an earlier attempt "
               "of this step, 0 earlier rows kept in them; 0 unchanged" in m for m in logged)


def test_a_retried_load_does_not_count_a_load_committed_before_its_first_attempt(tmp_path, instance, monkeypatch):
    """Another writer loads travel while this run parses (before products_table's first
    attempt): after a lock and a retry, travel is an unchanged input, not this step's load."""
    import scrape_assets.parse_run as parse_run
    from scrape_assets.extract import load_parse_state, load_parsed
    from scrape_assets.manifest import load_manifest, utc_now_iso

    res = make_resources(tmp_path)
    assert materialize(instance, res, ["travel", "mystery"], selection=["raw_pages", "parsed_products"]).success
    url = f"sqlite:///{tmp_path / 'warehouse.db'}"
    Warehouse(url).create_tables()
    original_parse, original_load = parse_run.parse_partitions, Warehouse.load_products

    def parse_then_another_writer_loads_travel(*args, **kwargs):
        yield from original_parse(*args, **kwargs)
        store = ObjectStore(str(tmp_path / "objects"))
        state = load_parse_state(store, "demo", "travel")
        rows = load_parsed(store, load_manifest(store, "demo", "travel", state.snapshot_id)).products
        original_load(Warehouse(url), "travel", rows, input_version=state.input_version, snapshot_id=state.snapshot_id,
                      loaded_at=utc_now_iso(), history_date=state.latest_snapshot_id[:10],
                      history_snapshot_id=state.latest_snapshot_id)
        time.sleep(1.05 - time.time() % 1)  # loaded_at has seconds: the step starts in a later second

    monkeypatch.setattr(parse_run, "parse_partitions", parse_then_another_writer_loads_travel)
    with locked_after_the_first_load(instance, tmp_path / "warehouse.db", monkeypatch) as loads:
        result = materialize(instance, res, ["travel", "mystery"], selection=["parsed_products", "products_table"])
    assert result.success
    assert loads == [("travel", False), ("travel", False), ("mystery", True)]
    assert Warehouse(url).rows_by_category(products) == {"mystery": 32, "travel": 11}
    by_partition = {m.partition: m.metadata for m in result.asset_materializations_for_node("products_table")}
    assert {p: (m["rows_loaded"].value, m["partitions_reloaded"].value, m["category_rows_loaded"].value)
            for p, m in by_partition.items()} == {"travel": (32, 1, 0), "mystery": (32, 1, 32)}
    logged = [e.user_message for e in instance.all_logs(result.run_id) if e.user_message]
    assert any("travel: unchanged input: products not reloaded" in m for m in logged)
    assert not any("earlier attempt" in m for m in logged)


def test_a_retried_load_counts_the_rows_its_earlier_attempt_carried_forward(tmp_path, instance):
    """products_table.py: a category loaded by an earlier attempt of the step counts, in the
    run's figures, the rows that load carried forward (rows in table - rows parsed)."""
    import types

    import logging

    from scrape_assets.defs.assets.products_table import load_categories
    from scrape_assets.extract import load_parse_state, load_parsed
    from scrape_assets.manifest import load_manifest, utc_now_iso
    from scrape_assets.storage import ObjectStore
    from scrape_assets.warehouse import Warehouse, products

    res = make_resources(tmp_path)
    assert materialize(instance, res, ["travel"], selection=["raw_pages", "parsed_products"]).success
    store = ObjectStore(str(tmp_path / "objects"))
    wh = Warehouse(f"sqlite:///{tmp_path / 'warehouse.db'}")
    wh.create_tables()
    state = load_parse_state(store, "demo", "travel")
    rows = load_parsed(store, load_manifest(store, "demo", "travel", state.snapshot_id),
                       decimal_prices=not wh.accepts_decimal_strings).products
    day = state.latest_snapshot_id[:10]
    gone = {**rows[0], "product_id": "no-longer-listed", "url": rows[0]["url"] + "#gone",
            "snapshot_id": "2000-01-01T000000Z"}
    wh.load_products("travel", [*rows, gone], input_version="older", snapshot_id="2000-01-01T000000Z",
                     loaded_at="2000-01-01T00:00:00Z", history_date="2000-01-01",
                     history_snapshot_id="2000-01-01T000000Z")
    started = utc_now_iso()
    # The first attempt's load: the product not seen this time is carried forward.
    assert wh.load_products("travel", rows, input_version=state.input_version, snapshot_id=state.snapshot_id,
                            loaded_at=utc_now_iso(), history_date=day, history_snapshot_id=state.latest_snapshot_id,
                            carry_unseen=True) == (len(rows), 1)
    context = types.SimpleNamespace(log=logging.getLogger("probe"))
    totals, loaded, in_table, problems = load_categories(context, ["travel"], res["site"], res["store"], wh,
                                                         step_started_at=started)
    assert totals == {"rows_loaded": len(rows), "partitions_reloaded": 1, "rows_carried_forward": 1}
    assert in_table == {"travel": len(rows) + 1} and problems == []


def test_a_materialization_that_cannot_tell_its_snapshot_never_lets_a_snapshot_be_adopted(instance):
    """raw_pages.py InterruptedRunSnapshots: 'Never adopted ... when the latest
    materialization cannot tell which snapshot it recorded' (no by_category entry, or one
    without snapshot_id, e.g. an event written by an older version)."""
    from scrape_assets.defs.assets.raw_pages import InterruptedRunSnapshots
    from scrape_assets.manifest import Manifest

    instance.add_run(dg.DagsterRun(job_name="daily_scrape_job", run_id="died", status=dg.DagsterRunStatus.FAILURE))
    instance.report_runless_asset_event(dg.AssetMaterialization("raw_pages", partition="classics",
                                                                metadata={"pages_done": 3}))
    instance.report_runless_asset_event(dg.AssetMaterialization(
        "raw_pages", partition="poetry", metadata={"by_category": dg.MetadataValue.json({"poetry": {"pages_done": 3}})}))
    adopt = InterruptedRunSnapshots(instance)
    for category in ("classics", "poetry"):
        assert not adopt(Manifest(site="demo", category=category, snapshot_id="s2", fetch_config={},
                                  fetch_config_hash="h", start_url="http://x/", run_id="died")), category


def test_a_run_with_no_page_attempted_has_a_success_rate_of_one():
    """raw_pages.py crawl_metadata: no page attempted is not a failure (success_rate 1.0,
    what the collapse sensor and --min-success-rate read), not 0."""
    from scrape_assets.defs.assets.raw_pages import crawl_metadata

    totals, by_category = crawl_metadata([])
    assert totals["success_rate"] == 1.0 and totals["pages_attempted"] == 0 and by_category == {}


def test_a_run_leaving_a_failing_category_out_says_so_on_the_schema_check(tmp_path, instance):
    """Dagster keeps one result of the check per run, and the UI shows the latest: a run over
    other categories (a one-category re-parse, a per-partition backfill) turned it green while
    mystery's rows were still held back for failing it. The result now names such categories."""
    good = make_resources(tmp_path)
    assert materialize(instance, good, ["travel", "mystery"]).success
    broken = make_resources(tmp_path, site=_broken_spec(tmp_path))
    failed = materialize(instance, broken, ["mystery"], selection=["parsed_products"], raise_on_error=False)
    assert {c.check_name: c.passed for c in failed.get_asset_check_evaluations()}["parsed_products_match_schema"] is False
    travel = materialize(instance, good, ["travel"], selection=["parsed_products"])
    check = {c.check_name: c for c in travel.get_asset_check_evaluations()}["parsed_products_match_schema"]
    assert check.passed is True  # travel's rows pass: its load goes on
    assert check.metadata["still_failing_outside_this_run"].value == ["mystery"]
    assert check.description == ("1 category outside this run still failing this check since an earlier run, rows "
                                 "held back: mystery")
    # a run over every category checks them itself: nothing is outside it
    everything = materialize(instance, good, ["travel", "mystery"], selection=["parsed_products"])
    check = {c.check_name: c for c in everything.get_asset_check_evaluations()}["parsed_products_match_schema"]
    assert check.passed and check.description is None  # the spec's fix parsed mystery again: it passes
    assert check.metadata["still_failing_outside_this_run"].value == []
