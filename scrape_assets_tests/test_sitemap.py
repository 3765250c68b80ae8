"""``incremental.revalidate: sitemap``: pages adopted on the sitemap's lastmod, page 1 as the check."""

from __future__ import annotations

import asyncio
import datetime
import functools
import gzip
import http.server
import threading
from pathlib import Path

import pytest

from scrape_assets.manifest import latest_manifest
from scrape_assets.sitemap import Sitemap, SitemapError, load_sitemap, parse_lastmod, saved_at
from scrape_assets.storage import ObjectStore
from scrape_assets.warehouse import Warehouse, products
from scrape_assets_tests.conftest import assert_later_pages_adopted, make_resources, materialize, run_metadata

UTC = datetime.timezone.utc
DEMO_SPEC = Path(__file__).resolve().parents[1] / "scrape_assets" / "sites" / "demo.yaml"
NS = 'xmlns="http://www.sitemaps.org/schemas/sitemap/0.9"'


def _sitemap_spec(tmp_path: Path, extra: str = "") -> str:
    spec_file = tmp_path / "demo-sitemap.yaml"
    spec_file.write_text(DEMO_SPEC.read_text() + "incremental:\n  revalidate: sitemap\n" + extra)
    return str(spec_file)


def _catalogue_requests(server) -> list[str]:
    return sorted(r.path for r in server.requests if r.path.startswith("/catalogue/"))


# -- the format ------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2026-12-02T10:30:00+01:00", datetime.datetime(2026, 12, 2, 9, 30, tzinfo=UTC)),
        ("2026-12-02T10:30:00Z", datetime.datetime(2026, 12, 2, 10, 30, tzinfo=UTC)),
        ("2026-12-02T10:30Z", datetime.datetime(2026, 12, 2, 10, 30, tzinfo=UTC)),
        ("2026-12-02T10:30:00.25Z", datetime.datetime(2026, 12, 2, 10, 30, 1, tzinfo=UTC)),  # end of its second
        ("2026-12-02T10:30:00", datetime.datetime(2026, 12, 2, 10, 30, tzinfo=UTC)),  # no zone: UTC
        ("2026-12-02", datetime.datetime(2026, 12, 3, tzinfo=UTC)),  # a day: its end
        (" 2026-12 ", datetime.datetime(2027, 1, 1, tzinfo=UTC)),
        ("2026", datetime.datetime(2027, 1, 1, tzinfo=UTC)),
        ("2026-13-01", None),
        ("2026-02-30", None),
        ("yesterday", None),
        ("", None),
    ],
)
def test_lastmod_is_the_latest_instant_a_w3c_datetime_may_mean(text, expected):
    assert parse_lastmod(text) == expected


def test_saved_at_prefers_the_sites_last_modified_over_our_fetch_time():
    assert saved_at("Wed, 02 Dec 2026 00:00:00 GMT", "2026-12-02T08:00:00+00:00") == datetime.datetime(2026, 12, 2, tzinfo=UTC)
    assert saved_at(None, "2026-12-02T08:00:00+00:00") == datetime.datetime(2026, 12, 2, 8, tzinfo=UTC)
    assert saved_at("not a date", "2026-12-02T08:00:00+00:00") == datetime.datetime(2026, 12, 2, 8, tzinfo=UTC)
    assert saved_at(None, None) is None


def test_a_urlset_gives_each_listed_pages_lastmod_and_skips_other_origins():
    body = f"""<?xml version="1.0"?><urlset {NS}>
      <url><loc>https://shop.example/c/a/index.html</loc><lastmod>2026-12-01T00:00:00+00:00</lastmod></url>
      <url><loc> https://shop.example/c/a/page-2.html?x=1 </loc><lastmod>2026-11-30</lastmod></url>
      <url><loc>https://shop.example/c/b/index.html</loc></url>
      <url><loc>https://elsewhere.example/c/a/index.html</loc><lastmod>2026-12-01</lastmod></url>
      <url><lastmod>2026-12-01</lastmod></url>
    </urlset>""".encode()
    sitemap = Sitemap(url="https://shop.example/sitemap.xml")
    assert sitemap.add(body, sitemap.url, ["shop.example"]) == []
    assert (sitemap.urls, sitemap.skipped) == (3, 2)
    assert sitemap.lastmod == {"/c/a/index.html": datetime.datetime(2026, 12, 1, tzinfo=UTC),
                               "/c/a/page-2.html?x=1": datetime.datetime(2026, 12, 1, tzinfo=UTC)}
    saved = datetime.datetime(2026, 12, 1, tzinfo=UTC)
    assert sitemap.unchanged_since("https://shop.example/c/a/index.html", saved)
    assert not sitemap.unchanged_since("https://shop.example/c/a/index.html", saved - datetime.timedelta(seconds=1))
    assert not sitemap.unchanged_since("https://shop.example/c/b/index.html", saved)  # listed without lastmod
    assert not sitemap.unchanged_since("https://shop.example/c/z/index.html", saved)  # not listed
    assert not sitemap.unchanged_since("https://shop.example/c/a/index.html", None)


def test_a_sitemap_index_lists_children_and_gzip_is_read():
    index = f"""<sitemapindex {NS}><sitemap><loc>https://shop.example/s1.xml.gz</loc></sitemap>
      <sitemap><loc>https://evil.example/s2.xml</loc></sitemap></sitemapindex>""".encode()
    sitemap = Sitemap(url="https://shop.example/sitemap.xml")
    assert sitemap.add(index, sitemap.url, ["shop.example"]) == ["https://shop.example/s1.xml.gz"]
    child = gzip.compress(f"<urlset {NS}><url><loc>https://shop.example/p</loc><lastmod>2026-12-01</lastmod></url></urlset>".encode())
    assert sitemap.add(child, "https://shop.example/s1.xml.gz", ["shop.example"]) == []
    assert list(sitemap.lastmod) == ["/p"] and sitemap.skipped == 1


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (b"<html><body>Not found</body></html>", "root element 'html'; expected urlset or sitemapindex"),
        (b"{\"urls\": []}", "not XML"),
        (b"\x1f\x8b\x08garbage", "not gzip"),
        (b'<?xml version="1.0"?><!DOCTYPE r [<!ENTITY a "aaaaaaaaaa"><!ENTITY b "&a;&a;&a;&a;">]>'
         b'<urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9"><url><loc>&b;</loc></url></urlset>', "not XML"),
    ],
)
def test_a_document_that_is_no_sitemap_is_refused_with_the_reason(body, reason):
    with pytest.raises(SitemapError) as info:
        Sitemap(url="https://shop.example/sitemap.xml").add(body, "https://shop.example/sitemap.xml", ["shop.example"])
    assert reason in str(info.value) and "https://shop.example/sitemap.xml" in str(info.value)


def test_load_sitemap_follows_an_index_through_the_polite_fetcher(tmp_path):
    """A real server: robots.txt asked first, the index, then its child (gzip); a 404 child fails the load."""
    from scrape_assets.fetcher import FetchPolicy, PageFetcher, build_client

    folder = tmp_path / "site"
    folder.mkdir()
    handler = functools.partial(_QuietHandler, directory=str(folder))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}/"
    (folder / "robots.txt").write_text("User-agent: *\nDisallow: /private/\n")
    (folder / "index.xml").write_text(f"<sitemapindex {NS}><sitemap><loc>{base}pages.xml.gz</loc></sitemap></sitemapindex>")
    (folder / "pages.xml.gz").write_bytes(gzip.compress(
        f"<urlset {NS}><url><loc>{base}a.html</loc><lastmod>2026-12-01</lastmod></url></urlset>".encode()))

    async def load(url):
        policy = FetchPolicy(user_agent="scrape-assets-test", requests_per_second=100, max_concurrency=2, max_attempts=1)
        async with build_client(policy) as client:
            return await load_sitemap(PageFetcher(client, policy), url)

    try:
        sitemap = asyncio.run(load(base + "index.xml"))
        assert (sitemap.requests, sitemap.urls) == (2, 1)
        assert sitemap.lastmod == {"/a.html": datetime.datetime(2026, 12, 2, tzinfo=UTC)}
        assert _QuietHandler.paths[:3] == ["/robots.txt", "/index.xml", "/pages.xml.gz"]
        with pytest.raises(SitemapError, match="http_404"):
            asyncio.run(load(base + "missing.xml"))
        with pytest.raises(SitemapError, match="robots_disallowed"):
            asyncio.run(load(base + "private/sitemap.xml"))
    finally:
        server.shutdown()
        server.server_close()


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    paths: list[str] = []

    def log_message(self, format, *args):  # noqa: A002
        type(self).paths.append(self.path)


# -- the pipeline -----------------------------------------------------------------------------
def test_spec_refuses_a_sitemap_outside_the_site(tmp_path):
    from scrape_assets.errors import SpecError
    from scrape_assets.spec import load_spec

    with pytest.raises(SpecError, match="incremental.sitemap.*relative to base_url"):
        load_spec(_sitemap_spec(tmp_path, "  sitemap: https://elsewhere.example/sitemap.xml\n"))
    assert load_spec(_sitemap_spec(tmp_path)).incremental.sitemap == "sitemap.xml"


def _serve_days(tmp_path, spec_file, keys, days, instance, before_day=None):
    """Materialize ``keys`` on each day's demo server (same port); return {day: (requests, result)}."""
    from scrape_assets.demo_site import make_server

    out, port = {}, 0
    for day in days:
        if before_day is not None:
            before_day(day)
        server = make_server("127.0.0.1", port, day=day)
        port = server.server_address[1]
        threading.Thread(target=server.serve_forever, daemon=True).start()
        try:
            res = make_resources(tmp_path, site=spec_file, base_url=server.base_url)
            result = materialize(instance, res, keys)
            assert result.success
            out[day] = ([r.path for r in server.requests], result)
        finally:
            server.shutdown()
            server.server_close()
    return out


def test_an_unchanged_category_costs_its_page_one_and_a_changed_one_every_page(tmp_path, instance):
    from scrape_assets.demo_site import changed_categories

    day1, day2 = datetime.date(2026, 11, 30), datetime.date(2026, 12, 1)
    keys = ["fiction", "default", "fantasy", "science", "poetry"]  # 4, 12, 3, 1, 1 pages
    assert changed_categories(day2) & set(keys) == {"default", "poetry"}
    runs = _serve_days(tmp_path, _sitemap_spec(tmp_path), keys, (day1, day2), instance)

    first, second = runs[day1][0], runs[day2][0]
    assert "/sitemap.xml" not in first  # a first run has nothing to keep: no sitemap asked
    assert len([p for p in first if p.startswith("/catalogue/")]) == 4 + 12 + 3 + 1 + 1
    assert second.count("/sitemap.xml") == 1  # once for the run, not per category
    asked = sorted(p for p in second if p.startswith("/catalogue/"))
    # Page 1 of every category (the check), and every page of the two that changed.
    assert len(asked) == 5 + 11 + 0 and sum("/default_15/" in p for p in asked) == 12
    assert [p for p in asked if "/fiction_10/" in p] == ["/catalogue/category/books/fiction_10/index.html"]

    md = run_metadata(runs[day2][1])
    by_category = md["raw_pages"]["by_category"]
    assert {k: by_category[k]["pages_assumed_unchanged"] for k in keys} == {
        "fiction": 3, "default": 0, "fantasy": 2, "science": 0, "poetry": 0}
    assert {k: by_category[k]["requests_made"] for k in keys} == {
        "fiction": 1, "default": 12, "fantasy": 1, "science": 1, "poetry": 1}
    store = ObjectStore(str(tmp_path / "objects"))
    for key in ("fiction", "fantasy"):
        assert_later_pages_adopted(store, key)
    parsed = md["parsed_products"]["by_category"]
    assert {k for k in keys if not parsed[k]["unchanged"]} == {"default", "poetry"}
    wh = Warehouse(f"sqlite:///{tmp_path / 'warehouse.db'}")
    assert len(wh.rows(products)) == 65 + 232 + 48 + 14 + 19


def test_a_page_the_sitemap_dates_after_its_saved_copy_is_asked_again(tmp_path, instance, demo_server):
    """Per page, unlike ``first_page``: a later page saved before its lastmod is revalidated alone."""
    spec_file = _sitemap_spec(tmp_path)
    res = make_resources(tmp_path, site=spec_file, base_url=demo_server.base_url)
    assert materialize(instance, res, ["fiction"], selection=["raw_pages"]).success  # 4 pages
    store = ObjectStore(str(tmp_path / "objects"))
    saved = latest_manifest(store, "demo", "fiction", complete=True)
    # As if page 3 had been saved a day before its current version appeared.
    saved.pages[3].last_modified = "Sun, 01 Jan 2006 00:00:00 GMT"
    saved.save(store)

    demo_server.clear_requests()
    result = materialize(instance, res, ["fiction"], selection=["raw_pages"])
    assert result.success
    assert _catalogue_requests(demo_server) == ["/catalogue/category/books/fiction_10/index.html",
                                                "/catalogue/category/books/fiction_10/page-3.html"]
    newer = latest_manifest(store, "demo", "fiction", complete=True)
    assert [p.assumed_unchanged for p in newer.pages.values()] == [False, True, False, True]
    assert (newer.pages[3].status, newer.pages[3].http_status) == ("done", 304)  # asked; its ETag still matched
    assert run_metadata(result)["raw_pages"]["by_category"]["fiction"]["pages_assumed_unchanged"] == 2


def test_a_sitemap_contradicted_by_page_one_is_not_trusted_for_that_category(tmp_path, instance, demo_server):
    spec_file = _sitemap_spec(tmp_path)
    res = make_resources(tmp_path, site=spec_file, base_url=demo_server.base_url)
    assert materialize(instance, res, ["fiction", "fantasy"], selection=["raw_pages"]).success
    store = ObjectStore(str(tmp_path / "objects"))
    saved = latest_manifest(store, "demo", "fiction", complete=True)
    # Page 1's saved copy differs from what is served now, yet its saved time is after every lastmod.
    saved.pages[1].content_hash, saved.pages[1].etag, saved.pages[1].last_modified = "sha256:" + "0" * 64, None, None
    saved.pages[1].fetched_at = "2099-01-01T00:00:00+00:00"
    saved.save(store)

    demo_server.clear_requests()
    result = materialize(instance, res, ["fiction", "fantasy"], selection=["raw_pages"])
    assert result.success
    asked = _catalogue_requests(demo_server)
    assert sum("/fiction_10/" in p for p in asked) == 4  # every page of fiction revalidated
    assert sum("/fantasy_19/" in p for p in asked) == 1  # fantasy still trusts it
    by_category = run_metadata(result)["raw_pages"]["by_category"]
    assert by_category["fiction"]["pages_assumed_unchanged"] == 0
    assert by_category["fantasy"]["pages_assumed_unchanged"] == 2
    assert _logged(instance, result, "fiction: page 1 changed although the sitemap")


def test_an_unusable_sitemap_revalidates_every_page_and_says_why(tmp_path, instance, demo_server):
    spec_file = _sitemap_spec(tmp_path, "  sitemap: no-such-sitemap.xml\n")
    res = make_resources(tmp_path, site=spec_file, base_url=demo_server.base_url)
    assert materialize(instance, res, ["fiction"], selection=["raw_pages"]).success
    demo_server.clear_requests()
    result = materialize(instance, res, ["fiction"], selection=["raw_pages"])
    assert result.success
    assert [r.status for r in demo_server.requests if r.path == "/no-such-sitemap.xml"] == [404]
    assert len(_catalogue_requests(demo_server)) == 4  # every page, with a conditional GET
    assert [r.status for r in demo_server.requests if r.path.startswith("/catalogue/")] == [304] * 4
    assert _logged(instance, result, "no-such-sitemap.xml: http_404: not used, every page is revalidated")


def _logged(instance, result, text: str) -> bool:
    return any(text in (e.user_message or "") for e in instance.all_logs(result.run_id))


def test_the_demo_sitemap_dates_every_listing_page_as_its_last_modified():
    from email.utils import parsedate_to_datetime

    from scrape_assets.demo_site import catalogue, respond

    day = datetime.date(2026, 12, 1)
    answer = respond("GET", "/sitemap.xml", {"Host": "127.0.0.1:8000"}, day=day)
    assert answer.status == 200 and answer.headers["Content-Type"] == "application/xml"
    sitemap = Sitemap(url="http://127.0.0.1:8000/sitemap.xml")
    sitemap.add(answer.body, sitemap.url, ["127.0.0.1:8000"])
    paths = ["/" + c.page_path(n) for c in catalogue(day).categories for n in range(1, c.page_count + 1)]
    assert sitemap.urls == len(paths) == 38 and sorted(sitemap.lastmod) == sorted(paths)
    for path in paths:
        page = respond("GET", path, day=day)
        assert sitemap.lastmod[path] == parsedate_to_datetime(page.headers["Last-Modified"])
