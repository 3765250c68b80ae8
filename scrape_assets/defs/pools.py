"""Concurrency pools: one per fetched host, so parallel runs share the host's politeness.

``raw_pages`` runs in the pool ``scrape-host-<host>``. With ``dagster.yaml``'s
``concurrency.pools.default_limit: 1`` (op granularity), at most one ``raw_pages`` step
fetches from a host at any time across all runs of the instance, so the per-host rate
and concurrency limits hold across runs, not only inside one; another run's step waits
for the slot ("blocked by concurrency limit" in the UI).
"""

from urllib.parse import urlsplit

from scrape_assets.settings import load_settings
from scrape_assets.spec import load_spec


def host_pool(base_url: str) -> str:
    """Pool name of the host serving ``base_url`` (port included when not the default)."""
    return f"scrape-host-{urlsplit(base_url).netloc.lower()}"


def configured_host_pool() -> str:
    settings = load_settings()
    return host_pool(settings.base_url or load_spec(settings.site).base_url)
