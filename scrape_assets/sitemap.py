"""A site's XML sitemap as a change feed: which listing pages changed since they were saved.

Format: the sitemaps.org protocol 0.9 (https://www.sitemaps.org/protocol.html), namespace
``http://www.sitemaps.org/schemas/sitemap/0.9``: a ``<urlset>`` of ``<url>`` entries, each
with a ``<loc>`` (absolute URL) and an optional ``<lastmod>`` (W3C Datetime,
https://www.w3.org/TR/NOTE-datetime: ``YYYY-MM-DD`` or ``YYYY-MM-DDThh:mm[:ss[.s]]TZD``), or
a ``<sitemapindex>`` listing ``<sitemap><loc>`` child sitemaps, which are read in turn (one
level, as the protocol allows). A gzip-compressed sitemap (``sitemap.xml.gz``) is
decompressed. Parsed with ``defusedxml`` (DTDs and entities refused: a hostile sitemap
cannot expand in memory); at most :data:`MAX_SITEMAP_BYTES` per document, compressed or not.

Used by ``incremental.revalidate: sitemap`` (see :class:`~scrape_assets.spec.Incremental`):
a saved page is taken as unchanged, without a request, when :meth:`Sitemap.unchanged_since`
says so for its URL and its saved copy. Every ``lastmod`` is read as the *latest* instant
it may mean, so a vague one never hides a change: a date is the end of that day in the
zone furthest west (UTC-12, i.e. 12:00 UTC the next day), a time without a zone is read
the same way (+12 h). A URL listed twice keeps its latest ``lastmod``, and none if one of
its entries has none.

Limits: a ``lastmod`` is the site's claim; a site that changes pages without moving it is
caught only through page 1 of each category, which is always revalidated (see
:class:`~scrape_assets.crawl.PartitionCrawler`). Entries on another origin than the
sitemap's or the site's are ignored; child sitemaps are fetched from the sitemap's own
origin (a mirror serves them too); at most :data:`MAX_CHILD_SITEMAPS` children of an index
are read (a page listed only in a later one counts as not listed), and a child that
cannot be fetched or read makes the whole sitemap unused for the run (a page it lists may
be listed in another child with an older ``lastmod``). Which sitemap: the spec's
``incremental.sitemap`` when it names one, else the robots.txt ``Sitemap:`` lines on the
site's origin, else ``sitemap.xml`` (see
:func:`~scrape_assets.crawl.load_run_sitemap`).

Each document served with an ``ETag`` or ``Last-Modified`` is kept (:class:`SitemapCopies`),
and the next run asks for it with a conditional GET: a 304 reads the kept copy, so an
unchanged sitemap costs the site one small response, not the whole document again.
"""

from __future__ import annotations

import asyncio
import datetime
import hashlib
import json
import logging
import re
import zlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from email.utils import parsedate_to_datetime
from urllib.parse import urljoin, urlsplit
from xml.etree.ElementTree import Element, ParseError
from xml.sax.saxutils import escape

import defusedxml.ElementTree as SafeET
from defusedxml import DefusedXmlException

from scrape_assets.errors import FetchError, StorageError
from scrape_assets.fetcher import sendable_validator, validators_differ
from scrape_assets.hostnames import DEFAULT_PORTS

logger = logging.getLogger(__name__)
_NS = "{http://www.sitemaps.org/schemas/sitemap/0.9}"
#: Children of a sitemap index read at most (sitemaps.org allows 50,000; each is one request).
MAX_CHILD_SITEMAPS = 100
#: Largest sitemap document, bytes, as fetched and once decompressed (the protocol's limit: 50 MB).
MAX_SITEMAP_BYTES = 50 * 1024 * 1024
#: How long before our fetch a change must be dated for our copy to surely hold it, when the
#: saved copy's own ``Last-Modified`` does not settle it: our clock against the site's, and a
#: cache in front of the site serving a slightly old copy.
FETCH_MARGIN = datetime.timedelta(hours=1)
#: A ``lastmod`` without a zone (a date, or a time the protocol says must have one) may be
#: local time anywhere: its latest reading is in the zone furthest west, UTC-12.
_WESTMOST = datetime.timedelta(hours=12)

_W3C = re.compile(
    r"(\d{4})(?:-(\d{2})(?:-(\d{2})(?:T(\d{2}):(\d{2})(?::(\d{2})(\.\d+)?)?(Z|[+-]\d{2}:\d{2})?)?)?)?"
)


class SitemapError(Exception):
    """A sitemap that cannot be used: unreachable, not XML, not a sitemap.

    Attributes:
        url: the sitemap's URL.
        reason: what was wrong, e.g. ``"http_404"``, ``"not XML: ..."``.
        requests: HTTP requests made for it before giving up (retries included).
    """

    def __init__(self, url: str, reason: str, requests: int = 0):
        super().__init__(f"sitemap {url}: {reason}")
        self.url = url
        self.reason = reason
        self.requests = requests


def parse_lastmod(text: str) -> datetime.datetime | None:
    """A W3C Datetime as the latest instant (UTC) it may mean; None when it is not one.

    ``2026-12-02T10:30:00+01:00`` -> 2026-12-02T09:30:00Z; with a fraction of a second, the
    end of that second; without seconds (``10:30Z``), the end of that minute (10:31:00Z);
    ``2026-12-02T10:30:00`` (no zone) -> 2026-12-02T22:30:00Z;
    ``2026-12-02`` -> 2026-12-03T12:00:00Z (its end at UTC-12); ``2026-12`` ->
    2027-01-01T12:00:00Z; ``2026`` -> 2027-01-01T12:00:00Z. An entry whose ``lastmod`` is
    None counts as undated.
    """
    match = _W3C.fullmatch(text.strip())
    if match is None:
        return None
    year, month, day, hour, minute, second, fraction, zone = match.groups()
    try:
        if day is None:  # a month or a year: from its first instant after it ends
            start = datetime.datetime(int(year), int(month or 1), 1, tzinfo=datetime.timezone.utc)
            after = start.replace(year=start.year + 1) if month is None else (start + datetime.timedelta(days=32)).replace(day=1)
            return after + _WESTMOST
        date = datetime.datetime(int(year), int(month), int(day), tzinfo=datetime.timezone.utc)
        if hour is None:
            return date + datetime.timedelta(days=1) + _WESTMOST
        moment = date.replace(hour=int(hour), minute=int(minute), second=int(second or 0))
        if second is None:
            moment += datetime.timedelta(minutes=1)  # hh:mm: the end of that minute
        elif fraction:
            moment += datetime.timedelta(seconds=1)  # compared with whole-second HTTP dates: its end
        if zone is None:
            return moment + _WESTMOST
        if zone != "Z":
            sign = 1 if zone[0] == "+" else -1
            moment -= sign * datetime.timedelta(hours=int(zone[1:3]), minutes=int(zone[4:6]))
        return moment
    except (ValueError, OverflowError):  # month 13, day 31 of a short month, hour 25; 9999-12-31 + 1 day
        return None


def _http_date(value: str | None) -> datetime.datetime | None:
    """An HTTP-date (RFC 9110 §5.6.7) as UTC, None when absent or malformed."""
    if not value:
        return None
    try:
        moment = parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError, OverflowError):  # a year past 9999, say
        return None
    return moment if moment.tzinfo else moment.replace(tzinfo=datetime.timezone.utc)


def parse_fetched_at(value: str | None) -> datetime.datetime | None:
    """The manifest's ``fetched_at`` (ISO 8601, ``Z`` suffix; any offset accepted) as UTC."""
    if not value:
        return None
    try:
        moment = datetime.datetime.fromisoformat(value)
    except ValueError:
        return None
    return moment if moment.tzinfo else moment.replace(tzinfo=datetime.timezone.utc)


def origin_host(url: str) -> str:
    """``url``'s ``host[:port]`` as sitemap entries are matched against a site's: the host in
    lower case (IPv6 in brackets), the port as a number, the scheme's default port dropped
    (``https://Shop.example:443/p``, ``https://shop.example:/p`` -> ``shop.example``); the
    scheme itself is not compared (a site's sitemap may list its http URLs). ``""`` when
    ``url`` cannot be parsed (``http://[bad/``, a port that is no number), which no origin
    matches."""
    return _key(url)[0]


def _key(url: str) -> tuple[str, str]:
    """``(origin_host(url), path[?query])`` of ``url``; ``("", "")`` when it cannot be
    parsed (``http://[bad/``, a port that is no number), which no origin matches."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        return "", ""
    host = parts.hostname or ""
    if ":" in host:  # IPv6
        host = f"[{host}]"
    if port is not None and port != DEFAULT_PORTS.get(parts.scheme.lower()):
        host = f"{host}:{port}"
    return host, (parts.path or "/") + (f"?{parts.query}" if parts.query else "")


@dataclass
class Sitemap:
    """The ``lastmod`` of every URL a sitemap (and its children) lists.

    Attributes:
        url: the sitemap's URL (several separated by spaces: a robots.txt's ``Sitemap:`` lines).
        lastmod: ``path[?query]`` -> latest instant its ``lastmod`` may mean (UTC), over all
            its entries; URLs listed without a (valid) ``lastmod`` are absent.
        urls: ``<url>`` entries read (with and without ``lastmod``).
        requests: HTTP requests made for the sitemap and its children (retries included).
        not_modified: documents the site answered 304 to a conditional GET (read from the
            kept copy, see :class:`SitemapCopies`).
        skipped: entries ignored (another origin, no ``<loc>``) and children not read.
        error: why the sitemap itself was not used (``"http_404"``...; see
            :func:`~scrape_assets.crawl.load_run_sitemap`), empty when it was.
    """

    url: str
    lastmod: dict[str, datetime.datetime] = field(default_factory=dict)
    urls: int = 0
    requests: int = 0
    not_modified: int = 0
    skipped: int = 0
    error: str = ""
    _undated: set[str] = field(default_factory=set, repr=False)

    def dated(self, url: str) -> bool:
        """Whether the sitemap lists ``url`` with a ``lastmod``."""
        return _key(url)[1] in self.lastmod

    def unchanged_since(self, url: str, last_modified: str | None, fetched_at: str | None) -> bool:
        """Whether the sitemap says ``url`` has not changed since a copy was saved.

        Args:
            url: the page's URL (matched by path and query).
            last_modified: the saved copy's ``Last-Modified`` header (HTTP-date), if any.
            fetched_at: when the saved copy was fetched (the manifest's ISO 8601 time).

        True when the URL is listed with a ``lastmod`` and either that ``lastmod`` is no later
        than the copy's ``Last-Modified`` (the site's own clock on both sides; a
        ``Last-Modified`` after the fetch is not believed), or it is at least
        :data:`FETCH_MARGIN` before the fetch. False otherwise, and when nothing is known of
        the copy.
        """
        lastmod = self.lastmod.get(_key(url)[1])
        fetched = parse_fetched_at(fetched_at)
        if lastmod is None or fetched is None:
            return False
        modified = _http_date(last_modified)
        if modified is not None and modified <= fetched and lastmod <= modified:
            return True
        return lastmod <= fetched - FETCH_MARGIN

    def add(self, body: bytes, url: str, origins: Iterable[str]) -> list[str]:
        """Read one sitemap document; return the child sitemaps' URLs (for an index), on
        ``url``'s origin.

        Raises:
            SitemapError: not XML (or a DTD in it), not gzip, too large once decompressed, or
                its root is neither ``urlset`` nor ``sitemapindex``.
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
            root: Element = SafeET.fromstring(body, forbid_dtd=True)
        except (ParseError, DefusedXmlException) as exc:
            raise SitemapError(url, f"not XML: {exc}") from None
        allowed = {o.lower() for o in origins}
        children = []
        if root.tag == f"{_NS}urlset":
            for entry in root.iterfind(f"{_NS}url"):
                host, path = _key((entry.findtext(f"{_NS}loc") or "").strip())
                if host not in allowed:  # (an entry without a loc has no host)
                    self.skipped += 1
                    continue
                self.urls += 1
                lastmod = parse_lastmod(entry.findtext(f"{_NS}lastmod") or "")
                if lastmod is None or path in self._undated:
                    self._undated.add(path)  # one undated entry makes the URL undated
                    self.lastmod.pop(path, None)
                else:
                    self.lastmod[path] = max(lastmod, self.lastmod.get(path, lastmod))
        elif root.tag == f"{_NS}sitemapindex":
            for entry in root.iterfind(f"{_NS}sitemap"):
                host, path = _key((entry.findtext(f"{_NS}loc") or "").strip())
                if host in allowed:
                    children.append(urljoin(url, path))  # from the origin this index came from
                else:
                    self.skipped += 1
        else:
            raise SitemapError(url, f"root element {root.tag!r}; expected urlset or sitemapindex ({_NS[1:-1]})")
        return children


_COPY_NAME = re.compile(r"[0-9a-f]{24}\.(?:body|json)")


@dataclass(frozen=True)
class KeptCopy:
    """A sitemap document kept by an earlier run (see :class:`SitemapCopies`).

    Attributes:
        body: the document as served.
        etag, last_modified: its validators (sendable), either may be None.
        final_url: where it was served from after redirects (None: its own URL), the only
            URL its validators are sent to (RFC 9110 §15.4).
    """

    body: bytes
    etag: str | None
    last_modified: str | None
    final_url: str | None = None

    @property
    def headers(self) -> dict[str, str]:
        """The conditional request for it: ``If-None-Match``, else ``If-Modified-Since`` ({} for none)."""
        if self.etag:
            return {"If-None-Match": self.etag}
        return {"If-Modified-Since": self.last_modified} if self.last_modified else {}


class SitemapCopies:
    """Kept copies of sitemap documents, for conditional GETs of them (RFC 9110 §13.1).

    One pair of objects per document URL in ``store`` under ``prefix``:
    ``<sha256 of the URL, 24 hex>.body`` (the document as served: a ``.gz`` stays gzip) and
    ``.json`` (``url``, ``etag``, ``last_modified``, ``sha256`` and ``bytes`` of the body,
    ``fetched_at``), each written atomically, the body first. A copy whose body is missing or
    does not match its JSON (a crash between the two writes, a hand edit) is not used: the
    document is then fetched whole. Only documents served with a validator (``ETag`` or
    ``Last-Modified``) are kept; the request for a kept one carries ``If-None-Match`` (else
    ``If-Modified-Since``), as pages' requests do.

    Args:
        store: an :class:`~scrape_assets.storage.ObjectStore` (local folder or S3).
        prefix: key prefix, e.g. ``"demo/sitemap.copies"`` (no category key has a ``.``, so none collides).
    """

    def __init__(self, store, prefix: str):
        self.store = store
        self.prefix = prefix.rstrip("/")

    def _keys(self, url: str) -> tuple[str, str]:
        name = hashlib.sha256(url.encode("utf-8")).hexdigest()[:24]
        return f"{self.prefix}/{name}.body", f"{self.prefix}/{name}.json"

    def load(self, url: str) -> KeptCopy | None:
        """The kept copy of ``url``; None when there is none usable (missing, torn, for
        another URL, or without a validator that can be sent back).

        Raises:
            StorageError: the store could not be read (other than a missing object).
        """
        body_key, meta_key = self._keys(url)
        try:
            meta = json.loads(self.store.read_bytes(meta_key))
            body = self.store.read_bytes(body_key)
        except (FileNotFoundError, ValueError):  # none kept, or a torn or edited JSON: fetch the document whole
            return None
        if not isinstance(meta, dict) or meta.get("url") != url or meta.get("sha256") != hashlib.sha256(body).hexdigest():
            return None
        kept = KeptCopy(body, sendable_validator(meta.get("etag")), sendable_validator(meta.get("last_modified")),
                        meta.get("final_url") or None)
        return kept if kept.headers else None

    def save(self, url: str, body: bytes, headers: dict[str, str], final_url: str | None = None) -> bool:
        """Keep ``body`` (as served) for ``url`` when ``headers`` (lower-case names) have a
        validator; return whether it was kept. ``final_url``: where it was served from, when
        a redirect led elsewhere.

        Raises:
            StorageError: the write failed (an earlier copy, if any, is intact or unused).
        """
        etag, last_modified = (sendable_validator(headers.get(name)) or "" for name in ("etag", "last-modified"))
        body_key, meta_key = self._keys(url)
        if not etag and not last_modified:  # the kept copy, if any, is not this document: never ask with it again
            self.store.delete(meta_key)  # first: a body without its meta is never read
            self.store.delete(body_key)
            return False
        digest = hashlib.sha256(body).hexdigest()
        try:
            kept = json.loads(self.store.read_bytes(meta_key))
        except (FileNotFoundError, ValueError):
            kept = {}
        final_url = final_url if final_url and final_url != url else None
        if (kept.get("url"), kept.get("sha256"), kept.get("etag"), kept.get("last_modified"), kept.get("final_url")) == (
                url, digest, etag, last_modified, final_url) and self.store.exists(body_key):
            return True  # the same document again (a 200 where a 304 would do): nothing to write
        meta = {"url": url, "etag": etag, "last_modified": last_modified, "sha256": digest, "bytes": len(body),
                "fetched_at": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
                **({"final_url": final_url} if final_url else {})}
        self.store.write_bytes_atomic(body_key, body)
        self.store.write_bytes_atomic(meta_key, json.dumps(meta, indent=1).encode("utf-8"))
        return True

    def keep_only(self, urls: Iterable[str]) -> int:
        """Delete every kept copy but those of ``urls`` (a child an index no longer lists, a
        sitemap the spec no longer names); return the objects deleted.

        Raises:
            StorageError: listing or deleting failed.
        """
        wanted = {key for url in urls for key in self._keys(url)}
        try:
            files = self.store.list_files(self.prefix)
        except FileNotFoundError:  # nothing kept yet
            return 0
        except OSError as exc:  # a local folder that cannot be read (EACCES, a file in the way)
            raise self._storage_error(self.prefix, "list", exc) from exc
        # Copies only: a temp file may be another run's write in flight (sweep_temp_files ages them).
        stale = [key for key, _size in files if key not in wanted and _COPY_NAME.fullmatch(key.rsplit("/", 1)[1])]
        for key in stale:
            try:
                self.store.delete_listed(key)
            except OSError as exc:  # on local disks unwrapped: a read-only folder or mount
                raise self._storage_error(key, "delete", exc) from exc
        return len(stale)

    def _storage_error(self, key: str, action: str, exc: OSError) -> StorageError:
        """``exc`` (the store's local listing or deletion failed) as the StorageError the caller handles."""
        error = StorageError(f"{self.store.describe()}/{key}", f"{action} failed: {exc}")
        error.root = self.store.describe()
        return error


async def load_sitemap(
    fetcher, url: str | Sequence[str], *, origins: Iterable[str] = (), copies: SitemapCopies | None = None
) -> Sitemap:
    """Fetch and read the sitemap at ``url`` (and, for an index, up to :data:`MAX_CHILD_SITEMAPS` children).

    Every document goes through ``fetcher`` (a :class:`~scrape_assets.fetcher.PageFetcher`):
    robots.txt, the per-host limits and retries apply as to pages; its ``max_body_bytes``
    bounds each document. Children are fetched one after another. With ``copies``, a
    document kept by an earlier run is asked for with a conditional GET and read from its
    copy on a 304 (``not_modified``); a document read whole is kept for the next run, and
    copies of documents no longer listed are deleted.

    Several URLs (a robots.txt's ``Sitemap:`` lines) are read as one sitemap index (at most
    :data:`MAX_CHILD_SITEMAPS` of them): each one's entries and children count. The load
    fails when any document (one of several roots, a child) cannot be fetched or read: the
    dates of the others cannot vouch for a page it may list with a later ``lastmod``. A kept
    document that came through a redirect is revalidated at its redirect target.

    Args:
        fetcher: a page fetcher of the run.
        url: absolute URL of the sitemap (or sitemap index), or a non-empty list of them.
        origins: ``host[:port]`` whose URLs are accepted besides the sitemap's own (the site's
            base URL when the sitemap is fetched from a mirror), as :func:`origin_host` spells
            them (without the scheme's default port).
        copies: where documents are kept between runs (None: always fetched whole). A
            storage error on them is logged and costs only the copy.

    Raises:
        SitemapError: the sitemap itself, one of several, or one of its children could not
            be fetched or read; ``reason`` says which and why (the first one's alone when a
            single sitemap failed); ``requests`` counts the requests made for it all.
        ValueError: ``url`` is an empty list.
    """
    roots = [url] if isinstance(url, str) else list(dict.fromkeys(url))
    if not roots:
        raise ValueError("load_sitemap needs at least one sitemap URL")
    over = roots[MAX_CHILD_SITEMAPS:]  # several (robots.txt lines) count as one index's children
    roots = roots[:MAX_CHILD_SITEMAPS]
    sitemap = Sitemap(url=" ".join(roots), skipped=len(over))
    allowed = {*(origin_host(root) for root in roots), *origins}

    async def count(_attempt: int) -> None:
        sitemap.requests += 1

    async def on_copies(operation, *args):
        """A call on ``copies``; a storage error costs only the copy (logged), never the run."""
        try:
            return await asyncio.to_thread(operation, *args)
        except StorageError as exc:
            logger.warning("sitemap copy not used: %s", exc)
            return None

    async def get(doc_url: str, headers: dict[str, str] | None = None, validators_url: str | None = None):
        try:
            return await fetcher.fetch(doc_url, on_attempt=count, headers=headers, validators_url=validators_url)
        except FetchError as exc:
            raise SitemapError(doc_url, exc.reason + (f" ({exc.detail})" if exc.detail else "")) from None

    async def read(doc_url: str) -> list[str]:
        kept = await on_copies(copies.load, doc_url) if copies is not None else None
        # A copy that came through a redirect is asked for at its redirect target.
        page = await get(doc_url, kept.headers if kept else None, validators_url=kept.final_url if kept else None)
        if page.http_status == 304 and kept is not None:
            if validators_differ(page.headers, kept):
                page = await get(doc_url)  # not the kept document (RFC 9111 §4.3.4): ask for it whole
            else:
                sitemap.not_modified += 1
                children = sitemap.add(kept.body, doc_url, allowed)
                new = (page.headers.get("etag") or kept.etag, page.headers.get("last-modified") or kept.last_modified)
                if new != (kept.etag, kept.last_modified):  # the 304 updates the copy's validators (RFC 9111 §4.3.4)
                    await on_copies(copies.save, doc_url, kept.body, {"etag": new[0] or "", "last-modified": new[1] or ""},
                                    kept.final_url)
                return children
        if page.http_status == 304:
            raise SitemapError(doc_url, "http_304 to a request that was not conditional")
        children = sitemap.add(page.body, doc_url, allowed)  # kept only once it reads as a sitemap
        if copies is not None:
            await on_copies(copies.save, doc_url, page.body, page.headers, page.final_url if page.redirected else None)
        return children

    children: list[str] = []
    failures: list[SitemapError] = []
    for root in roots:
        try:
            children += [child for child in await read(root) if child not in roots]
        except SitemapError as exc:
            failures.append(exc)
    if len(failures) == len(roots):
        error = failures[0] if len(roots) == 1 else SitemapError(
            sitemap.url, "; ".join(f"{exc.url}: {exc.reason}" for exc in failures))
        error.requests = sitemap.requests  # spent on it all the same: the metadata counts them
        raise error
    children = list(dict.fromkeys(children))
    sitemap.skipped += max(0, len(children) - MAX_CHILD_SITEMAPS)
    for child in children[:MAX_CHILD_SITEMAPS]:
        try:
            nested = await read(child)
        except SitemapError as exc:
            failures.append(exc)
            continue
        sitemap.skipped += len(nested)  # an index listed by an index: not read (the protocol nests no deeper)
    if failures:
        # Some of its documents could not be read: a page they list may be listed in another
        # too, with an older lastmod (an "all" and a "recent" sitemap), so what was read
        # cannot vouch for any page. Not used this run, as when none can be read.
        error = SitemapError(sitemap.url, "; ".join(f"{exc.url}: {exc.reason}" for exc in failures[:5])
                             + (f"; {len(failures) - 5} more" if len(failures) > 5 else "")
                             + f" ({len(failures)} of its documents could not be read)")
        error.requests = sitemap.requests
        raise error
    if copies is not None:
        await on_copies(copies.keep_only, [*roots, *children[:MAX_CHILD_SITEMAPS]])
    return sitemap


def render_urlset(entries: Iterable[tuple[str, datetime.datetime | None]]) -> bytes:
    """A ``<urlset>`` document for ``(absolute URL, lastmod or None)`` entries (the demo's, the benchmark's)."""
    lines = ['<?xml version="1.0" encoding="UTF-8"?>', f'<urlset xmlns="{_NS[1:-1]}">']
    for loc, lastmod in entries:
        stamp = f"<lastmod>{lastmod.astimezone(datetime.timezone.utc).isoformat()}</lastmod>" if lastmod else ""
        lines.append(f"<url><loc>{escape(loc)}</loc>{stamp}</url>")
    lines.append("</urlset>")
    return ("\n".join(lines) + "\n").encode("utf-8")


__all__ = ["FETCH_MARGIN", "MAX_CHILD_SITEMAPS", "MAX_SITEMAP_BYTES", "KeptCopy", "Sitemap", "SitemapCopies", "SitemapError",
           "load_sitemap", "parse_fetched_at", "parse_lastmod", "render_urlset"]
