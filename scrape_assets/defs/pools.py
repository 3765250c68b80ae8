"""Concurrency pools: one per fetched host, so parallel runs share the host's politeness.

With object storage on a local disk, ``raw_pages`` keeps runs apart with a host flock
(:func:`scrape_assets.locks.host_lock`), which the kernel releases when a run is killed.
With remote storage (S3) there is no flock, so ``raw_pages`` runs in the Dagster pool
``scrape-host-<host>`` (``<host>:<port>`` when the URL names a port other than the
scheme's default; the host spelled as :func:`host_pool` says) instead: with
``dagster.yaml``'s ``concurrency.pools.default_limit: 1`` (op granularity), at most one
``raw_pages`` step fetches from a host at any time across all runs of the instance
("blocked by concurrency limit" in the UI). Limit: a run killed with SIGKILL keeps its
slot while it is "started"; once it is marked failed or terminated, the daemon frees the
slot a minute later (``run_monitoring: free_slots_after_run_end_seconds`` in
``dagster.yaml``), or free it from the run's page in the UI ("Free concurrency slots"), or
with ``scrape-assets fail-run RUN_ID``. The flock needs none of this.
"""

from scrape_assets.hostnames import DEFAULT_PORTS
from scrape_assets.locks import host_origin
from scrape_assets.settings import load_settings
from scrape_assets.spec import load_spec
from scrape_assets.storage import ObjectStore


def host_pool(base_url: str) -> str:
    """Pool name of the host serving ``base_url``: ``scrape-host-<host>[:<port>]``, the port
    when not the scheme's default (``https://Shop.example:8443/`` ->
    ``scrape-host-shop.example:8443``). One pool per host however it is spelled, as one host
    lock (:func:`scrape_assets.locks.host_lock_name`): lower case, IDNA (punycode), no
    trailing dot, an explicit default port dropped; an IPv6 address in brackets."""
    scheme, host, port = host_origin(base_url)
    shown = f"[{host}]" if ":" in host else host
    return f"scrape-host-{shown}" + (f":{port}" if port and port != DEFAULT_PORTS.get(scheme) else "")


def configured_host_pool() -> str | None:
    """The pool of ``raw_pages``: None with local storage (the host flock applies instead)."""
    settings = load_settings()
    if ObjectStore(settings.storage_url).is_local:
        return None
    return host_pool(settings.base_url or load_spec(settings.site).base_url)
