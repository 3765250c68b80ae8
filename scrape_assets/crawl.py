"""Crawl one partition (category) into a snapshot: discovery, fetching, resume.

Discovery starts at page 1. When its pager says "Page 1 of N" and the spec gives a
``page_url`` pattern, pages 2..N are known at once and fetched concurrently, so one
dead page hides nothing; otherwise ``next`` links are followed page by page.

Every change of a page's state is persisted in the manifest before the crawl moves on
(see :mod:`scrape_assets.manifest`): the attempt count before each HTTP attempt, the
body (atomically) and then ``done``, or ``failed`` with its reason. A run that dies
therefore resumes with at most the in-flight pages to fetch again. Pages that fail
for good are recorded (they become dead letters) and never fail the crawl; storage
errors do fail it, so the step's RetryPolicy can resume.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import logging
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from urllib.parse import urldefrag, urljoin, urlsplit

from scrape_assets.batched_log import LOG_EVERY_S
from scrape_assets.content_type import header_charset
from scrape_assets.counts import counted
from scrape_assets.crashpoints import crashpoint
from scrape_assets.errors import FetchError, ManifestError, StorageError, exception_text
from scrape_assets.fetcher import PageFetcher, resource_key, same_origin, sendable_validator, validators_differ
from scrape_assets.manifest import (
    UNREAD,
    Manifest,
    PageEntry,
    latest_manifest,
    load_manifest,
    open_snapshot,
    retry_time,
    seconds_until,
    snapshot_folders,
    snapshot_sort_key,
    utc_now_iso,
)
from scrape_assets.page_slots import PageSlots, run_within
from scrape_assets.parsing import UrlJoiner, meta_declared_codec, parse_pager
from scrape_assets.politeness import robots_url_for
from scrape_assets.sitemap import (
    MAX_SITEMAP_BYTES,
    Sitemap,
    SitemapCopies,
    SitemapError,
    load_sitemap,
    origin_host,
    parse_fetched_at,
)
from scrape_assets.spec import SiteSpec
from scrape_assets.storage import ObjectStore

logger = logging.getLogger(__name__)

ProgressCallback = Callable[[str], None]
#: Pages that failed for good get a log line each up to this many per run; then only a count.
MAX_FAILURE_LINES = 20
#: Complete snapshots before the latest searched for the saved copy of a page that failed in
#: the latest one (an outage day), so the next day still asks with a conditional GET.
PREVIOUS_SNAPSHOTS_SEARCHED = 7


#: A page's ``last_error`` while it is asked once more after a crash between storing its
#: body and recording it on its last allowed attempt.
STORED_THEN_INTERRUPTED = "interrupted after its body was stored, before it was recorded"
#: ``last_error`` of an attempt that ended in an exception of ours (no FetchError): "unexpected_error on
#: attempt N: Type: message".
UNEXPECTED_ERROR = "unexpected_error"


class CrawlProgress:
    """Progress of one run's crawl over all its categories, as a few log lines.

    Each line is a Dagster event written to the event log, so a line per page or per
    category would cost more than the pages (100 categories = hundreds of events). This
    emits one line every ``every_s`` seconds and a last one when every category is done::

        4,210/10,000 pages done, 3 failed for good, 57 retries; 37/100 categories complete; 312 pages/s

    plus one line for each of the first :data:`MAX_FAILURE_LINES` pages that fail for good,
    given to ``warn`` (a WARNING in Dagster's log: a lost page stands out among the INFO
    progress lines). ``pages/s`` counts the pages this run settled (done or failed for good) per second of
    the crawl: a site answering half its pages with 404 at 20 requests/s shows 20, not 10.
    ``retries`` (shown once there is one) counts this run's failed attempts that were
    retried after a back-off (5xx, 429, timeouts...): a site in trouble shows there before
    pages fail for good.
    Per-category figures go into the asset's metadata instead.

    Args:
        categories: categories in the run.
        emit: called with each progress line (``context.log.info`` in an asset).
        warn: called with each failed page's line and the line that caps them
            (``context.log.warning`` in an asset); ``None``: ``emit``.
        every_s: seconds between periodic lines.
        clock: monotonic seconds (injectable for tests).
    """

    def __init__(self, categories: int, emit: ProgressCallback, *, warn: ProgressCallback | None = None,
                 every_s: float = LOG_EVERY_S, clock: Callable[[], float] = time.monotonic):
        self.categories = categories
        self.emit = emit
        self.warn = emit if warn is None else warn
        self.every_s = every_s
        self.clock = clock
        self._planned: dict[str, int] = {}
        self._known = 0  # sum of _planned's values
        self._final: set[str] = set()  # categories whose every page is known (discovery complete)
        self.pages_done = 0
        self.pages_failed = 0
        self.retries = 0
        self.categories_done = 0
        self._settled_now = 0
        self._started = self._last = clock()

    def planned(self, category: str, pages: int, *, final: bool = True, already_done: int = 0,
                already_failed: int = 0) -> None:
        """``category`` has ``pages`` pages known so far; ``final=False`` while discovery may find more."""
        if category not in self._planned:
            self.pages_done += already_done
            self.pages_failed += already_failed
        self._known += pages - self._planned.get(category, 0)
        self._planned[category] = pages
        if final:
            self._final.add(category)
        else:
            self._final.discard(category)

    def page_done(self) -> None:
        self.pages_done += 1
        self._settled_now += 1
        self._tick()

    def pages_adopted(self, count: int) -> None:
        """``count`` pages became done without a request (``incremental.revalidate``: ``first_page``, ``sitemap``)."""
        self.pages_done += count

    def page_failed(self, line: str) -> None:
        self.pages_failed += 1
        self._settled_now += 1  # pages/s counts every page this run settled, failed ones too
        if self.pages_failed <= MAX_FAILURE_LINES:
            self.warn(line)
        elif self.pages_failed == MAX_FAILURE_LINES + 1:
            self.warn("more pages failed for good: only counted from now on (all are in the manifests and dead_letters)")
        self._tick()

    def page_retried(self) -> None:
        """A page's attempt failed and will be retried after a back-off."""
        self.retries += 1
        self._tick()

    def category_done(self) -> None:
        self.categories_done += 1
        if self.categories_done == self.categories:
            self._last = self.clock()
            self.emit(self.line())

    def _last_line_next(self) -> bool:
        """Every category's pages are all known and accounted for: only completions remain."""
        return len(self._final) == self.categories and self.pages_done + self.pages_failed >= self._known

    def line(self) -> str:
        elapsed = max(self.clock() - self._started, 1e-9)
        return (
            f"{self.pages_done:,}/{self._known:,} pages done, {self.pages_failed:,} failed for good"
            + (f", {counted(self.retries, 'retry', 'retries')}" if self.retries else "") + "; "
            f"{self.categories_done}/{self.categories} categories complete; {_rate(self._settled_now / elapsed)} pages/s"
        )

    def _tick(self) -> None:
        if self._last_line_next():
            return  # category_done() prints the run's last line in a moment: not twice back to back
        now = self.clock()
        if now - self._last >= self.every_s:
            self._last = now
            self.emit(self.line())


@dataclass(frozen=True)
class CrawlReport:
    """Outcome of one partition's crawl (this run's share and the snapshot's totals)."""

    category: str
    snapshot_id: str
    resumed: bool
    pages_total: int
    pages_done: int
    pages_failed: int
    requests_made: int  # HTTP attempts made by this run
    pages_fetched: int  # pages that became done in this run
    pages_not_modified: int  # of those, answered 304 to a conditional GET
    pages_unchanged: int  # of those, 200 with the same content hash as the previous snapshot
    bytes_stored: int  # bytes written by this run
    products_expected: int | None
    duration_s: float
    data_version: str = ""
    pages_assumed_unchanged: int = 0  # adopted without a request (incremental.revalidate: first_page, sitemap)
    sitemap_check: str = ""  # revalidate: sitemap: "trusted", or why not (see PartitionCrawler._trust_sitemap)

    @property
    def success_rate(self) -> float:
        """done / (done + failed); 1.0 for an empty snapshot."""
        finished = self.pages_done + self.pages_failed
        return self.pages_done / finished if finished else 1.0


class PartitionCrawler:
    """Fetch every listing page of one category into a snapshot.

    Args:
        spec: the site spec.
        category: partition key (a key of ``spec.categories``).
        store: object storage for pages and the manifest.
        fetcher: a polite, retrying :class:`~scrape_assets.fetcher.PageFetcher` (shared per run).
        fetch_config: the frozen fetch config recorded in the manifest.
        fetch_base_url: where pages are fetched from (the spec's base URL or a mirror).
        run_id: the run crawling, recorded in the manifest.
        reexecuted_run_ids: the runs it re-executes (see :func:`~scrape_assets.manifest.open_snapshot`).
        adopt_complete: see :func:`~scrape_assets.manifest.open_snapshot`; an adopted
            complete snapshot is reported as resumed, with nothing fetched.
        resume_max_age: an incomplete snapshot older than this is left as it is and a new
            one starts (see :func:`~scrape_assets.manifest.open_snapshot`); None: any age.
        progress: the run's :class:`CrawlProgress` (shared by its crawlers), or a callback
            for log lines (a progress of its own is made for this one category).
        latest: the partition's latest snapshot as the caller read it just before (None:
            there is none; ``raw_pages`` holds the partition locks meanwhile); by default the
            crawler reads it. A complete one is also the snapshot whose pages are
            revalidated, so it is not read a second time.
        sitemap: the site's sitemap, read once per run (``incremental.revalidate: sitemap``,
            see :func:`load_run_sitemap`); None: no page is adopted on its word.
        warn: where warnings about the crawl's shape go (``max_pages`` reached, a next link
            off the site, looping or unresolvable): ``raw_pages`` passes the step's log, so
            they are in the run's event log; by default this module's logger.
        page_slots: the run's bound on pages in progress, shared by its crawlers (see
            :mod:`scrape_assets.page_slots`; give the fetcher ``sleep=page_slots.sleep`` and
            ``robots_sleep=asyncio.sleep``);
            None: every page found is started at once (fine for one small category).
        slot_priority: this category's place in the run: a lower number gets free slots first.
    """

    def __init__(
        self,
        spec: SiteSpec,
        category: str,
        store: ObjectStore,
        fetcher: PageFetcher,
        *,
        fetch_config: dict,
        fetch_base_url: str,
        max_attempts: int,
        run_id: str | None = None,
        reexecuted_run_ids: Collection[str] = (),
        adopt_complete: Callable[[Manifest], bool] | None = None,
        resume_max_age: timedelta | None = None,
        progress: CrawlProgress | ProgressCallback | None = None,
        latest: Manifest | None | object = UNREAD,
        sitemap: Sitemap | None = None,
        warn: Callable[[str], object] | None = None,
        page_slots: PageSlots | None = None,
        slot_priority: int = 0,
    ):
        self._warn = warn or logger.warning
        self.page_slots = page_slots
        self.slot_priority = slot_priority
        self.run_id = run_id
        self.reexecuted_run_ids = tuple(reexecuted_run_ids)
        self.sitemap = sitemap
        self.sitemap_check = ""  # decided once page 1 is done (see _trust_sitemap)
        self._latest = latest
        self.adopt_complete = adopt_complete
        self.resume_max_age = resume_max_age
        self.spec = spec
        self.category = category
        self.store = store
        self.fetcher = fetcher
        self.fetch_config = fetch_config
        self.fetch_base_url = fetch_base_url
        self.max_attempts = max_attempts
        if not isinstance(progress, CrawlProgress):
            progress = (CrawlProgress(1, progress) if progress is not None
                        else CrawlProgress(1, lambda line: logger.info(line), warn=lambda line: logger.warning(line)))
        self.progress = progress
        self._lock = asyncio.Lock()
        self._page_urls: UrlJoiner | None = None  # resolves page_url against the snapshot's start URL
        self._requests = 0
        self._fetched = 0
        self._not_modified = 0
        self._unchanged = 0
        self._assumed = 0
        self._bytes = 0
        self._previous: dict[str, tuple[Manifest, int]] = {}
        self._saved: dict[str, int] = {}  # storage key -> size of the saved copies in _previous
        self._by_hash: dict[str, list[tuple[Manifest, int]]] = {}  # the copies in _previous by content hash

    async def run(self, *, new_snapshot: bool = False) -> CrawlReport:
        """Crawl (or resume) the partition; return its report.

        Raises:
            FetchConfigChangedError: resume refused (see :func:`~scrape_assets.manifest.open_snapshot`).
            StorageError: a page or the manifest could not be written.
        """
        started = time.monotonic()
        manifest, resumed = open_snapshot(
            self.store,
            site=self.spec.name,
            category=self.category,
            start_url=self.spec.start_url(self.category, self.fetch_base_url),
            fetch_config=self.fetch_config,
            new_snapshot=new_snapshot,
            run_id=self.run_id,
            reexecuted_run_ids=self.reexecuted_run_ids,
            adopt_complete=self.adopt_complete,
            resume_max_age=self.resume_max_age,
            on_abandon=self._report_abandoned,
            latest=self._latest,
            on_repace=self._report_repace,
        )
        swept = self._sweep_abandoned(manifest)
        if not manifest.is_complete:  # a complete one is read (and written into) by later stages
            swept += self.store.sweep_temp_files(manifest.prefix)
        self._previous = self._previous_pages(manifest)
        self._latest = UNREAD  # used: a later run() reads again
        if not manifest.is_complete:  # pages to fetch: the saved copies they may reuse
            await self._list_saved_copies()
            self._by_hash = {}
            for m, k in self._previous.values():  # the latest snapshot's copies first
                if content_hash := m.pages[k].content_hash:
                    self._by_hash.setdefault(content_hash, []).append((m, k))
        lost = self._requeue_lost_bodies(manifest) if resumed and not manifest.is_complete else 0
        c = manifest.counts()
        if resumed:
            self.progress.emit(
                f"{self.category}: resuming snapshot {manifest.snapshot_id} "
                f"({c['done']} done, {c['failed']} failed, {c['pending']} pending"
                + (f", {swept} orphaned temp files removed" if swept else "")
                + (f", {lost} done pages without their body fetched again" if lost else "")
                + ")"
            )
        self.manifest = manifest
        self.progress.planned(self.category, len(manifest.pages), final=manifest.discovery_complete,
                              already_done=c["done"], already_failed=c["failed"])
        if not manifest.is_complete:  # else adopted: completed by a run that died before recording it
            await self._crawl()
            # Page bodies are written without a folder fsync each (storage.write_bytes_atomic);
            # one fsync makes them all durable before the snapshot is declared complete.
            await asyncio.to_thread(self.store.sync_folder, f"{manifest.prefix}/pages")
            manifest.completed_at = utc_now_iso()
            async with self._lock:
                manifest.save(self.store)
        self.progress.category_done()
        c = manifest.counts()
        return CrawlReport(
            category=self.category,
            snapshot_id=manifest.snapshot_id,
            resumed=resumed,
            pages_total=len(manifest.pages),
            pages_done=c["done"],
            pages_failed=c["failed"],
            requests_made=self._requests,
            pages_fetched=self._fetched,
            pages_not_modified=self._not_modified,
            pages_unchanged=self._unchanged,
            bytes_stored=self._bytes,
            products_expected=manifest.products_expected,
            data_version=manifest.data_version,
            duration_s=round(time.monotonic() - started, 3),
            pages_assumed_unchanged=self._assumed,
            sitemap_check=self.sitemap_check,
        )

    def _requeue_lost_bodies(self, manifest: Manifest) -> int:
        """Mark ``pending`` the done pages whose own body is missing; return how many.

        A process crash cannot cause this (bodies are stored before ``done`` is recorded), but
        a power loss can: page bodies are renamed into place without a folder fsync each.
        """
        lost = 0
        for n, entry in manifest.pages.items():
            if entry.status == "done" and entry.body_key is None and not self.store.exists(manifest.page_key(n)):
                # The page was fetched fine: its retry budget starts again.
                entry.status, entry.content_hash, entry.attempts = "pending", None, 0
                manifest.record(self.store, n)
                lost += 1
        return lost

    def _report_repace(self, manifest: Manifest, changes: dict[str, tuple]) -> None:
        self.progress.emit(
            f"{self.category}: snapshot {manifest.snapshot_id} goes on at the pace set now: "
            + ", ".join(f"{key} {was!r} -> {now!r}" for key, (was, now) in changes.items())
        )

    def _report_abandoned(self, stale: Manifest) -> None:
        c = stale.counts()
        self.progress.emit(
            f"{self.category}: not resuming snapshot {stale.snapshot_id}: started {stale.created_at}, more than "
            f"{self.resume_max_age.total_seconds() / 3600:g} h ago ({c['done']} done, {c['pending']} pending); "
            "it stays as it is and a new snapshot starts"
        )

    def _sweep_abandoned(self, manifest: Manifest) -> int:
        """Remove snapshot folders without a manifest (a crash inside a new snapshot's first write)."""
        if not self.store.is_local:
            return 0  # object stores write in one PUT: no temp files to sweep (and no request spent looking)
        partition = f"{manifest.site}/{manifest.category}"
        removed = 0
        for name in snapshot_folders(self.store, manifest.site, manifest.category):
            prefix = f"{partition}/{name}"
            if name != manifest.snapshot_id and not self.store.exists(f"{prefix}/manifest.json"):
                removed += self.store.sweep_temp_files(prefix, prune=True)
        return removed

    # -- discovery ------------------------------------------------------------------------
    async def _crawl(self) -> None:
        manifest = self.manifest
        if manifest.pages[1].status == "pending":
            await self._fetch(1)
        if self.sitemap is not None:
            self._trust_sitemap()  # page 1 is the check: decided (and recorded) for every category
        if manifest.pages[1].status == "done" and not manifest.discovery_complete:
            await self._discover_from_page_one()
        # Fetch whatever is pending (all of 2..N at once, or the next link's page).
        while True:
            pending = sorted(n for n, p in manifest.pages.items() if p.status == "pending")
            if pending and self.sitemap is not None:
                pending = await self._adopt_listed_unchanged(pending)
            if not pending:
                if manifest.discovery_complete:
                    return
                await self._follow_next_links()
                if not any(p.status == "pending" for p in manifest.pages.values()):
                    return
                continue
            # A page's storage error stops its siblings; with page_slots, pages start as slots free up.
            await all_or_cancel((self._fetch(n) for n in pending), slots=self.page_slots, priority=self.slot_priority)
            if not manifest.discovery_complete:
                await self._follow_next_links()

    async def _discover_from_page_one(self) -> None:
        manifest = self.manifest
        pager = self._pager(1)
        manifest.products_expected = pager.results_count
        pattern = self.spec.pagination.page_url
        if pager.total_pages is not None and pattern:
            total = min(pager.total_pages, self.spec.pagination.max_pages)
            if total < pager.total_pages:
                self._warn(f"{self.category}: the site lists {pager.total_pages} pages; the spec's "
                           f"pagination.max_pages stops the crawl at {total}")
            manifest.total_pages = total
            for n in range(2, total + 1):
                manifest.pages.setdefault(n, PageEntry(url=self._page_url(n)))
            manifest.discovery_complete = True
            self._adopt_unchanged_pages()
        elif pager.next_url is None:
            self._warn_dead_next_link(1, pager)
            manifest.total_pages = pager.total_pages or 1
            manifest.discovery_complete = True
        else:
            manifest.total_pages = pager.total_pages
        async with self._lock:
            manifest.save(self.store)
        self.progress.planned(self.category, len(manifest.pages), final=manifest.discovery_complete)

    def _adopt_unchanged_pages(self) -> None:
        """``revalidate: first_page``: page 1 unchanged -> pages 2..N taken from the previous snapshot.

        Only when every page of the previous complete snapshot was done and it had the same
        pages (same URLs, same count); otherwise every page is fetched as usual.
        """
        manifest = self.manifest
        first = manifest.pages[1]
        if self.spec.incremental.revalidate != "first_page" or first.status != "done" or not self._same_as_saved(first):
            return  # page 1 changed (a lost copy stored again is unchanged: same content hash)
        others = sorted(n for n in manifest.pages if n > 1)
        sources = [self._previous.get(manifest.pages[n].url) for n in others]
        if not others or any(source is None for source in sources) or len(sources[0][0].pages) != len(manifest.pages):
            return
        latest = self._previous.get(first.url)
        if latest is None or any(source[0] is not latest[0] for source in sources) or not latest[0].sees_every_page:
            return  # the previous snapshot missed pages (older copies stand in for them): ask every page
        if not all(self._recent(previous.pages[m]) for previous, m in sources):
            return  # a page kept without a request for max_days_without_request: ask every page again
        if not all(self._saved_copy_ok(previous, m) for previous, m in sources):
            return  # a saved copy is lost or cut short: ask every page again
        for n, (previous, m) in zip(others, sources):
            self._adopt(n, previous, m)
        self._assumed += len(others)
        self.progress.pages_adopted(len(others))  # (the caller reports the pages planned)

    def _adopt(self, n: int, previous: Manifest, m: int) -> None:
        """Page ``n`` becomes done as page ``m`` of ``previous``, without a request (``assumed_unchanged``)."""
        old, entry = previous.pages[m], self.manifest.pages[n]
        entry.status, entry.http_status, entry.content_hash = "done", old.http_status, old.content_hash
        entry.bytes, entry.content_type, entry.fetched_at = old.bytes, old.content_type, old.fetched_at
        entry.body_fetched_at = old.body_fetched_at  # (fetched_at is the copy's: its body time holds)
        entry.etag, entry.last_modified, entry.body_key = old.etag, old.last_modified, previous.body_key(m)
        entry.final_url, entry.meta_charset = old.final_url, old.meta_charset
        entry.assumed_unchanged = True
        entry.last_error = entry.retry_at = None  # of an attempt an earlier run made on it

    def _same_as_saved(self, entry: PageEntry) -> bool:
        """Whether a done page holds the content of its saved copy (a 304, the same bytes, or a
        lost copy stored again), by content hash."""
        source = self._previous.get(entry.url)
        return source is not None and entry.content_hash == source[0].pages[source[1]].content_hash

    def _recent(self, old: PageEntry) -> bool:
        """Whether ``old`` (a saved copy) was fetched within ``incremental.max_days_without_request``
        (an adopted page keeps its copy's fetch time, so this bounds how long pages go unasked)."""
        fetched = parse_fetched_at(old.fetched_at)
        limit = timedelta(days=self.spec.incremental.max_days_without_request)
        return fetched is not None and datetime.now(timezone.utc) - fetched <= limit

    def _trust_sitemap(self) -> bool:
        """Whether pages may be adopted on the sitemap's word in this category (decided once,
        recorded in ``sitemap_check`` and the report).

        Page 1 is always revalidated and is the check, so it must be listed with a
        ``lastmod`` ("untrusted: page 1 not dated"); when it came back changed although the
        sitemap dates it no later than the saved copy, the site does not keep ``lastmod``
        current ("untrusted: page 1 changed", with a line saying so). Either way every page of
        the category is revalidated. Also untrusted (nothing to keep) when page 1 failed or
        the category has no earlier complete snapshot.
        """
        if not self.sitemap_check:
            first = self.manifest.pages[1]
            source = self._previous.get(first.url)
            if first.status != "done" or source is None:
                self.sitemap_check = "untrusted: page 1 failed" if first.status != "done" else "untrusted: no saved pages"
            elif not self.sitemap.dated(first.url):
                self.sitemap_check = "untrusted: page 1 not dated"
            else:
                old = source[0].pages[source[1]]
                contradicted = not self._same_as_saved(first) and self.sitemap.unchanged_since(
                    first.url, old.last_modified, old.fetched_at)
                self.sitemap_check = "untrusted: page 1 changed" if contradicted else "trusted"
                if contradicted:
                    self.progress.emit(
                        f"{self.category}: page 1 changed although the sitemap {self.sitemap.url} dates it no later "
                        f"than the saved copy (Last-Modified {old.last_modified}, fetched {old.fetched_at}); its "
                        "lastmod is not trusted for this category: every page is revalidated"
                    )
        return self.sitemap_check == "trusted"

    async def _adopt_listed_unchanged(self, pending: list[int]) -> list[int]:
        """``revalidate: sitemap``: adopt the pending pages the sitemap dates no later than their
        saved copy; return the others (to fetch). Page 1 is never adopted (see :meth:`_trust_sitemap`)."""
        if not self._trust_sitemap():
            return pending
        rest, adopted = [], []
        for n in pending:
            source = self._previous.get(self.manifest.pages[n].url) if n != 1 else None
            if source is not None:
                old = source[0].pages[source[1]]
                if (self._recent(old) and self.sitemap.unchanged_since(old.url, old.last_modified, old.fetched_at)
                        and self._saved_copy_ok(*source)):
                    self._adopt(n, *source)
                    adopted.append(n)
                    continue
            rest.append(n)
        if adopted:
            self._assumed += len(adopted)
            self.progress.pages_adopted(len(adopted))
            async with self._lock:
                if len(adopted) == 1:  # next-link crawls: one page at a time, a journal line each
                    self.manifest.record(self.store, adopted[0])
                else:
                    self.manifest.save(self.store)
        return rest

    async def _follow_next_links(self) -> None:
        """Add the page after the highest done page, from its ``next`` link (next-link mode)."""
        manifest = self.manifest
        last = max(manifest.pages)
        entry = manifest.pages[last]
        if entry.status != "done":
            manifest.discovery_complete = True  # a dead page ends the chain: nothing more to find
        else:
            pager = self._pager(last)
            next_url = pager.next_url
            self._warn_dead_next_link(last, pager)
            if next_url is None or last >= self.spec.pagination.max_pages:
                if next_url is not None:
                    self._warn(f"{self.category}: page {last} has a next link; the spec's pagination.max_pages "
                               "stops the crawl there")
                manifest.discovery_complete = True
            elif not same_origin(next_url, self.fetch_base_url):
                self._warn(f"{self.category}: next link {next_url} leaves the site; not followed")
                manifest.discovery_complete = True
            elif (seen := self._page_at(next_url)) is not None:
                self._warn(f"{self.category}: page {last}'s next link goes back to page {seen} ({next_url}); "
                           "the crawl ends there")
                manifest.discovery_complete = True
            else:
                manifest.pages[last + 1] = PageEntry(url=urldefrag(next_url).url)  # a fragment is never sent
        self.progress.planned(self.category, len(manifest.pages), final=manifest.discovery_complete)
        async with self._lock:
            manifest.save(self.store)

    def _page_at(self, url: str) -> int | None:
        """The page of this snapshot fetched from ``url`` or redirected to it, compared as
        requested (``page-2.html#top`` is page 2, a host's case does not matter); None if none."""
        key = resource_key(url)
        return next((n for n, e in self.manifest.pages.items()
                     if key == resource_key(e.url) or (e.final_url and key == resource_key(e.final_url))), None)

    def _page_url(self, n: int) -> str:
        """URL of listing page ``n``: the spec's ``page_url`` resolved against the start URL
        (as ``urljoin``; the common prefix once per snapshot, see UrlJoiner)."""
        start = self.manifest.start_url
        if self._page_urls is None or self._page_urls.base != start:
            self._page_urls = UrlJoiner(start)
        return self._page_urls(self.spec.pagination.page_url.format(n=n))

    def _previous_pages(self, manifest: Manifest) -> dict[str, tuple[Manifest, int]]:
        """Saved copies by URL (validators and hashes): the done pages of the latest earlier
        complete snapshot; when some of its pages failed (an outage day: failed, or never
        reached), also each other page's newest copy in the complete snapshots before it, so
        the next day still asks with a conditional GET and stores nothing twice, after an
        outage of several days too. At most :data:`PREVIOUS_SNAPSHOTS_SEARCHED` folders are
        read, back to one that saw every page, or to one that neither adds a copy nor failed
        a page still lacking one (the site no longer has those pages): a page failing day
        after day costs up to that many manifest reads a day."""
        known = self._latest
        if isinstance(known, Manifest) and known.is_complete:  # the latest snapshot is the latest complete one
            previous = known
        else:
            previous = latest_manifest(self.store, manifest.site, manifest.category, complete=True)
        if previous is None or previous.snapshot_id == manifest.snapshot_id:
            return {}
        pages = {e.url: (previous, n) for n, e in previous.pages.items() if e.status == "done"}
        lacking = {e.url for e in previous.pages.values() if e.status != "done"}
        if not previous.sees_every_page:  # pages failed (and those its discovery never reached)
            older = [i for i in snapshot_folders(self.store, manifest.site, manifest.category)
                     if snapshot_sort_key(i) < snapshot_sort_key(previous.snapshot_id)]
            for snapshot_id in list(reversed(older))[:PREVIOUS_SNAPSHOTS_SEARCHED]:
                try:
                    earlier = load_manifest(self.store, manifest.site, manifest.category, snapshot_id)
                except ManifestError:  # no manifest (a crash in its first write), or not readable
                    continue
                if not earlier.is_complete:
                    continue
                found = {e.url: (earlier, n) for n, e in earlier.pages.items() if e.status == "done" and e.url not in pages}
                lacking -= found.keys()
                failed_too = any(e.status != "done" and e.url in lacking for e in earlier.pages.values())
                if not found and not failed_too:  # what is lacking is not there at all: gone from the site
                    break
                pages.update(found)
                if earlier.sees_every_page:  # older copies than a complete set are not needed
                    break
        return pages

    async def _list_saved_copies(self) -> None:
        """List the folders holding the saved copies in :attr:`_previous` (one listing each: on
        S3 one request, not one per page), for :meth:`_saved_copy_ok`."""
        folders = {previous.body_key(m).rsplit("/", 1)[0] for previous, m in self._previous.values()}

        def listing() -> dict[str, int]:
            sizes: dict[str, int] = {}
            for folder in sorted(folders):
                try:
                    sizes.update(self.store.list_files(folder))
                except FileNotFoundError:  # pruned, or lost: none of its copies can be reused
                    pass
            return sizes

        self._saved = await asyncio.to_thread(listing) if folders else {}

    def _saved_copy_ok(self, previous: Manifest, m: int) -> bool:
        """Whether page ``m`` of ``previous`` still has its body in storage, of the size recorded:
        a 304, a byte-identical page or an adopted page reuses it, so a copy that was lost or
        cut short (a disk filled up, a hand edit, a pruned snapshot) is fetched again instead."""
        size = self._saved.get(previous.body_key(m))
        recorded = previous.pages[m].bytes
        return size is not None and (recorded is None or size == recorded)

    def _warn_dead_next_link(self, n: int, pager) -> None:
        if pager.next_link_error:
            self._warn(f"{self.category}: page {n}'s next link {pager.next_link_error} cannot be resolved; "
                       "the crawl ends at that page")

    def _pager(self, n: int):
        entry = self.manifest.pages[n]
        body = self.store.read_bytes(self.manifest.body_key(n))
        return parse_pager(body, self.spec, entry.final_url or entry.url, content_type=entry.content_type)

    # -- fetching ---------------------------------------------------------------------------
    def _fail_for_good(self, n: int, reason: str) -> None:
        """Record page ``n`` as failed (it becomes a dead letter) and report it."""
        entry = self.manifest.pages[n]
        entry.status, entry.last_error, entry.retry_at, entry.failed_at = "failed", reason, None, utc_now_iso()
        self.manifest.record(self.store, n)
        self.progress.page_failed(f"{self.category}: page {n} failed for good ({reason}) {entry.url}")

    def _give_back_attempt(self, n: int) -> None:
        """Uncount page ``n``'s last attempt: it ended for a reason of ours, not the site's (storage
        failed, or the crawl was cancelled because another page or category failed)."""
        self.manifest.pages[n].attempts -= 1
        with contextlib.suppress(StorageError):
            self.manifest.record(self.store, n)

    async def _fetch(self, n: int) -> None:
        manifest = self.manifest
        entry = manifest.pages[n]
        if entry.attempts >= self.max_attempts:
            if entry.last_error != STORED_THEN_INTERRUPTED and await asyncio.to_thread(
                    self.store.exists, manifest.page_key(n)):
                # The last attempt was answered and its body stored; the process died before the
                # manifest said done. Asked once more (not twice: a page whose body kills the
                # process every time, in the pager's parse say, still ends failed below).
                entry.attempts -= 1
                entry.last_error = STORED_THEN_INTERRUPTED
            elif (entry.last_error or "").startswith(f"{UNEXPECTED_ERROR} on attempt {entry.attempts}:"):
                # The last allowed attempt ended in an error of ours (recorded below), not in a crash.
                self._fail_for_good(n, f"attempts_exhausted: {entry.last_error}")
                return
            else:
                # The last allowed attempt was in flight when an earlier run died.
                self._fail_for_good(n, "attempts_exhausted: interrupted on the last attempt" + (
                    f" (the one before: {entry.last_error})" if entry.last_error else ""))
                return

        async def on_retry(exc: FetchError, delay_s: float) -> None:
            # Persisted before the back-off: a run resuming after a crash waits out the rest of
            # it, Retry-After included, instead of asking again at once.
            entry.retry_at = retry_time(delay_s)
            entry.last_error = exc.recorded_reason
            entry.http_status = exc.http_status
            manifest.record(self.store, n)
            self.progress.page_retried()

        async def on_attempt(attempt: int) -> None:
            entry.attempts, entry.retry_at = attempt, None  # the wait is over
            try:
                manifest.record(self.store, n)
            except StorageError:
                entry.attempts = attempt - 1  # not sent: storage failed, not the site (nothing counted)
                raise
            self._requests += 1

        previous = self._previous.get(entry.url)
        old = previous[0].pages[previous[1]] if previous else None
        conditional = {}
        if old is not None:  # conditional GET (RFC 9110 §13.1): validators of the saved copy
            if sendable_validator(old.etag):
                conditional["If-None-Match"] = old.etag
            if sendable_validator(old.last_modified):
                conditional["If-Modified-Since"] = old.last_modified
        def get(headers: dict[str, str]):
            return self.fetcher.fetch(
                entry.url, prior_attempts=entry.attempts, on_attempt=on_attempt, headers=headers or None,
                on_attempt_cancelled=lambda _attempt: self._give_back_attempt(n),  # in flight when cancelled
                on_retry=on_retry, wait_s=seconds_until(entry.retry_at),
                # The copy's validators go to the URL it came from (its redirect target), no other (RFC 9110 §15.4).
                validators_url=(old.final_url or old.url) if headers else None,
            )

        tag_of_304 = None  # the ETag of a 304 refused below, for a page whose 200s carry none
        try:
            page = await get(conditional)
            if page.http_status == 304 and conditional:
                unusable = validators_differ(page.headers, old) or (
                    None if self._saved_copy_ok(*previous) else "the saved copy is missing or cut short")
                if unusable:
                    # RFC 9111 §4.3.4: a 304 that does not identify the saved copy, or a copy we no
                    # longer have, cannot be reused: ask for the page whole (this attempt is given back).
                    logger.info("%s: page %d: 304 not usable (%s); fetching it whole", self.category, n, unusable)
                    self._give_back_attempt(n)
                    conditional, refused = {}, page
                    page = await get(conditional)
                    # Its tag names what this 200 sent only if nothing changed in between: same
                    # URL and same Last-Modified (a deploy between the two moves it).
                    modified = refused.headers.get("last-modified")
                    if refused.final_url == page.final_url and modified and modified == page.headers.get("last-modified"):
                        tag_of_304 = refused.headers.get("etag")
        except FetchError as exc:
            entry.http_status = exc.http_status
            self._fail_for_good(n, exc.recorded_reason)
            return
        except StorageError:
            raise  # its attempt was given back (on_attempt, or the body's write)
        except Exception as exc:
            # Not the site's answer: a bug, ours or a library's, while the attempt was out. The
            # step fails (its RetryPolicy tries again); the attempt still counts, so a page whose
            # answer makes this happen every time ends a dead letter instead of failing every
            # run, and its reason keeps what happened ("attempts_exhausted: unexpected_error on attempt 3: ...").
            entry.last_error = f"{UNEXPECTED_ERROR} on attempt {entry.attempts}: {exception_text(exc)}"
            with contextlib.suppress(StorageError):
                manifest.record(self.store, n)
            raise
        content_hash = old.content_hash if page.http_status == 304 else "sha256:" + hashlib.sha256(page.body).hexdigest()
        same = old is not None and content_hash == old.content_hash and (
            page.http_status == 304 or self._saved_copy_ok(*previous))  # else the new body is stored
        # No saved copy under this URL (SCRAPE_BASE_URL now names a mirror, or the site again, so
        # every page's URL changed): a copy of the same bytes under another URL spares storing it.
        twin = None if old is not None else next(
            (copy for copy in self._by_hash.get(content_hash, ()) if self._saved_copy_ok(*copy)), None)
        if same or twin:
            # Not modified (304) or byte-identical: point at the stored body, store nothing.
            source = previous if same else twin
            entry.body_key = source[0].body_key(source[1])
            entry.bytes = source[0].pages[source[1]].bytes
            # Products keep the time their body was fetched: confirming it moves only fetched_at.
            entry.body_fetched_at = source[0].pages[source[1]].body_fetched_time
            # A 304 may omit the metadata; a 200's is the representation's (a corrected charset
            # label on the same bytes changes how they read: RFC 9110 §8.3).
            entry.content_type = old.content_type if page.http_status == 304 else page.headers.get("content-type")
            entry.meta_charset = old.meta_charset if page.http_status == 304 else _meta_charset(page.body, entry.content_type)
            entry.not_modified = page.http_status == 304
            self._not_modified += entry.not_modified
            self._unchanged += not entry.not_modified
        else:
            # Body first, then the manifest: a crash in between costs one refetch, never a lie.
            try:
                entry.bytes = await asyncio.to_thread(
                    self.store.write_bytes_atomic, manifest.page_key(n), page.body, sync_folder=False
                )
            except (StorageError, asyncio.CancelledError):
                # Storage failed (or the crawl was cancelled), not the site: give the attempt back, so
                # an outage that outlasts the step's retries fails the run instead of dead-lettering
                # the page "attempts_exhausted". A process killed outright cannot, and counts it.
                self._give_back_attempt(n)
                raise
            crashpoint("crawl.after_body_write")
            entry.body_key = entry.body_fetched_at = None
            entry.content_type = page.headers.get("content-type")
            entry.meta_charset = _meta_charset(page.body, entry.content_type)
            self._bytes += entry.bytes
        entry.status = "done"
        entry.http_status = page.http_status
        entry.final_url = page.final_url if page.redirected else None
        entry.content_hash = content_hash
        entry.fetched_at = utc_now_iso()
        entry.last_error = entry.retry_at = None
        # The response's validators; the saved copy's only for the same content (a 304 may omit
        # them). One that cannot be sent back as a header (non-ASCII) is not kept. A server whose
        # 304s carry an ETag its 200s lack (nginx before 1.7.3 with gzip on): the refused 304's
        # tag, which named what the 200 just after it sent, so the next day's 304 can be reused.
        entry.etag = sendable_validator(page.headers.get("etag") or (old.etag if same else None) or tag_of_304)
        entry.last_modified = sendable_validator(page.headers.get("last-modified") or (old.last_modified if same else None))
        self._fetched += 1
        manifest.record(self.store, n)
        self.progress.page_done()


def _rate(per_second: float) -> str:
    """A rate for a progress line: whole numbers from 10 up, one decimal below (a slow,
    rate-limited crawl's 0.4 pages/s is not "0")."""
    return f"{per_second:,.0f}" if per_second >= 9.95 else f"{per_second:.1f}".removesuffix(".0")


def _meta_charset(body: bytes, content_type: str | None) -> str | None:
    """:attr:`PageEntry.meta_charset` of a page: looked for only when its header names no
    charset (then the ``<meta>`` decides how it reads)."""
    return None if header_charset(content_type) else meta_declared_codec(body)


async def load_run_sitemap(
    spec: SiteSpec, fetcher: PageFetcher, fetch_base_url: str, emit: ProgressCallback,
    warn: ProgressCallback | None = None, copies: SitemapCopies | None = None,
) -> Sitemap:
    """The run's sitemap for ``incremental.revalidate: sitemap``; when it cannot be used, an
    empty one whose ``error`` says why (and a line to ``warn``): give no page its word then.

    Which sitemap: ``spec.incremental.sitemap`` when the spec names one; else the
    ``Sitemap:`` lines of the site's robots.txt (read anyway when ``obey_robots_txt``: no
    extra request) that are on the fetch origin or the spec's (a mirror serves the site's
    own: fetched from ``fetch_base_url``), read together as one index; else ``sitemap.xml``.
    Fetched through the run's fetcher (robots.txt, limits and retries apply); its entries
    may name the fetch origin or the spec's. A sitemap that cannot be fetched or read is not
    an error: every page is then revalidated with a conditional GET, as with
    ``every_page``; that line goes to ``warn``. With ``copies``, documents kept by the
    previous run are asked for with a conditional GET.
    """
    started = time.monotonic()
    urls = [urljoin(fetch_base_url, spec.incremental.sitemap)]
    if "sitemap" not in spec.incremental.model_fields_set and fetcher.policy.obey_robots_txt:
        robots_url = robots_url_for(fetch_base_url)
        listed = [urljoin(robots_url, u) for u in  # a relative line: on the robots.txt's origin
                  await fetcher.robots.sitemaps(fetcher.client, fetch_base_url, fetcher.policy.user_agent)]
        on_site = list(dict.fromkeys(u for u in (_on_fetch_origin(u, fetch_base_url, spec.base_url) for u in listed) if u))
        if on_site:
            urls = on_site
        if len(on_site) < len(listed):
            emit(f"robots.txt Sitemap: lines on another origin than the site's ignored: "
                 f"{', '.join(u for u in listed if not _on_fetch_origin(u, fetch_base_url, spec.base_url))}")
    url = " ".join(urls)
    # Same client, limiter and robots.txt cache; only the body cap is the protocol's (50 MB), not a page's.
    reader = PageFetcher(fetcher.client, dataclasses.replace(fetcher.policy, max_body_bytes=MAX_SITEMAP_BYTES),
                         limiter=fetcher.limiter, robots=fetcher.robots)
    try:
        sitemap = await load_sitemap(reader, urls, origins=[origin_host(spec.base_url)], copies=copies)
    except SitemapError as exc:
        (warn or emit)(f"{exc}: not used, every page is revalidated with a conditional GET")
        return Sitemap(url=url, error=exc.reason, requests=exc.requests)
    emit(
        f"sitemap {url}: {sitemap.urls:,} URLs, {len(sitemap.lastmod):,} with lastmod"
        + (f", {sitemap.skipped:,} entries or child sitemaps skipped (another origin, over the limit)"
           if sitemap.skipped else "")
        + f"; {sitemap.requests:,} request{'s' if sitemap.requests != 1 else ''}"
        + (f" ({sitemap.not_modified:,} not modified: 304, read from the kept copy)" if sitemap.not_modified else "")
        + f", {time.monotonic() - started:.1f}s"
    )
    return sitemap


def _on_fetch_origin(url: str, fetch_base_url: str, site_base_url: str) -> str | None:
    """``url`` (a robots.txt ``Sitemap:`` line, resolved against the robots.txt URL) as
    fetched: unchanged on the fetch origin; on the site's origin (a mirror serves the site's
    own), moved onto ``fetch_base_url`` (under the base URL's path: the same path below the
    mirror's; elsewhere: that path on the mirror's origin); else None. Origins compare as
    RFC 6454 says (host case and a default port do not matter)."""
    if same_origin(url, fetch_base_url):
        return url
    if not same_origin(url, site_base_url):
        return None
    parts, site = urlsplit(url), urlsplit(site_base_url)
    rest = parts.path + (f"?{parts.query}" if parts.query else "")
    if parts.path.startswith(site.path):
        return fetch_base_url + rest[len(site.path):]
    return urljoin(fetch_base_url, rest)


def sitemap_checks_line(reports: list[CrawlReport]) -> str | None:
    """One line on the categories whose pages were not adopted on the sitemap's word, and why
    (None when every category with saved pages trusted it, or the run did not use a sitemap)."""
    untrusted: dict[str, list[str]] = {}
    for r in reports:
        if r.sitemap_check.startswith("untrusted: page 1 ") and r.sitemap_check != "untrusted: page 1 failed":
            untrusted.setdefault(r.sitemap_check.removeprefix("untrusted: "), []).append(r.category)
    if not untrusted:
        return None
    parts = [f"{reason} in {len(keys)} ({', '.join(keys[:5])}{', ...' if len(keys) > 5 else ''})"
             for reason, keys in sorted(untrusted.items())]
    return "sitemap not used for some categories, every page of them revalidated: " + "; ".join(parts)


async def all_or_cancel(coros, on_other_error: Callable[[BaseException], None] | None = None, *,
                        slots: PageSlots | None = None, priority: int = 0) -> list | None:
    """Run ``coros`` concurrently and return their results in order; if one raises, cancel
    the others, wait until they have stopped, and raise the error that set this off (the first
    in ``coros`` order among those that had failed by then).

    With ``slots``, each coroutine is made and started only when one of the run's page slots
    is free (``priority``: the category's place in the run), none is started after one has
    failed, and the results are not kept: returns None (:func:`~scrape_assets.page_slots.run_within`).

    ``asyncio.gather`` would leave the others running after the first error (here: fetching
    through a client about to close, recording pages failed that the site never refused);
    ``asyncio.TaskGroup`` needs Python 3.11. The other errors go to ``on_other_error``.
    """
    if slots is not None:
        await run_within(slots, priority, coros, on_other_error)
        return None
    tasks = [asyncio.ensure_future(c) for c in coros]
    if not tasks:
        return []
    done: set = set()
    try:
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
    finally:  # also when this coroutine is cancelled: nothing is left running behind it
        for task in tasks:  # retrieved: when this is cancelled, no "exception was never retrieved"
            if task.done() and not task.cancelled():
                task.exception()
        pending = [task for task in tasks if not task.done()]
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
    # The errors that set off the cancelling first, then those raised while being cancelled.
    ordered = sorted(tasks, key=lambda task: task not in done)
    errors = [task.exception() for task in ordered if not task.cancelled() and task.exception() is not None]
    if errors:
        for other in errors[1:]:
            if on_other_error is not None:
                on_other_error(other)
        raise errors[0]
    return [task.result() for task in tasks]
