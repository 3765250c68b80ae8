"""Garbage-collector policy of a process that loads the definitions (``SCRAPE_GC_FREEZE``).

A ``dagster`` command holds a few hundred thousand long-lived objects once Dagster and
these modules are imported (classes, functions, config schemas). CPython's cyclic
collector walks all of them on every full collection, and several times more while the
interpreter shuts down, although none of them is garbage. :func:`apply_gc_policy`, called
once when :mod:`scrape_assets.definitions` is imported, does two things:

* ``gc.freeze()`` right away: the objects that exist after the definitions load move to
  the collector's permanent generation, so later collections (during the run) skip them,
  and the fork workers of ``parsed_products`` do not dirty (copy) those pages by walking
  them. Objects created afterwards are collected as usual.
* at exit (``atexit``), ``gc.disable()`` and ``gc.freeze()`` again: the interpreter's
  final collections then have nothing to walk. They were 0.55–0.8 s of every
  ``dagster asset materialize`` on the 2-core benchmark host (``benchmarks/analysis.md``),
  after the run had already ended: the command returned that much later.

A step that imports a large library only when it runs (``raw_pages``: httpx and aiohttp,
kept out of the definitions so processes that never fetch do not import them) calls
:func:`freeze_again` after the import, so those modules are out of the way too.

What it costs: cycles among frozen objects are never freed (memory of the process, given
back when it exits), and at exit the ``__del__`` of objects that are only reachable
through a reference cycle is not called. Everything this project writes is closed and
committed by then: files by context managers, the warehouse by the steps that use it,
the Dagster instance by the ``dagster`` CLI and ``scrape-assets demo`` (a WAL file a
process killed outright leaves behind is replayed by the next connection). Standard
streams are flushed by the interpreter as usual. ``atexit`` handlers all still run.

``SCRAPE_GC_FREEZE=0`` turns both off (Python's defaults), e.g. to rule this out when
chasing a leak; any value other than ``0`` or ``1`` raises
:class:`~scrape_assets.errors.SettingsError` naming the variable.

Reference: :func:`gc.freeze` (Python 3.7+), https://docs.python.org/3/library/gc.html#gc.freeze
"""

from __future__ import annotations

import atexit
import gc
import os
from collections.abc import Mapping

from scrape_assets.errors import SettingsError

VARIABLE = "SCRAPE_GC_FREEZE"
_applied = False


def gc_freeze_enabled(env: Mapping[str, str] | None = None) -> bool:
    """Whether ``SCRAPE_GC_FREEZE`` asks for the policy (unset or empty: yes).

    Raises:
        SettingsError: the value is neither ``0`` nor ``1``.
    """
    raw = (os.environ if env is None else env).get(VARIABLE, "").strip()
    if raw not in ("", "0", "1"):
        raise SettingsError(VARIABLE, raw, "0 (Python's default collector) or 1 (freeze; the default)")
    return raw != "0"


def _skip_final_collections() -> None:
    gc.disable()
    gc.freeze()


def freeze_again() -> None:
    """``gc.freeze()`` once more when the policy is in place (a no-op otherwise).

    For a step that imports a large library lazily (``raw_pages``: httpx, aiohttp): its
    modules arrived after the definitions' freeze, so without this the collector's full
    passes during the step would walk them. ``gc.freeze()`` itself is O(1).
    """
    if _applied:
        gc.freeze()


def apply_gc_policy(env: Mapping[str, str] | None = None) -> bool:
    """Freeze the objects alive now and skip the collector's work at exit, once per process.

    Returns:
        True when the policy is (already) in place, False when ``SCRAPE_GC_FREEZE=0``.

    Raises:
        SettingsError: ``SCRAPE_GC_FREEZE`` has a value other than ``0`` or ``1``.
    """
    global _applied
    if not gc_freeze_enabled(env):
        return False
    if not _applied:
        gc.freeze()
        atexit.register(_skip_final_collections)
        _applied = True
    return True
