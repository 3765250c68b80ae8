"""Partition locks: two runs never write the same partition's manifest or rows at once.

A lock is an advisory ``flock(2)`` on ``{site}/{category}/{scope}.lock`` under a local
object-storage root, one scope per writer (``raw_pages``, ``parsed_products``,
``products_table``, ``dead_letters``), so the steps of one run never block each other
while two runs writing the same thing do. The kernel releases it when the holder dies (even on SIGKILL), so
a crashed run never leaves a stale lock behind. The file records who holds it (run id,
pid, host, since) for the error message of the run that finds it taken.

On remote object stores (S3) there is no flock: there the Dagster concurrency pool of
``raw_pages`` (one pool per fetched host, limit 1 in ``dagster.yaml``) is what keeps two
runs of one site apart; :func:`partition_locks` is then a no-op. Documented in README.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

from scrape_assets.errors import PartitionLockedError
from scrape_assets.manifest import utc_now_iso
from scrape_assets.storage import ObjectStore, check_key

POLL_S = 0.2


@contextmanager
def partition_lock(
    store: ObjectStore, site: str, category: str, *, owner: str, scope: str = "raw_pages", wait_s: float = 0.0
) -> Iterator[None]:
    """Hold the partition's lock for ``scope`` for the duration of the block.

    Args:
        scope: what is being written (the asset name).
        owner: who is asking (e.g. the Dagster run id), recorded in the lock file.
        wait_s: how long to wait for another holder to finish before giving up, in seconds.

    Raises:
        PartitionLockedError: still held by another process after ``wait_s``; names the holder.
    """
    if not store.is_local:
        yield
        return
    key = f"{site}/{category}/{scope}.lock"
    check_key(key)
    path = Path(store.path(key).path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        deadline = time.monotonic() + wait_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise PartitionLockedError(f"{site}/{category}", f"{scope} of {_holder(path)}") from None
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
