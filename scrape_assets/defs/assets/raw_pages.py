"""``raw_pages``: one snapshot of a category's listing pages, saved with its manifest."""


import asyncio

import dagster as dg
from pydantic import Field

from scrape_assets.crawl import CrawlReport, PartitionCrawler
from scrape_assets.defs.partitions import category_partitions
from scrape_assets.defs.pools import configured_host_pool
from scrape_assets.defs.resources import ObjectStoreResource, SiteResource
from scrape_assets.errors import FetchConfigChangedError, PartitionLockedError, SettingsError, SpecError
from scrape_assets.fetcher import PageFetcher

# Crashes and infrastructure errors (storage unwritable, process killed) retry the step;
# the retry resumes the snapshot from its manifest. Page failures never reach here.
RAW_PAGES_RETRY_POLICY = dg.RetryPolicy(
    max_retries=3, delay=2.0, backoff=dg.Backoff.EXPONENTIAL, jitter=dg.Jitter.PLUS_MINUS
)


class RawPagesConfig(dg.Config):
    """Run config of ``raw_pages``."""

    new_snapshot: bool = Field(
        default=False,
        description="start a new snapshot even if the latest one is incomplete (required after a fetch-config change)",
    )


def crawl_metadata(reports: list[CrawlReport]) -> dict:
    """Materialization metadata: run totals plus a per-category table (the sensor reads it)."""
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
        "success_rate": round(done / (done + failed), 4) if done + failed else 1.0,
        "products_expected": sum(expected) if expected else None,
        "bytes_stored": sum(r.bytes_stored for r in reports),
        "duration_s": round(max((r.duration_s for r in reports), default=0.0), 3),
        "by_category": dg.MetadataValue.json(by_category),
    }


async def crawl_partitions(
    site: SiteResource, store: ObjectStoreResource, categories: list[str], *, new_snapshot: bool, log
) -> list[CrawlReport]:
    """Crawl several categories concurrently, sharing one client and the per-host limits."""
    spec = site.spec()
    object_store = store.store()
    object_store.ensure_writable()
    async with site.client() as client:
        fetcher = PageFetcher(client, site.fetch_policy())
        crawlers = [
            PartitionCrawler(
                spec,
                category,
                object_store,
                fetcher,
                fetch_config=site.fetch_config(),
                fetch_base_url=site.fetch_base_url(),
                max_attempts=site.max_attempts,
                progress=log.info,
            )
            for category in categories
        ]
        return list(await asyncio.gather(*(c.run(new_snapshot=new_snapshot) for c in crawlers)))


@dg.asset(
    partitions_def=category_partitions,
    backfill_policy=dg.BackfillPolicy.single_run(),
    retry_policy=RAW_PAGES_RETRY_POLICY,
    pool=configured_host_pool(),
    group_name="scrape",
    kinds={"python", "html"},
)
def raw_pages(context: dg.AssetExecutionContext, config: RawPagesConfig, site: SiteResource, store: ObjectStoreResource):
    """One snapshot of a category's listing pages: raw HTML + manifest in object storage.

    Fetches politely (robots.txt, per-host rate/concurrency, retries with backoff and
    Retry-After), resumes an interrupted snapshot, never fails for a dead page.
    """
    categories = list(context.partition_keys)
    try:
        context.log.info(f"fetching {len(categories)} categor{'y' if len(categories) == 1 else 'ies'} from {site.fetch_base_url()}")
        with store.locks(context, site.spec().name):
            reports = asyncio.run(
                crawl_partitions(site, store, categories, new_snapshot=config.new_snapshot, log=context.log)
            )
    except (FetchConfigChangedError, SpecError, SettingsError, PartitionLockedError) as exc:
        # Retrying cannot fix these: fail once, with the message that says what to do.
        raise dg.Failure(description=str(exc), allow_retries=False) from exc
    for r in reports:
        context.log.info(
            f"{r.category}: snapshot {r.snapshot_id}{' (resumed)' if r.resumed else ''}: "
            f"{r.pages_done} done, {r.pages_failed} failed, {r.requests_made} requests, {r.duration_s:.1f}s"
        )
    return dg.MaterializeResult(metadata=crawl_metadata(reports))
