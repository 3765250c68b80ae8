"""A site's XML sitemap as a change feed: which listing pages changed since they were saved.

Format: the sitemaps.org protocol 0.9 (https://www.sitemaps.org/protocol.html), namespace
``http://www.sitemaps.org/schemas/sitemap/0.9``: a ``<urlset>`` of ``<url>`` entries, each
with a ``<loc>`` (absolute URL) and an optional ``<lastmod>`` (W3C Datetime: ``YYYY-MM-DD``
or ``YYYY-MM-DDThh:mm[:ss[.s]]TZD``), or a ``<sitemapindex>`` listing ``<sitemap><loc>``
child sitemaps, which are read in turn (one level, as the protocol allows). A gzip-compressed
sitemap (``sitemap.xml.gz``) is decompressed. Parsed with ``defusedxml`` (no DTD, no entity
expansion: a hostile sitemap cannot blow up memory).

Used by ``incremental.revalidate: sitemap`` (see :class:`~scrape_assets.spec.Incremental`):
a saved page is taken as unchanged, without a request, when the sitemap lists its URL with a
``lastmod`` no later than the page's saved ``Last-Modified`` (or, without one, than when it
was fetched). A page not listed, or listed without ``lastmod``, is revalidated as usual.

Limits: a ``lastmod`` is the site's claim; a site that changes pages without moving it is
caught only through page 1 of each category, which is always revalidated (see
:meth:`~scrape_assets.crawl.PartitionCrawler`). A date-only ``lastmod`` counts as the end of
that day (UTC), so a page changed on the day it was fetched is asked again. Entries on
another origin than the sitemap's or the site's are ignored; at most
:data:`MAX_CHILD_SITEMAPS` children of an index are read (pages of the others are
revalidated).
"""

from __future__ import annotations

import datetime
import re
import zlib
from collections.abc import Iterable
from dataclasses import dataclass, field
from email.utils import parsedate_to_datetime
from urllib.parse import urljoin, urlsplit
from xml.etree.ElementTree import Element, ParseError
from xml.sax.saxutils import escape

import defusedxml.ElementTree as SafeET
from defusedxml import DefusedXmlException

from scrape_assets.errors import FetchError

_NS = "{http://www.sitemaps.org/schemas/sitemap/0.9}"
#: Children of a sitemap index read at most (sitemaps.org allows 50,000; each is one request).
MAX_CHILD_SITEMAPS = 100
#: Largest decompressed sitemap, bytes (the protocol's limit is 50 MB uncompressed).
MAX_SITEMAP_BYTES = 50 * 1024 * 1024

_W3C = re.compile(
    r"(\d{4})(?:-(\d{2})(?:-(\d{2})(?:T(\d{2}):(\d{2})(?::(\d{2})(?:\.\d+)?)?(Z|[+-]\d{2}:\d{2})?)?)?)?"
)


class SitemapError(Exception):
    """A sitemap that cannot be used: unreachable, not XML, not a sitemap.

    Attributes:
        url: the sitemap's URL.
        reason: what was wrong, e.g. ``"http_404"``, ``"not XML: ..."``.
    """

    def __init__(self, url: str, reason: str):
        super().__init__(f"sitemap {url}: {reason}")
        self.url = url
        self.reason = reason


def parse_lastmod(text: str) -> datetime.datetime | None:
    """A W3C Datetime (https://www.w3.org/TR/NOTE-datetime) as the latest instant it may mean, UTC.

    ``2026-12-02`` -> 2026-12-03T00:00Z (end of that day); ``2026-12`` -> 2027-01-01T00:00Z;
    ``2026-12-02T10:30:00+01:00`` -> 2026-12-02T09:30:00Z (a time without a zone: UTC).
    Returns None for text that is not such a date (the entry then counts as undated).
    """
    match = _W3C.fullmatch(text.strip())
    if match is None:
        return None
    year, month, day, hour, minute, second, zone = match.groups()
    try:
        if day is None:
            start = datetime.datetime(int(year), int(month or 1), 1, tzinfo=datetime.timezone.utc)
            if month is None:
                return start.replace(year=start.year + 1)
            return (start + datetime.timedelta(days=32)).replace(day=1)
        date = datetime.datetime(int(year), int(month), int(day), tzinfo=datetime.timezone.utc)
        if hour is None:
            return date + datetime.timedelta(days=1)
        offset = datetime.timedelta()
        if zone and zone != "Z":
            sign = 1 if zone[0] == "+" else -1
            offset = sign * datetime.timedelta(hours=int(zone[1:3]), minutes=int(zone[4:6]))
        moment = date.replace(hour=int(hour), minute=int(minute), second=int(second or 0))
        # A fraction of a second is dropped: the entry is compared with whole-second HTTP dates,
        # so its end of second is the latest it may mean.
        return moment - offset + (datetime.timedelta(seconds=1) if "." in text else datetime.timedelta())
    except ValueError:  # month 13, day 31 of a short month, hour 25
        return None


def saved_at(last_modified: str | None, fetched_at: str | None) -> datetime.datetime | None:
    """When a saved page was last known current: its ``Last-Modified`` (RFC 9110 §8.8.2, the
    site's clock), else when it was fetched (ISO 8601, ours); None when neither parses."""
    if last_modified:
        try:
            moment = parsedate_to_datetime(last_modified)
            return moment if moment.tzinfo else moment.replace(tzinfo=datetime.timezone.utc)
        except (TypeError, ValueError):
            pass
    if fetched_at:
        try:
            moment = datetime.datetime.fromisoformat(fetched_at)
            return moment if moment.tzinfo else moment.replace(tzinfo=datetime.timezone.utc)
        except ValueError:
            pass
    return None


def _key(url: str) -> tuple[str, str]:
    parts = urlsplit(url)
    return parts.netloc.lower(), (parts.path or "/") + (f"?{parts.query}" if parts.query else "")


@dataclass
class Sitemap:
    """The ``lastmod`` of every URL a sitemap (and its children) lists.

    Attributes:
        url: the sitemap's URL.
        lastmod: ``path[?query]`` -> latest instant its ``lastmod`` may mean (UTC); URLs listed
            without a (valid) ``lastmod`` are absent.
        urls: ``<url>`` entries read (with and without ``lastmod``).
        requests: sitemap documents fetched (1, plus the children of an index).
        skipped: entries ignored (another origin, no ``<loc>``) and children not read.
    """

    url: str
    lastmod: dict[str, datetime.datetime] = field(default_factory=dict)
    urls: int = 0
    requests: int = 0
    skipped: int = 0

    def unchanged_since(self, url: str, moment: datetime.datetime | None) -> bool:
        """Whether the sitemap says ``url`` has not changed after ``moment`` (its ``lastmod``
        is no later); False when the URL is not listed with a ``lastmod``, or ``moment`` is None."""
        if moment is None:
            return False
        lastmod = self.lastmod.get(_key(url)[1])
        return lastmod is not None and lastmod <= moment

    def add(self, body: bytes, url: str, origins: Iterable[str]) -> list[str]:
        """Read one sitemap document; return the child sitemaps' URLs (for an index).

        Raises:
            SitemapError: not XML, or its root is neither ``urlset`` nor ``sitemapindex``.
        """
        if body[:2] == b"\x1f\x8b":  # gzip magic: a sitemap.xml.gz served as is
            inflate = zlib.decompressobj(16 + zlib.MAX_WBITS)
            try:
                body = inflate.decompress(body, MAX_SITEMAP_BYTES)
            except zlib.error as exc:
                raise SitemapError(url, f"not gzip: {exc}") from None
            if inflate.unconsumed_tail:
                raise SitemapError(url, f"larger than {MAX_SITEMAP_BYTES:,} bytes once decompressed")
        try:
            root: Element = SafeET.fromstring(body)
        except (ParseError, DefusedXmlException) as exc:
            raise SitemapError(url, f"not XML: {exc}") from None
        allowed = {o.lower() for o in origins}
        children = []
        if root.tag == f"{_NS}urlset":
            for entry in root.iterfind(f"{_NS}url"):
                loc = (entry.findtext(f"{_NS}loc") or "").strip()
                host, path = _key(loc)
                if not loc or host not in allowed:
                    self.skipped += 1
                    continue
                self.urls += 1
                lastmod = parse_lastmod(entry.findtext(f"{_NS}lastmod") or "")
                if lastmod is not None:
                    self.lastmod[path] = lastmod
        elif root.tag == f"{_NS}sitemapindex":
            for entry in root.iterfind(f"{_NS}sitemap"):
                loc = (entry.findtext(f"{_NS}loc") or "").strip()
                if loc and _key(loc)[0] in allowed:
                    children.append(urljoin(url, loc))
                else:
                    self.skipped += 1
        else:
            raise SitemapError(url, f"root element {root.tag!r}; expected urlset or sitemapindex ({_NS[1:-1]})")
        return children


async def load_sitemap(fetcher, url: str, *, origins: Iterable[str] = ()) -> Sitemap:
    """Fetch and read the sitemap at ``url`` (and, for an index, up to :data:`MAX_CHILD_SITEMAPS` children).

    Every document goes through ``fetcher`` (a :class:`~scrape_assets.fetcher.PageFetcher`):
    robots.txt, the per-host limits and retries apply as to pages.

    Args:
        fetcher: the run's page fetcher.
        url: absolute URL of the sitemap (or sitemap index).
        origins: ``host[:port]`` whose URLs are accepted besides the sitemap's own (the site's
            base URL when the sitemap is fetched from a mirror).

    Raises:
        SitemapError: the sitemap (or a child) could not be fetched or read; ``reason`` says why.
    """
    sitemap = Sitemap(url=url)
    allowed = {urlsplit(url).netloc, *origins}
    queue, depth = [url], 0
    while queue and depth < 2:  # an index, then its children (the protocol nests no deeper)
        children = []
        for doc_url in queue:
            try:
                page = await fetcher.fetch(doc_url)
            except FetchError as exc:
                raise SitemapError(doc_url, exc.reason + (f" ({exc.detail})" if exc.detail else "")) from None
            sitemap.requests += 1
            children += sitemap.add(page.body, doc_url, allowed)
        if len(children) > MAX_CHILD_SITEMAPS:
            sitemap.skipped += len(children) - MAX_CHILD_SITEMAPS
        queue, depth = children[:MAX_CHILD_SITEMAPS], depth + 1
    sitemap.skipped += len(queue)  # an index listed by an index: not read
    return sitemap


def render_urlset(entries: Iterable[tuple[str, datetime.datetime | None]]) -> bytes:
    """A ``<urlset>`` document for ``(absolute URL, lastmod or None)`` entries (the demo's, the benchmark's)."""
    lines = ['<?xml version="1.0" encoding="UTF-8"?>', f'<urlset xmlns="{_NS[1:-1]}">']
    for loc, lastmod in entries:
        stamp = f"<lastmod>{lastmod.astimezone(datetime.timezone.utc).isoformat()}</lastmod>" if lastmod else ""
        lines.append(f"<url><loc>{escape(loc)}</loc>{stamp}</url>")
    lines.append("</urlset>")
    return ("\n".join(lines) + "\n").encode("utf-8")


__all__ = ["MAX_CHILD_SITEMAPS", "Sitemap", "SitemapError", "load_sitemap", "parse_lastmod", "render_urlset", "saved_at"]
