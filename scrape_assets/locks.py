"""Locks between runs: partitions, and fetched hosts. Crash-safe: ``flock(2)``.

:func:`partition_lock` takes an advisory ``flock(2)`` on ``{site}/{category}/{scope}.lock``
under a local object-storage root, one scope per writer (``raw_pages``,
``parsed_products``, ``products_table``, ``dead_letters``), so the steps of one run never
block each other while two runs writing the same thing do: the second stops at once
with a message naming the holder, or waits up to ``wait_s``.

:func:`host_lock` is the same mechanism for a fetched host (``locks/host-<host>.lock``):
``raw_pages`` holds it while it fetches, so one step at a time, across all runs sharing
the storage root, talks to a host and the per-host rate and concurrency limits hold across
runs. A second run *waits* for it, logging who holds it; :func:`read_host_handoff` tells it
when the previous one last asked the host (and a Retry-After pause), so its first request
keeps the rate's gap.

The kernel releases a flock when its holder dies, even on SIGKILL, so a crashed run
never leaves a stale lock behind (a Dagster concurrency-pool slot, by contrast, stays
claimed by a killed run until someone frees it). The lock file records who holds it
(run id, pid, host, since) for the messages.

On remote object stores (S3) there is no flock: there the Dagster concurrency pool of
``raw_pages`` (one per fetched host, limit 1 in ``dagster.yaml``) keeps two runs of one
host apart, and these functions are no-ops. Documented in README.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import socket
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from urllib.parse import urlsplit

from scrape_assets.errors import PartitionLockedError, StorageError
from scrape_assets.hostnames import DEFAULT_PORTS, ascii_host
from scrape_assets.manifest import utc_now_iso
from scrape_assets.storage import ObjectStore, check_key

POLL_S = 0.2


@contextmanager
def _flock(
    store: ObjectStore,
    key: str,
    *,
    owner: str,
    wait_s: float,
    refused: Callable[[str], PartitionLockedError],
    on_wait: Callable[[str], None] | None = None,
    log_every_s: float = 60.0,
) -> Iterator[None]:
    """Hold an exclusive flock on ``key`` (local stores only), waiting up to ``wait_s``."""
    if not store.is_local:
        yield
        return
    check_key(key)
    path = Path(store.path(key).path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        started = time.monotonic()
        next_log = started
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                now = time.monotonic()
                if now - started >= wait_s:
                    raise refused(_holder(path)) from None
                if on_wait is not None and now >= next_log:
                    on_wait(_holder(path))
                    next_log = now + log_every_s
                time.sleep(POLL_S)
        info = json.dumps({"owner": owner, "pid": os.getpid(), "host": socket.gethostname(), "since": utc_now_iso()})
        os.ftruncate(fd, 0)
        os.pwrite(fd, info.encode(), 0)
        try:
            yield
        finally:
            os.ftruncate(fd, 0)
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def partition_lock(
    store: ObjectStore, site: str, category: str, *, owner: str, scope: str = "raw_pages", wait_s: float = 0.0
):
    """Hold the partition's lock for ``scope`` (the asset writing) for the duration of the block.

    Args:
        owner: who is asking (e.g. the Dagster run id), recorded in the lock file.
        scope: what is being written (the asset name).
        wait_s: how long to wait for another holder to finish before giving up, in seconds.

    Raises:
        PartitionLockedError: still held by another process after ``wait_s``; names the holder.
    """
    return _flock(
        store,
        f"{site}/{category}/{scope}.lock",
        owner=owner,
        wait_s=wait_s,
        refused=lambda holder: PartitionLockedError(f"{site}/{category}", f"{scope} of {holder}"),
    )


def host_lock(
    store: ObjectStore, host: str, *, owner: str, wait_s: float = 24 * 3600.0, on_wait: Callable[[str], None] | None = None
):
    """Hold the fetched host's lock, waiting (default up to a day) for another run holding it.

    Args:
        host: the URL being fetched (its origin counts), or its ``host[:port]``.
        on_wait: called with a line naming the holder when the wait starts, then every minute.

    Raises:
        PartitionLockedError: still held after ``wait_s``.
    """
    _scheme, host_name, port = host_origin(host)
    name = _host_lock_name(host_name, port)
    host = f"{host_name}:{port}" if port else host_name  # for messages: no user info (a password), no path
    return _flock(
        store,
        f"locks/{name}.lock",
        owner=owner,
        wait_s=wait_s,
        refused=lambda holder: PartitionLockedError(host, f"host slot of {holder}"),
        on_wait=None if on_wait is None else (lambda holder: on_wait(f"waiting for {host}: fetched by {holder}")),
    )


def host_origin(url_or_netloc: str) -> tuple[str, str, int | None]:
    """``(scheme, host, port)`` as a host is one host: user info dropped, the host in lower
    case, IDNA 2008-encoded as httpx sends it (:func:`~scrape_assets.hostnames.ascii_host`),
    without a trailing dot; a scheme's default port made explicit."""
    parts = urlsplit(url_or_netloc if "://" in url_or_netloc else "//" + url_or_netloc)
    host = ascii_host((parts.hostname or "").rstrip(".")).rstrip(".")  # IDNA makes a trailing "。" a "."
    try:
        port = parts.port
    except ValueError:  # not a number: no port to compare
        port = None
    return parts.scheme, host, port or DEFAULT_PORTS.get(parts.scheme)


def host_lock_name(url_or_netloc: str) -> str:
    """The host lock's name for a URL or ``host[:port]``: one per host and port however it is
    spelled (``Example.com``, ``example.com.``, ``example.com:80`` from ``http://``, its
    Unicode or punycode form); a long host name hashed to fit a storage key segment."""
    _scheme, host, port = host_origin(url_or_netloc)
    return _host_lock_name(host, port)


def _host_lock_name(host: str, port: int | None) -> str:
    name = "host-" + re.sub(r"[^a-z0-9._-]", "=", host) + (f"={port}" if port else "")
    if len(name) > 100:  # a storage key segment holds 128 characters
        name = name[:60] + "-" + hashlib.sha256(name.encode()).hexdigest()[:16]
    return name


def host_handoff_key(url_or_netloc: str) -> str:
    """Storage key of what a run fetching the host left for the next (see :func:`read_host_handoff`)."""
    return f"locks/{host_lock_name(url_or_netloc)}.handoff.json"


def read_host_handoff(store: ObjectStore, url_or_netloc: str) -> dict | None:
    """What the last run fetching the host left for the next, written by :func:`write_host_handoff`:
    ``{"last_request_at": epoch seconds, "paused_until": epoch seconds of a Retry-After pause's
    end, "crawl_delay_s": the robots.txt Crawl-delay obeyed}`` (each may be None), so the next
    run keeps the per-host rate, the pause and the delay across runs (:meth:`~scrape_assets.politeness.HostLimiter.take_over`); None when there is none or
    it cannot be read (a damaged file is no reason to stop a run)."""
    try:
        data = json.loads(store.read_bytes(host_handoff_key(url_or_netloc)))
    except (FileNotFoundError, ValueError, OSError, StorageError):
        return None
    return data if isinstance(data, dict) else None


def write_host_handoff(store: ObjectStore, url_or_netloc: str, handoff: dict) -> None:
    """Record ``handoff`` (see :func:`read_host_handoff`) for the next run fetching the host, atomically.

    Raises:
        StorageError, OSError: the write failed (callers log it; the run's pages are stored).
    """
    store.write_bytes_atomic(host_handoff_key(url_or_netloc), json.dumps(handoff).encode(), sync_folder=False)


@contextmanager
def partition_locks(
    store: ObjectStore, site: str, categories: list[str], *, owner: str, scope: str, wait_s: float = 0.0
):
    """Hold the ``scope`` locks of several partitions (taken in sorted order: no deadlock between runs)."""
    with ExitStack() as stack:
        for category in sorted(set(categories)):
            stack.enter_context(partition_lock(store, site, category, owner=owner, scope=scope, wait_s=wait_s))
        yield


def _holder(path: Path) -> str:
    try:
        info = json.loads(path.read_text() or "{}")
    except (OSError, ValueError):
        info = {}
    if not info:
        return "another process"
    return f"run {info.get('owner')} (pid {info.get('pid')} on {info.get('host')}, since {info.get('since')})"
