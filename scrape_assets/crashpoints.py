"""Deterministic crash points: a test and reliability hook that SIGKILLs the process on cue.

Production code calls :func:`crashpoint` at the moments where a crash is most
interesting (between two writes that must both happen). Normally it does nothing. When
the environment variable ``SCRAPE_CRASHPOINT`` is ``"<name>:<n>"``, the *n*-th time the
point ``<name>`` is reached in this process, the process sends itself ``SIGKILL`` -
exactly what an external ``kill -9`` landing at that moment does: no ``finally``, no
``atexit``, no flush, no rollback by Python. Only ``SIGKILL`` is used, so nothing in the
pipeline can observe or soften the crash.

Points (where they sit and what a crash there leaves behind)::

    storage.after_temp_write   ObjectStore local write: temp file written and fsynced,
                               not yet renamed  -> old object intact + an orphan .tmp
    storage.after_replace      renamed over the target, folder not yet fsynced
    crawl.after_body_write     page body stored, manifest still says "pending"
                               -> that page is fetched again on resume
    warehouse.after_delete     Warehouse.replace_partition: DELETE run, INSERT not yet,
                               transaction open -> rolled back, previous rows intact
    warehouse.after_insert     INSERT run, not yet committed -> rolled back likewise

The variable is read once, on the first call (set it in the child's environment before
the process starts); hit counts are per process, so in a Dagster run use the in-process
executor to make "the run" and "the process" the same thing (see
``reliability/kill_loop.py``). Used by ``scrape_assets_tests/test_kill_loop.py`` and
``python -m reliability.kill_loop``; never set it in a deployment.
"""

from __future__ import annotations

import os
import signal
import threading

ENV_VAR = "SCRAPE_CRASHPOINT"

#: Every point the code base calls; a ``SCRAPE_CRASHPOINT`` naming another one is an error.
POINTS = frozenset(
    {
        "storage.after_temp_write",
        "storage.after_replace",
        "crawl.after_body_write",
        "warehouse.after_delete",
        "warehouse.after_insert",
    }
)

_UNSET = object()
_armed: object | tuple[str, int] | None = _UNSET  # (name, n) once parsed; None when disarmed
_hits = 0
_lock = threading.Lock()  # pages are written from worker threads (asyncio.to_thread)


def parse_spec(raw: str | None) -> tuple[str, int] | None:
    """Parse a ``SCRAPE_CRASHPOINT`` value.

    Args:
        raw: ``"<name>:<n>"`` with ``name`` one of :data:`POINTS` and ``n >= 1``; empty or
            None disarms.

    Returns:
        ``(name, n)``, or None when ``raw`` is empty.

    Raises:
        ValueError: malformed value or unknown point (the message names the variable).
    """
    if not raw or not raw.strip():
        return None
    name, sep, count = raw.strip().rpartition(":")
    if not sep or name not in POINTS or not count.isdigit() or int(count) < 1:
        raise ValueError(
            f"{ENV_VAR}={raw!r} is invalid: expected '<point>:<n>' with n >= 1 and point one of "
            + ", ".join(sorted(POINTS))
        )
    return name, int(count)


def crashpoint(name: str) -> None:
    """Mark a crash point; SIGKILL this process if ``SCRAPE_CRASHPOINT`` says so (see module docs).

    Args:
        name: the point's name, one of :data:`POINTS`.

    Raises:
        ValueError: on the first call, when ``SCRAPE_CRASHPOINT`` is malformed.
    """
    global _armed, _hits
    armed = _armed
    if armed is None:
        return  # the common case: one comparison
    if armed is _UNSET:
        with _lock:
            if _armed is _UNSET:
                _armed = parse_spec(os.environ.get(ENV_VAR))
        armed = _armed
        if armed is None:
            return
    target, n = armed
    if name != target:
        return
    with _lock:
        _hits += 1
        if _hits == n:
            os.kill(os.getpid(), signal.SIGKILL)


def reset() -> None:
    """Forget the parsed variable and the hit count (for tests in one process)."""
    global _armed, _hits
    with _lock:
        _armed, _hits = _UNSET, 0
