"""Tests of the built-in demo catalogue (scrape_assets/demo_site.py and demo_markup.py)."""

from __future__ import annotations

import asyncio
import datetime
import hashlib
import os
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from decimal import Decimal
from urllib.parse import urljoin

import httpx
import pytest
from protego import Protego
from selectolax.lexbor import LexborHTMLParser

from scrape_assets.demo_site import (
    DATE_ENV_VAR,
    DEMO_BASE_URL,
    DemoServer,
    DemoTransport,
    catalogue,
    make_server,
    resolve_day,
    changed_categories,
    CHANGED_PER_DAY,
    CATEGORY_TABLE,
    respond,
)
from scrape_assets.spec import load_spec

DAY = datetime.date(2024, 5, 1)
NEXT_DAY = datetime.date(2024, 5, 2)
SIZES = {
    "travel": 11, "mystery": 32, "classics": 19, "romance": 35, "fiction": 65, "default": 232,
    "fantasy": 48, "science": 14, "poetry": 19, "history": 18, "nonfiction": 110, "sequential-art": 75,
}
SPEC = load_spec("demo")


def listing(key: str, page: int = 1) -> str:
    """Request target of page ``page`` of category ``key``, e.g. ``/catalogue/.../travel_2/index.html``."""
    start = "/" + SPEC.categories[key]
    return start if page == 1 else start.replace("index.html", f"page-{page}.html")


CHANGED_TODAY = sorted(changed_categories(DAY))[0]
CHANGED_TOMORROW = sorted(changed_categories(NEXT_DAY))[0]
UNCHANGED_TOMORROW = sorted({row[0] for row in CATEGORY_TABLE} - changed_categories(NEXT_DAY))[0]


def get(target: str, headers: dict[str, str] | None = None, day: datetime.date = DAY):
    return respond("GET", target, headers, day=day)


@pytest.fixture
def server() -> Iterator[DemoServer]:
    srv = make_server(day=DAY)
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield srv
    srv.shutdown()
    srv.server_close()
    thread.join(timeout=5)


# --- the catalogue -------------------------------------------------------------------------------


def test_categories_are_those_of_the_demo_spec():
    cat = catalogue(DAY)
    assert {c.key: c.path for c in cat.categories} == SPEC.categories
    assert SPEC.base_url == DEMO_BASE_URL


def test_category_sizes_and_page_counts():
    cat = catalogue(DAY)
    assert {c.key: len(c.products) for c in cat.categories} == SIZES
    assert {c.key: c.page_count for c in cat.categories} == {
        "travel": 1, "mystery": 2, "classics": 1, "romance": 2, "fiction": 4, "default": 12,
        "fantasy": 3, "science": 1, "poetry": 1, "history": 1, "nonfiction": 6, "sequential-art": 4,
    }
    assert cat.page_count == 38


def test_product_ids_are_unique_across_the_catalogue():
    ids = [p.id for p in catalogue(DAY).products]
    assert len(ids) == 678
    assert sorted(ids) == list(range(1, 679))


def test_prices_move_by_day_but_products_do_not():
    today, tomorrow = catalogue(DAY).products, catalogue(NEXT_DAY).products
    assert [(p.id, p.title, p.slug, p.rating) for p in today] == [(p.id, p.title, p.slug, p.rating) for p in tomorrow]
    changed_keys = changed_categories(NEXT_DAY)
    assert len(changed_keys) == CHANGED_PER_DAY == 2
    for key in (row[0] for row in CATEGORY_TABLE):
        a, b = catalogue(DAY).category(key).products, catalogue(NEXT_DAY).category(key).products
        moved = sum(x.price != y.price for x, y in zip(a, b))
        if key in changed_keys:
            assert moved > 0.8 * len(a), key  # a changed category reprices (nearly) everything
        else:
            assert moved == 0, key  # the others keep yesterday's prices and bytes
    for product in today + tomorrow:
        assert Decimal("5") <= product.price <= Decimal("60")
        assert product.price.as_tuple().exponent == -2
        assert 1 <= product.rating <= 5


def test_day_comes_from_argument_then_env_then_utc_today(monkeypatch):
    monkeypatch.setenv(DATE_ENV_VAR, "2023-12-31")
    assert resolve_day(DAY) == DAY
    assert resolve_day() == datetime.date(2023, 12, 31)
    assert catalogue().day == datetime.date(2023, 12, 31)
    monkeypatch.delenv(DATE_ENV_VAR)
    assert resolve_day() == datetime.datetime.now(datetime.timezone.utc).date()


@pytest.mark.parametrize("value", ["31/12/2023", "2023-02-30", "yesterday"])
def test_malformed_date_env_var_is_a_clear_error(monkeypatch, value):
    monkeypatch.setenv(DATE_ENV_VAR, value)
    expected = rf"^SCRAPE_DEMO_DATE='{re.escape(value)}' is invalid: expected a date as YYYY-MM-DD"
    with pytest.raises(ValueError, match=expected):
        respond("GET", listing("travel"))


@pytest.mark.parametrize("value", ["0001-01-01", "1999-12-31", "9999-12-31"])
def test_a_date_outside_the_catalogues_range_is_a_clear_error(monkeypatch, value):
    monkeypatch.setenv(DATE_ENV_VAR, value)
    with pytest.raises(ValueError, match=rf"^SCRAPE_DEMO_DATE='{value}' is invalid: expected a date from 2000-01-01 "
                                         "to 9998-12-31$"):
        respond("GET", listing("travel"))


@pytest.mark.parametrize("value", ["2000-01-01", "9998-12-31"])
def test_the_first_and_last_days_of_the_range_are_served(monkeypatch, value):
    monkeypatch.setenv(DATE_ENV_VAR, value)
    assert respond("GET", listing("travel")).status == 200


# --- pages ---------------------------------------------------------------------------------------


def test_single_page_category_has_no_pager():
    response = get(listing("travel"))
    assert response.status == 200
    assert b'class="pager"' not in response.body
    tree = LexborHTMLParser(response.body.decode("utf-8"))
    assert len(tree.css(SPEC.selectors.product)) == 11
    assert " ".join(tree.css_first("form.form-horizontal").text().split()) == "11 results."


def test_default_has_twelve_pages_and_page_thirteen_is_missing():
    first = LexborHTMLParser(get(listing("default")).body.decode("utf-8"))
    assert first.css_first(SPEC.pagination.pager).text(strip=True) == "Page 1 of 12"
    assert get(listing("default", 12)).status == 200
    last = LexborHTMLParser(get(listing("default", 12)).body.decode("utf-8"))
    assert len(last.css("article.product_pod")) == 232 - 11 * 20
    assert last.css_first("ul.pager li.next") is None
    assert last.css_first("ul.pager li.previous a").attributes["href"] == "page-11.html"
    for missing in (listing("default", 13), listing("default").replace("index", "page-0"),
                    listing("default").replace("index", "page-02"), listing("travel", 2)):
        response = get(missing)
        assert response.status == 404, missing
        assert b"<h1>404 Not Found</h1>" in response.body
        assert len(response.body) < 1000


def test_page_one_alias_matches_index_like_the_real_site():
    assert get(listing("mystery").replace("index", "page-1")).body == get(listing("mystery")).body


def test_every_listing_page_shows_its_slice_of_products():
    for category in catalogue(DAY).categories:
        seen = []
        for page in range(1, category.page_count + 1):
            tree = LexborHTMLParser(get(listing(category.key, page)).body.decode("utf-8"))
            cards = tree.css(SPEC.selectors.product)
            assert len(cards) == (20 if page < category.page_count else len(category.products) - 20 * (page - 1))
            assert tree.css_first(SPEC.pagination.results_count).text() == str(len(category.products))
            seen += [int(re.search(SPEC.product_id.regex, c.css_first("h3 > a").attributes["href"])[1]) for c in cards]
        assert seen == [p.id for p in category.products]


def test_markup_parses_with_the_spec_selectors():
    mystery = catalogue(DAY).category("mystery")
    body = get(listing("mystery")).body
    tree = LexborHTMLParser(body.decode("utf-8"))
    cards = tree.css(SPEC.selectors.product)
    assert len(cards) == 20
    assert tree.css_first("ul.pager li.current").text(strip=True) == "Page 1 of 2"
    assert tree.css_first(SPEC.pagination.next_link).attributes["href"] == "page-2.html"
    assert tree.css_first("ul.pager li.previous") is None
    assert [t.text() for t in tree.css("form.form-horizontal strong")] == ["32", "1", "20"]
    for card, product in zip(cards, mystery.products):
        link = card.css_first("h3 > a")
        assert link.attributes["title"] == product.title
        assert urljoin(DEMO_BASE_URL + mystery.path, link.attributes["href"]) == DEMO_BASE_URL + product.path
        price = card.css_first("p.price_color").text()
        assert price.startswith("£")
        assert re.fullmatch(r"£\d{1,2}\.\d\d", price), price
        assert Decimal(price[1:]) == product.price
        assert card.css_first("p.star-rating").attributes["class"] == f"star-rating {product.rating_word}"
        assert card.css_first("p.availability").text(strip=True) == "In stock"
    page2 = LexborHTMLParser(get(listing("mystery", 2)).body.decode("utf-8"))
    assert page2.css_first("ul.pager li.current").text(strip=True) == "Page 2 of 2"
    assert page2.css_first("ul.pager li.previous a").attributes["href"] == "page-1.html"
    assert [t.text() for t in page2.css("form.form-horizontal strong")] == ["32", "21", "32"]


def test_long_titles_are_shortened_in_the_link_text_only():
    long_ones = [p for p in catalogue(DAY).products if len(p.title.split()) > 4]
    assert len(long_ones) > 50
    category = next(c for c in catalogue(DAY).categories if long_ones[0] in c.products)
    page = category.products.index(long_ones[0]) // 20 + 1
    tree = LexborHTMLParser(get(listing(category.key, page)).body.decode("utf-8"))
    link = next(a for a in tree.css("h3 > a") if a.attributes["title"] == long_ones[0].title)
    assert link.text() == " ".join(long_ones[0].title.split()[:4]) + " ..."


def test_pages_are_utf8_and_of_realistic_size():
    response = get(listing("default"))
    assert response.headers["Content-Type"] == "text/html; charset=utf-8"
    assert b'<meta charset="utf-8">' in response.body
    assert b'<p class="price_color">\xc2\xa3' in response.body  # "£" in UTF-8
    assert 30_000 < len(response.body) < 60_000
    assert int(response.headers["Content-Length"]) == len(response.body)


def test_same_day_gives_byte_identical_pages_in_a_fresh_process():
    code = (
        "import hashlib, sys; from scrape_assets.demo_site import respond; "
        "sys.stdout.write(hashlib.sha256(respond('GET', sys.argv[1]).body).hexdigest())"
    )
    env = {**os.environ, DATE_ENV_VAR: DAY.isoformat(), "PYTHONHASHSEED": "12345"}
    for key in ("mystery", "default"):
        command = [sys.executable, "-c", code, listing(key)]
        out = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
        assert out.stdout == hashlib.sha256(get(listing(key)).body).hexdigest()
    assert get(listing(CHANGED_TOMORROW), day=NEXT_DAY).body != get(listing(CHANGED_TOMORROW)).body
    assert get(listing(UNCHANGED_TOMORROW), day=NEXT_DAY).body == get(listing(UNCHANGED_TOMORROW)).body


def test_home_page_lists_the_categories():
    for target in ("/", "/index.html"):
        tree = LexborHTMLParser(get(target).body.decode("utf-8"))
        links = [a.attributes["href"] for a in tree.css("ul.categories a")]
        assert links == list(SPEC.categories.values())


def test_robots_txt_disallows_something_but_no_listing():
    response = get("/robots.txt")
    assert response.headers["Content-Type"] == "text/plain; charset=utf-8"
    text = response.body.decode()
    assert "User-agent: *" in text
    assert "Disallow: /basket/" in text
    robots = Protego.parse(text)
    assert not robots.can_fetch(DEMO_BASE_URL + "basket/", "scrape-assets")
    for key in SPEC.categories:
        assert robots.can_fetch(SPEC.start_url(key), "scrape-assets")


def test_other_methods_are_refused():
    response = respond("POST", listing("travel"), day=DAY)
    assert (response.status, response.headers["Allow"]) == (405, "GET, HEAD")


# --- conditional GET and HEAD ---------------------------------------------------------------------


def test_validators_and_conditional_get():
    full = get(listing(CHANGED_TODAY))
    etag = full.headers["ETag"]
    assert etag == '"' + hashlib.sha256(full.body).hexdigest()[:32] + '"'
    assert full.headers["Last-Modified"] == "Wed, 01 May 2024 00:00:00 GMT"
    for validator in (etag, f"W/{etag}", f'"nope", {etag}', "*"):
        not_modified = get(listing(CHANGED_TODAY), {"if-none-match": validator})
        assert (not_modified.status, not_modified.body) == (304, b""), validator
        assert not_modified.headers == {"ETag": etag, "Last-Modified": "Wed, 01 May 2024 00:00:00 GMT"}
    assert get(listing(CHANGED_TODAY), {"If-None-Match": '"stale"'}).status == 200
    tomorrow_etag = get(listing(CHANGED_TOMORROW)).headers["ETag"]
    assert get(listing(CHANGED_TOMORROW), {"If-None-Match": tomorrow_etag}, day=NEXT_DAY).status == 200
    assert get(listing(UNCHANGED_TOMORROW), {"If-None-Match": get(listing(UNCHANGED_TOMORROW)).headers["ETag"]}, day=NEXT_DAY).status == 304
    assert get(listing(CHANGED_TODAY), {"If-Modified-Since": "Wed, 01 May 2024 00:00:00 GMT"}).status == 304
    assert get(listing(CHANGED_TODAY), {"If-Modified-Since": "Thu, 02 May 2024 08:00:00 GMT"}).status == 304
    assert get(listing(CHANGED_TODAY), {"If-Modified-Since": "Tue, 30 Apr 2024 23:59:59 GMT"}).status == 200
    assert get(listing(CHANGED_TODAY), {"If-Modified-Since": "not a date"}).status == 200
    assert get(listing(CHANGED_TODAY), {"If-Modified-Since": "Mon, 30 Nov 99999999999 10:00:00 GMT"}).status == 200
    # If-None-Match wins over If-Modified-Since (RFC 9110 §13.2.2)
    both = {"If-None-Match": '"stale"', "If-Modified-Since": "Thu, 02 May 2024 08:00:00 GMT"}
    assert get(listing("mystery"), both).status == 200


def test_head_gives_get_headers_without_body():
    head, full = respond("HEAD", listing("fiction", 2), day=DAY), get(listing("fiction", 2))
    assert (head.status, head.body, head.headers) == (200, b"", full.headers)


# --- in-process transport and real sockets ---------------------------------------------------------


def test_transport_and_socket_server_serve_the_same_bytes(server):
    targets = [listing("travel"), listing("default", 7), "/robots.txt", "/", "/no/such/page.html"]
    with httpx.Client(transport=DemoTransport(day=DAY), base_url=DEMO_BASE_URL) as local, \
            httpx.Client(base_url=server.base_url) as remote:
        for target in targets:
            a, b = local.get(target), remote.get(target)
            assert (a.status_code, a.content) == (b.status_code, b.content), target
            assert a.headers.get("etag") == b.headers.get("etag")
            assert a.headers["content-length"] == b.headers["content-length"]
        etag = local.get(listing("travel")).headers["etag"]
        assert remote.get(listing("travel"), headers={"If-None-Match": etag}).status_code == 304
        head = remote.head(listing("travel"))
        assert (head.status_code, head.content) == (200, b"")
        assert head.headers["content-length"] == str(len(local.get(listing("travel")).content))
    assert re.fullmatch(r"http://127\.0\.0\.1:\d+/", server.base_url)
    with httpx.Client(mounts={DEMO_BASE_URL: DemoTransport(day=DAY)}) as mounted:
        assert mounted.get(DEMO_BASE_URL + "robots.txt").content == get("/robots.txt").body


def test_async_transport_serves_pages():
    async def fetch() -> tuple[int, bytes]:
        async with httpx.AsyncClient(transport=DemoTransport(day=DAY), base_url=DEMO_BASE_URL) as client:
            response = await client.post(listing("travel"), content=b"ignored")
            assert response.status_code == 405
            response = await client.get(listing("poetry"))
            return response.status_code, response.content

    assert asyncio.run(fetch()) == (200, get(listing("poetry")).body)


def test_request_log_counts_requests_per_path(server):
    with httpx.Client(base_url=server.base_url, headers={"User-Agent": "test-agent"}) as client:
        for _ in range(3):
            client.get(listing("travel"))
        client.get("/robots.txt", headers={"If-None-Match": '"x"'})
        client.get(listing("default", 99))
    assert server.request_count(listing("travel")) == 3
    assert server.request_count("/robots.txt") == 1
    assert server.request_count() == 5
    log = server.requests
    assert [r.method for r in log] == ["GET"] * 5
    robots = log[3]
    assert (robots.path, robots.headers["user-agent"], robots.headers["if-none-match"]) == ("/robots.txt", "test-agent", '"x"')
    assert all(a.at_s <= b.at_s for a, b in zip(log, log[1:]))
    server.clear_requests()
    assert server.requests == []


def test_serve_forever_prints_its_address_and_stops_on_ctrl_c():
    code = "from scrape_assets.demo_site import serve_forever; serve_forever('127.0.0.1', 0)"
    env = {**os.environ, DATE_ENV_VAR: DAY.isoformat()}
    process = subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, text=True)
    try:
        line = process.stdout.readline()
        match = re.fullmatch(r"demo catalogue on (http://127\.0\.0\.1:\d+/) \(12 categories, 38 pages; day "
                             + DAY.isoformat() + r", SCRAPE_DEMO_DATE\); one line per request below, Ctrl-C stops\n", line)
        assert match, line
        assert httpx.get(match[1] + listing("travel")[1:]).content == get(listing("travel")).body
        assert re.fullmatch(r"\d\d:\d\d:\d\d GET " + re.escape(listing("travel")) + r" 200\n", process.stdout.readline())
        assert httpx.get(match[1] + "robots.txt", headers={"If-None-Match": '"x"'}).status_code == 200
        assert process.stdout.readline().endswith(" GET /robots.txt 200 (If-None-Match)\n")
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=10) == 0
    finally:
        process.kill()
        process.stdout.close()


# --- behaviours pinned by the mutation audit --------------------------------------------------------


def test_date_env_var_is_stripped_and_must_be_written_yyyy_mm_dd(monkeypatch):
    """Whitespace around the date (an ``.env`` file, a shell quote) is ignored; other ISO 8601
    spellings that ``date.fromisoformat`` would take (basic, week dates) are refused."""
    monkeypatch.setenv(DATE_ENV_VAR, " 2024-05-01\n")
    assert resolve_day() == DAY
    for value in ("20240501", "2024-W18-3"):
        monkeypatch.setenv(DATE_ENV_VAR, value)
        with pytest.raises(ValueError) as raised:
            resolve_day()
        assert str(raised.value) == (f"SCRAPE_DEMO_DATE={value!r} is invalid: expected a date as YYYY-MM-DD, "
                                     "e.g. 2024-05-01")


def test_query_strings_are_ignored_and_methods_are_case_insensitive():
    page = get(listing("travel"))
    for target in (listing("travel") + "?utm_source=x", listing("travel") + "?", "/robots.txt?v=2"):
        response = get(target)
        assert response.status == 200, target
        assert response.body == (page.body if "travel" in target else get("/robots.txt").body)
    assert respond("get", listing("travel"), day=DAY).body == page.body
    head = respond("head", listing("travel"), day=DAY)
    assert (head.status, head.body, head.headers) == (200, b"", page.headers)


def test_an_unsupported_method_is_405_on_any_path():
    for target in (listing("travel"), "/no/such/page.html", listing("default", 99)):
        response = respond("DELETE", target, day=DAY)
        assert (response.status, response.headers["Allow"]) == (405, "GET, HEAD"), target
        assert b"<h1>405 Method Not Allowed</h1>" in response.body


def test_a_naive_if_modified_since_is_read_as_utc():
    """``-0000`` (RFC 5322: no zone information) parses to a naive datetime: taken as UTC, not an error."""
    assert get(listing(CHANGED_TODAY), {"If-Modified-Since": "Wed, 01 May 2024 00:00:00 -0000"}).status == 304
    assert get(listing(CHANGED_TODAY), {"If-Modified-Since": "Tue, 30 Apr 2024 23:59:59 -0000"}).status == 200


@pytest.mark.parametrize("host", ["", "evil.example/x", "a b", "127.0.0.1:8000/path", "x" * 254])
def test_sitemap_urls_fall_back_to_the_demo_host_for_a_missing_or_malformed_host(host):
    headers = {"Host": host} if host else {}
    body = get("/sitemap.xml", headers).body.decode()
    locs = re.findall(r"<loc>([^<]*)</loc>", body)
    assert len(locs) == 38
    assert all(loc.startswith(DEMO_BASE_URL + "catalogue/category/books/") for loc in locs), locs[:2]
    named = get("/sitemap.xml", {"Host": "[::1]:8080"}).body.decode()
    assert re.findall(r"<loc>([^<]*)</loc>", named)[0].startswith("http://[::1]:8080/catalogue/")


def test_a_post_body_is_drained_so_the_next_request_on_the_connection_is_answered(server):
    """The server reads a request's body before answering 405: the keep-alive connection's
    next request is parsed from where that body ended, not from inside it."""
    with httpx.Client(base_url=server.base_url) as client:
        refused = client.post(listing("travel"), content=b"GET /robots.txt HTTP/1.1\r\nHost: x\r\n\r\n")
        assert (refused.status_code, refused.headers["allow"]) == (405, "GET, HEAD")
        page = client.get(listing("travel"))
        assert (page.status_code, page.content) == (200, get(listing("travel")).body)
    assert [(r.method, r.path, r.status) for r in server.requests] == [
        ("POST", listing("travel"), 405), ("GET", listing("travel"), 200)]


def test_a_malformed_content_length_is_answered_400(server):
    import socket

    with socket.create_connection(server.server_address[:2], timeout=10) as client:
        client.sendall(f"POST {listing('travel')} HTTP/1.1\r\nHost: x\r\nContent-Length: ten\r\n\r\n".encode())
        answer = b""
        while chunk := client.recv(65536):
            answer += chunk
    assert answer.startswith(b"HTTP/1.1 400 ")
    assert server.requests == []  # refused before it was served or logged


def test_the_generated_catalogue_is_the_same_in_every_version():
    """Titles, ratings and categories "never change" and a price is a pure function of (product,
    the day its category last changed), rounded to the penny: golden values for DAY, so a change
    to the generator (a saved snapshot would no longer match the site) is seen."""
    from scrape_assets.demo_site import price_epoch

    cat = catalogue(DAY)
    assert [(p.id, p.title, str(p.price), p.rating) for p in cat.category("travel").products[:3]] == [
        (612, "Hidden Compass", "45.03", 2),
        (607, "The Endless Café", "35.88", 4),
        (536, "Ada's Garden", "38.29", 3),
    ]
    assert sum(p.price for p in cat.products) == Decimal("19532.69")
    assert (min(p.price for p in cat.products), max(p.price for p in cat.products)) == (Decimal("5.44"), Decimal("55.99"))
    assert {key: price_epoch(key, DAY).isoformat() for key in SIZES} == {
        "travel": "2024-05-01", "mystery": "2024-04-27", "classics": "2024-04-21", "romance": "2024-04-30",
        "fiction": "2024-04-29", "default": "2024-05-01", "fantasy": "2024-04-26", "science": "2024-04-23",
        "poetry": "2024-04-29", "history": "2024-04-16", "nonfiction": "2024-04-20", "sequential-art": "2024-04-11",
    }


# --- a second mutation audit (demo_markup.py): each test fails on the mutant named ---------------


def test_truncate_words_keeps_a_title_of_exactly_the_limit_whole():
    from scrape_assets.demo_markup import truncate_words

    assert truncate_words("One Two Three Four") == "One Two Three Four"
    assert truncate_words("One Two Three Four Five") == "One Two Three Four ..."
    assert truncate_words("One Two", words=2) == "One Two" and truncate_words("One Two Three", words=2) == "One Two ..."


def test_an_error_pages_message_and_status_are_escaped():
    from scrape_assets.demo_markup import error_page

    page = error_page("404 <Not> Found", 'no page "/<script>x</script>" & more')
    assert "<script>" not in page and "<Not>" not in page
    tree = LexborHTMLParser(page)
    assert (tree.css_first("h1").text(), tree.css_first("p").text()) == (
        "404 <Not> Found", 'no page "/<script>x</script>" & more')
    reflected = get("/no/<b>x</b>.html")  # the 404 names the path the client asked for
    assert reflected.status == 404 and b"<b>" not in reflected.body
    assert LexborHTMLParser(reflected.body.decode("utf-8")).css_first("p").text().startswith("/no/<b>x</b>.html ")


def test_a_listing_pages_site_links_resolve_to_the_site_root():
    """The header, footer, breadcrumb, static files and covers are four folders up from a listing page."""
    for page in (1, 2):
        page_url = DEMO_BASE_URL + listing("mystery", page).lstrip("/")
        tree = LexborHTMLParser(get(listing("mystery", page)).body.decode("utf-8"))
        home_links = {urljoin(page_url, a.attributes["href"]) for a in tree.css("header a, ul.breadcrumb a, footer a")}
        assert home_links == {DEMO_BASE_URL + p for p in ("index.html", "basket/", "accounts/login/", "robots.txt")}
        stylesheet = urljoin(page_url, tree.css_first('link[rel="stylesheet"]').attributes["href"])
        assert stylesheet == DEMO_BASE_URL + "static/oscar/css/styles.css"
        cover = urljoin(page_url, tree.css_first("article.product_pod img").attributes["src"])
        assert cover.startswith(DEMO_BASE_URL + "media/cache/")


def test_the_sidebar_lists_categories_in_site_order_the_current_one_in_bold():
    categories = sorted(catalogue(DAY).categories, key=lambda c: c.number)
    page_url = DEMO_BASE_URL + listing("mystery", 2).lstrip("/")
    tree = LexborHTMLParser(get(listing("mystery", 2)).body.decode("utf-8"))
    links = tree.css("div.side_categories ul ul a")
    assert [" ".join(a.text().split()) for a in links] == [c.name for c in categories]
    assert [urljoin(page_url, a.attributes["href"]) for a in links] == [DEMO_BASE_URL + c.path for c in categories]
    assert [a.text(strip=True) for a in tree.css("div.side_categories strong")] == ["Mystery"]
    (current,) = [a for a in links if a.css_first("strong") is not None]
    assert current.attributes["href"] == "index.html"
