"""The built-in demo catalogue: a deterministic, in-memory site shaped like books.toscrape.com.

It is the default scrape target. The pipeline mounts :class:`DemoTransport` for
``DEMO_BASE_URL`` (a reserved ``.invalid`` host, RFC 2606), so a scrape runs in-process with
no port and no network; ``scrape-assets serve-demo --port N`` serves the same bytes over real
sockets (:func:`make_server`, :func:`serve_forever`).

URL layout (paths relative to the base URL)::

    robots.txt                                        User-agent: *, Disallow /basket/ and /accounts/; Sitemap: line
    sitemap.xml                                       every listing page with its lastmod (sitemaps.org 0.9)
    index.html (and /)                                home page listing the categories
    catalogue/category/books/{key}_{num}/index.html   page 1 of a category (keys as in sites/demo.yaml)
    catalogue/category/books/{key}_{num}/page-{n}.html  page n (page-1.html is page 1 again, as on the real site)
    anything else, and pages beyond the last          404 with a small HTML body

Twelve categories hold 678 products (ids 1..678, unique across the catalogue), 20 per page:
38 listing pages. A single-page category has no pager element; others carry
``<ul class="pager">`` with "Page X of N" and previous/next links. Titles, ratings and the
category of each product come from a fixed seed and never change.

The date knob: prices move from day to day (±15 % around a fixed base, always £5.10-£59.80,
two decimals), but only in :data:`CHANGED_PER_DAY` categories a day, chosen from the date;
the others serve yesterday's bytes, so a daily refresh sees 304s for them. A product's
price is a pure function of (product id, the last day its category changed). The day is the ``day`` argument, else
the ``SCRAPE_DEMO_DATE`` environment variable (``YYYY-MM-DD``), else today's UTC date.

Responses carry a strong ``ETag`` (hash of the body) and ``Last-Modified`` (midnight UTC
of the day the category last changed); ``If-None-Match`` and ``If-Modified-Since`` give 304 (RFC 9110 §13).
``sitemap.xml`` lists every listing page with that same instant as its ``lastmod``, its
URLs on the host the request named (``Host``), so ``incremental.revalidate: sitemap`` can be
tried on the demo. Limits:
only GET and HEAD (others get 405); no product detail pages, images, CSS or search; query
strings are ignored; no gzip; no Range requests.
"""

from __future__ import annotations

import datetime
import functools
import hashlib
import math
import os
import re
import sys
import threading
import time
import unicodedata
from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal
from email.utils import format_datetime, parsedate_to_datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from socketserver import TCPServer
from typing import ClassVar, NamedTuple, TextIO
from urllib.parse import urlsplit

import httpx

from scrape_assets import demo_markup

DEMO_BASE_URL = "http://demo.scrape-assets.invalid/"
DATE_ENV_VAR = "SCRAPE_DEMO_DATE"
PAGE_SIZE = 20
_SEED = "scrape-assets-demo-v1"
_RATING_WORDS = ("One", "Two", "Three", "Four", "Five")

#: (partition key, number in the path, display name, number of products), as in sites/demo.yaml.
CATEGORY_TABLE: tuple[tuple[str, int, str, int], ...] = (
    ("travel", 2, "Travel", 11),
    ("mystery", 3, "Mystery", 32),
    ("classics", 6, "Classics", 19),
    ("romance", 8, "Romance", 35),
    ("fiction", 10, "Fiction", 65),
    ("default", 15, "Default", 232),
    ("fantasy", 19, "Fantasy", 48),
    ("science", 22, "Science", 14),
    ("poetry", 23, "Poetry", 19),
    ("history", 32, "History", 18),
    ("nonfiction", 13, "Nonfiction", 110),
    ("sequential-art", 5, "Sequential Art", 75),
)

_ADJECTIVES = ("Silent", "Crimson", "Hidden", "Last", "Broken", "Golden", "Midnight", "Wandering", "Forgotten",
               "Quiet", "Secret", "Burning", "Paper", "Glass", "Northern", "Naïve", "Little", "Endless", "Velvet")
_NOUNS = ("Harbour", "Garden", "Letters", "River", "Kingdom", "Lantern", "Orchard", "Winter", "Atlas", "Compass",
          "Island", "Mirror", "Clockmaker", "Café", "Lighthouse", "Archive", "Meridian", "Sparrow", "Empire", "Storm")
_NAMES = ("Ada", "Olivia", "Tomás", "Greta", "Idris", "Mei", "Noor", "Felix")
_TITLE_PATTERNS = (
    "The {a} {n}", "{n} of the {a2} {n2}", "{name}'s {n}", "{a} {n}",
    "A {a} {n}: {n2} & {n3} in the {a2} {n4}", "The {n} and the {n2} (The {a} {n3} #{k})",
)


def _draw(*parts: object) -> int:
    """A stable 64-bit integer from ``parts`` (independent of Python's hash seed and version)."""
    return int.from_bytes(hashlib.blake2b(":".join(map(str, (_SEED, *parts))).encode(), digest_size=8).digest(), "big")


def slugify(title: str) -> str:
    """URL slug of a title like Django's ``slugify``: ``"Ada's Café & Co"`` -> ``"adas-cafe-co"``."""
    ascii_text = unicodedata.normalize("NFKD", title).encode("ascii", "ignore").decode("ascii")
    return re.sub(r"[-\s]+", "-", re.sub(r"[^\w\s-]", "", ascii_text).strip().lower())


@dataclass(frozen=True)
class DemoProduct:
    """One product. ``price`` is in GBP (two decimals) on the catalogue's day; ``rating`` is 1..5."""

    id: int
    title: str
    slug: str
    rating: int
    price: Decimal
    availability: ClassVar[str] = "In stock"

    @property
    def rating_word(self) -> str:
        """The rating as books.toscrape.com spells it in the class: ``"One"`` .. ``"Five"``."""
        return _RATING_WORDS[self.rating - 1]

    @property
    def path(self) -> str:
        """Product URL relative to the base URL: ``catalogue/{slug}_{id}/index.html``."""
        return f"catalogue/{self.slug}_{self.id}/index.html"


@dataclass(frozen=True)
class DemoCategory:
    """One category (one partition): its products in listing order, ``page_size`` per page."""

    key: str
    number: int
    name: str
    products: tuple[DemoProduct, ...]
    page_size: ClassVar[int] = PAGE_SIZE

    @property
    def folder(self) -> str:
        return f"{self.key}_{self.number}"

    @property
    def path(self) -> str:
        """Page 1 relative to the base URL: ``catalogue/category/books/{key}_{num}/index.html``."""
        return self.page_path(1)

    @property
    def page_count(self) -> int:
        return max(1, math.ceil(len(self.products) / self.page_size))

    def page_path(self, page: int) -> str:
        """Path of 1-based ``page`` relative to the base URL (``index.html`` for page 1)."""
        return f"catalogue/category/books/{self.folder}/" + ("index.html" if page == 1 else f"page-{page}.html")

    def page_products(self, page: int) -> tuple[DemoProduct, ...]:
        """Products on 1-based ``page``. Raises ValueError outside ``1..page_count``."""
        if not 1 <= page <= self.page_count:
            raise ValueError(f"{self.key}: page {page} is outside 1..{self.page_count}")
        return self.products[(page - 1) * self.page_size : page * self.page_size]


@dataclass(frozen=True)
class DemoCatalogue:
    """The whole catalogue on one ``day``: categories in ``sites/demo.yaml`` order."""

    day: datetime.date
    categories: tuple[DemoCategory, ...]

    def category(self, key: str) -> DemoCategory:
        """The category whose partition key is ``key``. Raises KeyError naming the known keys."""
        for category in self.categories:
            if category.key == key:
                return category
        raise KeyError(f"unknown demo category {key!r}; known: {', '.join(c.key for c in self.categories)}")

    @property
    def products(self) -> tuple[DemoProduct, ...]:
        return tuple(p for c in self.categories for p in c.products)

    @property
    def page_count(self) -> int:
        """Number of listing pages over all categories (38)."""
        return sum(c.page_count for c in self.categories)


#: The days ``SCRAPE_DEMO_DATE`` may name: the catalogue looks 400 days back for a category's
#: last change (year 1 has no such days), and a day after the last is still a date.
FIRST_DAY, LAST_DAY = datetime.date(2000, 1, 1), datetime.date(9998, 12, 31)


def resolve_day(day: datetime.date | None = None) -> datetime.date:
    """``day`` if given, else ``$SCRAPE_DEMO_DATE`` (``YYYY-MM-DD``), else today's UTC date.

    Raises:
        ValueError: ``SCRAPE_DEMO_DATE`` is set but is not a ``YYYY-MM-DD`` date from
            :data:`FIRST_DAY` to :data:`LAST_DAY`.
    """
    if day is not None:
        return day
    raw = os.environ.get(DATE_ENV_VAR, "").strip()
    if not raw:
        return datetime.datetime.now(datetime.timezone.utc).date()
    if not re.fullmatch(r"\d{4}-\d{2}-\d{2}", raw):
        raise ValueError(f"{DATE_ENV_VAR}={raw!r} is invalid: expected a date as YYYY-MM-DD, e.g. 2024-05-01")
    try:
        day = datetime.date.fromisoformat(raw)
    except ValueError as exc:
        raise ValueError(f"{DATE_ENV_VAR}={raw!r} is invalid: expected a date as YYYY-MM-DD ({exc})") from None
    if not FIRST_DAY <= day <= LAST_DAY:
        raise ValueError(f"{DATE_ENV_VAR}={raw!r} is invalid: expected a date from {FIRST_DAY} to {LAST_DAY}")
    return day


def _title(product_id: int) -> str:
    words = {f"{k}{i}": pool[_draw("word", product_id, k, i) % len(pool)]
             for k, pool in (("a", _ADJECTIVES), ("n", _NOUNS)) for i in ("", "2", "3", "4")}
    words.update(name=_NAMES[_draw("name", product_id) % len(_NAMES)], k=1 + _draw("k", product_id) % 9)
    return _TITLE_PATTERNS[_draw("pattern", product_id) % len(_TITLE_PATTERNS)].format(**words)


def _price(product_id: int, epoch: datetime.date) -> Decimal:
    base_pence = 600 + _draw("base", product_id) % 4601  # £6.00..£52.00, fixed per product
    factor_bp = 8500 + _draw("day", product_id, epoch.isoformat()) % 3001  # 0.85..1.15, per price epoch
    return Decimal((base_pence * factor_bp + 5000) // 10000).scaleb(-2)  # exact pence, e.g. 20.60


#: How many categories change their prices each day (the rest keep yesterday's pages).
CHANGED_PER_DAY = 2
_LOOK_BACK_DAYS = 400


@functools.lru_cache(maxsize=1024)
def changed_categories(day: datetime.date) -> frozenset[str]:
    """The :data:`CHANGED_PER_DAY` categories whose prices change on ``day`` (seeded by the date)."""
    keys = sorted((row[0] for row in CATEGORY_TABLE), key=lambda key: _draw("changes", key, day.isoformat()))
    return frozenset(keys[:CHANGED_PER_DAY])


@functools.lru_cache(maxsize=4096)
def price_epoch(key: str, day: datetime.date) -> datetime.date:
    """The last day on or before ``day`` when category ``key`` changed (its pages' Last-Modified)."""
    for back in range(_LOOK_BACK_DAYS):
        candidate = day - datetime.timedelta(days=back)
        if key in changed_categories(candidate):
            return candidate
    return day - datetime.timedelta(days=_LOOK_BACK_DAYS)


@functools.cache
def _assignment() -> tuple[tuple[int, ...], ...]:
    """Product ids per category (CATEGORY_TABLE order), newest (highest id) first."""
    ids = sorted(range(1, sum(row[3] for row in CATEGORY_TABLE) + 1), key=lambda i: _draw("category", i))
    groups, start = [], 0
    for *_, size in CATEGORY_TABLE:
        groups.append(tuple(sorted(ids[start : start + size], reverse=True)))
        start += size
    return tuple(groups)


@functools.lru_cache(maxsize=64)
def _catalogue(day: datetime.date) -> DemoCatalogue:
    categories = []
    for (key, number, name, _), ids in zip(CATEGORY_TABLE, _assignment()):
        epoch = price_epoch(key, day)
        products = tuple(
            DemoProduct(i, title, slugify(title), 1 + _draw("rating", i) % 5, _price(i, epoch))
            for i, title in ((i, _title(i)) for i in ids)
        )
        categories.append(DemoCategory(key, number, name, products))
    return DemoCatalogue(day, tuple(categories))


def catalogue(day: datetime.date | None = None) -> DemoCatalogue:
    """The generated catalogue on ``day`` (resolved by :func:`resolve_day`): what the pages show."""
    return _catalogue(resolve_day(day))


@dataclass(frozen=True)
class DemoResponse:
    """One HTTP response: ``headers`` use canonical capitalisation; ``body`` is empty for HEAD and 304."""

    status: int
    headers: dict[str, str]
    body: bytes


#: A ``Host`` header the sitemap's URLs may be built on: a name or IP literal, an optional port.
_HOST = re.compile(r"(?:[A-Za-z0-9.-]{1,253}|\[[0-9A-Fa-f:.]{2,45}\])(?::\d{1,5})?")
_LISTING = re.compile(r"/catalogue/category/books/([a-z0-9-]+)_(\d+)/(?:index|page-([1-9]\d*))\.html")


def _route(path: str) -> tuple[str, str, int] | None:
    """``(kind, category key, page)`` for a served path, else None."""
    if path in ("/", "/index.html"):
        return ("home", "", 0)
    if path == "/robots.txt":
        return ("robots", "", 0)
    if path == "/sitemap.xml":
        return ("sitemap", "", 0)
    match = _LISTING.fullmatch(path)
    if match is None:
        return None
    for key, number, _, size in CATEGORY_TABLE:
        if key == match[1] and str(number) == match[2]:
            page = int(match[3] or 1)
            return ("listing", key, page) if page <= max(1, math.ceil(size / PAGE_SIZE)) else None
    return None


@functools.lru_cache(maxsize=512)
def _render(route: tuple[str, str, int], day: datetime.date) -> tuple[bytes, str, str]:
    """``(body, content type, ETag)`` of a served route on ``day``; cached (about 40 pages a day)."""
    kind, key, page = route
    if kind == "robots":
        body, content_type = demo_markup.ROBOTS_TXT.encode(), "text/plain; charset=utf-8"
    else:
        cat = _catalogue(day)
        text = demo_markup.home_page(cat) if kind == "home" else demo_markup.listing_page(cat, cat.category(key), page)
        body, content_type = text.encode("utf-8"), "text/html; charset=utf-8"
    return body, content_type, strong_etag(body)


def strong_etag(body: bytes) -> str:
    """The demo's strong ``ETag`` for ``body`` (RFC 9110 §8.8.3): a quoted hash of the bytes."""
    return '"' + hashlib.sha256(body).hexdigest()[:32] + '"'


def midnight_utc(day: datetime.date) -> datetime.datetime:
    """Midnight UTC starting ``day``: when a demo page changed (``Last-Modified``, ``lastmod``)."""
    return datetime.datetime.combine(day, datetime.time(), datetime.timezone.utc)


@functools.lru_cache(maxsize=64)
def _render_sitemap(day: datetime.date, origin: str) -> tuple[bytes, str, str]:
    """``(body, content type, ETag)`` of ``sitemap.xml`` on ``day`` with URLs on ``origin`` (``http://host[:port]/``)."""
    from scrape_assets.sitemap import render_urlset  # only the sitemap needs it

    cat = _catalogue(day)
    body = render_urlset(
        (origin + c.page_path(page), midnight_utc(price_epoch(c.key, day)))
        for c in cat.categories for page in range(1, c.page_count + 1)
    )
    return body, "application/xml", strong_etag(body)


def etag_matches(if_none_match: str, etag: str) -> bool:
    """RFC 9110 §13.1.2: weak comparison against a list of entity tags, or ``*``."""
    if if_none_match.strip() == "*":
        return True
    return any(tag.strip().removeprefix("W/") == etag for tag in if_none_match.split(","))


def _not_modified_since(if_modified_since: str, last_modified: datetime.datetime) -> bool:
    try:
        since = parsedate_to_datetime(if_modified_since)
    except (TypeError, ValueError, IndexError, OverflowError):
        return False  # RFC 9110 §13.1.3: an invalid date is ignored
    return last_modified <= (since if since.tzinfo else since.replace(tzinfo=datetime.timezone.utc))


def respond(
    method: str, target: str, headers: Mapping[str, str] | None = None, *, day: datetime.date | None = None
) -> DemoResponse:
    """Answer one request to the demo catalogue.

    Args:
        method: HTTP method; GET and HEAD are served, anything else gets 405.
        target: request path with optional query, e.g. ``"/catalogue/category/books/travel_2/index.html"``.
        headers: request headers (any case); ``If-None-Match`` and ``If-Modified-Since`` are honoured,
            If-None-Match taking precedence (RFC 9110 §13.2.2).
        day: the catalogue's day; see :func:`resolve_day`.

    Returns:
        200 with body, ``ETag``, ``Last-Modified``, ``Content-Type`` and ``Content-Length``; 304 with
        ``ETag`` and ``Last-Modified`` only; 404 (unknown path or page beyond the last) or 405 with a
        small HTML body. HEAD gets the GET headers and an empty body.

    Raises:
        ValueError: ``day`` is None and ``SCRAPE_DEMO_DATE`` is malformed.
    """
    method = method.upper()
    path = target.split("#", 1)[0].split("?", 1)[0]
    route = _route(path)
    if method not in ("GET", "HEAD"):
        message = f"{method} is not supported; use GET or HEAD."
        return _error(405, "Method Not Allowed", message, method, {"Allow": "GET, HEAD"})
    if route is None:
        return _error(404, "Not Found", f"{path} is not a page of the demo catalogue.", method)
    resolved = resolve_day(day)
    lower = {k.lower(): v for k, v in (headers or {}).items()}
    if route[0] == "sitemap":
        host = lower.get("host", "")
        if not _HOST.fullmatch(host):  # absent or not a host[:port]: the demo's own name
            host = urlsplit(DEMO_BASE_URL).netloc
        body, content_type, etag = _render_sitemap(resolved, f"http://{host}/")
    else:
        body, content_type, etag = _render(route, resolved)
    changed = price_epoch(route[1], resolved) if route[0] == "listing" else resolved
    midnight = midnight_utc(changed)
    validators = {"ETag": etag, "Last-Modified": format_datetime(midnight, usegmt=True)}
    if "if-none-match" in lower:
        not_modified = etag_matches(lower["if-none-match"], etag)
    else:
        not_modified = "if-modified-since" in lower and _not_modified_since(lower["if-modified-since"], midnight)
    if not_modified:
        return DemoResponse(304, validators, b"")
    return _full(200, body, content_type, method, validators)


def _full(status: int, body: bytes, content_type: str, method: str, extra: dict[str, str]) -> DemoResponse:
    headers = {"Content-Type": content_type, "Content-Length": str(len(body)), **extra}
    return DemoResponse(status, headers, b"" if method == "HEAD" else body)


def _error(status: int, reason: str, message: str, method: str, extra: dict[str, str] | None = None) -> DemoResponse:
    body = demo_markup.error_page(f"{status} {reason}", message).encode("utf-8")
    return _full(status, body, "text/html; charset=utf-8", method, extra or {})


class DemoTransport(httpx.AsyncBaseTransport, httpx.BaseTransport):
    """In-process httpx transport answering every request with :func:`respond` (no sockets).

    Mount it for ``DEMO_BASE_URL``: ``httpx.Client(mounts={DEMO_BASE_URL: DemoTransport()})``,
    or pass ``transport=DemoTransport()``. The request's host is not checked.

    Args:
        day: fixed catalogue day; None resolves per request (see :func:`resolve_day`).
    """

    def __init__(self, day: datetime.date | None = None):
        self.day = day

    def _answer(self, request: httpx.Request) -> httpx.Response:
        answer = respond(request.method, request.url.raw_path.decode("ascii"), request.headers, day=self.day)
        return httpx.Response(answer.status, headers=answer.headers, content=answer.body)

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        request.read()
        return self._answer(request)

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        await request.aread()
        return self._answer(request)


class LoggedRequest(NamedTuple):
    """One request seen by :class:`DemoServer`: ``at_s`` is ``time.monotonic()`` on arrival,
    ``status`` the HTTP status answered (``None`` where the server does not record it: the
    fault-injecting server logs a request before deciding its fault)."""

    at_s: float
    method: str
    path: str
    headers: dict[str, str]
    status: int | None = None


class DemoRequestHandler(BaseHTTPRequestHandler):
    """Serves :func:`respond` over HTTP/1.1 keep-alive. Override :meth:`send_demo_response` or
    :meth:`write_body` to inject faults (resets, trickled bytes, wrong Content-Length)."""

    server: DemoServer
    protocol_version = "HTTP/1.1"
    server_version = "scrape-assets-demo/1"
    timeout = 30  # seconds an idle keep-alive connection is kept
    disable_nagle_algorithm = True  # headers and body are separate writes: avoid a 40 ms delayed-ACK stall

    def drain_request_body(self) -> bool:
        """Read (and discard) the request body; False after answering 400 to a bad Content-Length."""
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            self.send_error(400, "bad Content-Length")
            return False
        if length > 0:
            self.rfile.read(length)
        return True

    def handle_demo(self) -> None:
        if not self.drain_request_body():
            return
        response = respond(self.command, self.path, self.headers, day=self.server.day)
        self.server.record(self.command, self.path, self.headers, status=response.status)
        self.send_demo_response(response)

    do_GET = do_HEAD = do_POST = do_PUT = do_PATCH = do_DELETE = do_OPTIONS = handle_demo

    def send_demo_response(self, response: DemoResponse) -> None:
        """Write the status line and headers of ``response``, then its body."""
        self.send_response(response.status)
        for name, value in response.headers.items():
            self.send_header(name, value)
        self.end_headers()
        self.write_body(response.body)

    def write_body(self, body: bytes) -> None:
        if body:
            self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - silence stderr
        pass


class DemoServer(ThreadingHTTPServer):
    """The demo catalogue on a real socket (daemon threads), logging every request it answers.

    Attributes:
        day: fixed catalogue day, or None to resolve per request.
        access_log: where to print one line per request answered (``scrape-assets serve-demo``
            sets stdout); None (the default, as in tests) prints nothing.
    """

    daemon_threads = True
    logged_headers = ("user-agent", "if-none-match", "if-modified-since", "accept-encoding", "range")
    access_log: TextIO | None = None

    def __init__(
        self,
        address: tuple[str, int],
        handler: type[BaseHTTPRequestHandler] = DemoRequestHandler,
        *,
        day: datetime.date | None = None,
    ):
        self.day = day
        self._lock = threading.Lock()
        self._requests: list[LoggedRequest] = []
        super().__init__(address, handler)

    def server_bind(self) -> None:
        TCPServer.server_bind(self)  # skip HTTPServer's reverse DNS lookup (socket.getfqdn)
        self.server_name, self.server_port = self.server_address[:2]

    @property
    def base_url(self) -> str:
        """``"http://HOST:PORT/"`` with the bound port (useful when created with port 0)."""
        return f"http://{self.server_address[0]}:{self.server_address[1]}/"

    def record(self, method: str, path: str, headers: Mapping[str, str], *, status: int | None = None) -> None:
        """Log one request (its :attr:`logged_headers`) and the status answered to it."""
        selected = {name: headers[name] for name in self.logged_headers if headers.get(name) is not None}
        with self._lock:
            self._requests.append(LoggedRequest(time.monotonic(), method, path, selected, status))
        self.log_access(method, path, status, headers)

    def log_access(self, method: str, path: str, status: int | None, headers: Mapping[str, str], note: str = "") -> None:
        """Print ``HH:MM:SS METHOD PATH STATUS`` to :attr:`access_log` (if set), with the
        conditional header the request carried and ``note``; ``-`` for no status sent."""
        if self.access_log is None:
            return
        conditional = next((name for name in ("If-None-Match", "If-Modified-Since") if headers.get(name)), None)
        line = (f"{datetime.datetime.now(datetime.timezone.utc):%H:%M:%S} {method} {path} "
                f"{status if status is not None else '-'}" + (f" ({conditional})" if conditional else "") + note)
        with self._lock:
            print(line, file=self.access_log, flush=True)

    @property
    def requests(self) -> list[LoggedRequest]:
        """A snapshot (copy) of the request log, oldest first."""
        with self._lock:
            return list(self._requests)

    def request_count(self, path: str | None = None) -> int:
        """Requests received for ``path`` (e.g. ``"/robots.txt"``), or in total when None."""
        return sum(1 for r in self.requests if path is None or r.path == path)

    def clear_requests(self) -> None:
        with self._lock:
            self._requests.clear()

    def handle_error(self, request, client_address) -> None:
        if not isinstance(sys.exc_info()[1], ConnectionError):  # clients hanging up are normal
            super().handle_error(request, client_address)


def make_server(host: str = "127.0.0.1", port: int = 0, *, day: datetime.date | None = None) -> DemoServer:
    """Bind a :class:`DemoServer` on ``host:port`` (0 picks a free port); call ``serve_forever()`` on it.

    Raises:
        OSError: the address cannot be bound (port in use, unknown host).
    """
    return DemoServer((host, port), day=day)


def serve_forever(host: str, port: int, *, server: DemoServer | None = None, note: str = "") -> None:
    """Serve the demo catalogue until Ctrl-C, after printing where and how big it is.

    Args:
        server: an already bound server (e.g. a faulty one); default: :func:`make_server`.
        note: appended to the printed line (e.g. which faults are injected).

    Raises:
        OSError: the address cannot be bound.
        ValueError: ``SCRAPE_DEMO_DATE`` is malformed.
    """
    server = server or make_server(host, port)
    day = resolve_day(server.day)
    cat = catalogue(day)
    if server.day is not None:
        source = "fixed"
    elif os.environ.get(DATE_ENV_VAR, "").strip():
        source = DATE_ENV_VAR
    else:
        source = "today in UTC, following the date"
    print(f"demo catalogue on {server.base_url} ({len(cat.categories)} categories, {cat.page_count} pages; "
          f"day {day.isoformat()}, {source}){note}; one line per request below, Ctrl-C stops", flush=True)
    server.access_log = sys.stdout
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
