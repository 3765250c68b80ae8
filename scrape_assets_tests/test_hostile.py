"""Hostile input never writes outside the storage root, and links to other hosts are not followed."""

from __future__ import annotations

import contextlib
import logging
import re
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources as importlib_resources

import pytest
import yaml

from scrape_assets.demo_site import respond
from scrape_assets.errors import SpecError
from scrape_assets.manifest import latest_manifest
from scrape_assets.spec import load_spec
from scrape_assets.storage import ObjectStore
from scrape_assets_tests.conftest import make_resources, materialize


def _demo_spec() -> dict:
    return yaml.safe_load(importlib_resources.files("scrape_assets.sites").joinpath("demo.yaml").read_text())


@pytest.mark.parametrize("key", ["../escape", "..", "a/b", "%2e%2e", "/abs", "a\\b", "UPPER", "a%2fb"])
def test_partition_keys_that_could_escape_are_refused(tmp_path, key):
    data = _demo_spec()
    data["categories"][key] = "catalogue/x/index.html"
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(SpecError, match="categories"):
        load_spec(str(path))


@pytest.mark.parametrize(
    "value", ["../../etc/passwd", "/etc/passwd", "http://evil.example/x.html", "//evil.example/x.html", "a/../../b.html"]
)
def test_category_paths_that_leave_the_site_are_refused(tmp_path, value):
    data = _demo_spec()
    data["categories"]["travel"] = value
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(SpecError, match="expected a path relative to base_url"):
        load_spec(str(path))


def _page_with_next(next_href: str) -> bytes:
    """Demo page 1 of travel, with a pager whose next link is ``next_href``."""
    body = respond("GET", "/catalogue/category/books/travel_2/index.html").body.decode()
    pager = (
        '<ul class="pager"><li class="current">Page 1 of 3</li>'
        f'<li class="next"><a href="{next_href}">next</a></li></ul>'
    )
    return body.replace("</section>", pager + "</section>", 1).encode()


class _Hostile(BaseHTTPRequestHandler):
    def log_message(self, format, *args):  # noqa: A002
        pass

    def do_GET(self):
        with self.server.lock:
            self.server.paths.append(self.path)
        body = self.server.pages.get(self.path.split("?")[0])
        self.send_response(200 if body else 404)
        body = body or b"not found"
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture
def hostile_server():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Hostile)
    server.daemon_threads = True
    server.lock = threading.Lock()
    server.paths = []
    port = server.server_address[1]
    server.base_url = f"http://127.0.0.1:{port}/"
    server.pages = {
        # travel: next link to another host (127.0.0.2 is a different host on the same machine)
        "/catalogue/category/books/travel_2/index.html": _page_with_next(f"http://127.0.0.2:{port}/steal.html"),
        # mystery: next link that climbs out with ../ and encoded separators
        "/catalogue/category/books/mystery_3/index.html": _page_with_next("../../../../../../../tmp/%2e%2e%2fescape/page-2.html"),
        # fiction: next link no URL parser accepts (urlsplit raises "Invalid IPv6 URL")
        "/catalogue/category/books/fiction_10/index.html": _page_with_next("http://[bad/page-2.html"),
        # poetry: next link back to the page itself (followed, it would be asked max_pages times)
        "/catalogue/category/books/poetry_23/index.html": _page_with_next("index.html"),
    }
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def test_links_off_site_are_not_followed_and_nothing_is_written_outside_the_root(tmp_path, instance, hostile_server):
    data = _demo_spec()
    data["pagination"].pop("page_url")  # follow next links, where hostile links would bite
    spec_path = tmp_path / "next_links.yaml"
    spec_path.write_text(yaml.safe_dump(data))
    root = tmp_path / "objects"
    before = {p for p in tmp_path.parent.rglob("*")}

    res = make_resources(tmp_path, site=str(spec_path), base_url=hostile_server.base_url, max_attempts=1)
    result = materialize(instance, res, ["travel", "mystery", "fiction", "poetry"], selection=["raw_pages"])
    assert result.success

    store = ObjectStore(str(root))
    travel = latest_manifest(store, "demo", "travel")
    assert sorted(travel.pages) == [1]  # the off-site next link was not followed
    assert travel.is_complete and travel.pages[1].status == "done"
    mystery = latest_manifest(store, "demo", "mystery")
    # The ../ link resolves to a URL on the same host; it is fetched (404 here) and stored by page number.
    assert mystery.pages[2].url == f"{hostile_server.base_url}tmp/%2e%2e%2fescape/page-2.html"
    assert (mystery.pages[2].status, mystery.pages[2].http_status) == ("failed", 404)
    assert not any("127.0.0.2" in p or "steal" in p for p in hostile_server.paths)
    fiction = latest_manifest(store, "demo", "fiction")  # a dead end, not a failed run
    assert sorted(fiction.pages) == [1] and fiction.is_complete and fiction.pages[1].status == "done"
    poetry = latest_manifest(store, "demo", "poetry")
    assert sorted(poetry.pages) == [1] and poetry.is_complete
    assert hostile_server.paths.count("/catalogue/category/books/poetry_23/index.html") == 1
    warnings = [e.user_message for e in instance.all_logs(result.run_id) if e.level == logging.WARNING]
    assert any("travel: next link" in w and "leaves the site; not followed" in w for w in warnings)
    assert any("poetry: page 1's next link goes back to page 1" in w for w in warnings)
    assert any("fiction: page 1's next link 'http://[bad/page-2.html' (Invalid IPv6 URL) cannot be resolved" in w
               for w in warnings)

    created = {p for p in tmp_path.parent.rglob("*")} - before
    outside = [p for p in created if not (p == root or root in p.parents or p.name == "warehouse.db" or p.parent == tmp_path)]
    assert outside == [], outside
    assert all(p.name.startswith(("page-", "manifest", "raw_pages", "host-", ".")) for p in root.rglob("*") if p.is_file())


@pytest.mark.parametrize("answer", ["empty", "compress", "204"])
def test_a_page_with_nothing_usable_in_it_keeps_the_categorys_rows(tmp_path, instance, answer):
    """An empty 200, a body in a compression we never offered (compress: LZW), a 204:
    taken as pages they would parse to no products and empty the category in the table. They
    are failed fetches instead (dead letters), and the rows loaded before are carried forward."""
    from scrape_assets.demo_site import DemoRequestHandler, DemoResponse, DemoServer, catalogue
    from scrape_assets.warehouse import Warehouse, dead_letters, products
    from scrape_assets_tests.conftest import serving

    travel = "/" + catalogue().category("travel").path

    class Handler(DemoRequestHandler):
        def send_demo_response(self, response):
            if self.server.broken and self.path == travel:
                headers = {"Content-Type": "text/html; charset=utf-8", "Content-Length": "0"}
                if answer == "compress":
                    headers.update({"Content-Encoding": "compress", "Content-Length": "6"})
                response = DemoResponse(204 if answer == "204" else 200, headers,
                                        b"\x1f\x9d\x90ok\x03" if answer == "compress" else b"")
            super().send_demo_response(response)

    server = DemoServer(("127.0.0.1", 0), Handler)
    server.broken = False
    with serving(server):
        res = make_resources(tmp_path, base_url=server.base_url, max_attempts=2)
        assert materialize(instance, res, ["travel"]).success
        server.broken = True
        assert materialize(instance, res, ["travel"]).success
    wh = Warehouse(f"sqlite:///{tmp_path / 'warehouse.db'}")
    assert len(wh.rows(products)) == len(catalogue().category("travel").products)  # carried forward
    (letter,) = wh.rows(dead_letters)
    assert letter["stage"] == "fetch" and letter["reason"].startswith({
        "empty": "empty_body: HTTP 200 with an empty body", "204": "http_204: a GET answered 204, not 200 with the page",
        "compress": "unsupported_content_encoding: Content-Encoding compress; this client accepts gzip, deflate, br"}[
            answer])


@pytest.mark.parametrize(("spec_counts_results", "page"),
                         [(True, "bot check"), (False, "bot check"), (True, "script shell")])
def test_a_bot_check_served_as_200_holds_the_category_back_instead_of_emptying_it(tmp_path, instance,
                                                                                   spec_counts_results, page):
    """A challenge page answered with status 200 has no product card, no pager and no results
    count: parsed as an empty listing it would replace the category's rows with none. With a
    results count in the spec (which even an empty listing shows), the page fails the blocking
    check and the earlier rows stay; without one the guard cannot tell it from an empty
    category (the documented limit), and the category empties as the site asked. A page whose
    listing a script fills in has the results element, but no number in it ("{{ total }}"):
    no sign of an empty listing either (it emptied the category before)."""
    from scrape_assets.demo_site import DemoRequestHandler, DemoResponse, DemoServer, catalogue
    from scrape_assets.warehouse import Warehouse, products
    from scrape_assets_tests.conftest import serving

    travel = "/" + catalogue().category("travel").path  # one page, 11 products
    challenge = (b"<html><head><title>Just a moment...</title></head><body><p>Checking your browser</p></body></html>"
                 if page == "bot check" else
                 b'<html><body><form class="form-horizontal"><strong>{{ total }}</strong> results</form>'
                 b'<ol class="row"></ol><script src="/app.js"></script></body></html>')

    class Handler(DemoRequestHandler):
        def send_demo_response(self, response):
            if self.server.challenge and self.path == travel:
                response = DemoResponse(200, {"Content-Type": "text/html; charset=utf-8",
                                              "Content-Length": str(len(challenge))}, challenge)
            super().send_demo_response(response)

    spec = _demo_spec()
    if not spec_counts_results:
        del spec["pagination"]["results_count"]
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(spec))
    server = DemoServer(("127.0.0.1", 0), Handler)
    server.challenge = False
    with serving(server):
        res = make_resources(tmp_path, base_url=server.base_url, site=str(tmp_path / "spec.yaml"))
        assert materialize(instance, res, ["travel"]).success
        server.challenge = True
        result = materialize(instance, res, ["travel"], raise_on_error=False)
    check = {c.check_name: c for c in result.get_asset_check_evaluations()}["parsed_products_match_schema"]
    rows = Warehouse(f"sqlite:///{tmp_path / 'warehouse.db'}").rows(products)
    if spec_counts_results:
        assert check.passed is False
        (case,) = check.metadata["failure_cases"].value
        assert case["check"] == "unrecognised_page" and "bot check" in case["message"]
        assert case["failure_case"]["category"] == "travel" and case["failure_case"]["page_number"] == 1
        assert len(rows) == 11  # the rows loaded the day before stay
    else:
        assert check.passed is True and rows == []


def test_a_product_listed_twice_keeps_its_first_listing_and_the_category_loads(tmp_path, instance):
    """Cards the site repeats on every page (or products that moved between pages while they
    were fetched): one row each (the first listing), the others parse dead letters; they are
    not rejected cards, so they neither fail the uniqueness check nor the rejected share."""
    import re

    from scrape_assets.demo_site import DemoRequestHandler, DemoResponse, DemoServer, catalogue
    from scrape_assets.warehouse import Warehouse, dead_letters, products
    from scrape_assets_tests.conftest import run_metadata, serving

    default = catalogue().category("default")  # 12 pages, 232 products
    first_page = respond("GET", "/" + default.path).body
    cards = re.findall(rb'<article class="product_pod">.*?</article>', first_page, re.S)[:2]
    repeated = [str(p.id) for p in default.products[:2]]
    assert all(f"_{pid}/".encode() in card for pid, card in zip(repeated, cards))

    class Handler(DemoRequestHandler):
        removed: str | None = None  # a product that left the site: its card is cut from its page

        def send_demo_response(self, response):
            # Pages 2..12: the two "featured" cards first. Their own ETag: the catalogue's
            # never matches it, so they are always sent whole (page 1 may answer 304).
            if "/default_15/page-" in self.path and response.status == 200:
                body = response.body.replace(b'<article class="product_pod">', b"".join(cards)
                                             + b'<article class="product_pod">', 1)
                if self.removed:
                    body = re.sub(rb'<article class="product_pod">(?:(?!</article>).)*_' + self.removed.encode()
                                  + rb"/.*?</article>", b"", body, flags=re.S)
                response = DemoResponse(200, {**response.headers, "Content-Length": str(len(body)),
                                              "ETag": f'"{hash(body)}"'}, body)
            super().send_demo_response(response)

    with serving(DemoServer(("127.0.0.1", 0), Handler)) as server:
        result = materialize(instance, make_resources(tmp_path, base_url=server.base_url), ["default"])
        assert result.success
        # 254 cards for the site's 232 results: more is no sign of pages missed, no warning
        count = {c.check_name: c for c in result.get_asset_check_evaluations()}["parsed_products_match_site_count"]
        assert count.passed and count.metadata["mismatched"].value == {}
        wh = Warehouse(f"sqlite:///{tmp_path / 'warehouse.db'}")
        rows = {r["product_id"]: r["page_number"] for r in wh.rows(products)}
        assert len(rows) == len(default.products) and [rows[pid] for pid in repeated] == [1, 1]
        letters = wh.rows(dead_letters)
        assert len(letters) == 22 > 0.05 * (232 + 22)  # more than the share of rejected cards allowed
        assert {(r["stage"], r["reason"]) for r in letters} == {
            ("parse", f"product_id {pid}: already listed on page 1") for pid in repeated}

        # The next day a product leaves the site. The repeated cards are dead letters whose
        # product is known (not cards whose id could not be read): the snapshot saw every
        # product, so the one that left is dropped, not carried forward.
        Handler.removed = str(default.products[-1].id)
        again = materialize(instance, make_resources(tmp_path, base_url=server.base_url), ["default"],
                            run_config={"ops": {"raw_pages": {"config": {"new_snapshot": True}}}})
    table = run_metadata(again)["products_table"]
    assert (table["rows_loaded"], table["rows_carried_forward"]) == (len(default.products) - 1, 0)
    assert {r["product_id"] for r in wh.rows(products)} == {str(p.id) for p in default.products[:-1]}


def test_a_page_moved_with_a_redirect_resolves_its_links_against_where_it_now_is(tmp_path, instance):
    """Travel's page 1 moved one folder deeper (301), its relative links written for the new
    place: resolved against the old URL they would name products that do not exist."""
    from scrape_assets.demo_site import DemoRequestHandler, DemoResponse, DemoServer, catalogue
    from scrape_assets.warehouse import Warehouse, products
    from scrape_assets_tests.conftest import serving

    travel = catalogue().category("travel")
    old_path = "/" + travel.path
    new_path = old_path.replace("/index.html", "/v2/index.html")

    class Handler(DemoRequestHandler):
        def send_demo_response(self, response):
            if self.path == old_path:
                response = DemoResponse(301, {"Location": new_path, "Content-Length": "0"}, b"")
            elif self.path == new_path:
                body = respond("GET", old_path).body.replace(b'href="../../../', b'href="../../../../')
                response = DemoResponse(200, {"Content-Type": "text/html; charset=utf-8",
                                              "Content-Length": str(len(body))}, body)
            super().send_demo_response(response)

    with serving(DemoServer(("127.0.0.1", 0), Handler)) as server:
        res = make_resources(tmp_path, base_url=server.base_url)
        assert materialize(instance, res, ["travel"]).success
    entry = latest_manifest(ObjectStore(str(tmp_path / "objects")), "demo", "travel").pages[1]
    assert entry.final_url == server.base_url + new_path.lstrip("/")
    wh = Warehouse(f"sqlite:///{tmp_path / 'warehouse.db'}")
    assert sorted(r["url"] for r in wh.rows(products)) == sorted(
        f"http://demo.scrape-assets.invalid/{p.path}" for p in travel.products)



def test_an_unredirected_page_keeps_no_final_url_however_httpx_spells_its_url(tmp_path, instance, demo_server):
    """httpx lower-cases the host: "LOCALHOST" fetched unredirected is no redirect, and a
    next-link crawl on it stays on the site."""
    data = _demo_spec()
    data["pagination"].pop("page_url")
    spec_path = tmp_path / "next_links.yaml"
    spec_path.write_text(yaml.safe_dump(data))
    base_url = demo_server.base_url.replace("127.0.0.1", "LOCALHOST")
    res = make_resources(tmp_path, site=str(spec_path), base_url=base_url)
    assert materialize(instance, res, ["fiction"], selection=["raw_pages"]).success
    fiction = latest_manifest(ObjectStore(str(tmp_path / "objects")), "demo", "fiction")
    assert len(fiction.pages) == 4 and all(p.final_url is None for p in fiction.pages.values())


@contextlib.contextmanager
def _fiction_with_next_link(tmp_path, page: str, link: str, host: str = "127.0.0.1") -> Iterator[tuple[dict, list]]:
    """The demo catalogue on a real socket, fiction's ``page`` (``index.html``, ``page-2.html``)
    linking ``link`` (``{port}`` filled in) as its next page; yields the resources of a
    next-link spec on the base URL spelled with ``host``, and the paths asked."""
    from scrape_assets.demo_site import DemoRequestHandler, DemoResponse, DemoServer
    from scrape_assets_tests.conftest import serving

    asked: list[str] = []

    class Handler(DemoRequestHandler):
        def send_demo_response(self, response):
            asked.append(self.path)
            if self.path.endswith(f"fiction_10/{page}"):
                old = re.search(rb'<li class="next"><a href="([^"]+)"', response.body).group(1)
                new = link.format(port=self.server.server_address[1]).encode()
                body = response.body.replace(b'href="' + old + b'"', b'href="' + new + b'"')
                response = DemoResponse(200, {**response.headers, "Content-Length": str(len(body))}, body)
            super().send_demo_response(response)

    data = _demo_spec()
    data["pagination"].pop("page_url")
    spec_path = tmp_path / "next_links.yaml"
    spec_path.write_text(yaml.safe_dump(data))
    with serving(DemoServer(("127.0.0.1", 0), Handler)) as server:
        yield make_resources(tmp_path, site=str(spec_path), base_url=server.base_url.replace("127.0.0.1", host)), asked


def test_a_next_link_spelling_the_sites_host_in_another_case_stays_on_the_site(tmp_path, instance):
    """Hosts are case-insensitive and a default port is the same port (RFC 6454): an absolute
    next link to http://localhost:PORT/ from a base URL of http://LOCALHOST:PORT/ is on the site."""
    link = "http://localhost:{port}/catalogue/category/books/fiction_10/page-2.html"
    with _fiction_with_next_link(tmp_path, "index.html", link, host="LOCALHOST") as (res, _asked):
        assert materialize(instance, res, ["fiction"], selection=["raw_pages"]).success
    fiction = latest_manifest(ObjectStore(str(tmp_path / "objects")), "demo", "fiction")
    assert len(fiction.pages) == 4 and fiction.pages[2].url.startswith("http://localhost:")


@pytest.mark.parametrize("mode", ["pager", "next_links"])
def test_a_category_longer_than_max_pages_stops_there_with_a_warning(tmp_path, instance, mode):
    """max_pages is a safety limit: hitting it drops the later pages' products, so it says so."""
    data = _demo_spec()
    data["pagination"]["max_pages"] = 3
    if mode == "next_links":
        data["pagination"].pop("page_url")
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(data))
    res = make_resources(tmp_path, site=str(tmp_path / "spec.yaml"))
    result = materialize(instance, res, ["default"], selection=["raw_pages"])  # 12 pages on the site
    assert result.success
    manifest = latest_manifest(ObjectStore(str(tmp_path / "objects")), "demo", "default")
    assert sorted(manifest.pages) == [1, 2, 3] and manifest.is_complete
    warning = {"pager": "default: the site lists 12 pages; the spec's pagination.max_pages stops the crawl at 3",
               "next_links": "default: page 3 has a next link; the spec's pagination.max_pages stops the crawl there",
               }[mode]
    # In the run's event log (the UI's run page), as a warning, not only on the step's stderr.
    assert [e.level for e in instance.all_logs(result.run_id) if warning in (e.user_message or "")] == [logging.WARNING]


@pytest.mark.parametrize("host, href, back_to", [
    ("127.0.0.1", "page-2.html#top", 2),
    ("LOCALHOST", "http://localhost:{port}/catalogue/category/books/fiction_10/index.html", 1),
])
def test_a_next_link_back_to_a_page_spelled_otherwise_ends_the_crawl(tmp_path, instance, host, href, back_to):
    """A fragment is never sent and a host's case does not matter: page 2's next link to
    "page-2.html#top" (a disabled "next" on the last page) is page 2 again, not a page 3
    fetched a second time with its products listed twice; so is a link to page 1 spelling
    the host in another case than the base URL."""
    with _fiction_with_next_link(tmp_path, "page-2.html", href, host=host) as (res, asked):
        result = materialize(instance, res, ["fiction"], selection=["raw_pages"])
    assert result.success
    fiction = latest_manifest(ObjectStore(str(tmp_path / "objects")), "demo", "fiction")
    assert sorted(fiction.pages) == [1, 2] and fiction.is_complete
    pages = [p for p in asked if "fiction_10" in p]
    assert pages == ["/catalogue/category/books/fiction_10/index.html", "/catalogue/category/books/fiction_10/page-2.html"]
    warnings = [e.user_message for e in instance.all_logs(result.run_id) if e.level == logging.WARNING]
    assert any(f"fiction: page 2's next link goes back to page {back_to}" in w for w in warnings), warnings
