"""A large demo catalogue for the benchmarks, served over real sockets from its own process.

The markup is the demo's (:func:`scrape_assets.demo_markup.listing_page` on a synthetic
:class:`~scrape_assets.demo_site.DemoCatalogue`), so the pipeline's shipped selectors and our
Scrapy spider read it exactly as they read the demo. Only the size differs:

* ``--categories C --pages P``: C categories of P listing pages, 20 products a page, product ids
  unique across the catalogue (1,000 pages = 20 x 50, 10,000 pages = 100 x 100 in ``run.py``).
* Every page is rendered once at start-up and kept as bytes (about 41 KB each, ~410 MB for
  10,000 pages), so serving one costs a dict lookup and a socket write: the server's ceiling
  is measured by ``benchmarks/fast_client.py`` in the same run.
* The sidebar lists at most :data:`SIDEBAR_CATEGORIES` categories (the current one and its
  neighbours) so a page weighs the same in both sizes (~41 KB; books.toscrape.com's weigh ~51 KB).
* Conditional GET: strong ``ETag`` (hash of the body) and ``Last-Modified``;
  ``If-None-Match`` (else ``If-Modified-Since``) answers 304, as the demo does.
* ``/sitemap.xml`` (sitemaps.org 0.9) lists every listing page with its ``Last-Modified``
  as ``lastmod`` (in the current variant), its URLs on the host the request named, for the
  spec opt-in ``incremental: {revalidate: sitemap}``.
* Change sets for the incremental scenario: ``GET /_bench/variant/changed10`` switches to a
  catalogue where every 10th category (10 %) has new prices (new bytes, new ETag, and a
  Last-Modified and ``lastmod`` of the moment of the switch); ``/_bench/variant/base``
  switches back (to the base pages' old dates: a crawler trusting the sitemap then sees the
  revert only through page 1). ``GET /_bench/stats`` returns the
  counters as JSON (requests, 200s, 304s, bytes) and ``/_bench/reset`` zeroes them. The
  ``/_bench/`` paths are for the harness only (robots.txt disallows them).

The server is the demo's :class:`~scrape_assets.demo_site.DemoServer` (threaded, HTTP/1.1
keep-alive) with a handler answering from the pre-rendered pages instead of
:func:`scrape_assets.demo_site.respond`.

Run: ``python -m benchmarks.large_site --categories 20 --pages 50 --port 0 --ready-file F``
writes ``{"base_url": ..., "pages": ..., "bytes": ...}`` to F once it serves, then serves until
SIGTERM.
"""

from __future__ import annotations

import argparse
import datetime
import json
import random
import signal
import sys
import threading
from decimal import Decimal
from email.utils import format_datetime, parsedate_to_datetime
from pathlib import Path

from scrape_assets import demo_markup
from scrape_assets.demo_site import (
    DemoCatalogue,
    DemoCategory,
    DemoProduct,
    DemoRequestHandler,
    DemoResponse,
    DemoServer,
    midnight_utc,
    slugify,
    strong_etag,
)
from scrape_assets.sitemap import render_urlset

PRODUCTS_PER_PAGE = 20
SIDEBAR_CATEGORIES = 20
#: In the ``changed10`` variant, categories whose index is a multiple of this change (10 %).
CHANGED_EVERY = 10
BASE_DAY = datetime.date(2026, 1, 1)
CHANGED_DAY = datetime.date(2026, 1, 2)
ROBOTS_TXT = demo_markup.ROBOTS_RULES + "Disallow: /_bench/\n"  # no Sitemap: line: the spec's default sitemap.xml

# Same flavour as the demo: mostly ASCII, about one word in twenty with an accent.
_ADJECTIVES = ("Silent", "Crimson", "Hidden", "Last", "Broken", "Golden", "Midnight", "Wandering", "Forgotten",
               "Quiet", "Secret", "Burning", "Paper", "Glass", "Northern", "Naïve", "Little", "Endless", "Velvet")
_NOUNS = ("Harbour", "Garden", "Letters", "River", "Kingdom", "Lantern", "Orchard", "Winter", "Atlas", "Compass",
          "Island", "Mirror", "Clockmaker", "Café", "Lighthouse", "Archive", "Meridian", "Sparrow", "Empire", "Storm")
_PATTERNS = ("The {a} {n}", "{n} of the {a2} {n2}", "{a} {n}", "A {a} {n}: {n2} in the {a2} {n3}",
             "The {n} and the {n2} (The {a} {n3} #{k})")


def category_key(index: int) -> str:
    """Partition key of category ``index`` (0-based): ``cat-000``, ``cat-001``..."""
    return f"cat-{index:03d}"


def build_catalogue(categories: int, pages: int, *, changed: bool = False) -> DemoCatalogue:
    """The synthetic catalogue: ``categories`` x ``pages`` listing pages of 20 products.

    Titles and ratings are fixed by the seed; prices too, except in the ``changed`` variant,
    where categories ``0, 10, 20, ...`` carry new prices.
    """
    rng = random.Random(f"scrape-assets-bench-{categories}x{pages}")
    cats = []
    product_id = 0
    for c in range(categories):
        new_prices = changed and c % CHANGED_EVERY == 0
        products = []
        for _ in range(pages * PRODUCTS_PER_PAGE):
            product_id += 1
            words = {f"{k}{i}": rng.choice(pool) for k, pool in (("a", _ADJECTIVES), ("n", _NOUNS)) for i in ("", "2", "3")}
            title = rng.choice(_PATTERNS).format(k=rng.randint(1, 9), **words)
            base_pence = rng.randint(600, 5200)
            rating = rng.randint(1, 5)
            pence = base_pence + (137 if new_prices else 0)
            price = Decimal(pence).scaleb(-2)
            products.append(DemoProduct(product_id, title, slugify(title), rating, price))
        cats.append(DemoCategory(category_key(c), c + 1, f"Category {c:03d}", tuple(products)))
    return DemoCatalogue(BASE_DAY, tuple(cats))


def _sidebar_catalogue(catalogue: DemoCatalogue, index: int) -> DemoCatalogue:
    """A catalogue view holding at most SIDEBAR_CATEGORIES categories around ``index`` (for the sidebar)."""
    cats = catalogue.categories
    start = max(0, min(index - SIDEBAR_CATEGORIES // 2, len(cats) - SIDEBAR_CATEGORIES))
    return DemoCatalogue(catalogue.day, cats[start : start + SIDEBAR_CATEGORIES])


class Page:
    __slots__ = ("body", "etag", "last_modified", "modified_at")

    def __init__(self, body: bytes, modified_at: datetime.datetime):
        self.body = body
        self.etag = strong_etag(body)
        self.stamp(modified_at)

    def stamp(self, modified_at: datetime.datetime) -> None:
        """Set when the page last changed (``Last-Modified`` and the sitemap's ``lastmod``)."""
        self.modified_at = modified_at
        self.last_modified = format_datetime(modified_at, usegmt=True)


def render_pages(catalogue: DemoCatalogue, day: datetime.date, only: set[int] | None = None) -> dict[str, Page]:
    """Path -> pre-rendered page, for every listing page (of the categories ``only``, if given)."""
    out: dict[str, Page] = {}
    modified = midnight_utc(day)
    for index, category in enumerate(catalogue.categories):
        if only is not None and index not in only:
            continue
        sidebar = _sidebar_catalogue(catalogue, index)
        for page in range(1, category.page_count + 1):
            body = demo_markup.listing_page(sidebar, category, page).encode("utf-8")
            page_obj = Page(body, modified)
            out["/" + category.page_path(page)] = page_obj
            if page == 1:
                out["/" + category.page_path(1).replace("index.html", "page-1.html")] = page_obj
    return out


class LargeSite:
    """The pre-rendered catalogue, its variants and request counters (thread-safe)."""

    def __init__(self, categories: int, pages: int):
        self.categories, self.pages = categories, pages
        base = build_catalogue(categories, pages)
        changed = build_catalogue(categories, pages, changed=True)
        self.base = render_pages(base, BASE_DAY)
        changed_indexes = {i for i in range(categories) if i % CHANGED_EVERY == 0}
        self._changed_only = render_pages(changed, CHANGED_DAY, only=changed_indexes)
        self.changed = {**self.base, **self._changed_only}
        self.catalogue = base
        self.variant = "base"
        self._lock = threading.Lock()
        self.stats = {"requests": 0, "status_200": 0, "status_304": 0, "status_other": 0, "bytes_sent": 0,
                      "robots": 0}
        self.robots = Page(ROBOTS_TXT.encode(), midnight_utc(BASE_DAY))
        self._sitemaps: dict[tuple[str, str], Page] = {}  # (variant, host) -> sitemap.xml

    def sitemap(self, host: str) -> Page:
        """``sitemap.xml`` of the current variant with URLs on ``host`` (rendered once per pair)."""
        key = (self.variant, host)
        with self._lock:
            page = self._sitemaps.get(key)
        if page is None:
            pages = self.changed if self.variant == "changed10" else self.base
            listed = {path: page for path, page in pages.items() if not path.endswith("/page-1.html")}  # (an alias)
            body = render_urlset((f"http://{host}{path}", page.modified_at) for path, page in listed.items())
            page = Page(body, max(p.modified_at for p in listed.values()))
            with self._lock:
                self._sitemaps[key] = page
        return page

    @property
    def listing_pages(self) -> int:
        return self.categories * self.pages

    def _count(self, status: int, size: int, robots: bool = False) -> None:
        with self._lock:
            self.stats["requests"] += 1
            key = f"status_{status}" if status in (200, 304) else "status_other"
            self.stats[key] += 1
            self.stats["bytes_sent"] += size
            self.stats["robots"] += robots

    def control(self, path: str) -> DemoResponse:
        action = path.removeprefix("/_bench/")
        if action.startswith("variant/") and action[8:] in ("base", "changed10"):
            if action[8:] == "changed10" and self.variant != "changed10":
                # The change happens now, as on a real site: its Last-Modified (and lastmod) say
                # so, later than any copy a crawler saved before.
                now = datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0)
                for page in self._changed_only.values():
                    page.stamp(now)
                with self._lock:
                    self._sitemaps.clear()
            self.variant = action[8:]
        elif action == "reset":
            with self._lock:
                self.stats = dict.fromkeys(self.stats, 0)
        elif action != "stats":
            return DemoResponse(404, {"Content-Length": "0"}, b"")
        with self._lock:
            body = json.dumps({**self.stats, "variant": self.variant}).encode()
        return DemoResponse(200, {"Content-Type": "application/json", "Content-Length": str(len(body))}, body)

    def respond(self, method: str, target: str, headers) -> DemoResponse:
        path = target.split("?", 1)[0]
        if path.startswith("/_bench/"):
            return self.control(path)
        if path == "/robots.txt":
            page = self.robots
        elif path == "/sitemap.xml":
            page = self.sitemap(headers.get("Host") or "localhost")
        else:
            page = (self.changed if self.variant == "changed10" else self.base).get(path)
        if page is None or method not in ("GET", "HEAD"):
            body = demo_markup.error_page("404 Not Found", f"{path} is not a page").encode()
            self._count(404, len(body))
            return DemoResponse(404, {"Content-Type": "text/html; charset=utf-8", "Content-Length": str(len(body))}, body)
        validators = {"ETag": page.etag, "Last-Modified": page.last_modified}
        if_none_match, if_modified_since = headers.get("If-None-Match"), headers.get("If-Modified-Since")
        if if_none_match is not None:
            not_modified = any(t.strip().removeprefix("W/") == page.etag for t in if_none_match.split(",")) or if_none_match.strip() == "*"
        elif if_modified_since is not None:
            try:
                since = parsedate_to_datetime(if_modified_since)
                not_modified = page.modified_at <= (since if since.tzinfo else since.replace(tzinfo=datetime.timezone.utc))
            except (TypeError, ValueError):
                not_modified = False
        else:
            not_modified = False
        if not_modified:
            self._count(304, 0)
            return DemoResponse(304, validators, b"")
        content_type = ("text/plain; charset=utf-8" if page is self.robots
                        else "application/xml" if path == "/sitemap.xml" else "text/html; charset=utf-8")
        self._count(200, len(page.body), robots=page is self.robots)
        return DemoResponse(
            200, {"Content-Type": content_type, "Content-Length": str(len(page.body)), **validators},
            b"" if method == "HEAD" else page.body,
        )


class LargeSiteHandler(DemoRequestHandler):
    """The demo's keep-alive handler, answering from :class:`LargeSite` instead of ``demo_site.respond``."""

    def handle_demo(self) -> None:
        self.send_demo_response(self.server.site.respond(self.command, self.path, self.headers))

    do_GET = do_HEAD = do_POST = handle_demo


class LargeSiteServer(DemoServer):
    """:class:`DemoServer` without its per-request log (counters live in :class:`LargeSite`)."""

    request_queue_size = 256

    def __init__(self, address: tuple[str, int], site: LargeSite):
        self.site = site
        super().__init__(address, LargeSiteHandler)

    def record(self, method, path, headers) -> None:  # the log of every request is not needed here
        pass


def spec_yaml(base_url: str, categories: int, *, max_concurrency: int = 16, max_pages: int = 1000) -> str:
    """A site spec for the large catalogue: the demo's selectors, one partition per category."""
    demo_spec = (Path(__file__).resolve().parent.parent / "scrape_assets" / "sites" / "demo.yaml").read_text("utf-8")
    head, _, _ = demo_spec.partition("categories:")
    head = head.replace("name: demo", "name: bench").replace("http://demo.scrape-assets.invalid/", base_url)
    head = head.replace("requests_per_second: 50.0", "requests_per_second: 10000.0")
    head = head.replace("max_concurrency: 4", f"max_concurrency: {max_concurrency}")
    head = head.replace("pagination:\n", f"pagination:\n  max_pages: {max_pages}\n", 1)
    lines = [f"  {category_key(i)}: catalogue/category/books/{category_key(i)}_{i + 1}/index.html" for i in range(categories)]
    return head + "categories:\n" + "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--categories", type=int, required=True)
    parser.add_argument("--pages", type=int, required=True, help="listing pages per category")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--ready-file", type=Path, help="write base_url and sizes here (JSON) once serving")
    args = parser.parse_args(argv)
    site = LargeSite(args.categories, args.pages)
    server = LargeSiteServer((args.host, args.port), site)
    sizes = [len(p.body) for path, p in site.base.items() if not path.endswith("/page-1.html")]
    info = {"base_url": server.base_url, "pages": len(sizes), "bytes": sum(sizes),
            "mean_page_bytes": round(sum(sizes) / len(sizes)), "categories": args.categories}
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=server.shutdown, daemon=True).start())
    if args.ready_file:
        tmp = args.ready_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(info))
        tmp.rename(args.ready_file)
    print(json.dumps(info), flush=True)
    try:
        server.serve_forever(poll_interval=0.5)
    finally:
        server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
