"""Real input: books.toscrape.com pages saved by others, served by a plain static file server.

Runs the shipped ``books_toscrape`` spec through ``dagster asset materialize`` (a real
subprocess on a real instance) and asserts every value of EXPECTED.json.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from decimal import Decimal
from pathlib import Path

import pytest

from scrape_assets.extract import load_parsed
from scrape_assets.manifest import latest_manifest
from scrape_assets.storage import ObjectStore
from scrape_assets.warehouse import Warehouse, dead_letters, products
from scrape_assets_tests.conftest import REALDATA

# partition key in the spec -> key in EXPECTED.json
LISTINGS = {"all": "all", "mystery": "mystery_3", "travel": "travel_2"}


def dagster_materialize(env: dict, *args: str) -> subprocess.CompletedProcess:
    dagster = Path(sys.executable).with_name("dagster")
    return subprocess.run(
        [str(dagster), "asset", "materialize", "-m", "scrape_assets.definitions", *args],
        env=env, capture_output=True, text=True, timeout=300,
    )


@pytest.fixture
def books_env(tmp_path, realdata_server):
    env = {k: v for k, v in os.environ.items() if not k.startswith("SCRAPE_")}
    env.update(
        DAGSTER_HOME=str(tmp_path / "dagster_home"),
        SCRAPE_SITE="books_toscrape",
        SCRAPE_BASE_URL=realdata_server.base_url,
        SCRAPE_DATA_DIR=str(tmp_path / "data"),
        SCRAPE_REQUESTS_PER_SECOND="500",
        SCRAPE_MAX_CONCURRENCY="8",
    )
    (tmp_path / "dagster_home").mkdir()
    (tmp_path / "dagster_home" / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    return env


def test_books_toscrape_real_pages_reproduce_expected_values(books_env, realdata_server, tmp_path):
    expected = json.loads((REALDATA / "EXPECTED.json").read_text())

    # One partition with --partition, two with --partition-range (travel, mystery are adjacent in the spec).
    one = dagster_materialize(books_env, "--select", "*", "--partition", "all")
    assert one.returncode == 0, one.stderr[-3000:]
    rng = dagster_materialize(books_env, "--select", "*", "--partition-range", "travel...mystery")
    assert rng.returncode == 0, rng.stderr[-3000:]

    store = ObjectStore(str(tmp_path / "data" / "objects"))
    wh = Warehouse(f"sqlite:///{tmp_path / 'data' / 'warehouse.db'}")
    for category, key in LISTINGS.items():
        exp = expected[key]
        rows = wh.rows(products, category)
        assert len(rows) == exp["products"], category
        assert len({r["product_id"] for r in rows}) == exp["unique_product_ids"]
        assert sum(r["price"] for r in rows) == Decimal(str(exp["price_sum"]))
        histogram = Counter(str(r["rating"]) for r in rows)
        assert dict(histogram) == {k: v for k, v in exp["rating_histogram"].items() if v}
        assert {r["currency"] for r in rows} == {"GBP"}

        manifest = latest_manifest(store, "books_toscrape", category, complete=True)
        assert manifest.counts()["done"] == exp["pages_present"]
        first = load_parsed(store, manifest).products[0]  # first card of page 1, in page order
        exp_first = exp["first_product"]
        assert {k: first[k] for k in exp_first} == {**exp_first, "price": Decimal(str(exp_first["price"]))}
        in_table = next(r for r in rows if r["product_id"] == exp_first["product_id"])
        assert in_table["url"] == exp_first["url"]  # canonical, although fetched from 127.0.0.1
        if exp["pager_text_on_first_page"]:
            total = int(exp["pager_text_on_first_page"].rsplit(" ", 1)[1])
            assert manifest.total_pages == total
        else:
            assert manifest.total_pages == 1

    # Mystery page 2 was never saved: a dead letter with HTTP 404, the rest of the run succeeded.
    letters = wh.rows(dead_letters)
    assert [(r["category"], r["stage"], r["http_status"], r["attempts"], r["reason"]) for r in letters] == [
        ("mystery", "fetch", 404, 1, "http_404")
    ]
    assert letters[0]["url"] == f"{realdata_server.base_url}catalogue/category/books/mystery_3/page-2.html"
    mystery = latest_manifest(store, "books_toscrape", "mystery")
    assert mystery.pages[2].status == "failed" and mystery.products_expected == 32
    assert mystery.counts() == {"pending": 0, "done": 1, "failed": 1, "attempts": 2}
    # Each page was requested once: no retry of a 404, no refetch by the downstream assets.
    pages = [p for p in realdata_server.paths if p != "/robots.txt"]
    assert len(pages) == len(set(pages)) == 50 + 2 + 1
