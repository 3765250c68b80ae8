"""Conditional GETs at the edges of RFC 9110 / 9111, against a scripted server on 127.0.0.1.

Each test answers every request the way a real (sometimes misconfigured) site does and
checks what the pipeline asked, stored and loaded: a 304 is reused only for a saved copy
it identifies and that is still in storage, validators go only to the URL they came from,
an outage day does not cost the next day its conditional GETs, and a corrected charset
label on the same bytes is parsed again.
"""

from __future__ import annotations

import contextlib
import sqlite3
import threading
from email.utils import parsedate_to_datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import SimpleNamespace

import pytest

from scrape_assets.fetcher import validators_differ
from scrape_assets.manifest import list_snapshots, load_manifest
from scrape_assets.storage import ObjectStore
from scrape_assets_tests.conftest import make_resources, materialize, run_metadata

SPEC = """name: rev
base_url: http://rev.example/
currency: {currency}
{extra_top}politeness: {{requests_per_second: 500.0, max_concurrency: 4, obey_robots_txt: false}}
selectors:
  product: article.product_pod
  title: {{css: h3 > a, attr: title}}
  url: {{css: h3 > a, attr: href}}
  price: {{css: p.price_color}}
  rating: {{css: p.star-rating, attr: class}}
  availability: {{css: p.availability}}
pagination:
  pager: ul.pager li.current
  pager_regex: 'Page\\s+(\\d+)\\s+of\\s+(\\d+)'
  next_link: ul.pager li.next a
  page_url: page-{{n}}.html
  results_count: form.form-horizontal strong
product_id: {{source: url, regex: '_(\\d+)/index\\.html$'}}
categories:
  travel: cat/index.html
{extra}"""


class Site:
    """A scripted site: ``routes`` maps a path to ``f(request headers, lower-case) -> (status, headers, body)``;
    ``log`` records ``(path, request headers, status)``."""

    def __init__(self):
        self.routes: dict = {}
        self.log: list[tuple[str, dict, int]] = []

    def asked(self, prefix: str = "/cat"):
        return [(path, status) for path, _, status in self.log if path.startswith(prefix)]

    def sent(self, header: str, prefix: str = "/cat"):
        return [(path, headers.get(header)) for path, headers, _ in self.log if path.startswith(prefix)]


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def do_GET(self):
        site = self.server.site
        request = {k.lower(): v for k, v in self.headers.items()}
        route = site.routes.get(self.path)
        status, headers, body = route(request) if route else (404, {"Content-Type": "text/plain"}, b"not found")
        site.log.append((self.path, request, status))
        self.send_response(status)
        for name, value in headers.items():
            self.send_header(name, value)
        self.send_header("Content-Length", "0" if status == 304 else str(len(body)))
        self.end_headers()
        if status != 304:
            self.wfile.write(body)


@contextlib.contextmanager
def serve(site: Site):
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    server.daemon_threads = True
    server.site = site
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


def card(pid: int, title: str, price: str) -> str:
    return (f'<li><article class="product_pod"><h3><a href="../book-{pid}_{pid}/index.html" title="{title}">{title}</a>'
            f'</h3><p class="price_color">{price}</p><p class="star-rating Three"></p>'
            f'<p class="availability">In stock</p></article></li>')


def listing(n: int, total: int, cards: list[str]) -> bytes:
    following = f'<li class="next"><a href="page-{n + 1}.html">next</a></li>' if n < total else ""
    pager = f'<ul class="pager"><li class="current">Page {n} of {total}</li>{following}</ul>' if total > 1 else ""
    return (f'<html><head></head><body><form class="form-horizontal"><strong>{len(cards) * total}</strong> results'
            f"</form><ol>{''.join(cards)}</ol>{pager}</body></html>").encode()


def compliant(body: bytes, etag: str | None = None, last_modified: str | None = None,
              content_type: str = "text/html; charset=utf-8"):
    """A route answering conditional GETs as RFC 9110 §13.2.2 says (If-None-Match first)."""

    def route(request):
        headers = {"Content-Type": content_type, **({"ETag": etag} if etag else {}),
                   **({"Last-Modified": last_modified} if last_modified else {})}
        if "if-none-match" in request:
            tags = [t.strip().removeprefix("W/") for t in request["if-none-match"].split(",")]
            return (304, headers, b"") if etag and etag.removeprefix("W/") in tags else (200, headers, body)
        if last_modified and "if-modified-since" in request:
            if parsedate_to_datetime(last_modified) <= parsedate_to_datetime(request["if-modified-since"]):
                return 304, headers, b""
        return 200, headers, body

    return route


class Runs:
    """Runs of the whole pipeline (or a selection) over ``travel`` from the scripted site, day after day."""

    def __init__(self, instance, folder: Path, base_url: str, *, extra: str = "", currency: str = "GBP",
                 extra_top: str = "", **site):
        spec = folder / "rev.yaml"
        spec.write_text(SPEC.format(extra=extra, currency=currency, extra_top=extra_top))
        self.instance, self.folder = instance, folder
        self.resources = make_resources(folder, site=str(spec), base_url=base_url, **site)

    def run(self, **kwargs):
        result = materialize(self.instance, self.resources, ["travel"], **kwargs)
        assert result.success
        return run_metadata(result)

    def products(self) -> list[tuple[str, str, float]]:
        with contextlib.closing(sqlite3.connect(self.folder / "warehouse.db")) as db:
            return db.execute("select product_id, title, price from products order by product_id").fetchall()

    def manifests(self):
        store = ObjectStore(str(self.folder / "objects"))
        return [load_manifest(store, "rev", "travel", s) for s in list_snapshots(store, "rev", "travel")]


# -- which 304 identifies the saved copy (RFC 9111 §4.3.4) -----------------------------------------
@pytest.mark.parametrize(
    ("headers", "saved", "differs"),
    [
        ({"etag": '"a"'}, ('"a"', None), False),
        ({"etag": 'W/"a"'}, ('"a"', None), False),  # weak comparison: a server may weaken a tag
        ({"etag": '"b"'}, ('"a"', None), True),
        # no tag kept (the site sent none): a tag names another copy, whatever the date says
        ({"etag": '"b"', "last-modified": "Tue, 01 Dec 2026 10:00:00 GMT"}, (None, "Tue, 01 Dec 2026 10:00:00 GMT"), True),
        ({"etag": 'W/"b"'}, (None, "Tue, 01 Dec 2026 10:00:00 GMT"), True),
        # a tag that cannot be kept (non-ASCII, RFC 9110 obs-text) was dropped from the copy: the date decides
        ({"etag": '"café"'}, (None, "Tue, 01 Dec 2026 10:00:00 GMT"), False),
        ({"last-modified": "Tue, 01 Dec 2026 10:00:00 GMT"}, (None, "Tue, 01 Dec 2026 10:00:00 GMT"), False),
        ({"last-modified": "Tuesday, 01-Dec-26 10:00:00 GMT"}, (None, "Tue, 01 Dec 2026 10:00:00 GMT"), False),
        ({"last-modified": "Tue, 01 Dec 2026 10:00:01 GMT"}, (None, "Tue, 01 Dec 2026 10:00:00 GMT"), True),
        ({}, ('"a"', "Tue, 01 Dec 2026 10:00:00 GMT"), False),  # a 304 naming nothing: the copy asked about
    ],
)
def test_a_304_identifies_the_saved_copy_by_its_validators(headers, saved, differs):
    reason = validators_differ(headers, SimpleNamespace(etag=saved[0], last_modified=saved[1]))
    assert (reason is not None) == differs


def test_a_304_naming_another_etag_is_not_reused_and_the_page_is_fetched_whole(tmp_path, instance):
    """A server honouring If-Modified-Since only; the page changed within the same second
    (Last-Modified unchanged, ETag "a" -> "b"): its 304 is for another copy than ours."""
    modified = "Mon, 30 Nov 2026 10:00:00 GMT"
    state = {"body": listing(1, 1, [card(1, "Book one", "£10.00"), card(2, "Book two", "£20.00")]), "etag": '"a"'}

    def page(request):
        headers = {"Content-Type": "text/html; charset=utf-8", "ETag": state["etag"], "Last-Modified": modified}
        return (304, headers, b"") if request.get("if-modified-since") == modified else (200, headers, state["body"])

    site = Site()
    site.routes["/cat/index.html"] = page
    with serve(site) as base:
        runs = Runs(instance, tmp_path, base)
        runs.run()
        state["body"], state["etag"] = listing(1, 1, [card(1, "Book one", "£10.00"), card(2, "Book two", "£25.00")]), '"b"'
        site.log.clear()
        md = runs.run()
    assert site.asked() == [("/cat/index.html", 304), ("/cat/index.html", 200)]
    assert site.sent("if-none-match") == [("/cat/index.html", '"a"'), ("/cat/index.html", None)]
    assert (md["raw_pages"]["requests_made"], md["raw_pages"]["pages_not_modified"]) == (2, 0)
    page1 = runs.manifests()[-1].pages[1]
    assert (page1.http_status, page1.etag, page1.body_key, page1.attempts) == (200, '"b"', None, 1)
    assert runs.products() == [("1", "Book one", 10), ("2", "Book two", 25)]


def test_a_304_with_an_etag_the_saved_copy_never_had_is_not_reused(tmp_path, instance):
    """The site served the page with Last-Modified only, then began sending ETags (a CDN
    setting) while its Last-Modified lags the content. Its 304 to If-Modified-Since carries
    the new page's tag: it names no copy of ours (RFC 9111 §4.3.4), so the page is fetched
    whole; reused, the old body would have been stored under the new tag and every later
    day's 304 would have kept the old prices."""
    modified = "Mon, 30 Nov 2026 10:00:00 GMT"
    state = {"body": listing(1, 1, [card(1, "Book one", "£10.00")]), "etag": None}

    def page(request):
        headers = {"Content-Type": "text/html; charset=utf-8", "Last-Modified": modified,
                   **({"ETag": state["etag"]} if state["etag"] else {})}
        tags = request.get("if-none-match")
        if (tags == state["etag"] if tags else request.get("if-modified-since") == modified):
            return 304, headers, b""
        return 200, headers, state["body"]

    site = Site()
    site.routes["/cat/index.html"] = page
    with serve(site) as base:
        runs = Runs(instance, tmp_path, base)
        runs.run()
        state["body"], state["etag"] = listing(1, 1, [card(1, "Book one", "£14.00")]), '"v2"'
        site.log.clear()
        md = runs.run()
        assert site.asked() == [("/cat/index.html", 304), ("/cat/index.html", 200)]
        assert (md["raw_pages"]["requests_made"], md["raw_pages"]["pages_not_modified"]) == (2, 0)
        assert runs.products() == [("1", "Book one", 14)]
        page1 = runs.manifests()[-1].pages[1]
        assert (page1.http_status, page1.etag) == (200, '"v2"')
        site.log.clear()
        md = runs.run()  # the next day: the tag it now has identifies the copy
    assert site.sent("if-none-match") == [("/cat/index.html", '"v2"')]
    assert site.asked() == [("/cat/index.html", 304)] and md["raw_pages"]["pages_not_modified"] == 1
    assert runs.products() == [("1", "Book one", 14)]


def test_a_server_whose_304s_alone_carry_an_etag_costs_one_full_fetch_then_its_304s_are_reused(tmp_path, instance):
    """nginx before 1.7.3 with gzip on clears the ETag of its 200s, not of its 304s (no body
    to compress). The first 304 names no copy of ours (saved without a tag) and the page is
    fetched whole once; its tag, which named what that 200 sent, is kept with the copy, so
    the next days' 304s identify it instead of costing two requests a page every day."""
    modified = "Mon, 30 Nov 2026 10:00:00 GMT"
    body = listing(1, 1, [card(1, "Book one", "£10.00")])

    def page(request):
        if request.get("if-none-match") == '"v1"' or (
                "if-none-match" not in request and request.get("if-modified-since") == modified):
            return 304, {"Last-Modified": modified, "ETag": '"v1"'}, b""
        return 200, {"Content-Type": "text/html; charset=utf-8", "Last-Modified": modified}, body

    site = Site()
    site.routes["/cat/index.html"] = page
    with serve(site) as base:
        runs = Runs(instance, tmp_path, base)
        runs.run()
        days = []
        for _ in range(3):
            site.log.clear()
            md = runs.run()
            days.append((site.asked(), md["raw_pages"]["pages_not_modified"], md["parsed_products"]["pages_parsed"]))
        assert site.sent("if-none-match") == [("/cat/index.html", '"v1"')]
    assert days == [([("/cat/index.html", 304), ("/cat/index.html", 200)], 0, 0),  # same bytes: not parsed again
                    ([("/cat/index.html", 304)], 1, 0), ([("/cat/index.html", 304)], 1, 0)]
    assert runs.manifests()[-1].pages[1].etag == '"v1"'
    assert runs.products() == [("1", "Book one", 10)]


def test_a_refused_304s_etag_is_not_kept_for_a_page_that_changed_before_the_200_after_it(tmp_path, instance):
    """Such a server (304s alone tagged), and a deploy lands between the refused 304 ("v1")
    and the 200 after it (v2, its Last-Modified moved): "v1" names the old page, so it is not
    kept with the new copy. Kept, a rollback the next day (rsync -a keeps the file's time,
    so the tag is "v1" again) would have been answered 304 and the new copy reused: £12
    loaded while the site shows £10."""
    bodies = {"v1": listing(1, 1, [card(1, "Book one", "£10.00")]),
              "v2": listing(1, 1, [card(1, "Book one", "£12.00")])}
    modified = {"v1": "Mon, 30 Nov 2026 10:00:00 GMT", "v2": "Mon, 30 Nov 2026 10:00:05 GMT"}
    state = {"current": "v1", "deploy_after_304": None}

    def page(request):
        version = state["current"]
        if "if-none-match" in request:
            hit = request["if-none-match"] == f'"{version}"'
        else:
            hit = request.get("if-modified-since") == modified[version]
        if hit:
            if state["deploy_after_304"]:
                state["current"], state["deploy_after_304"] = state["deploy_after_304"], None
            return 304, {"Last-Modified": modified[version], "ETag": f'"{version}"'}, b""
        return 200, {"Content-Type": "text/html; charset=utf-8", "Last-Modified": modified[version]}, bodies[version]

    site = Site()
    site.routes["/cat/index.html"] = page
    with serve(site) as base:
        runs = Runs(instance, tmp_path, base)
        runs.run()
        state["deploy_after_304"] = "v2"
        runs.run()
        assert runs.products() == [("1", "Book one", 12)]
        assert runs.manifests()[-1].pages[1].etag is None
        state["current"] = "v1"  # rolled back, the file's time kept
        site.log.clear()
        runs.run()
    assert site.asked() == [("/cat/index.html", 200)]  # asked by its date: not the saved copy's
    assert runs.products() == [("1", "Book one", 10)]


def test_a_304_to_an_unconditional_request_is_a_dead_letter_not_the_old_page(tmp_path, instance):
    """No validators were kept (the site sent none), so a 304 (a misconfigured cache) cannot
    stand for the saved copy: the page fails for good and its earlier rows are carried."""
    state = {"day": 1}

    def page(request):
        if state["day"] == 2:
            return 304, {}, b""
        return 200, {"Content-Type": "text/html"}, listing(1, 1, [card(1, "Book one", "£10.00")])

    site = Site()
    site.routes["/cat/index.html"] = page
    with serve(site) as base:
        runs = Runs(instance, tmp_path, base)
        runs.run()
        state["day"] = 2
        md = runs.run()
    assert md["raw_pages"]["pages_not_modified"] == 0
    page1 = runs.manifests()[-1].pages[1]
    assert (page1.status, page1.http_status) == ("failed", 304)
    assert page1.last_error.startswith("unexpected_304")
    assert md["dead_letters"]["dead_letters"] == 1
    assert runs.products() == [("1", "Book one", 10)]  # kept from the page's last good copy


def test_a_304_from_a_redirect_target_sent_no_validators_is_a_dead_letter(tmp_path, instance):
    """Day 2 the category moved (301) to a URL behind a cache answering 304 to everything: our
    ETag went to the old URL only, so that 304 names no copy of ours and is refused."""
    site = Site()
    site.routes["/cat/index.html"] = compliant(listing(1, 1, [card(1, "Book one", "£10.00")]), etag='"v1"')
    with serve(site) as base:
        runs = Runs(instance, tmp_path, base)
        runs.run()
        site.routes["/cat/index.html"] = lambda _request: (301, {"Location": "/cat-new/index.html"}, b"")
        site.routes["/cat-new/index.html"] = lambda _request: (304, {}, b"")
        site.log.clear()
        md = runs.run()
    assert site.sent("if-none-match") == [("/cat/index.html", '"v1"'), ("/cat-new/index.html", None)]
    page1 = runs.manifests()[-1].pages[1]
    assert (page1.status, page1.http_status, page1.not_modified) == ("failed", 304, False)
    assert page1.last_error.startswith("unexpected_304")
    assert (md["raw_pages"]["pages_not_modified"], md["dead_letters"]["dead_letters"]) == (0, 1)
    assert runs.products() == [("1", "Book one", 10)]  # kept from the page's last good copy


@pytest.mark.parametrize("header", ["Mon, 30 Nov 99999999999 10:00:00 GMT", "Mon, 30 Nov 10000 10:00:00 GMT"])
def test_a_304_with_a_last_modified_out_of_range_is_fetched_whole_not_a_crash(tmp_path, instance, header):
    """A Last-Modified whose year overflows Python's dates (OverflowError, ValueError) on a
    304 is a date that does not match the saved copy's: the page is asked whole."""
    modified = "Mon, 30 Nov 2026 10:00:00 GMT"
    state = {"day": 1}

    def page(request):
        headers = {"Content-Type": "text/html; charset=utf-8", "Last-Modified": modified}
        if state["day"] == 2 and "if-modified-since" in request:
            return 304, {"Last-Modified": header}, b""
        return 200, headers, listing(1, 1, [card(1, "Book one", "£10.00")])

    site = Site()
    site.routes["/cat/index.html"] = page
    with serve(site) as base:
        runs = Runs(instance, tmp_path, base)
        runs.run()
        state["day"] = 2
        site.log.clear()
        md = runs.run()
    assert site.asked() == [("/cat/index.html", 304), ("/cat/index.html", 200)]
    assert (md["raw_pages"]["requests_made"], md["raw_pages"]["pages_not_modified"]) == (2, 0)
    assert runs.manifests()[-1].pages[1].status == "done"


@pytest.mark.parametrize("damage", ["deleted", "cut short"])
def test_a_304_for_a_saved_copy_no_longer_in_storage_fetches_the_page_whole(tmp_path, instance, damage):
    """A 304 lets us reuse a copy we have (RFC 9111 §4.3.3): a body deleted or cut short
    since (a full disk, a hand edit) is fetched again, not pointed at day after day."""
    site = Site()
    site.routes["/cat/index.html"] = compliant(listing(1, 2, [card(1, "Book one", "£10.00")]), etag='"p1"')
    site.routes["/cat/page-2.html"] = compliant(
        listing(2, 2, [card(2, "Book two", "£20.00"), card(3, "Book three", "£30.00")]), etag='"p2"')
    with serve(site) as base:
        runs = Runs(instance, tmp_path, base)
        runs.run()
        body = tmp_path / "objects" / runs.manifests()[-1].page_key(2)
        if damage == "deleted":
            body.unlink()
        else:
            body.write_bytes(body.read_bytes()[:200])
        site.log.clear()
        md = runs.run()
        assert site.asked() == [("/cat/index.html", 304), ("/cat/page-2.html", 304), ("/cat/page-2.html", 200)]
        latest = runs.manifests()[-1]
        assert latest.pages[2].body_key is None and (tmp_path / "objects" / latest.page_key(2)).exists()
        assert md["raw_pages"]["pages_not_modified"] == 1
        assert runs.products() == [("1", "Book one", 10), ("2", "Book two", 20), ("3", "Book three", 30)]
        site.log.clear()
        runs.run()  # healed: the next day reuses the new copy
    assert site.asked() == [("/cat/index.html", 304), ("/cat/page-2.html", 304)]


def test_a_byte_identical_page_whose_saved_copy_is_gone_is_stored_again(tmp_path, instance):
    site = Site()
    site.routes["/cat/index.html"] = lambda _request: (200, {"Content-Type": "text/html"},
                                                       listing(1, 1, [card(1, "Book one", "£10.00")]))
    with serve(site) as base:
        runs = Runs(instance, tmp_path, base)
        runs.run()
        (tmp_path / "objects" / runs.manifests()[-1].page_key(1)).unlink()
        md = runs.run()
    latest = runs.manifests()[-1]
    assert latest.pages[1].body_key is None and (tmp_path / "objects" / latest.page_key(1)).exists()
    assert md["raw_pages"]["pages_unchanged"] == 0
    assert runs.products() == [("1", "Book one", 10)]


def test_a_parse_refuses_a_saved_body_of_the_wrong_size(tmp_path, instance):
    from scrape_assets.errors import ManifestError
    from scrape_assets.extract import extract_snapshot
    from scrape_assets.spec import load_spec

    site = Site()
    site.routes["/cat/index.html"] = compliant(listing(1, 1, [card(1, "Book one", "£10.00"), card(2, "Book two", "£2")]))
    with serve(site) as base:
        runs = Runs(instance, tmp_path, base)
        runs.run(selection=["raw_pages"])
    manifest = runs.manifests()[-1]
    body = tmp_path / "objects" / manifest.page_key(1)
    body.write_bytes(body.read_bytes()[:-300])  # the second card lost: it must not vanish silently
    with pytest.raises(ManifestError, match=r"page 1's saved body .* is [\d,]+ bytes, the manifest recorded [\d,]+: damaged"):
        extract_snapshot(ObjectStore(str(tmp_path / "objects")), manifest, load_spec(str(tmp_path / "rev.yaml")),
                         fetch_base_url=base)


# -- redirects -----------------------------------------------------------------------------------
def test_validators_are_not_sent_to_a_redirect_target_they_do_not_describe(tmp_path, instance):
    """RFC 9110 §15.4: page 2 now redirects to another page, older than our copy; our
    If-Modified-Since must not reach it (it would answer 304 for a page we never saved)."""
    site = Site()
    site.routes["/cat/index.html"] = compliant(listing(1, 2, [card(1, "Book one", "£10.00")]),
                                               last_modified="Tue, 01 Dec 2026 09:00:00 GMT")
    site.routes["/cat/page-2.html"] = compliant(listing(2, 2, [card(2, "Book two", "£20.00")]),
                                                last_modified="Tue, 01 Dec 2026 10:00:00 GMT")
    with serve(site) as base:
        runs = Runs(instance, tmp_path, base)
        runs.run()
        site.routes["/cat/page-2.html"] = lambda _request: (301, {"Location": "/cat-new/page-2.html"}, b"")
        site.routes["/cat-new/page-2.html"] = compliant(listing(2, 2, [card(3, "Book three", "£30.00")]),
                                                        last_modified="Mon, 30 Nov 2026 08:00:00 GMT")
        site.log.clear()
        runs.run()
    assert site.sent("if-modified-since") == [("/cat/index.html", "Tue, 01 Dec 2026 09:00:00 GMT"),
                                             ("/cat/page-2.html", "Tue, 01 Dec 2026 10:00:00 GMT"),
                                             ("/cat-new/page-2.html", None)]
    assert runs.products() == [("1", "Book one", 10), ("3", "Book three", 30)]


def _site_whose_page_2_moved() -> Site:
    """A category of two pages with ETags; page 2 answers 301 to /cat-new/page-2.html."""
    site = Site()
    site.routes["/cat/index.html"] = compliant(listing(1, 2, [card(1, "Book one", "£10.00")]), etag='"p1"')
    site.routes["/cat/page-2.html"] = lambda _request: (301, {"Location": "/cat-new/page-2.html"}, b"")
    site.routes["/cat-new/page-2.html"] = compliant(listing(2, 2, [card(2, "Book two", "£20.00")]), etag='"p2"')
    return site


def test_a_page_saved_from_its_redirect_target_is_revalidated_there(tmp_path, instance):
    """The saved copy came from /cat-new/: its ETag goes on the hop to /cat-new/, not to the
    URL that redirects, and the 304 from there reuses it."""
    site = _site_whose_page_2_moved()
    with serve(site) as base:
        runs = Runs(instance, tmp_path, base)
        runs.run()
        site.log.clear()
        md = runs.run()
    assert site.sent("if-none-match") == [("/cat/index.html", '"p1"'), ("/cat/page-2.html", None),
                                         ("/cat-new/page-2.html", '"p2"')]
    assert site.asked()[-1] == ("/cat-new/page-2.html", 304)
    assert (md["raw_pages"]["pages_not_modified"], md["parsed_products"]["pages_parsed"]) == (2, 0)


def test_only_a_redirected_page_records_the_url_it_was_read_from(tmp_path, instance):
    """final_url is kept for a page that was redirected (its links resolve against it, and it is
    part of the version); a page read where it was asked records none, so its version is the
    one it had before redirects counted."""
    site = _site_whose_page_2_moved()
    with serve(site) as base:
        runs = Runs(instance, tmp_path, base)
        runs.run(selection=["raw_pages"])
    pages = runs.manifests()[-1].pages
    assert (pages[1].final_url, pages[2].final_url) == (None, f"{base}cat-new/page-2.html")


# -- what a page's version covers --------------------------------------------------------------------
def _relabelled_page(body: bytes, content_type: str) -> tuple[Site, dict]:
    """A site of one listing page, ``body`` always; its ``Content-Type`` and ETag are the
    returned dict's ``type`` and ``etag`` (``"v1"`` first), for a test to change."""
    state = {"type": content_type, "etag": '"v1"'}
    site = Site()
    site.routes["/cat/index.html"] = lambda request: compliant(body, etag=state["etag"], content_type=state["type"])(request)
    return site, state


def test_a_corrected_charset_label_on_the_same_bytes_is_parsed_again(tmp_path, instance):
    """Day 1 the site labels its windows-1251 page windows-1252 (mojibake); day 2 it fixes
    the header, same bytes: the label is stored and the page parsed again (RFC 9110 §8.3)."""
    body = listing(1, 1, [card(1, "Книга", "10.00")]).decode().encode("cp1251")  # (no £ in windows-1251)
    site, state = _relabelled_page(body, "text/html; charset=windows-1252")
    with serve(site) as base:
        runs = Runs(instance, tmp_path, base)
        runs.run()
        assert runs.products() == [("1", "Êíèãà", 10)]
        state["type"], state["etag"] = "text/html; charset=windows-1251", '"v2"'
        md = runs.run()
    assert runs.manifests()[-1].pages[1].content_type == "text/html; charset=windows-1251"
    assert (md["raw_pages"]["pages_unchanged"], md["parsed_products"]["pages_parsed"]) == (1, 1)
    assert runs.products() == [("1", "Книга", 10)]


@pytest.mark.parametrize("meta, reparsed", [("shift_jis", True), ("utf-8", False)])
def test_a_header_charset_added_to_a_page_its_meta_decided_is_parsed_again(tmp_path, instance, meta, reparsed):
    """Day 1 the header names no charset and the page's <meta> says Shift_JIS over UTF-8 bytes
    (mojibake); day 2 the header says charset=utf-8, same bytes: they read otherwise, so the
    page is parsed again. Behind a <meta> saying UTF-8 the header changes nothing: no re-parse."""
    body = listing(1, 1, [card(1, "Café", "10.00")]).replace(b"<head>", f'<head><meta charset="{meta}">'.encode())
    site, state = _relabelled_page(body, "text/html")
    with serve(site) as base:
        runs = Runs(instance, tmp_path, base)
        runs.run()
        day1 = runs.products()
        assert (day1[0][1] != "Café") is reparsed  # the Shift_JIS <meta> misreads the UTF-8 bytes
        state["type"], state["etag"] = "text/html; charset=utf-8", '"v2"'
        md = runs.run()
    assert (md["raw_pages"]["pages_unchanged"], md["parsed_products"]["pages_parsed"]) == (1, int(reparsed))
    assert runs.products() == [("1", "Café", 10)]
    first, second = runs.manifests()[-2:]
    assert (first.pages[1].meta_charset, second.pages[1].meta_charset) == (("cp932", None) if reparsed else (None, None))


def test_a_304_keeps_the_meta_charset_that_decides_how_the_saved_copy_reads(tmp_path, instance):
    """The header names no charset and the page's <meta> says Shift_JIS: a 304 (no body to look
    in) keeps the saved copy's meta_charset, so the version is unchanged and nothing is parsed again."""
    body = listing(1, 1, [card(1, "Cafe", "10.00")]).replace(b"<head>", b'<head><meta charset="shift_jis">')
    site, _ = _relabelled_page(body, "text/html")
    with serve(site) as base:
        runs = Runs(instance, tmp_path, base)
        runs.run()
        site.log.clear()
        md = runs.run()
    assert site.asked() == [("/cat/index.html", 304)]
    first, second = runs.manifests()[-2:]
    assert (first.pages[1].meta_charset, second.pages[1].meta_charset) == ("cp932", "cp932")
    assert second.data_version == first.data_version
    assert (md["raw_pages"]["pages_not_modified"], md["parsed_products"]["pages_parsed"]) == (1, 0)


def test_setting_the_specs_decimal_mark_parses_the_saved_pages_again(tmp_path, instance):
    """"€1.250" is a reject asking for decimal_mark; once the spec sets it, the same saved
    pages are parsed again (the rules are part of the input version) and the product loads."""
    site = Site()
    site.routes["/cat/index.html"] = compliant(listing(1, 1, [card(1, "Buch eins", "€1.250"), card(2, "Buch zwei", "€5,00")]),
                                               etag='"x"')
    with serve(site) as base:
        runs = Runs(instance, tmp_path, base, currency="EUR", extra="validation: {max_rejected_share: 0.9}\n")
        runs.run()
        assert runs.products() == [("2", "Buch zwei", 5)]
        runs = Runs(instance, tmp_path, base, currency="EUR", extra_top='decimal_mark: ","\n',
                    extra="validation: {max_rejected_share: 0.9}\n")
        md = runs.run()
    assert (md["raw_pages"]["pages_not_modified"], md["parsed_products"]["pages_parsed"]) == (1, 1)
    assert runs.products() == [("1", "Buch eins", 1250), ("2", "Buch zwei", 5)]


def test_the_input_version_is_unchanged_for_a_spec_without_decimal_mark():
    """Adding decimal_mark to the version must not re-parse every existing partition."""
    import hashlib

    from scrape_assets.extract import PARSER_VERSION, input_version
    from scrape_assets.spec import load_spec

    spec = load_spec("demo")
    manifest = SimpleNamespace(data_version="dv")
    rules = spec.model_dump_json(include={"base_url", "currency", "selectors", "pagination", "product_id"})
    assert input_version(manifest, spec) == f"dv+parser{PARSER_VERSION}+spec{hashlib.sha256(rules.encode()).hexdigest()[:12]}"
    assert input_version(manifest, spec.model_copy(update={"decimal_mark": ","})) != input_version(manifest, spec)


# -- an outage day ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("days_down", [1, 2, 3])
def test_after_an_outage_day_pages_are_revalidated_against_their_older_copies(tmp_path, instance, days_down):
    """Day 2 (and 3, 4) every page fails (503); then the site is back unchanged: the copies of
    day 1 are asked for with their validators and nothing is stored again (the pages are
    parsed again: the latest parse was of the outage snapshot, which had none).
    (After two outage days the search stopped at the first outage snapshot: every page was
    asked without validators, stored again and re-parsed.)"""
    state = {"down": False}
    pages = {"/cat/index.html": compliant(listing(1, 2, [card(1, "Book one", "£10.00")]), etag='"p1"'),
             "/cat/page-2.html": compliant(listing(2, 2, [card(2, "Book two", "£20.00")]), etag='"p2"')}
    site = Site()
    for path, route in pages.items():
        site.routes[path] = lambda request, route=route: (503, {}, b"down") if state["down"] else route(request)
    with serve(site) as base:
        runs = Runs(instance, tmp_path, base, max_attempts=1)
        runs.run()
        state["down"] = True
        for _ in range(days_down):
            runs.run()
        state["down"] = False
        site.log.clear()
        md = runs.run()
    assert site.sent("if-none-match") == [("/cat/index.html", '"p1"'), ("/cat/page-2.html", '"p2"')]
    assert site.asked() == [("/cat/index.html", 304), ("/cat/page-2.html", 304)]
    assert (md["raw_pages"]["bytes_stored"], md["raw_pages"]["pages_not_modified"]) == (0, 2)
    manifests = runs.manifests()
    first, last = manifests[0], manifests[-1]
    assert len(manifests) == days_down + 2
    assert [last.pages[n].body_key for n in (1, 2)] == [first.page_key(1), first.page_key(2)]
    assert runs.products() == [("1", "Book one", 10), ("2", "Book two", 20)]


def test_the_search_for_older_copies_passes_outage_days_and_stops_where_a_page_never_was(tmp_path):
    """Which earlier snapshots are read for copies of pages the latest one lacks: past those
    that failed the page too (an outage of several days), not past one in which the page
    does not exist (gone from the site: no manifest read for it day after day)."""
    from scrape_assets.crawl import PartitionCrawler
    from scrape_assets.manifest import Manifest, PageEntry
    from scrape_assets.spec import load_spec

    reads = []

    class _Counting(ObjectStore):
        def read_bytes(self, key):
            if key.endswith("manifest.json"):
                reads.append(key.split("/")[2][8:10])  # the day
            return super().read_bytes(key)

    def snapshot(store, day: int, pages: dict[int, str], *, complete: bool = True) -> Manifest:
        manifest = Manifest(site="demo", category="travel", snapshot_id=f"2026-12-0{day}T080000Z", fetch_config={},
                            fetch_config_hash="h", start_url="http://x/t/page-1.html",
                            completed_at=f"2026-12-0{day}T08:01:00Z" if complete else None,
                            pages={n: PageEntry(url=f"http://x/t/page-{n}.html", status=status, content_hash=f"d{day}")
                                   for n, status in pages.items()})
        manifest.save(store)
        return manifest

    def copies(store, today: Manifest) -> dict[str, str]:
        crawler = PartitionCrawler(load_spec("demo"), "travel", store, None, fetch_config={},
                                   fetch_base_url="http://x/", max_attempts=1)
        reads.clear()
        return {url.rsplit("/", 1)[1]: previous.snapshot_id[8:10]
                for url, (previous, _n) in crawler._previous_pages(today).items()}

    outage = _Counting(str(tmp_path / "outage"))
    snapshot(outage, 1, {1: "done", 2: "done", 3: "done"})
    snapshot(outage, 2, {1: "done", 2: "done", 3: "failed"})  # page 3 down three days running
    snapshot(outage, 3, {1: "done", 2: "failed", 3: "failed"})
    snapshot(outage, 4, {1: "done", 2: "done", 3: "failed"})
    today = snapshot(outage, 5, {1: "pending"}, complete=False)
    assert copies(outage, today) == {"page-1.html": "04", "page-2.html": "04", "page-3.html": "01"}
    assert reads == ["05", "04", "03", "02", "01"]  # today's first: the latest complete one is looked for
    # Page 3 failed on day 3, and day 2 has no page 3 at all (the site had two pages then):
    # day 2 is read, day 1 is not.
    gone = _Counting(str(tmp_path / "gone"))
    snapshot(gone, 1, {1: "done", 2: "done", 3: "done"})
    snapshot(gone, 2, {1: "done", 2: "done"})
    snapshot(gone, 3, {1: "done", 2: "done", 3: "failed"})
    today = snapshot(gone, 4, {1: "pending"}, complete=False)
    assert copies(gone, today) == {"page-1.html": "03", "page-2.html": "03"}
    assert reads == ["04", "03", "02"]


def test_first_page_does_not_adopt_pages_after_an_outage_day(tmp_path, instance):
    """revalidate: first_page adopts pages 2..N only from a snapshot that saw them all: after
    a day on which page 1 changed and page 2 failed, page 2 is asked (a 304 against its
    older copy), not adopted."""
    state = {"down": False, "page1": compliant(listing(1, 2, [card(1, "Book one", "£10.00")]), etag='"p1"')}
    page2 = compliant(listing(2, 2, [card(2, "Book two", "£20.00")]), etag='"p2"')
    site = Site()
    site.routes["/cat/index.html"] = lambda request: state["page1"](request)
    site.routes["/cat/page-2.html"] = lambda request: (503, {}, b"down") if state["down"] else page2(request)
    with serve(site) as base:
        runs = Runs(instance, tmp_path, base, max_attempts=1, extra="incremental:\n  revalidate: first_page\n")
        runs.run()
        state["down"], state["page1"] = True, compliant(listing(1, 2, [card(1, "Book one", "£11.00")]), etag='"p1b"')
        runs.run()
        assert runs.manifests()[-1].pages[2].status == "failed"
        state["down"] = False
        site.log.clear()
        md = runs.run()
    assert site.asked() == [("/cat/index.html", 304), ("/cat/page-2.html", 304)]
    assert md["raw_pages"]["pages_assumed_unchanged"] == 0
    assert runs.products() == [("1", "Book one", 11), ("2", "Book two", 20)]


def test_a_product_that_moved_onto_the_page_that_failed_keeps_its_row(tmp_path, instance):
    """Day 1: page 1 lists books 1 and 2, page 2 books 3 and 4. Day 2 the listing is re-sorted
    (2 and 3 swap pages) and page 2 fails for good. Book 2 was loaded from page 1, which was
    fetched, and is now on the page that failed: its row is carried forward, not deleted
    (before: only rows loaded from the failed page were kept, and book 2 silently vanished)."""
    state = {"day": 1}
    cards = {1: {1: [card(1, "One", "£1.00"), card(2, "Two", "£2.00")],
                 2: [card(3, "Three", "£3.00"), card(4, "Four", "£4.00")]},
             2: {1: [card(1, "One", "£1.00"), card(3, "Three", "£3.00")],
                 2: [card(2, "Two", "£2.00"), card(4, "Four", "£4.00")]}}

    def page(n):
        def route(request):
            if state["day"] == 2 and n == 2:
                return 503, {}, b"down"
            return compliant(listing(n, 2, cards[state["day"]][n]), etag=f'"d{state["day"]}p{n}"')(request)
        return route

    site = Site()
    site.routes["/cat/index.html"] = page(1)
    site.routes["/cat/page-2.html"] = page(2)
    with serve(site) as base:
        runs = Runs(instance, tmp_path, base, max_attempts=1)
        runs.run()
        state["day"] = 2
        md = runs.run()
        assert runs.manifests()[-1].pages[2].status == "failed"
        assert [pid for pid, _title, _price in runs.products()] == ["1", "2", "3", "4"]
        assert (md["products_table"]["rows_loaded"], md["products_table"]["rows_carried_forward"]) == (2, 2)
        # The same partial snapshot re-parsed with a corrected id rule (no request): its own rows
        # are replaced, not carried beside their new ids; the failed page's are still carried.
        spec = tmp_path / "rev.yaml"
        spec.write_text(spec.read_text().replace(r"regex: '_(\d+)/index\.html$'",
                                                 r"regex: '/(book-\d+)_\d+/index\.html$'"))
        site.log.clear()
        md = runs.run(selection=["parsed_products", "products_table"])
    assert site.asked() == []
    assert [pid for pid, _title, _price in runs.products()] == ["2", "4", "book-1", "book-3"]
    assert (md["products_table"]["rows_loaded"], md["products_table"]["rows_carried_forward"]) == (2, 2)


def _growing_listing(state: dict):
    """``travel``: 40 books (1..40) on 2 pages; with ``state["grown"]``, 20 new books (101..120)
    on top, 60 books on 3 pages (books 21..40 pushed onto page 3)."""
    def books():
        ids = ([*range(101, 121)] if state["grown"] else []) + [*range(1, 41)]
        return [card(i, f"Book {i}", f"£{i}.{state.get('cents', '00')}") for i in ids]

    def page(n):
        def route(request):
            all_cards = books()
            total = len(all_cards) // 20
            if n > total:
                return 404, {"Content-Type": "text/plain"}, b"not found"
            body = listing(n, total, all_cards[(n - 1) * 20:n * 20])
            if n == 1 and state.get("grow_after_page_1"):
                state["grown"] = True  # the site changes once page 1 is out: pages 2.. are the new listing
            return compliant(body, etag=f'"{len(all_cards)}-{n}-{state.get("cents")}"')(request)
        return route

    site = Site()
    for n in (1, 2, 3):
        site.routes["/cat/index.html" if n == 1 else f"/cat/page-{n}.html"] = page(n)
    return site


def _check(result, name: str):
    return {c.check_name: c for c in result.get_asset_check_evaluations()}[name]


@pytest.mark.parametrize("day_two", ["grows during the crawl", "grows while a killed crawl waits to resume"])
def test_a_listing_that_grew_while_its_pages_were_fetched_keeps_the_rows_it_pushed_out_of_sight(
        tmp_path, instance, day_two):
    """Page 1 (40 results, 2 pages) is fetched from the old listing, page 2 from the new one
    (60 results, 3 pages: books 1..20 now on page 2, 21..40 on page 3, never fetched: page 1
    fixed the page count). Books 21..40 never left the site: their rows are kept (carried
    forward, as after a failed page), not deleted (before: 20 of 40 rows were left), and the
    count check warns, naming the disagreement. The crash variant is the reviewer's case: a
    crawl SIGKILLed after page 1, resumed after the site changed."""
    import signal
    import subprocess
    import sys
    import textwrap

    from scrape_assets_tests.conftest import REPO_ROOT

    state = {"grown": False}
    site = _growing_listing(state)
    with serve(site) as base:
        runs = Runs(instance, tmp_path, base)
        runs.run()  # day 1: 40 rows
        assert sorted(int(pid) for pid, _t, _p in runs.products()) == [*range(1, 41)]
        if day_two == "grows during the crawl":
            state["grow_after_page_1"] = True
        else:  # new prices (pages fetched whole); raw_pages killed (SIGKILL) once page 2's body is stored
            state["cents"] = "50"
            code = textwrap.dedent(f"""
                import asyncio, logging
                from scrape_assets.defs.assets.raw_pages import crawl_partitions
                from scrape_assets.defs.resources import ObjectStoreResource, SiteResource
                asyncio.run(crawl_partitions(SiteResource(site={str(tmp_path / "rev.yaml")!r}, base_url={base!r}),
                                             ObjectStoreResource(url={str(tmp_path / "objects")!r}), ["travel"],
                                             new_snapshot=False, log=logging.getLogger("crawl")))
            """)
            env = {k: v for k, v in __import__("os").environ.items() if not k.startswith("SCRAPE_")}
            env.update(PYTHONPATH=str(REPO_ROOT), SCRAPE_CRASHPOINT="crawl.after_body_write:2")
            killed = subprocess.run([sys.executable, "-c", code], env=env, cwd=tmp_path, capture_output=True,
                                    text=True, timeout=120)
            assert killed.returncode == -signal.SIGKILL, killed.stderr
            interrupted = runs.manifests()[-1]
            assert {n: e.status for n, e in interrupted.pages.items()} == {1: "done", 2: "pending"}
            state["grown"] = True
        result = materialize(instance, runs.resources, ["travel"])
    assert result.success
    latest = runs.manifests()[-1]
    if day_two != "grows during the crawl":
        assert latest.snapshot_id == interrupted.snapshot_id  # resumed, not started anew
    assert (sorted(latest.pages), latest.sees_every_page) == ([1, 2], True)
    assert ("/cat/page-3.html", 200) not in site.asked()
    # Books 1..20 from the new snapshot (page 1: 101..120 are not on the old page 1 it kept),
    # 21..40 carried forward with the day-1 snapshot id; nothing lost, nothing duplicated.
    rows = {int(pid): price for pid, _t, price in runs.products()}
    assert sorted(rows) == [*range(1, 41)]
    md = run_metadata(result)
    assert (md["products_table"]["rows_loaded"], md["products_table"]["rows_carried_forward"]) == (20, 20)
    with contextlib.closing(sqlite3.connect(tmp_path / "warehouse.db")) as db:
        seen_today = db.execute("select count(*) from price_history where snapshot_id = ?",
                                (latest.snapshot_id,)).fetchone()[0]
    assert seen_today == 20  # carried rows were not seen: no price stamped for them
    count = _check(result, "parsed_products_match_site_count")
    assert not count.passed and count.metadata["mismatched"].value == {}
    assert count.metadata["listing_moved"].value == {
        "travel": "page 1 says 40 results, page 2 says 60; page 1 says 2 pages, page 2 says 3; page 2 only lists "
                  "products of earlier pages"}
    assert _check(result, "products_table_matches_parsed").passed
    from scrape_assets.cli import run_figures

    assert run_figures(result)["categories_listing_moved"] == count.metadata["listing_moved"].value  # make demo's line
    if day_two == "grows during the crawl":
        # parsed_products again (a re-execution, a launch from the UI): the rows are reused, and
        # the check still says the listing moved (the parse state keeps it), page 1's count no yardstick.
        again = materialize(instance, runs.resources, ["travel"], selection=["parsed_products"])
        assert run_metadata(again)["parsed_products"]["pages_parsed"] == 0
        count = _check(again, "parsed_products_match_site_count")
        assert not count.passed and count.metadata["listing_moved"].value == {
            "travel": "page 1 says 40 results, page 2 says 60; page 1 says 2 pages, page 2 says 3; page 2 only "
                      "lists products of earlier pages"}


@pytest.mark.parametrize("shown", ["position", "cards on the page"])
def test_a_results_count_that_is_a_figure_of_the_page_is_no_measure_of_the_listing(tmp_path, instance, shown):
    """A spec whose results_count reads "Showing 21-40 of 40" as 21 (page 1 says 1, page 2 says
    21), or "Showing 20 of 39" as 20 and 19: no page's figure can be the listing's total, so the
    pages are not taken to disagree, and a book that left the listing is dropped as usual (not
    carried forward every day)."""
    def page(n: int, ids: list[int]) -> bytes:
        cards = "".join(card(i, f"Book {i}", f"£{i}.00") for i in ids)
        following = f'<li class="next"><a href="page-{n + 1}.html">next</a></li>' if n < 2 else ""
        figure = (f"<strong>{(n - 1) * 20 + 1}</strong>-{n * 20} of 40" if shown == "position"
                  else f"<strong>{len(ids)}</strong> of {20 + len(ids)}")
        return (f'<html><body><form class="form-horizontal">Showing {figure}</form><ol>{cards}</ol>'
                f'<ul class="pager"><li class="current">Page {n} of 2</li>{following}</ul></body></html>').encode()

    site = Site()
    site.routes["/cat/index.html"] = compliant(page(1, [*range(1, 21)]), etag='"1"')
    site.routes["/cat/page-2.html"] = compliant(page(2, [*range(21, 41)]), etag='"2"')
    with serve(site) as base:
        runs = Runs(instance, tmp_path, base)
        runs.run()
        site.routes["/cat/page-2.html"] = compliant(page(2, [*range(21, 40)]), etag='"2b"')  # book 40 left
        result = materialize(instance, runs.resources, ["travel"])
    assert sorted(int(pid) for pid, _t, _p in runs.products()) == [*range(1, 40)]
    assert run_metadata(result)["products_table"]["rows_carried_forward"] == 0
    assert _check(result, "parsed_products_match_site_count").metadata["listing_moved"].value == {}


def test_pages_that_agree_on_the_listings_size_drop_a_product_that_left(tmp_path, instance):
    """The usual case stays as it was: every page fetched, pages agreeing ("40 results",
    "Page n of 2"), a book gone from the listing is deleted, nothing carried."""
    state = {"grown": False, "gone": False}
    site = _growing_listing(state)
    with serve(site) as base:
        runs = Runs(instance, tmp_path, base)
        runs.run()
        # book 40 leaves, book 41 takes its place: same size, the pages agree
        site.routes["/cat/page-2.html"] = compliant(listing(2, 2, [card(i, f"Book {i}", f"£{i}.00")
                                                                    for i in [*range(21, 40), 41]]), etag='"new"')
        result = materialize(instance, runs.resources, ["travel"])
    md = run_metadata(result)
    assert sorted(int(pid) for pid, _t, _p in runs.products()) == [*range(1, 40), 41]
    assert md["products_table"]["rows_carried_forward"] == 0
    count = _check(result, "parsed_products_match_site_count")
    assert count.passed and count.metadata["listing_moved"].value == {}


def _two_page_site(ids_1: list[int], ids_2: list[int]) -> Site:
    site = Site()
    site.routes["/cat/index.html"] = compliant(listing(1, 2, [card(i, f"Book {i}", f"£{i}.00") for i in ids_1]),
                                               etag='"p1"')
    site.routes["/cat/page-2.html"] = compliant(listing(2, 2, [card(i, f"Book {i}", f"£{i}.00") for i in ids_2]),
                                                etag='"p2"')
    return site


@pytest.mark.parametrize("how", ["page 2 serves page 1", "page 2 redirects to page 1"])
def test_a_page_served_again_for_another_keeps_the_rows_of_the_page_not_seen(tmp_path, instance, how):
    """Day 2 the site answers page 2 with page 1 (it ignores the page number, or redirects
    back): every card there is one of page 1's, so books 21..40 were not seen, though every
    page is "done". Their rows are kept (before: deleted, every check passing) and the count
    check warns, naming the page."""
    site = _two_page_site([*range(1, 21)], [*range(21, 41)])
    with serve(site) as base:
        runs = Runs(instance, tmp_path, base)
        runs.run()
        if how == "page 2 serves page 1":  # "Page 1 of 2" and all: the same bytes under page 2's URL
            site.routes["/cat/page-2.html"] = site.routes["/cat/index.html"]
        else:
            site.routes["/cat/page-2.html"] = lambda request: (302, {"Location": "/cat/index.html"}, b"")
        result = materialize(instance, runs.resources, ["travel"])
    assert result.success
    assert runs.manifests()[-1].sees_every_page
    assert sorted(int(pid) for pid, _t, _p in runs.products()) == [*range(1, 41)]
    md = run_metadata(result)
    assert (md["products_table"]["rows_loaded"], md["products_table"]["rows_carried_forward"]) == (20, 20)
    count = _check(result, "parsed_products_match_site_count")
    assert not count.passed
    assert count.metadata["listing_moved"].value == {"travel": "page 2 only lists products of earlier pages"}


def test_a_snapshot_listing_fewer_products_than_the_site_counts_keeps_the_rows_not_seen(tmp_path, instance):
    """Day 2 the pager is redesigned ("1 / 2": the spec's pager_regex no longer reads it, the
    next link is gone): only page 1 is fetched, every page of the snapshot is done, yet page
    1 still says 40 results and the snapshot has 20 cards. Books 21..40 are kept (before:
    deleted, only the warning check said anything); the count check names the shortfall."""
    site = _two_page_site([*range(1, 21)], [*range(21, 41)])
    with serve(site) as base:
        runs = Runs(instance, tmp_path, base)
        runs.run()
        cards = "".join(card(i, f"Book {i}", f"£{i}.00") for i in range(1, 21))
        site.routes["/cat/index.html"] = compliant((
            f'<html><body><form class="form-horizontal"><strong>40</strong> results</form><ol>{cards}</ol>'
            '<ul class="pager"><li class="current">1 / 2</li></ul></body></html>').encode(), etag='"p1b"')
        result = materialize(instance, runs.resources, ["travel"])
    assert result.success
    latest = runs.manifests()[-1]
    assert (sorted(latest.pages), latest.sees_every_page) == ([1], True)
    assert sorted(int(pid) for pid, _t, _p in runs.products()) == [*range(1, 41)]
    md = run_metadata(result)
    assert (md["products_table"]["rows_loaded"], md["products_table"]["rows_carried_forward"]) == (20, 20)
    count = _check(result, "parsed_products_match_site_count")
    assert not count.passed
    assert count.metadata["mismatched"].value == {"travel": {"cards_found": 20, "site_says": 40}}


def test_a_product_whose_card_is_rejected_keeps_its_earlier_row_until_the_card_parses_again(tmp_path, instance):
    """Day 2 one card's price no longer parses (1 of 3 cards: under the partial-layout
    guard, so the category loads): that product is still listed, so its day-1 row stays,
    carried forward with its day-1 snapshot, beside its dead letter; day 3 reads it again."""
    state = {"price": "£20.00"}

    def page(_request):
        cards = [card(1, "Book one", "£10.00"), card(2, "Book two", state["price"]), card(3, "Book three", "£30.00")]
        return 200, {"Content-Type": "text/html; charset=utf-8"}, listing(1, 1, cards)

    def rows():
        with contextlib.closing(sqlite3.connect(tmp_path / "warehouse.db")) as db:
            return db.execute("select product_id, price, snapshot_id from products order by product_id").fetchall()

    site = Site()
    site.routes["/cat/index.html"] = page
    with serve(site) as base:
        runs = Runs(instance, tmp_path, base)
        runs.run()
        day1 = runs.manifests()[-1].snapshot_id
        state["price"] = "price on request"
        md = runs.run()
        day2 = runs.manifests()[-1].snapshot_id
        assert rows() == [("1", 10, day2), ("2", 20, day1), ("3", 30, day2)]
        assert (md["products_table"]["rows_loaded"], md["products_table"]["rows_carried_forward"]) == (2, 1)
        assert md["dead_letters"]["dead_letters"] == 1
        state["price"] = "£25.00"
        md = runs.run()
        day3 = runs.manifests()[-1].snapshot_id
    assert rows() == [("1", 10, day3), ("2", 25, day3), ("3", 30, day3)]
    assert (md["products_table"]["rows_loaded"], md["products_table"]["rows_carried_forward"]) == (3, 0)


def test_a_load_beside_a_re_parse_loads_nothing_the_parse_state_did_not_vouch_for(tmp_path, instance, monkeypatch):
    """parsed_products and products_table lock different scopes, so a re-parse launched from
    the UI (no scrape/day tag) can run beside the sensor's load_job. The load read the parse
    state (validated), then the re-parse replaced parsed.json with rows that fail the schema,
    then the load read parsed.json: it loaded them (here: no price, so none) under the old
    state. The load now reads the state again after parsed.json and stops when it moved."""
    import scrape_assets.defs.assets.products_table as products_table_module
    from scrape_assets.extract import load_parse_state
    from scrape_assets.parse_run import parse_partitions
    from scrape_assets.spec import load_spec

    state = {"day": 1}
    site = Site()
    site.routes["/cat/index.html"] = lambda request: compliant(listing(1, 1, [
        card(1, "One", f"£{state['day']}.00"), card(2, "Two", f"£{state['day']}.50")]), etag=f'"d{state["day"]}"')(request)
    with serve(site) as base:
        runs = Runs(instance, tmp_path, base, max_attempts=1)
        runs.run()  # day 1: loaded
        state["day"] = 2
        runs.run(selection=["raw_pages", "parsed_products"])  # day 2: parsed and passed, not loaded yet
    before = runs.products()
    spec_file = tmp_path / "rev.yaml"
    spec_file.write_text(spec_file.read_text().replace("price: {css: p.price_color}", "price: {css: p.no_price}"))
    store = ObjectStore(str(tmp_path / "objects"))
    real_load_parsed, beside = products_table_module.load_parsed, []

    def re_parse_in_between(*args, **kwargs):  # the other run's parsed_products step, between the load's reads
        if not beside:
            beside.extend(parse_partitions(store, load_spec(str(spec_file)), ["travel"]))
        return real_load_parsed(*args, **kwargs)

    monkeypatch.setattr(products_table_module, "load_parsed", re_parse_in_between)
    result = materialize(instance, runs.resources, ["travel"], selection=["products_table"], raise_on_error=False)
    assert not result.success and not beside[0].report.passed
    assert not load_parse_state(store, "rev", "travel").validated
    failure = next(e for e in result.all_events if e.is_step_failure).step_failure_data.error
    assert "parsed rows changed while this load read them" in (failure.cause or failure).message
    assert runs.products() == before == [("1", "One", 1), ("2", "Two", 1.5)]


# -- the sitemap's kept copies ----------------------------------------------------------------------
def _kept(copies, url: str) -> tuple:
    """``(etag, last_modified, final_url)`` of the kept copy of ``url``."""
    kept = copies.load(url)
    return kept.etag, kept.last_modified, kept.final_url


def _load_sitemap(url: str, copies):
    """load_sitemap(url) through a polite fetcher of its own, entries of rev.example accepted."""
    import asyncio

    from scrape_assets.fetcher import FetchPolicy, PageFetcher, build_client
    from scrape_assets.sitemap import load_sitemap

    async def run():
        policy = FetchPolicy(user_agent="scrape-assets-test", requests_per_second=500, max_concurrency=2,
                             max_attempts=1, obey_robots_txt=False)
        async with build_client(policy) as client:
            return await load_sitemap(PageFetcher(client, policy), url, copies=copies, origins=["rev.example"])

    return asyncio.run(run())


def test_a_sitemap_304_updates_the_kept_copys_validators_or_is_not_reused(tmp_path):
    """A 304 carrying a new Last-Modified for the same tag updates the kept copy (RFC 9111
    §4.3.4), so the next run asks with it; a 304 naming another tag is not the kept document:
    it is fetched whole."""
    from scrape_assets.sitemap import SitemapCopies

    document = (b'<urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9"><url><loc>http://rev.example/a.html</loc>'
                b"<lastmod>2026-11-01</lastmod></url></urlset>")
    state = {"answer": None}

    def sitemap(request):
        if state["answer"] and "if-none-match" in request:
            return state["answer"]
        return 200, {"Content-Type": "application/xml", "ETag": '"s1"', "Last-Modified": "Tue, 01 Dec 2026 10:00:00 GMT"}, document

    site = Site()
    site.routes["/sitemap.xml"] = sitemap
    copies = SitemapCopies(ObjectStore(str(tmp_path / "objects")), "rev/sitemap.copies")

    def load(base):
        return _load_sitemap(base + "sitemap.xml", copies)

    with serve(site) as base:
        load(base)
        assert _kept(copies, base + "sitemap.xml") == ('"s1"', "Tue, 01 Dec 2026 10:00:00 GMT", None)
        state["answer"] = (304, {"ETag": '"s1"', "Last-Modified": "Wed, 02 Dec 2026 10:00:00 GMT"}, b"")
        second = load(base)
        assert (second.requests, second.not_modified, len(second.lastmod)) == (1, 1, 1)
        assert _kept(copies, base + "sitemap.xml") == ('"s1"', "Wed, 02 Dec 2026 10:00:00 GMT", None)
        state["answer"] = (304, {"ETag": '"s2"'}, b"")  # not our copy: ask for it whole
        site.log.clear()
        third = load(base)
    assert [(path, headers.get("if-none-match"), status) for path, headers, status in site.log] == [
        ("/sitemap.xml", '"s1"', 304), ("/sitemap.xml", None, 200)]
    assert (third.requests, third.not_modified, len(third.lastmod)) == (2, 0, 1)


def test_a_sitemap_behind_a_redirect_is_revalidated_at_its_target(tmp_path):
    from scrape_assets.sitemap import SitemapCopies

    document = (b'<urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9"><url><loc>http://rev.example/a.html</loc>'
                b"<lastmod>2026-11-01</lastmod></url></urlset>")
    site = Site()
    site.routes["/sitemap.xml"] = lambda _request: (301, {"Location": "/real-sitemap.xml"}, b"")
    site.routes["/real-sitemap.xml"] = compliant(document, etag='"s1"', content_type="application/xml")
    copies = SitemapCopies(ObjectStore(str(tmp_path / "objects")), "rev/sitemap.copies")

    def load(base):
        return _load_sitemap(base + "sitemap.xml", copies)

    with serve(site) as base:
        load(base)
        site.log.clear()
        again = load(base)
    assert [(path, headers.get("if-none-match"), status) for path, headers, status in site.log] == [
        ("/sitemap.xml", None, 301), ("/real-sitemap.xml", '"s1"', 304)]
    assert (again.not_modified, len(again.lastmod)) == (1, 1)


def _two_dated_pages() -> Site:
    """A category of two pages, Last-Modified 10:00 and 11:00 on 2026-11-30."""
    site = Site()
    site.routes["/cat/index.html"] = compliant(listing(1, 2, [card(1, "Book one", "£10.00")]),
                                               last_modified="Mon, 30 Nov 2026 10:00:00 GMT")
    site.routes["/cat/page-2.html"] = compliant(listing(2, 2, [card(2, "Book two", "£20.00")]),
                                                last_modified="Mon, 30 Nov 2026 11:00:00 GMT")
    return site


def _date_both_in_a_sitemap(site: Site, base: str) -> None:
    """``/sitemap.xml`` dating both pages of :func:`_two_dated_pages` as their Last-Modified."""
    document = ('<urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">' + "".join(
        f"<url><loc>{base}cat/{name}</loc><lastmod>2026-11-30T{hour}:00:00Z</lastmod></url>"
        for name, hour in (("index.html", 10), ("page-2.html", 11))) + "</urlset>").encode()
    site.routes["/sitemap.xml"] = compliant(document, content_type="application/xml")


def test_a_lost_copy_of_an_unchanged_page_one_keeps_the_sitemap_trusted(tmp_path, instance):
    """Page 1's copy deleted: it is fetched again (same bytes), which is no change: the
    sitemap's word still holds for the category's other pages."""
    site = _two_dated_pages()
    with serve(site) as base:
        _date_both_in_a_sitemap(site, base)
        runs = Runs(instance, tmp_path, base, extra="incremental:\n  revalidate: sitemap\n  sitemap: sitemap.xml\n")
        runs.run(selection=["raw_pages"])
        (tmp_path / "objects" / runs.manifests()[-1].page_key(1)).unlink()
        site.log.clear()
        md = runs.run(selection=["raw_pages"])
    assert site.asked() == [("/cat/index.html", 304), ("/cat/index.html", 200)]  # page 2 adopted
    assert md["raw_pages"]["by_category"]["travel"]["sitemap_check"] == "trusted"
    assert md["raw_pages"]["pages_assumed_unchanged"] == 1


def test_a_relative_or_differently_spelled_robots_sitemap_line_is_read_from_the_mirror():
    from scrape_assets.crawl import _on_fetch_origin

    mirror, site = "http://127.0.0.1:8000/", "https://Shop.example/en/"
    assert _on_fetch_origin("http://127.0.0.1:8000/sitemap_index.xml", mirror, site) == mirror + "sitemap_index.xml"
    assert _on_fetch_origin("https://shop.example:443/en/maps/a.xml", mirror, site) == mirror + "maps/a.xml"
    assert _on_fetch_origin("https://SHOP.example/sitemap.xml", mirror, site) == mirror + "sitemap.xml"  # at the root
    assert _on_fetch_origin("http://shop.example/en/a.xml", mirror, site) is None  # another scheme: another origin
    assert _on_fetch_origin("https://cdn.example/a.xml", mirror, site) is None


@pytest.mark.parametrize("mode", ["sitemap", "first_page"])
def test_a_lost_copy_of_a_later_page_is_asked_again_not_adopted(tmp_path, instance, mode):
    """A later page's saved body gone (a full disk, a prune by hand): neither opt-in adopts it
    without a request, which would leave parsed_products refusing the missing body every day."""
    site = _two_dated_pages()
    with serve(site) as base:
        _date_both_in_a_sitemap(site, base)
        extra = ("incremental:\n  revalidate: sitemap\n  sitemap: sitemap.xml\n" if mode == "sitemap"
                 else "incremental:\n  revalidate: first_page\n")
        runs = Runs(instance, tmp_path, base, extra=extra)
        runs.run(selection=["raw_pages"])
        (tmp_path / "objects" / runs.manifests()[-1].page_key(2)).unlink()
        site.log.clear()
        md = runs.run(selection=["raw_pages"])
    pages = [asked for asked in site.asked() if asked[0].startswith("/cat/")]
    assert pages == [("/cat/index.html", 304), ("/cat/page-2.html", 304), ("/cat/page-2.html", 200)]
    assert md["raw_pages"]["pages_assumed_unchanged"] == 0
