"""``raw_pages``: one snapshot of a category's listing pages, saved with its manifest."""


import asyncio
import hashlib
import threading
import time
from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

import dagster as dg
import sqlalchemy as sa
from pydantic import Field

from scrape_assets.batched_log import BatchedLog
from scrape_assets.counts import counted
from scrape_assets.defs.assets.partition_metadata import add_per_category
from scrape_assets.defs.partitions import category_partitions, run_categories
from scrape_assets.defs.pools import configured_host_pool
from scrape_assets.defs.resources import ObjectStoreResource, SiteResource, WarehouseResource
from scrape_assets.errors import (
    FetchConfigChangedError,
    ManifestError,
    MissingBucketError,
    PartitionLockedError,
    SettingsError,
    SpecError,
    StorageError,
)
from scrape_assets.gc_tuning import freeze_again
from scrape_assets.interrupts import CrawlInterrupted, run_interruptible
from scrape_assets.manifest import Manifest, has_snapshot, latest_manifest, resume_conflict
from scrape_assets.run_processes import tag_run_process
from scrape_assets.storage import refusal
from scrape_assets.warehouse import may_recover

if TYPE_CHECKING:  # the HTTP stack (httpx, aiohttp) is imported by the step, not with the definitions
    from scrape_assets.crawl import CrawlReport
    from scrape_assets.sitemap import Sitemap

# Crashes and infrastructure errors (storage unwritable, process killed) retry the step;
# the retry resumes the snapshot from its manifest. Page failures never reach here, and
# an interrupt (Terminate, SIGTERM, Ctrl-C) is not retried: it stops the crawl.
RAW_PAGES_RETRY_POLICY = dg.RetryPolicy(
    max_retries=3, delay=2.0, backoff=dg.Backoff.EXPONENTIAL, jitter=dg.Jitter.PLUS_MINUS
)


#: Why raw_pages stopped when its run was terminated or its process interrupted.
INTERRUPTED = ("interrupted (the run was terminated, by hand or at its dagster/max_runtime, or its process got "
               "SIGTERM or Ctrl-C): stopped fetching; the next run resumes the snapshot where it stopped")


class RawPagesConfig(dg.Config):
    """Run config of ``raw_pages``."""

    new_snapshot: bool = Field(
        default=False,
        description="start a new snapshot even if the latest one is incomplete (required after a fetch-config change)",
    )


def _of_them_this_run(done: int, this_run: int) -> str:
    """``", 20 of them this run"`` after "38 done" when a resumed snapshot's other pages were
    done by an earlier run (the 304s, requests and bytes said next are this run's); else ``""``."""
    return f", {this_run:,} of them this run" if this_run != done else ""


def crawl_metadata(reports: list["CrawlReport"], sitemap: "Sitemap | None" = None) -> tuple[dict, dict[str, dict]]:
    """Materialization metadata: ``(run totals, {category: its figures})``.

    The totals go on every partition's materialization, each category's figures only on its
    own (``by_category``, see :mod:`.partition_metadata`); the collapse sensor reads both.
    """
    done = sum(r.pages_done for r in reports)
    failed = sum(r.pages_failed for r in reports)
    expected = [r.products_expected for r in reports if r.products_expected is not None]
    by_category = {
        r.category: {
            "snapshot_id": r.snapshot_id,
            "resumed": r.resumed,
            "pages_done": r.pages_done,
            "pages_failed": r.pages_failed,
            "requests_made": r.requests_made,
            "pages_not_modified": r.pages_not_modified,
            "pages_unchanged": r.pages_unchanged,
            "pages_assumed_unchanged": r.pages_assumed_unchanged,
            **({"sitemap_check": r.sitemap_check} if r.sitemap_check else {}),
            "data_version": r.data_version,
            "success_rate": round(r.success_rate, 4),
            "products_expected": r.products_expected,
            "bytes_stored": r.bytes_stored,
            "duration_s": r.duration_s,
        }
        for r in reports
    }
    return {
        "pages_done": done,
        "pages_failed": failed,
        "pages_attempted": done + failed,
        "requests_made": sum(r.requests_made for r in reports),
        "pages_not_modified": sum(r.pages_not_modified for r in reports),
        "pages_unchanged": sum(r.pages_unchanged for r in reports),
        "pages_assumed_unchanged": sum(r.pages_assumed_unchanged for r in reports),
        "success_rate": round(done / (done + failed), 4) if done + failed else 1.0,
        "products_expected": sum(expected) if expected else None,
        "bytes_stored": sum(r.bytes_stored for r in reports),
        "duration_s": round(max((r.duration_s for r in reports), default=0.0), 3),
        "categories": len(reports),
        **({"sitemap_requests": sitemap.requests, "sitemap_not_modified": sitemap.not_modified,
            "sitemap_urls_dated": len(sitemap.lastmod)} if sitemap else {}),
        **({"sitemap_error": f"{sitemap.url}: {sitemap.error}"} if sitemap and sitemap.error else {}),
    }, by_category


def run_data_version(reports: list["CrawlReport"]) -> dg.DataVersion:
    """The Dagster data version: derived from the pages' content hashes, so an unchanged
    crawl keeps the version and downstream assets stay up to date in the UI.

    A run covering several categories records one version for all of them (Dagster
    gives a single-run backfill one output); each partition's own version is in its
    ``by_category`` entry.
    """
    if len(reports) == 1:
        return dg.DataVersion(reports[0].data_version)
    digest = hashlib.sha256("|".join(f"{r.category}={r.data_version}" for r in sorted(reports, key=lambda r: r.category)).encode())
    return dg.DataVersion(digest.hexdigest()[:24])


def storage_refused(exc: StorageError) -> bool:
    """Whether no retry can make ``exc`` (object storage unusable) pass.

    True for a refusal (no permission: ``PermissionError``, which s3fs also raises for S3's
    AccessDenied; a read-only file system), a path that cannot become a folder (a file in
    the way: ENOTDIR, EEXIST), a missing filesystem driver (s3fs not installed) and a
    missing bucket. Anything else (a remote store not answering, a full disk being cleaned)
    may pass: False.
    """
    return isinstance(exc, MissingBucketError) or refusal(exc.__cause__)


class InterruptedRunSnapshots:
    """``adopt_complete`` for :func:`~scrape_assets.manifest.open_snapshot`: whether a complete
    snapshot was finished by a run of this instance that died before recording ``raw_pages``
    for its partition (killed, or the step failed on another category).

    A run covering several categories completes them one by one but records them together at
    the end; its restart (or step retry) adopts such snapshots instead of fetching them again.
    Recorded means: the run succeeded (its ``raw_pages`` step recorded every category it
    completed), or the partition's latest ``raw_pages`` materialization names this snapshot
    in ``by_category``. Never adopted: a snapshot of a run this instance does not know, or
    when the latest materialization cannot tell which snapshot it recorded.

    One instance serves one step: each run's status is asked once (a daily run asks about
    100 categories completed by the same earlier run), and the materialization only when
    that run did not succeed.
    """

    def __init__(self, instance: dg.DagsterInstance):
        self.instance = instance
        self._status: dict[str, dg.DagsterRunStatus | None] = {}

    def run_status(self, run_id: str) -> dg.DagsterRunStatus | None:
        """The run's status, ``None`` for a run this instance does not know (asked once per run)."""
        if run_id not in self._status:
            run = self.instance.get_run_by_id(run_id)
            self._status[run_id] = run.status if run is not None else None
        return self._status[run_id]

    def __call__(self, manifest: Manifest) -> bool:
        status = self.run_status(manifest.run_id) if manifest.run_id is not None else None
        if status is None or status == dg.DagsterRunStatus.SUCCESS:
            return False
        records = self.instance.fetch_materializations(
            dg.AssetRecordsFilter(asset_key=dg.AssetKey("raw_pages"), asset_partitions=[manifest.category]), limit=1
        ).records
        if not records:
            return True
        by_category = records[0].asset_materialization.metadata.get("by_category")
        recorded = (by_category.value if by_category is not None else {}).get(manifest.category, {}).get("snapshot_id")
        return recorded is not None and recorded != manifest.snapshot_id


async def crawl_partitions(
    site: SiteResource, store: ObjectStoreResource, categories: list[str], *, new_snapshot: bool, log,
    run_id: str | None = None, adopt_complete: Callable[[Manifest], bool] | None = None,
    on_sitemap: Callable[["Sitemap"], None] | None = None, reexecuted_run_ids: Collection[str] = (),
) -> list["CrawlReport"]:
    """Crawl several categories concurrently, sharing one client and the per-host limits.

    Before any snapshot is opened, every category's incomplete snapshot is checked against
    this run's fetch config (unless ``new_snapshot``): a change stops the run untouched,
    naming every category it concerns. When one category's crawl fails, its other pages
    and the other categories are cancelled before the client closes (:func:`all_or_cancel`):
    their pages stay pending, an attempt whose request was out given back, and are fetched
    again on resume instead of being recorded as failures of the closed client.

    With ``incremental.revalidate: sitemap``, the site's sitemap is read once for all the
    categories (only when some category has saved pages) and given to ``on_sitemap``.

    Raises:
        FetchConfigChangedError: the first category whose incomplete snapshot has another
            fetch config (the log names all of them).
    """
    # Here, not at module level: processes that load the definitions but never fetch (sensors,
    # the UI's code server, re-parse backfills) do not import httpx and aiohttp (~0.1-0.2 s).
    from scrape_assets.crawl import CrawlProgress, PartitionCrawler, all_or_cancel, load_run_sitemap, sitemap_checks_line
    from scrape_assets.fetcher import PageFetcher
    from scrape_assets.page_slots import PageSlots, slots_for
    from scrape_assets.sitemap import SitemapCopies

    freeze_again()  # what these imports brought, out of the collector's way like the rest of the code
    spec = site.spec()
    fetch_config, fetch_base_url = site.fetch_config(), site.fetch_base_url()  # parse the spec once, not per category
    object_store = store.store()  # proven writable by raw_pages before its locks (ensure_writable)
    # Read once here, before any snapshot is opened (raw_pages holds the partition locks; on
    # S3 the host pool keeps runs apart): the preflight, opening the snapshot and, when it
    # is complete, revalidating its pages all use this read (one manifest GET, not three).
    # A corrupt manifest stops the run here, before any category's snapshot is opened.
    latest = {category: latest_manifest(object_store, spec.name, category) for category in categories}
    if not new_snapshot:
        conflicts = [c for c in (resume_conflict(object_store, site=spec.name, category=category, fetch_config=fetch_config,
                                                 resume_max_age=store.resume_max_age(), latest=latest[category],
                                                 start_url=spec.start_url(category, fetch_base_url))
                                 for category in categories) if c]
        if conflicts:
            if len(conflicts) > 1:
                log.error(f"{len(conflicts)} categories have an incomplete snapshot fetched with another config: "
                          + "; ".join(f"{c.location} ({', '.join(c.differing_keys)})" for c in conflicts))
            raise conflicts[0]
    policy = site.fetch_policy()
    # At most slots_for(c) pages holding a slot (~4.5 KB each) and as many backing off, not
    # every page found. robots.txt's retries sleep plainly: that fetch holds its origin's
    # lock, which pages started in its place would wait for (a deadlock on resume).
    page_slots = PageSlots(slots_for(policy.max_concurrency))
    async with site.client() as client:
        fetcher = PageFetcher(client, policy, sleep=page_slots.sleep, robots_sleep=asyncio.sleep, warn=log.warning)
        with _host_handoff(object_store, fetcher.limiter, fetch_base_url, policy, log):
            progress = CrawlProgress(len(categories), log.info, warn=log.warning)
            # revalidate: sitemap: read once for every category, and only when some category has
            # saved pages to keep (a first run fetches everything anyway).
            sitemap = None
            if spec.incremental.revalidate == "sitemap" and any(m is not None for m in latest.values()):
                loaded = await load_run_sitemap(spec, fetcher, fetch_base_url, log.info, log.warning,
                                                copies=SitemapCopies(object_store, f"{spec.name}/sitemap.copies"))
                if on_sitemap is not None:
                    on_sitemap(loaded)
                sitemap = None if loaded.error else loaded
            elif spec.incremental.revalidate == "sitemap":
                log.info("sitemap not fetched: no category has saved pages yet (a first run asks every page)")
            crawlers = [
                PartitionCrawler(
                    spec,
                    category,
                    object_store,
                    fetcher,
                    fetch_config=fetch_config,
                    fetch_base_url=fetch_base_url,
                    max_attempts=site.max_attempts,
                    run_id=run_id,
                    reexecuted_run_ids=reexecuted_run_ids,
                    adopt_complete=adopt_complete,
                    resume_max_age=store.resume_max_age(),
                    progress=progress,
                    warn=log.warning,
                    latest=latest.pop(category),  # the crawler drops it once its snapshot is open
                    sitemap=sitemap,
                    page_slots=page_slots,
                    slot_priority=priority,
                )
                for priority, category in enumerate(categories)
            ]
            try:  # a crawl failing stops the others before the client closes
                reports = await all_or_cancel(
                    (c.run(new_snapshot=new_snapshot) for c in crawlers),
                    on_other_error=lambda e: log.error(f"another category's crawl failed too: {type(e).__name__}: {e}"),
                )
                if sitemap is not None and (line := sitemap_checks_line(reports)):
                    log.warning(line)
                return reports
            finally:
                object_store.close()  # journals of snapshots left incomplete


@contextmanager
def _host_handoff(object_store, limiter, fetch_base_url: str, policy, log) -> Iterator[None]:
    """Keep the site host's rate and a Retry-After pause across runs: the first request waits
    for the gap after the previous run's last one (or for its pause to end), and this run's
    last request (its pause) is recorded for the next, even when the crawl fails. The run
    holds the host lock (or pool) meanwhile, so runs hand the host over one to the next."""
    import httpx

    from scrape_assets.locks import read_host_handoff, write_host_handoff

    host = httpx.URL(fetch_base_url).host  # as the limiter keys it (lower case, IDNA)
    if (handoff := read_host_handoff(object_store, fetch_base_url)) is not None:
        waited = limiter.take_over(host, handoff, now=time.time(),
                                   max_wait_s=1.0 / policy.requests_per_second + policy.retry_after_max_s)
        if waited >= 0.01:
            log.info(f"{host}: first request in {waited:.2f} s: the previous run on this host asked it last, or was "
                     "told to pause (Retry-After), this long before the gap it asks is over")

    errors: list[BaseException] = []

    def record() -> None:  # in the writer's thread
        try:
            if (handoff := limiter.handoff(host)) is not None:
                write_host_handoff(object_store, fetch_base_url, handoff)
        except Exception as exc:  # noqa: BLE001 - the pages are stored; the next run just does not wait
            errors.append(exc)

    # A pause is recorded when it begins too: a run killed during it (SIGKILL, out of memory)
    # gets no finally, and the next run must not ask the host inside it. In a thread of its
    # own: a slow or hanging store must not stall the crawl's event loop (and with it the
    # signal that stops it); the state written is the latest, however many pauses asked.
    writer = _LatestWriter(record)
    limiter.on_pause = lambda paused: writer.request() if paused == host else None
    try:
        yield
    finally:
        limiter.on_pause = None
        if not writer.close(HANDOFF_WRITE_WAIT_S):  # a hanging store: the run ends anyway
            log.warning(f"{host}: this run's last request and pause were not recorded for the next run within "
                        f"{HANDOFF_WRITE_WAIT_S:.0f} s (is the storage answering?)")
        for exc in errors[:1]:
            log.warning(f"{host}: could not record this run's last request and pause for the next run "
                        f"({type(exc).__name__}: {exc})")


#: Seconds the end of a crawl waits for the host handoff's last write (then gives up, saying so).
HANDOFF_WRITE_WAIT_S = 10.0


class _LatestWriter:
    """Runs ``write`` in a daemon thread whenever :meth:`request` asks, the requests that arrive
    during a write coalesced into one more (the state written is the latest), and once more
    at :meth:`close`."""

    def __init__(self, write: Callable[[], None]):
        self._write, self._wanted, self._closing = write, threading.Event(), False
        self._thread = threading.Thread(target=self._run, name="host-handoff", daemon=True)
        self._thread.start()

    def request(self) -> None:
        self._wanted.set()

    def close(self, timeout_s: float) -> bool:
        """Write the latest state once more and wait for it, at most ``timeout_s``; whether it
        finished (if not, the write under way may still land; none starts after it)."""
        self._closing = True
        self._wanted.set()
        self._thread.join(timeout_s)
        self._abandoned = self._thread.is_alive()
        return not self._abandoned

    _abandoned = False

    def _run(self) -> None:
        while True:
            self._wanted.wait()
            self._wanted.clear()  # before reading _closing: a close from here on sets it again
            closing = self._closing
            try:
                self._write()
            except Exception:  # noqa: BLE001, S110 - the writer must outlive a write (record logs its errors)
                pass
            if self._abandoned or (closing and not self._wanted.is_set()):
                return




@dg.asset(
    partitions_def=category_partitions,
    backfill_policy=dg.BackfillPolicy.single_run(),
    retry_policy=RAW_PAGES_RETRY_POLICY,
    pool=configured_host_pool(),
    group_name="scrape",
    kinds={"python", "html"},
)
def raw_pages(
    context: dg.AssetExecutionContext, config: RawPagesConfig, site: SiteResource, store: ObjectStoreResource,
    warehouse: WarehouseResource,
):
    """One snapshot of a category's listing pages: raw HTML + manifest in object storage.

    Fetches politely (robots.txt, per-host rate/concurrency, retries with backoff and
    Retry-After), resumes an interrupted snapshot, never fails for a dead page. Before any
    request it checks object storage takes a write (a refusal of the OS, e.g. a read-only
    folder, fails once, not retried) and the warehouse is not another site's (its load
    would be refused). Terminate, SIGTERM or Ctrl-C stop it (see :data:`INTERRUPTED`).
    """
    try:
        return _raw_pages(context, config, site, store, warehouse)
    except (dg.DagsterExecutionInterruptedError, KeyboardInterrupt, CrawlInterrupted) as exc:
        # Dagster retries an interrupted step that has a RetryPolicy (op_execution_error_boundary),
        # so the crawl would go on fetching: stop, whichever part of the step the signal met.
        raise dg.Failure(description=INTERRUPTED, allow_retries=False) from exc


def _tag_process(context: dg.AssetExecutionContext) -> None:
    """Tag the run with the process running it (:data:`~scrape_assets.run_processes.PROCESS_TAG`;
    the run's own: steps run in process) unless it has it: killed, the run stays "started"
    holding its host's pool slot, and the next demo or the daemon's ``dead_run_sensor`` can
    then tell it is dead (:func:`~scrape_assets.run_processes.fail_dead_runs`). The project's
    executor tags runs before their first step (:mod:`scrape_assets.defs.executor`); this
    covers ``execute_in_process`` runs (``materialize()`` from Python), which replace it."""
    tag_run_process(context.instance, context.run)


def _raw_pages(
    context: dg.AssetExecutionContext, config: RawPagesConfig, site: SiteResource, store: ObjectStoreResource,
    warehouse: WarehouseResource,
) -> dg.MaterializeResult:
    _tag_process(context)
    categories = run_categories(context)
    try:
        store.store().ensure_writable()  # one probe object: before any lock, request or warehouse
    except StorageError as exc:
        raise dg.Failure(description=f"{exc}; nothing fetched", allow_retries=not storage_refused(exc)) from exc
    try:
        name = site.spec().name  # (a spec edited since the definitions loaded: SpecError, below)
        wh = warehouse.warehouse()
        try:
            with wh:
                # Before any request: its load would be refused (claim_site's checks, reading only).
                wh.check_site(name, owns=has_snapshot(store.store(), name))
        except sa.exc.SQLAlchemyError as exc:
            # Down, locked, unreachable: the RetryPolicy tries again. A file that is not a
            # database, tables of another shape, a refused login: no retry helps (may_recover).
            raise dg.Failure(description=f"{wh.unreadable(exc)}; nothing fetched",
                             allow_retries=may_recover(exc)) from exc
        context.log.info(
            f"fetching {counted(len(categories), 'category')} from {site.describe_route()}"
        )
        sitemaps = []
        with store.locks(context, name), store.host_lock(context, site.fetch_base_url()):
            reports = run_interruptible(  # a signal cancels the crawl (asyncio.run could drop Dagster's interrupt)
                crawl_partitions(
                    site, store, categories, new_snapshot=config.new_snapshot, log=context.log, run_id=context.run_id,
                    adopt_complete=InterruptedRunSnapshots(context.instance), on_sitemap=sitemaps.append,
                    reexecuted_run_ids=[r for r in (context.run.parent_run_id, context.run.root_run_id) if r],
                )
            )
    except (FetchConfigChangedError, ManifestError, SpecError, SettingsError, PartitionLockedError) as exc:
        # Retrying cannot fix these (a manifest of another format or not JSON reads the same
        # next time): fail once, with the message that says what to do.
        raise dg.Failure(description=str(exc), allow_retries=False) from exc
    except StorageError as exc:
        if not storage_refused(exc):
            # A store not answering, a full disk: the RetryPolicy tries again. Said at WARNING:
            # Dagster logs the retry itself at DEBUG only, so an INFO log would show the step
            # starting again and again with no reason until its last attempt fails.
            if context.retry_number < RAW_PAGES_RETRY_POLICY.max_retries:
                context.log.warning(f"{exc}: the step tries again (retry {context.retry_number + 1} of "
                                    f"{RAW_PAGES_RETRY_POLICY.max_retries}; the snapshots resume where they stopped)")
            raise
        # A folder of one category this process may not write (another user's, read-only):
        # the same next time. The snapshots resume once it is fixed.
        raise dg.Failure(description=f"{exc}: no retry changes a refusal; the next run resumes the snapshots",
                         allow_retries=False) from exc
    log = BatchedLog(context.log.info)
    for r in reports:
        log.add(
            f"{r.category}: snapshot {r.snapshot_id}{' (resumed)' if r.resumed else ''}: "
            f"{r.pages_done:,} done{_of_them_this_run(r.pages_done, r.pages_fetched + r.pages_assumed_unchanged)} "
            f"({r.pages_not_modified:,} not modified: 304"
            + (f", {r.pages_assumed_unchanged:,} kept without a request" if r.pages_assumed_unchanged else "")
            + f"), {r.pages_failed:,} failed, "
            f"{counted(r.requests_made, 'request')}, {r.duration_s:.1f}s"
        )
    metadata, by_category = crawl_metadata(reports, sitemaps[0] if sitemaps else None)
    add_per_category(context, {"by_category": by_category}, {
        name: {c: row[name] for c, row in by_category.items()}
        for name in ("success_rate", "pages_done", "pages_failed", "requests_made")})
    this_run = sum(r.pages_fetched + r.pages_assumed_unchanged for r in reports)
    log.close(
        f"{counted(len(reports), 'category')}: {counted(metadata['pages_done'], 'page')} done"
        f"{_of_them_this_run(metadata['pages_done'], this_run)} ({metadata['pages_not_modified']:,} not modified: 304), "
        f"{metadata['pages_failed']:,} failed, {counted(metadata['requests_made'], 'request')}"
    )
    return dg.MaterializeResult(metadata=metadata, data_version=run_data_version(reports))
