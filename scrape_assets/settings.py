"""Settings from ``SCRAPE_*`` environment variables, read in one place.

The modules of ``scrape_assets/defs/`` (resources, partitions, pools, the schedule) and
the CLI call :func:`load_settings`; everything else receives values through Dagster
resources (``SCRAPE_GC_FREEZE`` and ``DAGSTER_EVENT_BATCH_SIZE`` are read where they act:
:mod:`scrape_assets.gc_tuning`, :mod:`scrape_assets.instance_storage`). ``SCRAPE_DEMO_DATE`` is validated here and read by the demo catalogue itself
(it is the catalogue's clock, not the pipeline's).

| variable | meaning | default |
|---|---|---|
| ``SCRAPE_SITE`` | shipped spec name or path to a spec file | ``demo`` |
| ``SCRAPE_BASE_URL`` | overrides the spec's base URL (a local mirror) | from the spec |
| ``SCRAPE_DATA_DIR`` | root of local object storage and the default warehouse | ``./data`` |
| ``SCRAPE_STORAGE_URL`` | object storage root (fsspec URL; not ``memory://``) | ``$SCRAPE_DATA_DIR/objects`` |
| ``SCRAPE_WAREHOUSE_URL`` | SQLAlchemy URL | ``sqlite:///$SCRAPE_DATA_DIR/warehouse.db`` |
| ``SCRAPE_REQUESTS_PER_SECOND`` | per-host rate limit | spec |
| ``SCRAPE_MAX_CONCURRENCY`` | per-host concurrent requests | spec |
| ``SCRAPE_MAX_ATTEMPTS`` | attempts per page before it is dead-lettered | 3 |
| ``SCRAPE_ALERT_WEBHOOK_URL`` | alerts POSTed here as JSON | unset: log only |
| ``SCRAPE_PROXY_URL`` | ``http://[user:pass@]host:port`` forward proxy for page and robots.txt fetches (secret) | unset: direct |
| ``SCRAPE_USER_AGENT`` | User-Agent sent (put a contact in it for real sites) | ``scrape_assets/<version> (...)`` |
| ``SCRAPE_LOCK_WAIT_S`` | seconds a run waits for another run holding the same partition | 0: stop at once |
| ``SCRAPE_RESUME_MAX_AGE_H`` | hours after its start an incomplete snapshot is still resumed | 20 |
| ``SCRAPE_SCHEDULE_CRON`` | cron of the daily schedule (UTC) | ``0 2 * * *`` |
| ``SCRAPE_DEMO_DATE`` | the demo catalogue's day (``YYYY-MM-DD``, 2000-01-01 to 9998-12-31) | today (UTC) |
| ``SCRAPE_GC_FREEZE`` | garbage-collector policy, read by :mod:`scrape_assets.gc_tuning` | ``1`` |
"""

from __future__ import annotations

import difflib
import logging
import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import date
from pathlib import Path
from urllib.parse import urlsplit

from scrape_assets.errors import SettingsError, UnknownSiteError, UnreadableFileError
from scrape_assets.proxies import ProxyURL
from scrape_assets.spec import (  # noqa: F401 - base_url_problem re-exported
    base_url_problem,
    http_host,
    MAX_CONCURRENCY,
    MAX_REQUESTS_PER_SECOND,
    MIN_REQUESTS_PER_SECOND,
    USER_AGENT_EXPECTED,
    load_spec,
    user_agent_problem,
)
from scrape_assets.storage import query_problem, redact_url, shown_storage_url

logger = logging.getLogger(__name__)

#: The data folder when ``SCRAPE_DATA_DIR`` is unset (relative to the current folder).
DEFAULT_DATA_DIR = "./data"


def data_folder(env: Mapping[str, str]) -> Path:
    """The data folder ``SCRAPE_DATA_DIR`` names in ``env`` (else :data:`DEFAULT_DATA_DIR`), absolute."""
    return Path(env.get("SCRAPE_DATA_DIR") or DEFAULT_DATA_DIR).expanduser().resolve()

#: Every ``SCRAPE_*`` variable the package reads: the table above, and ``SCRAPE_CRASHPOINT``
#: (:mod:`scrape_assets.crashpoints`, for the reliability tests). ``SCRAPE_TEST_*`` is left
#: to test suites.
KNOWN_VARIABLES = frozenset({
    "SCRAPE_SITE", "SCRAPE_BASE_URL", "SCRAPE_DATA_DIR", "SCRAPE_STORAGE_URL", "SCRAPE_WAREHOUSE_URL",
    "SCRAPE_REQUESTS_PER_SECOND", "SCRAPE_MAX_CONCURRENCY", "SCRAPE_MAX_ATTEMPTS", "SCRAPE_ALERT_WEBHOOK_URL",
    "SCRAPE_PROXY_URL", "SCRAPE_USER_AGENT", "SCRAPE_LOCK_WAIT_S", "SCRAPE_RESUME_MAX_AGE_H", "SCRAPE_SCHEDULE_CRON",
    "SCRAPE_DEMO_DATE", "SCRAPE_GC_FREEZE", "SCRAPE_CRASHPOINT",
})
_warned: set[str] = set()


def unknown_variables(env: dict) -> list[tuple[str, str | None]]:
    """``SCRAPE_*`` names in ``env`` that no setting reads, each with the closest known name
    (``None`` when none is close), sorted by name: a ``SCRAPE_DATA_DIR`` typed without its
    second underscore is paired with ``SCRAPE_DATA_DIR``."""
    return [(name, next(iter(difflib.get_close_matches(name, KNOWN_VARIABLES, n=1, cutoff=0.75)), None))
            for name in sorted(env) if name.startswith("SCRAPE_") and name not in KNOWN_VARIABLES
            and not name.startswith("SCRAPE_TEST_")]


_CRON_FIELD = r"[0-9*/,\-A-Za-z?LW#]+"
_CRON = re.compile(rf"{_CRON_FIELD}(\s+{_CRON_FIELD}){{4}}")


@dataclass(frozen=True)
class Settings:
    """Validated ``SCRAPE_*`` settings (see the table above); paths are absolute."""

    site: str
    base_url: str | None
    data_dir: str
    storage_url: str
    warehouse_url: str
    requests_per_second: float | None
    max_concurrency: int | None
    max_attempts: int
    alert_webhook_set: bool
    proxy_set: bool
    storage_url_set: bool
    warehouse_url_set: bool
    schedule_cron: str
    user_agent: str | None
    lock_wait_s: float
    resume_max_age_h: float


#: Most attempts per page (``SCRAPE_MAX_ATTEMPTS``): beyond, a dead page would hold its run for hours.
MAX_ATTEMPTS = 100
#: Longest ``SCRAPE_LOCK_WAIT_S``: a day.
MAX_LOCK_WAIT_S = 86_400.0

#: Hours an incomplete snapshot is resumed after its start (a daily run must not continue yesterday's).
DEFAULT_RESUME_MAX_AGE_H = 20.0
MIN_RESUME_MAX_AGE_H = 0.01  # 36 s: below that even a step retry would start a new snapshot
MAX_RESUME_MAX_AGE_H = 8760.0  # a year


def _number(env, name: str, kind: type, minimum: float, maximum: float | None = None):
    what = "an integer" if kind is int else "a number"
    expected = f"{what} ≥ {minimum}" + (f" and ≤ {maximum:g}" if maximum is not None else "")
    raw = env.get(name)
    if raw in (None, ""):
        return None
    try:
        value = kind(raw)
    except ValueError:
        raise SettingsError(name, raw, expected) from None
    if not math.isfinite(value) or value < minimum or (maximum is not None and value > maximum):  # nan, inf too
        raise SettingsError(name, raw, expected)
    return value


def file_in_the_way(folder: Path) -> Path | None:
    """``folder`` itself, or the nearest of its parents that exists, when that is not a folder."""
    try:
        for path in (folder, *folder.parents):
            if path.exists():
                return None if path.is_dir() else path
    except OSError:  # not ours to look into: the write probe says what is wrong
        return None
    return None


#: A protocol written with "//" but no colon ("s3//bucket"): a relative folder to fsspec.
_PROTOCOL_WITHOUT_COLON = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*)//")


def _protocol_meant(url: str) -> str | None:
    """``s3//key:secret@bucket/prefix`` -> ``s3://bucket/prefix`` (credentials dropped); ``None``
    when ``url`` does not start with a protocol and ``//``."""
    match = None if "://" in url else _PROTOCOL_WITHOUT_COLON.match(url)
    return None if match is None else redact_url(f"{match.group(1)}://{url[match.end():]}")


def storage_url_problem(url: str) -> str | None:
    """What is wrong with ``SCRAPE_STORAGE_URL=url`` that no store would report, or ``None``.

    A value without ``://`` or ``::`` is a local folder to fsspec, so ``s3//bucket/prefix``
    would write pages under ``./s3/bucket/prefix`` without a word; a relative folder
    depends on the current folder of each process (the CLI, the UI's code server, a run
    worker), which need not be the same. Both are refused, as is any value fsspec reads as
    a relative folder (``s3:bucket``, ``C:/data``); ``~/objects`` is the user's home
    (:class:`~scrape_assets.storage.ObjectStore` expands it).
    """
    from upath import UPath

    try:
        protocol = UPath(url).protocol
    except (ValueError, ImportError):  # an unknown protocol: the store names it
        return None
    if protocol and (problem := query_problem(url)):
        return problem
    if protocol in ("file", "local"):
        # file://data/objects is read as a folder relative to each process's own, like "data/objects".
        rest = url.split("://", 1)[1] if "://" in url else url.split(":", 1)[1]
        if not rest.startswith("/"):
            return f"a {protocol}:// URL of an absolute folder, e.g. {protocol}:///srv/scrape/objects (three slashes)"
        return None
    if protocol != "":
        return None  # a URL (s3://, simplecache::..., s3:/bucket): the store decides
    if meant := _protocol_meant(url):
        return f"an object store URL with '://' after its protocol, e.g. {meant}, or an absolute folder"
    if not os.path.isabs(os.path.expanduser(url)):
        return (f"an absolute folder (this one is {os.path.abspath(url)} from this process's folder; the UI's code "
                "server and run workers may start in another) or an object store URL such as s3://bucket/prefix")
    return None


def load_settings(env: dict | None = None) -> Settings:
    """Read and validate ``SCRAPE_*`` variables (``env`` defaults to ``os.environ``).

    A ``SCRAPE_*`` variable no setting reads (a misspelling, most likely) is logged as a
    warning, once per name and process, with the closest known name.

    Raises:
        SettingsError: a variable has a value of the wrong kind.
        SpecError: the spec file ``SCRAPE_SITE`` names is not a valid spec (the file and the key named).
    """
    env = dict(os.environ if env is None else env)
    for name, close in unknown_variables(env):  # a misspelled setting is otherwise silently ignored
        if name not in _warned:
            _warned.add(name)
            logger.warning("%s is not a setting of scrape_assets: ignored%s", name,
                           f" (did you mean {close}?)" if close else " (the settings: README, Configuration)")
    data_path = data_folder(env)
    site = env.get("SCRAPE_SITE") or "demo"
    try:
        load_spec(site)  # fail early, naming the input
    except UnknownSiteError as exc:
        raise SettingsError("SCRAPE_SITE", site, exc.expected) from None
    except UnreadableFileError as exc:  # missing, no permission, not UTF-8: say which setting named it
        raise SettingsError("SCRAPE_SITE", site, f"a readable spec file; {exc}") from None
    day = (env.get("SCRAPE_DEMO_DATE") or "").strip()
    if day:
        try:
            if not re.fullmatch(r"\d{4}-\d{2}-\d{2}", day):  # fromisoformat also takes 20261201, 2026-W48-1
                raise ValueError(day)
            demo_day = date.fromisoformat(day)
        except ValueError:
            raise SettingsError("SCRAPE_DEMO_DATE", day, "a date as YYYY-MM-DD, e.g. 2026-12-01") from None
        from scrape_assets.demo_site import FIRST_DAY, LAST_DAY

        if not FIRST_DAY <= demo_day <= LAST_DAY:  # the catalogue's dates look 400 days back
            raise SettingsError("SCRAPE_DEMO_DATE", day, f"a date from {FIRST_DAY} to {LAST_DAY}, e.g. 2026-12-01")
    cron = env.get("SCRAPE_SCHEDULE_CRON") or "0 2 * * *"
    if not _CRON.fullmatch(cron.strip()):
        raise SettingsError("SCRAPE_SCHEDULE_CRON", cron, "a cron expression with 5 fields, e.g. '0 2 * * *'")
    webhook = env.get("SCRAPE_ALERT_WEBHOOK_URL") or ""
    if webhook and not webhook.startswith(("http://", "https://")):
        # The value is a secret: name the variable, not the URL.
        raise SettingsError("SCRAPE_ALERT_WEBHOOK_URL", "<hidden>", "an http(s) URL")
    if webhook and (not http_host(webhook) or any(c.isspace() or not c.isprintable() for c in webhook)):
        # Else every alert would fail to send (httpx refuses it), found only when one is due.
        raise SettingsError("SCRAPE_ALERT_WEBHOOK_URL", "<hidden>", "an http(s) URL with a host, a numeric port if "
                                                                 "any, and no space or control character (a \\r "
                                                                 "left by a CRLF .env file?)")
    proxy = env.get("SCRAPE_PROXY_URL") or ""
    if proxy:
        ProxyURL.from_setting(proxy)  # fail early, without echoing a password
    base_url = env.get("SCRAPE_BASE_URL") or None
    if base_url and (problem := base_url_problem(base_url)):
        # User info or a query may hold a secret: such a value is not echoed.
        shown = "<hidden>" if any(c in base_url for c in "@?#") else base_url
        raise SettingsError("SCRAPE_BASE_URL", shown, problem)
    max_attempts = _number(env, "SCRAPE_MAX_ATTEMPTS", int, 1, maximum=MAX_ATTEMPTS)
    user_agent = env.get("SCRAPE_USER_AGENT") or None
    problem = None if user_agent is None else user_agent_problem(user_agent)
    if problem:  # else httpx refuses it at the first request, after the run started
        raise SettingsError("SCRAPE_USER_AGENT", user_agent, f"{USER_AGENT_EXPECTED}; this one: {problem}")
    storage_url = env.get("SCRAPE_STORAGE_URL") or ""
    # fsspec's in-process store, alone or in a chain (simplecache::memory://): a run would save pages nobody reads
    if any(part.lower().startswith("memory:") for part in storage_url.split("::")):
        raise SettingsError("SCRAPE_STORAGE_URL", redact_url(storage_url),
                            "a folder or an object store URL such as s3://bucket/prefix (memory:// keeps nothing once "
                            "the process ends, and a run's steps, the summary and the next run are other processes)")
    if storage_url and (problem := storage_url_problem(storage_url)):
        meant = _protocol_meant(storage_url)
        # as typed, credentials out; a cut query marked
        shown = shown_storage_url(storage_url) if meant is None else meant.replace("://", "//", 1)
        raise SettingsError("SCRAPE_STORAGE_URL", shown, problem)
    resume_max_age_h = _number(env, "SCRAPE_RESUME_MAX_AGE_H", float, MIN_RESUME_MAX_AGE_H, maximum=MAX_RESUME_MAX_AGE_H)
    return Settings(
        site=site,
        base_url=base_url,
        data_dir=str(data_path),
        storage_url=storage_url or str(data_path / "objects"),
        warehouse_url=env.get("SCRAPE_WAREHOUSE_URL") or f"sqlite:///{data_path / 'warehouse.db'}",
        requests_per_second=_number(env, "SCRAPE_REQUESTS_PER_SECOND", float, MIN_REQUESTS_PER_SECOND, maximum=MAX_REQUESTS_PER_SECOND),
        max_concurrency=_number(env, "SCRAPE_MAX_CONCURRENCY", int, 1, maximum=MAX_CONCURRENCY),
        max_attempts=3 if max_attempts is None else max_attempts,
        alert_webhook_set=bool(env.get("SCRAPE_ALERT_WEBHOOK_URL")),
        proxy_set=bool(proxy),
        storage_url_set=bool(storage_url),
        warehouse_url_set=bool(env.get("SCRAPE_WAREHOUSE_URL")),
        schedule_cron=cron.strip(),  # as checked: a \r of a CRLF .env file is not the schedule's
        user_agent=user_agent,
        lock_wait_s=_number(env, "SCRAPE_LOCK_WAIT_S", float, 0, maximum=MAX_LOCK_WAIT_S) or 0.0,
        resume_max_age_h=DEFAULT_RESUME_MAX_AGE_H if resume_max_age_h is None else resume_max_age_h,
    )
