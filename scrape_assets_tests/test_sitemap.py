"""``incremental.revalidate: sitemap``: pages adopted on the sitemap's lastmod, page 1 as the check."""

from __future__ import annotations

import asyncio
import datetime
import functools
import gzip
import http.server
import io
import threading
import urllib.request
from email.utils import format_datetime, parsedate_to_datetime
from pathlib import Path

import pytest

from scrape_assets.manifest import latest_manifest, utc_now_iso
from scrape_assets.sitemap import Sitemap, SitemapError, load_sitemap, parse_lastmod
from scrape_assets.storage import ObjectStore
from scrape_assets.warehouse import Warehouse, products
from scrape_assets.demo_site import make_server
from scrape_assets_tests.conftest import (
    assert_later_pages_adopted,
    make_resources,
    materialize,
    run_metadata,
    serving,
)

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
        ("2026-12-02T10:30:00-05:00", datetime.datetime(2026, 12, 2, 15, 30, tzinfo=UTC)),
        ("2026-12-02T10:30:00Z", datetime.datetime(2026, 12, 2, 10, 30, tzinfo=UTC)),
        ("2026-12-02T10:30Z", datetime.datetime(2026, 12, 2, 10, 31, tzinfo=UTC)),  # end of its minute
        ("2026-12-02T10:30+01:00", datetime.datetime(2026, 12, 2, 9, 31, tzinfo=UTC)),
        ("2026-12-02T10:30:00.25Z", datetime.datetime(2026, 12, 2, 10, 30, 1, tzinfo=UTC)),  # end of its second
        # Without a zone, local time anywhere: its latest reading is at UTC-12.
        ("2026-12-02T10:30:00", datetime.datetime(2026, 12, 2, 22, 30, tzinfo=UTC)),
        ("2026-12-02", datetime.datetime(2026, 12, 3, 12, tzinfo=UTC)),  # a day: its end at UTC-12
        (" 2026-12 ", datetime.datetime(2027, 1, 1, 12, tzinfo=UTC)),
        ("2026", datetime.datetime(2027, 1, 1, 12, tzinfo=UTC)),
        ("2026-13-01", None),
        ("9999-12-31", None),  # a common "never changes" placeholder: its end is past datetime's range
        ("0001-01-01T00:00:00+14:00", None),
        ("2026-02-30", None),
        ("yesterday", None),
        ("", None),
    ],
)
def test_lastmod_is_the_latest_instant_a_w3c_datetime_may_mean(text, expected):
    assert parse_lastmod(text) == expected


def _one_entry(lastmod: str) -> Sitemap:
    sitemap = Sitemap(url="https://shop.example/sitemap.xml")
    sitemap.add(f"<urlset {NS}><url><loc>https://shop.example/p</loc><lastmod>{lastmod}</lastmod></url></urlset>".encode(),
                sitemap.url, ["shop.example"])
    return sitemap


def test_unchanged_since_the_saved_copy_by_its_last_modified_or_well_before_its_fetch():
    url = "https://shop.example/p"
    # The manifest's own format (Z suffix); Last-Modified on the site's clock, the same instant as lastmod.
    same = _one_entry("2026-12-01T00:00:00+00:00")
    assert same.unchanged_since(url, "Tue, 01 Dec 2026 00:00:00 GMT", "2026-12-01T00:10:00Z")
    assert not _one_entry("2026-12-01T00:00:01+00:00").unchanged_since(url, "Tue, 01 Dec 2026 00:00:00 GMT",
                                                                       "2026-12-01T00:10:00Z")
    # Without Last-Modified: only a change at least FETCH_MARGIN (1 h) before the fetch is surely in the copy.
    assert same.unchanged_since(url, None, "2026-12-01T01:00:00Z")
    assert not same.unchanged_since(url, None, "2026-12-01T00:59:59Z")
    # A Last-Modified after the fetch (the site's clock is wrong) is not believed: the margin decides.
    assert not _one_entry("2026-12-05T00:00:00Z").unchanged_since(url, "Sat, 05 Dec 2026 00:00:00 GMT",
                                                                  "2026-12-01T00:00:00Z")
    # A date-only lastmod is settled by a fetch after that day ended everywhere.
    day = _one_entry("2026-12-01")
    assert not day.unchanged_since(url, "Tue, 01 Dec 2026 10:00:00 GMT", "2026-12-01T20:00:00Z")
    assert day.unchanged_since(url, "Tue, 01 Dec 2026 10:00:00 GMT", "2026-12-02T13:00:00Z")
    assert not same.unchanged_since(url, "Tue, 01 Dec 2026 00:00:00 GMT", None)  # nothing known of the copy
    assert not same.unchanged_since("https://shop.example/q", None, "2026-12-09T00:00:00Z")  # not listed
    # A saved Last-Modified Python cannot hold as a date (OverflowError, a year past 9999) is
    # no date at all: the margin decides, as without one; no exception stops the crawl.
    for unreadable in ("Mon, 30 Nov 99999999999 10:00:00 GMT", "Mon, 30 Nov 10000 10:00:00 GMT"):
        assert same.unchanged_since(url, unreadable, "2026-12-01T01:00:00Z")
        assert not same.unchanged_since(url, unreadable, "2026-12-01T00:59:59Z")


def test_a_urlset_gives_each_listed_pages_lastmod_and_skips_other_origins():
    body = f"""<?xml version="1.0"?><urlset {NS}>
      <url><loc>https://shop.example/c/a/index.html</loc><lastmod>2026-12-01T00:00:00+00:00</lastmod></url>
      <url><loc> https://shop.example/c/a/page-2.html?x=1 </loc><lastmod>2026-11-30T12:00:00Z</lastmod></url>
      <url><loc>https://shop.example/c/b/index.html</loc></url>
      <url><loc>https://elsewhere.example/c/a/index.html</loc><lastmod>2026-12-01</lastmod></url>
      <url><lastmod>2026-12-01</lastmod></url>
    </urlset>""".encode()
    sitemap = Sitemap(url="https://shop.example/sitemap.xml")
    assert sitemap.add(body, sitemap.url, ["shop.example"]) == []
    assert (sitemap.urls, sitemap.skipped) == (3, 2)
    assert sitemap.lastmod == {"/c/a/index.html": datetime.datetime(2026, 12, 1, tzinfo=UTC),
                               "/c/a/page-2.html?x=1": datetime.datetime(2026, 11, 30, 12, tzinfo=UTC)}
    assert sitemap.dated("https://shop.example/c/a/index.html")
    assert not sitemap.dated("https://shop.example/c/b/index.html")  # listed without lastmod: undated


def test_an_entry_whose_loc_is_not_a_url_is_skipped():
    sitemap = Sitemap(url="http://h/sitemap.xml")
    sitemap.add(_urlset([("http://[bad/a.html", "2026-12-01"), ("http://h/b.html", "2026-12-01")]), sitemap.url, ["h"])
    assert (sitemap.urls, sitemap.skipped, sorted(sitemap.lastmod)) == (1, 1, ["/b.html"])
    assert not sitemap.dated("http://[bad/a.html")


def test_a_url_listed_twice_keeps_its_latest_lastmod_and_none_if_one_entry_has_none():
    def entries(*lastmods):
        urls = "".join(f"<url><loc>https://shop.example/p</loc>{f'<lastmod>{m}</lastmod>' if m else ''}</url>"
                       for m in lastmods)
        sitemap = Sitemap(url="https://shop.example/sitemap.xml")
        sitemap.add(f"<urlset {NS}>{urls}</urlset>".encode(), sitemap.url, ["shop.example"])
        return sitemap.lastmod.get("/p")

    newer = datetime.datetime(2026, 12, 2, 10, tzinfo=UTC)
    assert entries("2026-12-02T10:00:00Z", "2020-01-01T00:00:00Z") == newer  # an old archive entry after it
    assert entries("2020-01-01T00:00:00Z", "2026-12-02T10:00:00Z") == newer
    assert entries("2026-12-02T10:00:00Z", None) is None
    assert entries(None, "2026-12-02T10:00:00Z") is None


def test_a_sitemap_index_lists_children_on_its_own_origin_and_gzip_is_read():
    """Children on the site's origin are fetched from where the index came from (a mirror)."""
    index = f"""<sitemapindex {NS}><sitemap><loc>https://shop.example/s1.xml.gz</loc></sitemap>
      <sitemap><loc>https://evil.example/s2.xml</loc></sitemap></sitemapindex>""".encode()
    sitemap = Sitemap(url="http://127.0.0.1:8000/sitemap.xml")
    allowed = ["127.0.0.1:8000", "shop.example"]
    assert sitemap.add(index, sitemap.url, allowed) == ["http://127.0.0.1:8000/s1.xml.gz"]
    child = gzip.compress(f"<urlset {NS}><url><loc>https://shop.example/p</loc><lastmod>2026-12-01</lastmod></url></urlset>".encode())
    assert sitemap.add(child, "http://127.0.0.1:8000/s1.xml.gz", allowed) == []
    assert list(sitemap.lastmod) == ["/p"] and sitemap.skipped == 1


def test_a_gzip_bomb_stops_at_the_size_limit(monkeypatch):
    from scrape_assets import sitemap as sitemap_module

    monkeypatch.setattr(sitemap_module, "MAX_SITEMAP_BYTES", 10_000)
    bomb = gzip.compress(f"<urlset {NS}>".encode() + b" " * 20_000 + b"</urlset>")
    with pytest.raises(SitemapError, match="larger than 10,000 bytes once decompressed"):
        Sitemap(url="https://shop.example/s.xml.gz").add(bomb, "https://shop.example/s.xml.gz", ["shop.example"])


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (b"<html><body>Not found</body></html>", "root element 'html'; expected urlset or sitemapindex"),
        (b"{\"urls\": []}", "not XML"),
        (b"\x1f\x8b\x08garbage", "not gzip"),
        (b'<?xml version="1.0"?><!DOCTYPE r [<!ENTITY a "aaaaaaaaaa"><!ENTITY b "&a;&a;&a;&a;">]>'
         b'<urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9"><url><loc>&b;</loc></url></urlset>', "not XML"),
        (b'<?xml version="1.0"?><!DOCTYPE urlset SYSTEM "http://evil.example/x.dtd">'
         b'<urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9"></urlset>', "not XML"),
    ],
)
def test_a_document_that_is_no_sitemap_is_refused_with_the_reason(body, reason):
    with pytest.raises(SitemapError) as info:
        Sitemap(url="https://shop.example/sitemap.xml").add(body, "https://shop.example/sitemap.xml", ["shop.example"])
    assert reason in str(info.value) and "https://shop.example/sitemap.xml" in str(info.value)


def _file_server(tmp_path: Path, handler_class) -> tuple[Path, http.server.ThreadingHTTPServer, str]:
    """Python's file server on 127.0.0.1 over a new folder: ``(folder, server, base URL)``."""
    folder = tmp_path / "site"
    folder.mkdir()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(handler_class, directory=str(folder)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return folder, server, f"http://127.0.0.1:{server.server_address[1]}/"


def test_load_sitemap_follows_an_index_through_the_polite_fetcher(tmp_path):
    """A real server: robots.txt asked first, the index, then its child (gzip); a 404 child fails the load."""
    from scrape_assets.fetcher import FetchPolicy, PageFetcher, build_client

    folder, server, base = _file_server(tmp_path, _QuietHandler)
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
        assert sitemap.lastmod == {"/a.html": datetime.datetime(2026, 12, 2, 12, tzinfo=UTC)}
        assert _QuietHandler.paths[:3] == ["/robots.txt", "/index.xml", "/pages.xml.gz"]
        with pytest.raises(SitemapError, match="http_404"):
            asyncio.run(load(base + "missing.xml"))
        with pytest.raises(SitemapError, match="robots_disallowed"):
            asyncio.run(load(base + "private/sitemap.xml"))
    finally:
        server.shutdown()
        server.server_close()


def test_a_kept_sitemap_is_asked_for_with_a_conditional_get_and_read_from_its_copy_on_304(tmp_path):
    """Python's file server answers If-Modified-Since: the second load gets two 304s and reads
    the same dates from the kept copies; a changed child is read whole; a torn copy is not used."""
    import os

    from scrape_assets.fetcher import FetchPolicy, PageFetcher, build_client
    from scrape_assets.sitemap import SitemapCopies

    folder, server, base = _file_server(tmp_path, _ConditionalLoggingHandler)
    (folder / "index.xml").write_text(f"<sitemapindex {NS}><sitemap><loc>{base}pages.xml</loc></sitemap></sitemapindex>")
    (folder / "pages.xml").write_bytes(_urlset([(base + "a.html", "2026-12-01")]))
    day_one = datetime.datetime(2026, 12, 1, tzinfo=UTC).timestamp()
    for name in ("index.xml", "pages.xml"):
        os.utime(folder / name, (day_one, day_one))
    store = ObjectStore(str(tmp_path / "objects"))
    copies = SitemapCopies(store, "demo/sitemap.copies")

    def load():
        async def run():
            policy = FetchPolicy(user_agent="scrape-assets-test", requests_per_second=100, max_concurrency=2,
                                 max_attempts=1, obey_robots_txt=False)
            async with build_client(policy) as client:
                return await load_sitemap(PageFetcher(client, policy), base + "index.xml", copies=copies)
        _ConditionalLoggingHandler.seen.clear()
        return asyncio.run(run())

    try:
        first = load()
        assert (first.requests, first.not_modified) == (2, 0)
        assert [h for _, h in _ConditionalLoggingHandler.seen] == [None, None]  # nothing kept yet: plain GETs
        assert len([n for n in store.list_files("demo/sitemap.copies")]) == 4  # a body and its JSON per document

        second = load()
        assert (second.requests, second.not_modified) == (2, 2)
        assert [h for _, h in _ConditionalLoggingHandler.seen] == ["Tue, 01 Dec 2026 00:00:00 GMT"] * 2
        assert second.lastmod == first.lastmod == {"/a.html": datetime.datetime(2026, 12, 2, 12, tzinfo=UTC)}

        (folder / "pages.xml").write_bytes(_urlset([(base + "a.html", "2026-12-05")]))  # the child changed
        day_five = datetime.datetime(2026, 12, 5, tzinfo=UTC).timestamp()
        os.utime(folder / "pages.xml", (day_five, day_five))
        third = load()
        assert (third.requests, third.not_modified) == (2, 1)
        assert third.lastmod == {"/a.html": datetime.datetime(2026, 12, 6, 12, tzinfo=UTC)}
        assert load().not_modified == 2  # the new version was kept

        body_key, _ = copies._keys(base + "pages.xml")
        store.write_bytes_atomic(body_key, b"<urlset/>")  # as if a crash came between the body and its JSON
        fifth = load()
        assert (fifth.requests, fifth.not_modified) == (2, 1)
        assert dict(_ConditionalLoggingHandler.seen)["/pages.xml"] is None  # a torn copy: asked whole
        assert fifth.lastmod == third.lastmod

        in_flight = "demo/sitemap.copies/.0123456789abcdef01234567.body.1f2e.tmp"  # another run's write
        (tmp_path / "objects" / in_flight).write_bytes(b"<urlset")  # (temp names are no valid keys)
        (folder / "index.xml").write_text(f"<sitemapindex {NS}></sitemapindex>")  # the child is no longer listed
        assert load().urls == 0
        assert [key.rsplit("/", 1)[1] for key, _ in store.list_files("demo/sitemap.copies")] == sorted(
            [*(key.rsplit("/", 1)[1] for key in copies._keys(base + "index.xml")), in_flight.rsplit("/", 1)[1]])

        # A document served without validators: its old copy is not this document, never asked with again.
        assert copies.save(base + "index.xml", b"<sitemapindex/>", {}) is False
        assert copies.load(base + "index.xml") is None
        assert [key for key, _ in store.list_files("demo/sitemap.copies")] == [in_flight]  # its body went too
    finally:
        server.shutdown()
        server.server_close()


class _ConditionalLoggingHandler(http.server.SimpleHTTPRequestHandler):
    seen: list[tuple[str, str | None]] = []  # (path, If-Modified-Since)

    def do_GET(self):
        type(self).seen.append((self.path, self.headers.get("If-Modified-Since")))
        super().do_GET()

    def log_message(self, format, *args):  # noqa: A002
        pass


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    paths: list[str] = []

    def log_message(self, format, *args):  # noqa: A002
        type(self).paths.append(self.path)


# -- the pipeline -----------------------------------------------------------------------------
def test_spec_takes_a_sitemap_path_on_the_site_and_only_with_its_mode(tmp_path):
    from scrape_assets.errors import SpecError
    from scrape_assets.spec import load_spec

    with pytest.raises(SpecError, match="incremental.sitemap: expected a path on the site") as info:
        load_spec(_sitemap_spec(tmp_path, "  sitemap: https://elsewhere.example/sitemap.xml\n"))
    assert "demo-sitemap.yaml" in str(info.value) and "https://elsewhere.example/sitemap.xml" in str(info.value)
    with pytest.raises(SpecError, match="expected a path on the site"):
        load_spec(_sitemap_spec(tmp_path, "  sitemap: ../../sitemap.xml\n"))
    assert load_spec(_sitemap_spec(tmp_path)).incremental.sitemap == "sitemap.xml"
    assert load_spec(_sitemap_spec(tmp_path, "  sitemap: /sitemap_index.xml\n")).incremental.sitemap == "/sitemap_index.xml"
    spec_file = tmp_path / "no-mode.yaml"
    spec_file.write_text(DEMO_SPEC.read_text() + "incremental:\n  sitemap: sitemap.xml\n")
    with pytest.raises(SpecError, match="'sitemap' is used only with 'revalidate: sitemap' \\(revalidate is 'every_page'\\): set that"):
        load_spec(str(spec_file))


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
    """Today's demo, then tomorrow's: the two categories tomorrow changes have a lastmod after
    today's fetch (an honest sitemap: the demo's day is the real one here)."""
    from scrape_assets.demo_site import CATEGORY_TABLE, catalogue, changed_categories

    today = datetime.datetime.now(UTC).date()
    tomorrow = today + datetime.timedelta(days=1)
    keys = [row[0] for row in CATEGORY_TABLE]  # all twelve, in the spec's order (a partition range)
    changed = sorted(changed_categories(tomorrow))
    steady = [k for k in keys if k not in changed]
    pages = {k: catalogue(today).category(k).page_count for k in keys}
    runs = _serve_days(tmp_path, _sitemap_spec(tmp_path), keys, (today, tomorrow), instance)

    first, second = runs[today][0], runs[tomorrow][0]
    assert "/sitemap.xml" not in first  # a first run has nothing to keep: no sitemap asked
    assert len([p for p in first if p.startswith("/catalogue/")]) == sum(pages.values())
    assert second.count("/sitemap.xml") == 1  # once for the run, not per category
    asked = [p for p in second if p.startswith("/catalogue/")]
    # Page 1 of every category (the check), and every page of the two that changed.
    assert len(asked) == len(keys) + sum(pages[k] - 1 for k in changed)
    for key in steady:
        assert [p for p in asked if f"/{key}_" in p] == ["/" + catalogue(today).category(key).path]

    md = run_metadata(runs[tomorrow][1])
    by_category = md["raw_pages"]["by_category"]
    assert {k: by_category[k]["sitemap_check"] for k in keys} == dict.fromkeys(keys, "trusted")
    assert {k: by_category[k]["pages_assumed_unchanged"] for k in keys} == {
        k: 0 if k in changed else pages[k] - 1 for k in keys}
    assert {k: by_category[k]["requests_made"] for k in keys} == {k: pages[k] if k in changed else 1 for k in keys}
    store = ObjectStore(str(tmp_path / "objects"))
    for key in steady:
        assert_later_pages_adopted(store, key)
    parsed = md["parsed_products"]["by_category"]
    assert sorted(k for k in keys if not parsed[k]["unchanged"]) == changed
    assert sum(pages[k] - 1 for k in steady) > 10  # (the day's pick leaves multi-page categories to adopt)
    wh = Warehouse(f"sqlite:///{tmp_path / 'warehouse.db'}")
    assert len(wh.rows(products)) == sum(len(catalogue(tomorrow).category(k).products) for k in keys)


def test_a_page_the_sitemap_dates_after_its_saved_copy_is_asked_again(tmp_path, instance, demo_server):
    """Per page, unlike ``first_page``: a later page saved before its lastmod is revalidated alone."""
    spec_file = _sitemap_spec(tmp_path, "  max_days_without_request: 365\n")
    res = make_resources(tmp_path, site=spec_file, base_url=demo_server.base_url)
    assert materialize(instance, res, ["fiction"], selection=["raw_pages"]).success  # 4 pages
    store = ObjectStore(str(tmp_path / "objects"))
    saved = latest_manifest(store, "demo", "fiction", complete=True)
    # As if page 3 had been saved (and last modified) a day before its current version appeared.
    lastmod = parsedate_to_datetime(saved.pages[3].last_modified)
    saved.pages[3].last_modified = format_datetime(lastmod - datetime.timedelta(days=1), usegmt=True)
    saved.pages[3].fetched_at = utc_now_iso(lastmod - datetime.timedelta(hours=23))
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
    first = materialize(instance, res, ["fiction"], selection=["raw_pages"])
    assert first.success and demo_server.request_count("/no-such-sitemap.xml") == 0
    assert _logged(instance, first, "sitemap not fetched: no category has saved pages yet")
    demo_server.clear_requests()
    result = materialize(instance, res, ["fiction"], selection=["raw_pages"])
    assert result.success
    assert [r.status for r in demo_server.requests if r.path == "/no-such-sitemap.xml"] == [404]
    assert len(_catalogue_requests(demo_server)) == 4  # every page, with a conditional GET
    assert [r.status for r in demo_server.requests if r.path.startswith("/catalogue/")] == [304] * 4
    assert _logged(instance, result, "no-such-sitemap.xml: http_404: not used, every page is revalidated")
    md = run_metadata(result)["raw_pages"]
    assert md["sitemap_error"] == f"{demo_server.base_url}no-such-sitemap.xml: http_404"
    assert md["sitemap_requests"] == 1  # spent on it all the same
    assert md["pages_assumed_unchanged"] == 0 and "sitemap_check" not in md["by_category"]["fiction"]
    from scrape_assets.cli import run_figures

    assert run_figures(result)["sitemap_error"].endswith(": http_404")


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


def _demo_server_with(documents: dict[str, bytes]):
    """The demo catalogue on 127.0.0.1, plus ``documents`` (path -> XML body) served as they are."""
    from scrape_assets.demo_site import DemoRequestHandler, DemoResponse, DemoServer

    class Handler(DemoRequestHandler):
        def handle_demo(self) -> None:
            body = documents.get(self.path)
            if body is None:
                return super().handle_demo()
            self.server.record(self.command, self.path, self.headers, status=200)
            self.send_demo_response(DemoResponse(200, {"Content-Type": "application/xml",
                                                       "Content-Length": str(len(body))}, body))

        do_GET = handle_demo

    return DemoServer(("127.0.0.1", 0), Handler)


def _second_run_with_documents(tmp_path, instance, spec_extra: str, documents_for):
    """Crawl fiction (4 pages) from a demo server, then again once it also serves
    ``documents_for(base_url, saved manifest)`` (path -> XML); return (base URL, paths asked the
    second time, its result)."""
    documents = {}
    server = _demo_server_with(documents)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        res = make_resources(tmp_path, site=_sitemap_spec(tmp_path, spec_extra), base_url=server.base_url)
        assert materialize(instance, res, ["fiction"], selection=["raw_pages"]).success
        saved = latest_manifest(ObjectStore(str(tmp_path / "objects")), "demo", "fiction", complete=True)
        documents.update(documents_for(server.base_url, saved))
        server.clear_requests()
        result = materialize(instance, res, ["fiction"], selection=["raw_pages"])
        assert result.success
        return server.base_url, [r.path for r in server.requests], result
    finally:
        server.shutdown()
        server.server_close()


def _urlset(entries) -> bytes:
    return ("<urlset " + NS + ">" + "".join(
        f"<url><loc>{loc}</loc>{f'<lastmod>{m}</lastmod>' if m else ''}</url>" for loc, m in entries) + "</urlset>").encode()


def test_a_sitemap_index_naming_the_sites_origin_is_read_from_the_mirror_and_counted(tmp_path, instance):
    """Entries on the spec's origin (a mirror serves the site's own sitemap); sitemap requests
    are in the metadata and the summary."""
    site = "http://demo.scrape-assets.invalid/"  # the spec's base URL; pages are fetched from the mirror
    pages = [f"catalogue/category/books/fiction_10/{name}" for name in ("index.html", "page-2.html", "page-3.html",
                                                                       "page-4.html")]

    def documents(_base_url, saved):
        dated = [(site + path, parsedate_to_datetime(saved.pages[n].last_modified).isoformat())
                 for n, path in enumerate(pages, 1)]
        return {"/maps/index.xml": (f"<sitemapindex {NS}><sitemap><loc>{site}maps/a.xml</loc></sitemap>"
                                    "</sitemapindex>").encode(),
                "/maps/a.xml": _urlset(dated[:3])}  # page 4 is not listed: asked

    base_url, asked, result = _second_run_with_documents(tmp_path, instance, "  sitemap: /maps/index.xml\n", documents)
    assert asked.count("/maps/index.xml") == asked.count("/maps/a.xml") == 1
    assert _catalogue_requests_of(asked) == ["/" + pages[0], "/" + pages[3]]
    md = run_metadata(result)["raw_pages"]
    assert (md["sitemap_requests"], md["sitemap_urls_dated"], md["pages_assumed_unchanged"]) == (2, 3, 2)
    assert md["by_category"]["fiction"]["sitemap_check"] == "trusted"
    assert ("  requests        2 (2 not modified: 304; 2 pages kept without a request; 2 more requests for the "
            "sitemap), 0 pages failed for good") in _summary_lines(result)


def test_a_child_sitemap_that_fails_leaves_the_sitemap_unused_for_the_run(tmp_path, instance):
    """An "all" sitemap dates page 2 before its saved copy; the "recent" one, which dates it
    after, answers 500: page 2 must not be adopted on the word of the child that could be
    read. The sitemap is not used that run: every page is asked, as when none can be read."""
    site = "http://demo.scrape-assets.invalid/"
    pages = [f"catalogue/category/books/fiction_10/{name}" for name in ("index.html", "page-2.html", "page-3.html",
                                                                       "page-4.html")]

    def documents(_base_url, saved):
        old = [(site + path, "2000-01-01") for path in pages]
        return {"/maps/index.xml": (f"<sitemapindex {NS}><sitemap><loc>{site}maps/all.xml</loc></sitemap>"
                                    f"<sitemap><loc>{site}maps/recent.xml</loc></sitemap></sitemapindex>").encode(),
                "/maps/all.xml": _urlset(old)}  # recent.xml: 404 here, as a failing child

    base_url, asked, result = _second_run_with_documents(tmp_path, instance, "  sitemap: /maps/index.xml\n", documents)
    assert asked.count("/maps/all.xml") == asked.count("/maps/recent.xml") == 1
    assert _catalogue_requests_of(asked) == ["/" + path for path in pages]  # all asked (conditional GETs)
    md = run_metadata(result)["raw_pages"]
    assert (md["sitemap_requests"], md["pages_assumed_unchanged"]) == (3, 0)
    assert md["sitemap_error"] == (f"{base_url}maps/index.xml: {base_url}maps/recent.xml: http_404 (1 of its "
                                   "documents could not be read)")
    assert _logged(instance, result, f"{base_url}maps/recent.xml: http_404 (1 of its documents could not be read): "
                                     "not used, every page is revalidated")


def _robots_with_sitemaps(*urls: str) -> bytes:
    return ("User-agent: *\nDisallow: /basket/\n\n" + "".join(f"Sitemap: {u}\n" for u in urls)).encode()


def test_without_a_sitemap_in_the_spec_the_robots_txt_sitemap_lines_are_read_together(tmp_path, instance):
    """Two Sitemap: lines on the site's origin (read from the mirror), one elsewhere (ignored,
    said): pages dated by either one are adopted, and the default sitemap.xml is not asked for."""
    site = "http://demo.scrape-assets.invalid/"
    pages = [f"catalogue/category/books/fiction_10/{name}" for name in ("index.html", "page-2.html", "page-3.html",
                                                                       "page-4.html")]

    def documents(_base_url, saved):
        dated = [(site + path, parsedate_to_datetime(saved.pages[n].last_modified).isoformat())
                 for n, path in enumerate(pages, 1)]
        return {"/robots.txt": _robots_with_sitemaps(site + "maps/a.xml", "http://cdn.example.invalid/all.xml",
                                                     site + "maps/b.xml"),
                "/maps/a.xml": _urlset(dated[:2]), "/maps/b.xml": _urlset(dated[2:3])}  # page 4 not listed

    base_url, asked, result = _second_run_with_documents(tmp_path, instance, "", documents)
    assert "/sitemap.xml" not in asked
    assert asked.count("/maps/a.xml") == asked.count("/maps/b.xml") == 1
    assert _catalogue_requests_of(asked) == ["/" + pages[0], "/" + pages[3]]
    md = run_metadata(result)["raw_pages"]
    assert (md["sitemap_requests"], md["sitemap_urls_dated"], md["pages_assumed_unchanged"]) == (2, 3, 2)
    assert _logged(instance, result, "robots.txt Sitemap: lines on another origin than the site's ignored: "
                                     "http://cdn.example.invalid/all.xml")


def test_a_sitemap_named_in_the_spec_wins_over_robots_txt_and_failing_robots_sitemaps_say_which(tmp_path, instance):
    site = "http://demo.scrape-assets.invalid/"

    def named(base_url, saved):
        return {"/robots.txt": _robots_with_sitemaps(site + "maps/a.xml"),
                "/maps/b.xml": _urlset([(base_url + "catalogue/category/books/fiction_10/index.html",
                                         parsedate_to_datetime(saved.pages[1].last_modified).isoformat())])}

    (tmp_path / "named").mkdir()
    (tmp_path / "failing").mkdir()
    _, asked, _ = _second_run_with_documents(tmp_path / "named", instance, "  sitemap: maps/b.xml\n", named)
    assert "/maps/b.xml" in asked and "/maps/a.xml" not in asked

    def failing(_base_url, _saved):
        return {"/robots.txt": _robots_with_sitemaps(site + "maps/a.xml", site + "maps/b.xml")}

    base_url, asked, result = _second_run_with_documents(tmp_path / "failing", instance, "", failing)
    assert len(_catalogue_requests_of(asked)) == 4  # no sitemap: every page revalidated
    assert run_metadata(result)["raw_pages"]["sitemap_error"] == (
        f"{base_url}maps/a.xml {base_url}maps/b.xml: {base_url}maps/a.xml: http_404; {base_url}maps/b.xml: http_404")


def test_the_demo_robots_txt_names_its_sitemap_on_the_canonical_origin(demo_server):
    from protego import Protego

    from scrape_assets.demo_site import DEMO_BASE_URL

    with urllib.request.urlopen(demo_server.base_url + "robots.txt") as response:
        assert list(Protego.parse(response.read().decode()).sitemaps) == [DEMO_BASE_URL + "sitemap.xml"]


def test_the_summary_names_why_the_sitemap_was_not_used():
    from scrape_assets.cli import print_summary

    run = {"success": True, "requests_made": 4, "pages_done": 4, "pages_not_modified": 4, "pages_failed": 0,
           "sitemap_requests": 1, "sitemap_error": "http://127.0.0.1:8000/robots.txt: not XML: not well-formed "
                                                   "(invalid token): line 1, column 1",
           "pages_parsed": 0, "partitions_unchanged": 1, "rows_loaded": 0, "rows_carried_forward": 0}
    out = io.StringIO()
    print_summary({"site": "demo", "categories": 1, "categories_configured": 12, "pages_done": 4, "pages_failed": 0,
                   "success_rate": 1.0, "products_loaded": 0, "dead_letters": 0, "object_storage": "/d",
                   "warehouse": "sqlite:///w", "warehouse_site": None}, run, out=out)
    assert ("  requests        4 (4 not modified: 304; 1 more request for the sitemap; sitemap not used (not XML: not "
            "well-formed (invalid token): line 1, column 1)), 0 pages failed for good") in out.getvalue().splitlines()


def _summary_lines(result) -> list[str]:
    """The lines ``scrape-assets demo`` would print for one fiction run ``result`` (4 pages)."""
    from scrape_assets.cli import print_summary, run_figures

    out = io.StringIO()
    print_summary({"site": "demo", "categories": 1, "categories_configured": 12, "pages_done": 4, "pages_failed": 0,
                   "success_rate": 1.0, "products_loaded": 0, "dead_letters": 0, "object_storage": "/d",
                   "warehouse": "sqlite:///w", "warehouse_site": None}, {**run_figures(result), "pages_parsed": 0,
                   "partitions_unchanged": 0, "rows_loaded": 0, "rows_carried_forward": 0}, out=out)
    return out.getvalue().splitlines()


def _catalogue_requests_of(paths) -> list[str]:
    return sorted(p for p in paths if p.startswith("/catalogue/"))


def test_a_category_whose_page_one_the_sitemap_does_not_date_revalidates_every_page(tmp_path, instance):
    def documents(base_url, _saved):
        base = base_url + "catalogue/category/books/fiction_10/"
        return {"/pages.xml": _urlset([(base + "index.html", None)] + [
            (base + f"page-{n}.html", "2000-01-01T00:00:00Z") for n in (2, 3, 4)])}

    _, asked, result = _second_run_with_documents(tmp_path, instance, "  sitemap: pages.xml\n", documents)
    assert len(_catalogue_requests_of(asked)) == 4  # no check possible: nothing adopted
    md = run_metadata(result)["raw_pages"]
    assert md["by_category"]["fiction"]["sitemap_check"] == "untrusted: page 1 not dated"
    assert md["pages_assumed_unchanged"] == 0
    assert _logged(instance, result, "sitemap not used for some categories, every page of them revalidated: "
                                     "page 1 not dated in 1 (fiction)")


def test_the_next_run_asks_for_the_sitemap_with_a_conditional_get(tmp_path, instance, demo_server):
    res = make_resources(tmp_path, site=_sitemap_spec(tmp_path), base_url=demo_server.base_url)
    for _ in range(3):  # the first run reads no sitemap; the second reads it whole; the third gets a 304
        demo_server.clear_requests()
        result = materialize(instance, res, ["fiction"], selection=["raw_pages"])
        assert result.success
    assert [(r.status, r.headers.get("if-none-match") is not None) for r in demo_server.requests
            if r.path == "/sitemap.xml"] == [(304, True)]
    assert _catalogue_requests(demo_server) == ["/catalogue/category/books/fiction_10/index.html"]
    md = run_metadata(result)["raw_pages"]
    assert (md["sitemap_requests"], md["sitemap_not_modified"], md["pages_assumed_unchanged"]) == (1, 1, 3)
    assert _logged(instance, result, "1 request (1 not modified: 304, read from the kept copy)")
    assert ("  requests        1 (1 not modified: 304; 3 pages kept without a request; 1 more request for the "
            "sitemap (1 not modified: 304)), 0 pages failed for good") in _summary_lines(result)


def test_next_link_crawls_adopt_page_by_page(tmp_path, instance, demo_server):
    spec_file = tmp_path / "next-links.yaml"
    demo = "".join(line for line in DEMO_SPEC.read_text().splitlines(keepends=True) if "page_url:" not in line)
    spec_file.write_text(demo + "incremental:\n  revalidate: sitemap\n")
    res = make_resources(tmp_path, site=str(spec_file), base_url=demo_server.base_url)
    assert materialize(instance, res, ["fiction"], selection=["raw_pages"]).success
    demo_server.clear_requests()
    result = materialize(instance, res, ["fiction"], selection=["raw_pages"])
    assert result.success
    assert _catalogue_requests(demo_server) == ["/catalogue/category/books/fiction_10/index.html"]
    store = ObjectStore(str(tmp_path / "objects"))
    newer = latest_manifest(store, "demo", "fiction", complete=True)
    assert [p.assumed_unchanged for p in newer.pages.values()] == [False, True, True, True]
    assert newer.discovery_complete and len(newer.pages) == 4  # the chain followed through the adopted pages
    assert _logged(instance, result, "4 done (1 not modified: 304, 3 kept without a request), 0 failed, 1 request")


@pytest.mark.parametrize("mode", ["sitemap", "first_page"])
def test_a_page_unasked_for_max_days_without_request_is_asked_again(tmp_path, instance, mode):
    spec_file = tmp_path / f"{mode}.yaml"
    spec_file.write_text(DEMO_SPEC.read_text() + f"incremental:\n  revalidate: {mode}\n  max_days_without_request: 3\n")
    # The catalogue as it was 10 days ago: fiction's pages last changed before the fetch
    # times faked below whatever today's date (served as of today, a change of fiction in
    # the last 3 days would rightly make page 4 asked too).
    day = datetime.datetime.now(UTC).date() - datetime.timedelta(days=10)
    with serving(make_server("127.0.0.1", 0, day=day)) as demo_server:
        res = make_resources(tmp_path, site=str(spec_file), base_url=demo_server.base_url)
        assert materialize(instance, res, ["fiction"], selection=["raw_pages"]).success
        store = ObjectStore(str(tmp_path / "objects"))
        saved = latest_manifest(store, "demo", "fiction", complete=True)
        now = datetime.datetime.now(UTC)
        saved.pages[3].fetched_at = utc_now_iso(now - datetime.timedelta(days=3, minutes=1))  # just over the limit
        saved.pages[4].fetched_at = utc_now_iso(now - datetime.timedelta(days=2, hours=23))  # just under it
        saved.save(store)
        demo_server.clear_requests()
        assert materialize(instance, res, ["fiction"], selection=["raw_pages"]).success
    asked = [p.rsplit("/", 1)[1] for p in _catalogue_requests(demo_server)]
    # sitemap: per page; first_page: all or nothing, so every page is asked.
    assert asked == (["index.html", "page-3.html"] if mode == "sitemap"
                     else ["index.html", "page-2.html", "page-3.html", "page-4.html"])


def test_a_half_hour_zone_offset_counts_its_minutes():
    import datetime

    from scrape_assets.sitemap import parse_lastmod

    utc = datetime.timezone.utc
    assert parse_lastmod("2026-12-02T10:30:00+05:30") == datetime.datetime(2026, 12, 2, 5, 0, tzinfo=utc)
    assert parse_lastmod("2026-12-02T10:30:00-09:30") == datetime.datetime(2026, 12, 2, 20, 0, tzinfo=utc)


class _DocumentsFetcher:
    """What load_sitemap uses of a fetcher: ``fetch(url, on_attempt=..., headers=..., validators_url=...)``."""

    def __init__(self, docs: dict[str, bytes]):
        self.docs = docs
        self.asked: list[str] = []

    async def fetch(self, url, *, on_attempt=None, headers=None, validators_url=None):
        from scrape_assets.fetcher import FetchedPage

        self.asked.append(url)
        if on_attempt is not None:
            await on_attempt(1)
        return FetchedPage(url=url, final_url=url, http_status=200, headers={}, body=self.docs[url],
                           elapsed_ms=0.0, attempts=1)


def test_an_index_reads_at_most_max_children_and_counts_the_rest_skipped():
    """A huge or hostile index costs at most MAX_CHILD_SITEMAPS requests."""
    import asyncio

    from scrape_assets.sitemap import MAX_CHILD_SITEMAPS, load_sitemap

    ns = 'xmlns="http://www.sitemaps.org/schemas/sitemap/0.9"'
    base = "https://shop.example/"
    children = [f"{base}s{i}.xml" for i in range(MAX_CHILD_SITEMAPS + 3)]
    docs = {base + "index.xml": (f"<sitemapindex {ns}>" + "".join(f"<sitemap><loc>{c}</loc></sitemap>" for c in children)
                                 + "</sitemapindex>").encode()}
    for i, child in enumerate(children):
        docs[child] = f"<urlset {ns}><url><loc>{base}p{i}.html</loc><lastmod>2026-12-01</lastmod></url></urlset>".encode()
    fetcher = _DocumentsFetcher(docs)
    sitemap = asyncio.run(load_sitemap(fetcher, base + "index.xml"))
    assert len(fetcher.asked) == 1 + MAX_CHILD_SITEMAPS
    assert (sitemap.requests, sitemap.urls, sitemap.skipped) == (1 + MAX_CHILD_SITEMAPS, MAX_CHILD_SITEMAPS, 3)


def test_hosts_compare_in_any_case_on_both_sides():
    """``https://Shop.example/`` in a spec (its netloc is an origin as written) and a ``<loc>``
    spelled ``SHOP.example``: one host, so the entries are dated, not skipped."""
    body = _urlset([("https://SHOP.example/a.html", "2026-12-01T00:00:00Z"),
                    ("https://shop.example/b.html", "2026-12-01T00:00:00Z")])
    sitemap = Sitemap(url="https://shop.example/sitemap.xml")
    sitemap.add(body, sitemap.url, ["Shop.Example"])
    assert (sitemap.urls, sitemap.skipped, sorted(sitemap.lastmod)) == (2, 0, ["/a.html", "/b.html"])
    assert sitemap.dated("https://shop.example/a.html") and sitemap.dated("https://Shop.Example/b.html")


def test_a_loc_without_a_path_dates_the_sites_root():
    """``https://shop.example`` and ``https://shop.example/`` are one URL (RFC 9110 §4.2.3)."""
    sitemap = Sitemap(url="https://shop.example/sitemap.xml")
    sitemap.add(_urlset([("https://shop.example", "2026-12-01T00:00:00Z")]), sitemap.url, ["shop.example"])
    assert sitemap.lastmod == {"/": datetime.datetime(2026, 12, 1, tzinfo=UTC)}
    assert sitemap.dated("https://shop.example/")
    assert sitemap.unchanged_since("https://shop.example/", "Tue, 01 Dec 2026 00:00:00 GMT", "2026-12-01T00:00:05Z")


def test_a_last_modified_at_the_very_second_of_the_fetch_is_believed():
    """The copy's Last-Modified may equal its fetch time (a page generated for that request):
    it is not after the fetch, so it settles a lastmod no later than it, without the margin."""
    url = "https://shop.example/p"
    same = _one_entry("2026-12-01T00:10:00Z")
    assert same.unchanged_since(url, "Tue, 01 Dec 2026 00:10:00 GMT", "2026-12-01T00:10:00Z")
    assert not same.unchanged_since(url, "Tue, 01 Dec 2026 00:10:01 GMT", "2026-12-01T00:10:00Z")  # after the fetch


def test_a_gzip_sitemap_of_exactly_the_size_limit_is_read_and_the_limit_is_the_protocols(monkeypatch):
    """sitemaps.org: at most 50 MB, i.e. 52,428,800 bytes, uncompressed; a document of exactly
    the limit is read, one byte more is refused."""
    from scrape_assets import sitemap as sitemap_module

    assert sitemap_module.MAX_SITEMAP_BYTES == 52_428_800
    monkeypatch.setattr(sitemap_module, "MAX_SITEMAP_BYTES", 10_000)
    head, tail = f"<urlset {NS}>".encode(), b"</urlset>"
    url = "https://shop.example/s.xml.gz"
    for size in (9_999, 10_000):
        document = head + b" " * (size - len(head) - len(tail)) + tail
        assert Sitemap(url=url).add(gzip.compress(document), url, ["shop.example"]) == []
    with pytest.raises(SitemapError, match="larger than 10,000 bytes once decompressed"):
        Sitemap(url=url).add(gzip.compress(head + b" " * (10_001 - len(head) - len(tail)) + tail), url, ["shop.example"])


class _DocumentsOr404Fetcher(_DocumentsFetcher):
    """:class:`_DocumentsFetcher` answering a URL it has no document for as the fetcher does a 404."""

    async def fetch(self, url, *, on_attempt=None, headers=None, validators_url=None):
        from scrape_assets.errors import FetchError

        if url not in self.docs:
            self.asked.append(url)
            if on_attempt is not None:
                await on_attempt(1)
            raise FetchError(url, "http_404", http_status=404, attempts=1)
        return await super().fetch(url, on_attempt=on_attempt, headers=headers, validators_url=validators_url)


def _entry_doc(*locs: str) -> bytes:
    return _urlset([(loc, "2026-12-01") for loc in locs])


def _index_doc(*locs: str) -> bytes:
    return (f"<sitemapindex {NS}>" + "".join(f"<sitemap><loc>{loc}</loc></sitemap>" for loc in locs)
            + "</sitemapindex>").encode()


def test_several_roots_over_the_limit_are_counted_skipped_and_duplicates_read_once():
    """robots.txt Sitemap: lines: at most MAX_CHILD_SITEMAPS read (the rest counted), each once."""
    from scrape_assets.sitemap import MAX_CHILD_SITEMAPS

    base = "https://shop.example/"
    roots = [f"{base}s{i}.xml" for i in range(MAX_CHILD_SITEMAPS + 2)]
    fetcher = _DocumentsFetcher({root: _entry_doc(f"{base}p{i}.html") for i, root in enumerate(roots)})
    sitemap = asyncio.run(load_sitemap(fetcher, [roots[0], *roots, roots[1]]))
    assert fetcher.asked == roots[:MAX_CHILD_SITEMAPS]
    assert (sitemap.requests, sitemap.urls, sitemap.skipped) == (MAX_CHILD_SITEMAPS, MAX_CHILD_SITEMAPS, 2)
    exactly = _DocumentsFetcher(fetcher.docs)
    assert asyncio.run(load_sitemap(exactly, roots[:MAX_CHILD_SITEMAPS])).skipped == 0


def test_each_roots_own_origin_is_accepted():
    """Two Sitemap: lines on two origins the site serves (the mirror, the site): each one's entries count."""
    a, b = "http://127.0.0.1:8000/", "https://shop.example/"
    fetcher = _DocumentsFetcher({a + "a.xml": _entry_doc(a + "p1.html"), b + "b.xml": _entry_doc(b + "p2.html")})
    sitemap = asyncio.run(load_sitemap(fetcher, [a + "a.xml", b + "b.xml"]))
    assert (sitemap.urls, sitemap.skipped, sorted(sitemap.lastmod)) == (2, 0, ["/p1.html", "/p2.html"])


def test_an_index_listing_itself_or_a_child_twice_costs_one_request_each():
    base = "https://shop.example/"
    fetcher = _DocumentsFetcher({base + "index.xml": _index_doc(base + "index.xml", base + "a.xml", base + "a.xml"),
                                 base + "a.xml": _entry_doc(base + "p.html")})
    sitemap = asyncio.run(load_sitemap(fetcher, base + "index.xml"))
    assert fetcher.asked == [base + "index.xml", base + "a.xml"]
    assert (sitemap.requests, sitemap.urls, sitemap.skipped) == (2, 1, 0)


def test_an_index_listed_by_an_index_is_not_read_and_its_children_are_counted_skipped():
    """The protocol nests one level: a child that is itself an index is read, its own children not."""
    base = "https://shop.example/"
    fetcher = _DocumentsFetcher({base + "index.xml": _index_doc(base + "inner.xml"),
                                 base + "inner.xml": _index_doc(base + "deep1.xml", base + "deep2.xml")})
    sitemap = asyncio.run(load_sitemap(fetcher, base + "index.xml"))
    assert fetcher.asked == [base + "index.xml", base + "inner.xml"]
    assert (sitemap.requests, sitemap.urls, sitemap.skipped) == (2, 0, 2)


def test_many_failing_children_are_named_five_at_most_and_counted():
    base = "https://shop.example/"
    children = [f"{base}c{i}.xml" for i in range(7)]
    fetcher = _DocumentsOr404Fetcher({base + "index.xml": _index_doc(*children)})
    with pytest.raises(SitemapError) as info:
        asyncio.run(load_sitemap(fetcher, base + "index.xml"))
    assert info.value.reason == ("; ".join(f"{child}: http_404" for child in children[:5])
                                 + "; 2 more (7 of its documents could not be read)")
    assert info.value.requests == 8


class _ValidatedDocumentsFetcher(_DocumentsFetcher):
    """:class:`_DocumentsFetcher` serving every document with an ``ETag`` (so it is kept)."""

    async def fetch(self, url, *, on_attempt=None, headers=None, validators_url=None):
        page = await super().fetch(url, on_attempt=on_attempt, headers=headers, validators_url=validators_url)
        page.headers["etag"] = '"v1"'
        return page


def _copies(tmp_path):
    from scrape_assets.sitemap import SitemapCopies

    return SitemapCopies(ObjectStore(str(tmp_path / "objects")), "demo/sitemap.copies")


def test_a_storage_error_on_the_copies_costs_only_the_copy(tmp_path):
    """The copy cannot be written (a folder where its body goes): the sitemap is read all the same."""
    url = "https://shop.example/sitemap.xml"
    copies = _copies(tmp_path)
    (tmp_path / "objects" / copies._keys(url)[0]).mkdir(parents=True)
    sitemap = asyncio.run(load_sitemap(_ValidatedDocumentsFetcher({url: _entry_doc("https://shop.example/p.html")}),
                                       url, copies=copies))
    assert (sitemap.urls, sorted(sitemap.lastmod)) == (1, ["/p.html"])
    assert copies.load(url) is None


def test_a_copies_folder_that_cannot_be_listed_costs_only_the_copies(tmp_path):
    """Deleting the copies no longer listed starts with a listing: a folder it cannot read (a
    file in the way, EACCES) raised a bare OSError out of load_sitemap, which failed raw_pages
    after its retries (found by the twelfth mutation audit). The sitemap is read all the same."""
    url = "https://shop.example/sitemap.xml"
    (tmp_path / "objects" / "demo").mkdir(parents=True)
    (tmp_path / "objects" / "demo" / "sitemap.copies").write_text("in the way")
    sitemap = asyncio.run(load_sitemap(_ValidatedDocumentsFetcher({url: _entry_doc("https://shop.example/p.html")}),
                                       url, copies=_copies(tmp_path)))
    assert (sitemap.urls, sorted(sitemap.lastmod)) == (1, ["/p.html"])


def test_a_stale_copy_that_cannot_be_deleted_costs_only_the_copies(tmp_path, monkeypatch):
    """A read-only copies folder (or mount): the delete's bare PermissionError escaped
    load_sitemap as the listing's did. The sitemap is read; the stale copy stays."""
    old, url = "https://shop.example/old.xml", "https://shop.example/sitemap.xml"
    copies = _copies(tmp_path)
    assert copies.save(old, b"<urlset/>", {"etag": '"v1"'})

    def refuse(self, key):
        raise PermissionError(13, "Permission denied", key)

    monkeypatch.setattr(ObjectStore, "delete_listed", refuse)
    sitemap = asyncio.run(load_sitemap(_ValidatedDocumentsFetcher({url: _entry_doc("https://shop.example/p.html")}),
                                       url, copies=copies))
    assert (sitemap.urls, sorted(sitemap.lastmod)) == (1, ["/p.html"])
    assert copies.load(old) is not None


@pytest.mark.parametrize(("base_url", "loc"), [
    ("https://shop.example/", "https://shop.example:443/p.html"),
    ("https://Shop.example:443/", "https://shop.example/p.html"),
    ("http://shop.example:80/", "HTTP://shop.example/p.html"),
    ("https://shop.example/", "https://shop.example:/p.html"),  # an empty port is the default one
    ("https://shop.example/", "https://shop.example:0443/p.html"),  # a port is a number
])
def test_an_entry_on_the_sites_origin_with_or_without_its_default_port_is_read(base_url, loc):
    """One origin however its default port is spelled (RFC 6454), as crawl compares robots.txt's
    Sitemap: lines: the entry was skipped and its page asked again every run."""
    from scrape_assets.sitemap import origin_host

    sitemap = Sitemap(url=base_url + "sitemap.xml")
    sitemap.add(_urlset([(loc, "2026-12-01")]), sitemap.url, [origin_host(base_url)])
    assert (sitemap.urls, sitemap.skipped, sitemap.dated(base_url + "p.html")) == (1, 0, True)


def test_a_document_that_does_not_read_as_a_sitemap_is_not_kept(tmp_path):
    """An HTML error page served with an ETag at the sitemap's URL: refused, and not kept (the
    next run asks for it whole, not with the error page's validator)."""
    url = "https://shop.example/sitemap.xml"
    copies = _copies(tmp_path)
    with pytest.raises(SitemapError, match="root element 'html'"):
        asyncio.run(load_sitemap(_ValidatedDocumentsFetcher({url: b"<html><body>Maintenance</body></html>"}), url,
                                 copies=copies))
    assert copies.load(url) is None and not (tmp_path / "objects" / "demo").exists()


def test_a_kept_copy_serves_only_its_own_url_and_only_with_a_validator_it_can_send(tmp_path):
    import json

    url, other = "https://shop.example/sitemap.xml", "https://shop.example/other.xml"
    copies = _copies(tmp_path)
    assert copies.save(url, b"<urlset/>", {"etag": '"v1"'})
    objects = tmp_path / "objects"
    for mine, theirs in zip(copies._keys(url), copies._keys(other)):  # a copy moved by hand
        (objects / theirs).write_bytes((objects / mine).read_bytes())
    assert copies.load(other) is None
    assert copies.load(url).headers == {"If-None-Match": '"v1"'}
    meta_key = objects / copies._keys(url)[1]
    meta = json.loads(meta_key.read_text())
    meta.update(etag='"caf\u00e9"', last_modified="Tue, 01 Dec 2026\r\n 00:00:00 GMT")  # edited: neither sendable
    meta_key.write_text(json.dumps(meta))
    assert copies.load(url) is None


def test_a_copy_whose_body_went_missing_is_written_again_when_the_same_document_comes(tmp_path):
    url = "https://shop.example/sitemap.xml"
    copies = _copies(tmp_path)
    assert copies.save(url, b"<urlset/>", {"etag": '"v1"'})
    (tmp_path / "objects" / copies._keys(url)[0]).unlink()
    assert copies.load(url) is None
    assert copies.save(url, b"<urlset/>", {"etag": '"v1"'})  # the same document, its JSON unchanged
    assert copies.load(url).body == b"<urlset/>"


def test_a_copy_follows_where_its_document_is_served_from(tmp_path):
    """The same document, moved to another redirect target, then served without a redirect:
    the copy's validators go only to where it now comes from."""
    url = "https://shop.example/sitemap.xml"
    copies = _copies(tmp_path)
    headers = {"etag": '"v1"'}
    copies.save(url, b"<urlset/>", headers, "https://shop.example/maps/a.xml")
    assert copies.load(url).final_url == "https://shop.example/maps/a.xml"
    copies.save(url, b"<urlset/>", headers, "https://shop.example/maps/b.xml")
    assert copies.load(url).final_url == "https://shop.example/maps/b.xml"
    copies.save(url, b"<urlset/>", headers)
    assert copies.load(url).final_url is None
