"""Resources, wired from ``SCRAPE_*`` settings in this one file.

Each resource is a ``dg.ConfigurableResource`` so tests (and the UI's launchpad) can
swap values without touching code; secrets come in through ``dg.EnvVar`` so Dagster
never displays them.
"""


import contextlib
import os
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

import dagster as dg
from pydantic import ConfigDict, Field, field_validator

from scrape_assets import __version__
from scrape_assets.errors import SettingsError, StorageError
from scrape_assets.locks import host_lock, partition_locks
from scrape_assets.manifest import has_snapshot, utc_now_iso
from scrape_assets.proxies import ProxyURL
from scrape_assets.settings import (
    DEFAULT_RESUME_MAX_AGE_H,
    MAX_ATTEMPTS,
    MAX_LOCK_WAIT_S,
    MAX_RESUME_MAX_AGE_H,
    MIN_RESUME_MAX_AGE_H,
    base_url_problem,
    file_in_the_way,
    load_settings,
    storage_url_problem,
)
from scrape_assets.spec import (
    MAX_CONCURRENCY,
    MAX_REQUESTS_PER_SECOND,
    USER_AGENT_EXPECTED,
    SiteSpec,
    load_spec,
    user_agent_problem,
)
from scrape_assets.storage import ObjectStore, shown_storage_url
from scrape_assets.warehouse import Warehouse

if TYPE_CHECKING:  # the HTTP stack is imported where a fetch needs it (see raw_pages), not with the definitions
    import httpx

    from scrape_assets.fetcher import FetchPolicy

USER_AGENT = f"scrape_assets/{__version__} (polite catalogue crawler; httpx+aiohttp)"


class SiteResource(dg.ConfigurableResource):
    """The site to scrape and how politely (spec + overrides)."""

    # A refused value is not echoed in the error (a base_url's user info or query may hold a secret).
    model_config = ConfigDict(hide_input_in_errors=True)

    site: str = Field(default="demo", description="shipped spec name or path to a spec YAML")
    base_url: str | None = Field(default=None, description="fetch from this base instead of the spec's (a mirror)")
    requests_per_second: float | None = Field(default=None, gt=0, le=MAX_REQUESTS_PER_SECOND,
                                              description="per-host rate; default from the spec")
    max_concurrency: int | None = Field(default=None, ge=1, le=MAX_CONCURRENCY,
                                        description="per-host concurrent requests; default from the spec")
    max_attempts: int = Field(default=3, ge=1, le=MAX_ATTEMPTS,
                              description="HTTP attempts per page before it is dead-lettered")
    timeout_s: float = Field(default=20.0, gt=0, description="per-request timeout in seconds")
    user_agent: str = Field(default=USER_AGENT, description="the User-Agent header: printable ASCII, a contact in it")

    # "wrap" validators see a dg.EnvVar as such (an "after" one gets its name as a plain str):
    # an EnvVar is checked when a run starts, once Dagster has read the variable's value.
    @field_validator("base_url", mode="wrap")
    @classmethod
    def _fetchable(cls, value, handler) -> str | None:  # the same rule as SCRAPE_BASE_URL (run config, launchpad)
        checked = handler(value)
        if not isinstance(value, dg.EnvVar) and checked and (problem := base_url_problem(checked)):
            raise ValueError(f"base_url: expected {problem}")  # empty: the spec's, as unset
        return checked

    @field_validator("user_agent", mode="wrap")
    @classmethod
    def _sendable(cls, value, handler) -> str:  # the same rule as SCRAPE_USER_AGENT, before any snapshot is opened
        checked = handler(value)
        if not isinstance(value, dg.EnvVar) and (problem := user_agent_problem(checked)):
            raise ValueError(f"expected {USER_AGENT_EXPECTED}; this one: {problem}")
        return checked
    proxy_url: str | None = Field(
        default=None, description="http:// forward proxy for all fetches; secret: set via SCRAPE_PROXY_URL"
    )

    def spec(self) -> SiteSpec:
        """The site spec (raises SpecError naming the file and key when invalid)."""
        return load_spec(self.site)

    def fetch_base_url(self) -> str:
        """Where pages are fetched from: ``base_url`` or the spec's, with a trailing slash."""
        url = self.base_url or self.spec().base_url
        return url if url.endswith("/") else url + "/"

    def fetch_policy(self) -> "FetchPolicy":
        """Politeness and retry settings: the spec's, overridden by this resource's fields."""
        from scrape_assets.fetcher import FetchPolicy

        politeness = self.spec().politeness
        return FetchPolicy(
            user_agent=self.user_agent,
            requests_per_second=self.requests_per_second or politeness.requests_per_second,
            max_concurrency=self.max_concurrency or politeness.max_concurrency,
            max_attempts=self.max_attempts,
            timeout_s=self.timeout_s,
            obey_robots_txt=politeness.obey_robots_txt,
        )

    def fetch_config(self) -> dict:
        """The frozen fetch config recorded in each manifest (a change other than the pace,
        ``manifest.PACING_KEYS``, refuses resume).

        ``site`` is the spec's name, not how ``SCRAPE_SITE`` named it: ``demo`` and the path
        of the same spec file (or a copy of it elsewhere) resume each other's snapshots.
        """
        return {"site": self.spec().name, "base_url": self.fetch_base_url(), **self.fetch_policy().as_dict()}

    def proxy(self) -> ProxyURL | None:
        """The parsed ``proxy_url`` (None: direct).

        Raises:
            SettingsError: not an ``http://[user:pass@]host:port`` URL (the value is not shown).
        """
        return ProxyURL.from_setting(self.proxy_url) if self.proxy_url else None

    def client(self) -> "httpx.AsyncClient":
        """An httpx client (through the proxy when set); the demo host is served in-process (no socket, no proxy).

        Raises:
            SettingsError: ``proxy_url`` is malformed.
        """
        from scrape_assets.demo_site import DEMO_BASE_URL, DemoTransport
        from scrape_assets.fetcher import build_client

        proxy = self.proxy()
        return build_client(
            self.fetch_policy(), mounts={DEMO_BASE_URL.rstrip("/"): DemoTransport()},
            proxy_url=self.proxy_url if proxy else None,
        )

    def describe_route(self) -> str:
        """``<fetch base URL>``, plus `` through proxy http://host:port`` when one carries the fetches (for logs).

        Raises:
            SettingsError: ``proxy_url`` is malformed.
        """
        from scrape_assets.demo_site import DEMO_BASE_URL

        base, proxy = self.fetch_base_url(), self.proxy()
        return base + (f" through proxy {proxy.address}" if proxy and not base.startswith(DEMO_BASE_URL) else "")


class ObjectStoreResource(dg.ConfigurableResource):
    """Object storage root for raw pages, manifests and parsed output."""

    url: str = Field(description="local path or fsspec URL (s3://bucket/prefix)")
    lock_wait_s: float = Field(
        default=0.0, ge=0, le=MAX_LOCK_WAIT_S,
        description="seconds to wait for another run holding a partition before stopping"
    )
    resume_max_age_h: float | None = Field(
        default=DEFAULT_RESUME_MAX_AGE_H,
        ge=MIN_RESUME_MAX_AGE_H,
        le=MAX_RESUME_MAX_AGE_H,
        description=(
            "hours after its start an incomplete snapshot is still resumed; older: a new one starts "
            "(None: any age; the same bounds as SCRAPE_RESUME_MAX_AGE_H)"
        ),
    )

    def resume_max_age(self) -> timedelta | None:
        """``resume_max_age_h`` as a timedelta (None: resume at any age)."""
        return None if self.resume_max_age_h is None else timedelta(hours=self.resume_max_age_h)

    def store(self) -> ObjectStore:
        """The :class:`ObjectStore` at ``url`` (raises StorageError when it cannot be opened).

        ``url`` is checked as ``SCRAPE_STORAGE_URL`` is (:func:`~scrape_assets.settings.storage_url_problem`):
        a launchpad value such as ``data/objects`` (relative: each process's own folder) or
        ``s3//bucket`` (a local folder to fsspec) is refused, not written to.
        """
        if problem := storage_url_problem(self.url):
            raise StorageError(shown_storage_url(self.url), f"cannot open object storage: expected {problem}")
        return ObjectStore(self.url)

    def host_lock(self, context: dg.AssetExecutionContext, base_url: str):
        """Hold the fetched host's lock while fetching (waits for another run; see :mod:`scrape_assets.locks`)."""
        return host_lock(self.store(), base_url, owner=context.run_id, on_wait=context.log.info)

    def locks(self, context: dg.AssetExecutionContext, site: str):
        """Hold this asset's locks on the run's partitions (see :mod:`scrape_assets.locks`).

        Raises:
            dagster.Failure: the run's partition range is not one of this spec's (see
                :func:`~scrape_assets.defs.partitions.run_categories`).
        """
        from scrape_assets.defs.partitions import run_categories

        return partition_locks(
            self.store(),
            site,
            run_categories(context),
            owner=context.run_id,
            scope=context.asset_key.to_user_string(),
            wait_s=self.lock_wait_s,
        )


class WarehouseResource(dg.ConfigurableResource):
    """The SQL warehouse holding ``products`` and ``dead_letters``."""

    url: str = Field(description="SQLAlchemy URL")

    def warehouse(self) -> Warehouse:
        """The :class:`Warehouse` at ``url`` (raises SettingsError for a bad URL)."""
        return Warehouse(self.url)

    def for_site(self, site: str, owns: Callable[[str, str], bool] | None = None) -> Warehouse:
        """The warehouse, claimed for ``site`` (:meth:`Warehouse.claim_site`, ``owns`` passed on); close it (``with``).

        Raises:
            dagster.Failure: the tables belong to another site (not retried: a setting must change).
        """
        wh = self.warehouse()
        try:
            wh.claim_site(site, now=utc_now_iso(), owns=owns)
        except SettingsError as exc:
            wh.close()
            raise dg.Failure(description=str(exc), allow_retries=False) from exc
        except BaseException:
            wh.close()
            raise
        return wh


#: Step retries of the warehouse loads (``products_table``, ``dead_letters``) while the
#: database may recover: :func:`retried_while_the_database_may_recover`.
DATABASE_RETRIES = 3


@contextlib.contextmanager
def retried_while_the_database_may_recover(context: dg.AssetExecutionContext,
                                           warehouse: WarehouseResource) -> Iterator[None]:
    """Turn a warehouse error that may pass into a retry of the step (``dagster.RetryRequested``).

    "May pass" is :func:`~scrape_assets.warehouse.may_recover`: a database locked by
    another writer, busy, unreachable, restarting, out of space. Up to
    :data:`DATABASE_RETRIES` retries, 2, 4 and 8 s apart (each attempt on a locked SQLite
    file also waits its busy timeout, 30 s, first: about 2 min in all). The loads are
    idempotent per category (one transaction each; an unchanged input is not loaded
    again), so a retry redoes only what had not committed. Any other database error, and
    the last attempt's, fails the step without a retry, in one line
    (:meth:`~scrape_assets.warehouse.Warehouse.unreadable`: no SQL, no parameters), with
    `` (after N retries)`` when retries ran out.
    """
    import sqlalchemy as sa

    from scrape_assets.counts import counted
    from scrape_assets.warehouse import database_error, may_recover

    try:
        yield
    except sa.exc.SQLAlchemyError as exc:
        retries = context.retry_number
        if may_recover(exc) and retries < DATABASE_RETRIES:
            wait = 2.0 * 2**retries
            context.log.warning(f"the warehouse may recover ({database_error(exc)}): the step tries again in "
                                f"{wait:.0f} s (retry {retries + 1} of {DATABASE_RETRIES})")
            raise dg.RetryRequested(max_retries=DATABASE_RETRIES, seconds_to_wait=wait) from exc
        with warehouse.warehouse() as wh:
            line = wh.unreadable(exc)
        raise dg.Failure(description=line + (f" (after {counted(retries, 'retry')})" if retries else ""),
                         allow_retries=False) from exc


@contextlib.contextmanager
def warehouse_for_load(context: dg.AssetExecutionContext, store: ObjectStoreResource, warehouse: WarehouseResource,
                       site: str) -> Iterator[Warehouse]:
    """A load step's warehouse (``products_table``, ``dead_letters``): claimed for ``site``
    (:meth:`~scrape_assets.warehouse.Warehouse.claim_site`, tables loaded before claims
    existed judged by this storage's snapshots), with the run's partitions locked, and the
    step retried while the database may recover (:func:`retried_while_the_database_may_recover`:
    outermost, so the locks and the connection are given back before a retry takes them again)."""
    with (retried_while_the_database_may_recover(context, warehouse), store.locks(context, site),
          warehouse.for_site(site, owns=has_snapshot(store.store(), site)) as wh):
        yield wh


class AlertsResource(dg.ConfigurableResource):
    """Where alerts go: the log always, a webhook (JSON POST, Slack-compatible) when set."""

    webhook_url: str | None = Field(default=None, description="secret; set via SCRAPE_ALERT_WEBHOOK_URL")


def build_resources(env: dict | None = None, *, secrets_as_env_vars: bool = True) -> dict:
    """The resources of a deployment, from ``SCRAPE_*`` variables (see README).

    Args:
        env: the variables (default ``os.environ``).
        secrets_as_env_vars: values that may hold credentials (the proxy, storage, warehouse
            and webhook URLs, when set) as ``dg.EnvVar``: Dagster resolves them in a run and
            shows only the variable's name in the UI and its API. False gives the values, for
            a process that uses the resources itself (the ``scrape-assets`` commands), never
            for definitions handed to Dagster.
    """
    settings = load_settings(env)
    values = dict(os.environ if env is None else env)
    if secrets_as_env_vars:
        # The definitions' load (the scrape-assets commands check these themselves, saying
        # whether they read or write): a mistyped warehouse URL, a missing driver, or a data
        # folder under a file stops `dagster asset materialize` before it creates a run.
        if settings.warehouse_url_set:
            Warehouse(values["SCRAPE_WAREHOUSE_URL"]).close()  # parsed; no connection is made
        if not (settings.storage_url_set and settings.warehouse_url_set):  # the data folder is used
            if (blocker := file_in_the_way(Path(settings.data_dir))) is not None:
                raise SettingsError("SCRAPE_DATA_DIR", values.get("SCRAPE_DATA_DIR") or settings.data_dir,
                                    f"a folder this process can write ({blocker} is a file, not a folder)")

    def secret(name: str, is_set: bool) -> str | None:
        if not is_set:
            return None
        return dg.EnvVar(name) if secrets_as_env_vars else values[name]

    return {
        "site": SiteResource(
            site=settings.site,
            base_url=settings.base_url,
            requests_per_second=settings.requests_per_second,
            max_concurrency=settings.max_concurrency,
            max_attempts=settings.max_attempts,
            user_agent=settings.user_agent or USER_AGENT,
            proxy_url=secret("SCRAPE_PROXY_URL", settings.proxy_set),
        ),
        # URLs set by the user may carry credentials (a PostgreSQL password); the defaults are local paths.
        "store": ObjectStoreResource(
            url=secret("SCRAPE_STORAGE_URL", settings.storage_url_set) or settings.storage_url,
            lock_wait_s=settings.lock_wait_s,
            resume_max_age_h=settings.resume_max_age_h,
        ),
        "warehouse": WarehouseResource(
            url=secret("SCRAPE_WAREHOUSE_URL", settings.warehouse_url_set) or settings.warehouse_url
        ),
        "alerts": AlertsResource(webhook_url=secret("SCRAPE_ALERT_WEBHOOK_URL", settings.alert_webhook_set)),
    }
