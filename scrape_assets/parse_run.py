"""Parse a run's partitions: unchanged ones skipped, the others parsed and validated on every core.

``parsed_products`` calls :func:`parse_partitions` with the run's categories. For each:

* its input (the latest complete snapshot's pages + parser + rules, see
  :func:`~scrape_assets.extract.input_version`) is unchanged since a parse that passed the
  schema under the spec's current ``validation.max_rejected_share``: nothing is read,
  parsed or validated again;
* it is unchanged but failed the schema last time, or was judged under another share: the
  saved rows are validated again;
* otherwise its saved pages are parsed, the rows encoded and validated in a **worker
  process**, and this process writes ``parsed.json`` and the parse state.

Parsing is CPU-bound and one category does not depend on another, so with ``workers > 1``
categories are parsed in a process pool (``fork``: the workers inherit the loaded code,
no start-up cost). Workers only read; every write stays in the calling process, in
category order, so a crash leaves the same states as a serial run (a worker that dies: the
parses finished by then are saved, and :class:`ParseWorkerDied` names the unfinished
categories); workers die with the
step's process (``PR_SET_PDEATHSIG``), so a killed step leaves no worker holding its
partition locks. At most
``2 * workers`` results wait in memory. ``workers == 1``, a single category to parse, or a
platform without ``fork`` (the pool is Linux-only) parse serially in this process.
"""

from __future__ import annotations

import collections
import ctypes
import gc
import multiprocessing
import os
import signal
import sys
from collections.abc import Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, replace

from scrape_assets.counts import counted
from scrape_assets.errors import ManifestError
from scrape_assets.extract import (
    ParsedSnapshot,
    ParseState,
    encode_parsed,
    extract_snapshot,
    input_version,
    load_current,
    load_parse_state,
    save_parse_state,
    save_parsed,
)
from scrape_assets.gc_tuning import gc_freeze_enabled
from scrape_assets.manifest import Manifest, latest_manifest
from scrape_assets.spec import SiteSpec
from scrape_assets.storage import ObjectStore
from scrape_assets.validation_report import ValidationReport, common_reasons

#: Most worker processes :func:`default_workers` suggests (memory: each is a copy-on-write fork).
MAX_DEFAULT_WORKERS = 4
_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


@dataclass(frozen=True)
class PartitionParse:
    """What parsing one partition did.

    Attributes:
        figures: ``snapshot_id, parsed_snapshot_id, pages_parsed, products, rejects, unchanged``.
        report: the schema's verdict; None when the input was unchanged since a parse that
            passed (nothing validated).
        line: one human-readable log line.
        products_expected: the results count the site shows on page 1 (e.g. "32 results"),
            when every page of the snapshot was fetched; None otherwise, when the spec
            names no results count, or when the listing moved.
        listing_moved: how the parsed pages disagree about the listing's size (see
            :attr:`~scrape_assets.extract.ParsedSnapshot.listing_moved`; for rows reused
            unchanged, as their parse recorded it); None when they agree.
    """

    category: str
    figures: dict
    report: ValidationReport | None
    line: str
    products_expected: int | None = None
    listing_moved: str | None = None


@dataclass(frozen=True)
class _Encoded:
    """A worker's result: ``parsed.json``'s bytes, counts and the schema's verdict."""

    data: bytes
    snapshot_id: str
    pages: int
    products: int
    rejects: int
    report: ValidationReport
    listing_moved: str | None = None


def default_workers() -> int:
    """CPUs this process may run on, at most :data:`MAX_DEFAULT_WORKERS`."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, min(cpus, MAX_DEFAULT_WORKERS))


def _init_worker(parent_pid: int, freeze: bool) -> None:
    """Pool initializer: die with the parent; with ``freeze``, ``gc.freeze()`` what was inherited.

    Frozen, the objects inherited from the step's process are skipped by the worker's
    collections instead of walked (and their pages copied) on each one; the step's process
    itself is left as it was (see :mod:`scrape_assets.gc_tuning`).
    """
    _die_with_parent(parent_pid)
    if freeze:
        gc.freeze()


def _die_with_parent(parent_pid: int) -> None:
    """Pool initializer: the worker gets SIGKILL when the step's process dies (Linux prctl).

    Without it, workers of a step killed with SIGKILL would wait forever on their task
    queue, keeping copies of the step's partition lock descriptors (flock) open, so the
    partitions would stay locked until someone killed them by hand.
    """
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    if os.getppid() != parent_pid:  # the parent died before prctl took effect
        os._exit(1)


def _validate(parsed: ParsedSnapshot, spec: SiteSpec) -> ValidationReport:
    """The pandera schemas' verdict on a snapshot's rows (pandas is imported only here)."""
    from scrape_assets.schemas import REJECTED_SHARE_CHECK, pages_frame, products_frame, validate_parsed

    pages = pages_frame(parsed.pages, max_rejected_share=spec.validation.max_rejected_share)
    report = validate_parsed(products_frame(parsed.products), pages)
    if not report.passed and parsed.rejects:  # say which field stopped parsing, not only which pages
        reasons = common_reasons(r["reason"] for r in parsed.rejects)
        for case in report.failure_cases:
            if case["check"] == REJECTED_SHARE_CHECK:
                case["reject_reasons"] = reasons
    return report


def _parse_and_validate(store: ObjectStore, manifest: Manifest, spec: SiteSpec) -> _Encoded:
    """Worker: parse a snapshot's saved pages, validate the rows, encode ``parsed.json`` (reads only)."""
    parsed = extract_snapshot(store, manifest, spec, fetch_base_url=manifest.fetch_config.get("base_url", spec.base_url))
    report = _validate(parsed, spec)
    return _Encoded(encode_parsed(parsed), parsed.snapshot_id, len(parsed.pages), len(parsed.products),
                    len(parsed.rejects), report, parsed.listing_moved)


def parse_partitions(
    store: ObjectStore, spec: SiteSpec, categories: list[str], *, workers: int = 1
) -> Iterator[PartitionParse]:
    """Parse (or skip) each category's latest complete snapshot; yield results in category order.

    Args:
        workers: processes parsing at once (``>= 1``; see the module docstring).

    Raises:
        ManifestError: a category has no complete snapshot (materialize ``raw_pages`` first),
            or a page marked done is missing from storage.
        ValueError: ``workers < 1``.
    """
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    plans = []  # (category, manifest, version, state, needs a parse)
    for category in categories:
        manifest = latest_manifest(store, spec.name, category, complete=True)
        if manifest is None:
            raise ManifestError(
                f"{spec.name}/{category}",
                f"no complete snapshot in {store.describe()}: materialize raw_pages for this partition first "
                "(or is this the storage it was scraped into?)",
            )
        version = input_version(manifest, spec)
        state = load_parse_state(store, spec.name, category)
        plans.append((category, manifest, version, state, state is None or state.input_version != version))
    to_parse = [plan for plan in plans if plan[4]]
    pool, workers = None, min(workers, len(to_parse))
    if workers > 1 and "fork" in multiprocessing.get_all_start_methods() and sys.platform == "linux":
        # Import the validation code (pandas, pandera: ~0.4 s) once, before forking, rather
        # than once in every worker; a run with nothing to parse never imports it.
        import scrape_assets.schemas  # noqa: F401

        pool = ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("fork"),
                                   initializer=_init_worker, initargs=(os.getpid(), gc_freeze_enabled()))
    try:
        pending: collections.deque[tuple[tuple, Future]] = collections.deque()  # (plan, its parse)
        queue = iter(to_parse)

        def top_up() -> None:  # keep the workers busy, with a bounded number of results waiting
            while pool is not None and len(pending) < 2 * workers:
                nxt = next(queue, None)
                if nxt is None:
                    return
                pending.append((nxt, pool.submit(_parse_and_validate, store, nxt[1], spec)))

        top_up()
        for category, manifest, version, state, parse in plans:
            if not parse:
                result = _reuse(store, spec, category, manifest, version, state)
            else:
                if pool is not None:
                    plan, future = pending.popleft()
                    try:
                        encoded = future.result()
                    except BrokenProcessPool as exc:
                        raise _worker_died(store, spec, [(plan, future), *pending]) from exc
                    top_up()
                else:
                    encoded = _parse_and_validate(store, manifest, spec)
                result = _save(store, spec, category, manifest, version, encoded, state)
            # page 1's count is no yardstick when the listing moved (it says so itself)
            sure = manifest.sees_every_page and result.listing_moved is None
            yield replace(result, products_expected=manifest.products_expected if sure else None)
    finally:
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)


class ParseWorkerDied(RuntimeError):
    """A parse worker process ended abruptly (killed by the system: out of memory, say)."""


def _worker_died(store: ObjectStore, spec: SiteSpec, in_pool: list[tuple[tuple, Future]]) -> ParseWorkerDied:
    """The error for a pool a worker died in, once the parses it finished are saved.

    ``in_pool``: ``(plan, future)`` of the categories handed to the pool and not yet saved, in
    order. Python does not say which category the dead worker held: the message names every
    one that was not finished.
    """
    lost = []
    for (category, manifest, version, state, _), future in in_pool:
        if future.done() and not future.cancelled() and future.exception() is None:
            _save(store, spec, category, manifest, version, future.result(), state)
        else:
            lost.append(category)
    return ParseWorkerDied(
        f"a parse worker process died (killed by the system: out of memory?) while parsing one of "
        f"{', '.join(lost)}; the categories parsed before are saved, so a retry of the step parses only "
        "the others (run config ops: {parsed_products: {config: {parse_workers: 1}}} parses in the step's own "
        "process)"
    )


def _standing_for(manifest: Manifest) -> dict:
    """The parse state's fields naming the latest complete snapshot its rows stand for."""
    return {"latest_snapshot_id": manifest.snapshot_id, "latest_completed_at": manifest.completed_at}


def _reuse(store: ObjectStore, spec: SiteSpec, category: str, manifest: Manifest, version: str,
           state: ParseState) -> PartitionParse:
    """Same input as the current parse: keep its rows, validated again when they failed or
    the spec's ``validation.max_rejected_share`` is not the one they were judged under
    (raised or lowered alike)."""
    share = spec.validation.max_rejected_share
    same_share = state.max_rejected_share == share
    figures = {"snapshot_id": manifest.snapshot_id, "parsed_snapshot_id": state.snapshot_id, "pages_parsed": 0,
               "products": state.products, "rejects": state.rejects, "unchanged": True,
               "validated_again": not (state.validated and same_share)}
    if not figures["validated_again"]:
        save_parse_state(store, spec.name, category, replace(state, **_standing_for(manifest)))
        return PartitionParse(category, figures, None,
                              f"{category}: unchanged since snapshot {state.snapshot_id}: 0 pages re-parsed",
                              listing_moved=state.listing_moved)
    parsed, _ = load_current(store, spec.name, category)
    report = _validate(parsed, spec)
    save_parse_state(store, spec.name, category,
                     replace(state, **_standing_for(manifest), validated=report.passed, max_rejected_share=share))
    why = ""  # the rows failed last time under this share (or under none recorded): no more to say
    if not same_share and state.max_rejected_share is not None:
        why = f" under validation.max_rejected_share {share:g} (was {state.max_rejected_share:g})"
    elif not same_share and state.validated:
        why = f" under validation.max_rejected_share {share:g} (its state recorded none: once after upgrading)"
    return PartitionParse(category, figures, report, (
        f"{category}: unchanged since snapshot {state.snapshot_id}: 0 pages re-parsed; its "
        f"{counted(state.products, 'product')} and {counted(state.rejects, 'rejected card')} validated again{why} "
        f"(schema {'passed' if report.passed else 'FAILED'})"), listing_moved=state.listing_moved)


def _save(store: ObjectStore, spec: SiteSpec, category: str, manifest: Manifest, version: str,
          encoded: _Encoded, state: ParseState | None) -> PartitionParse:
    if state is not None and state.snapshot_id == encoded.snapshot_id:
        # parsed.json is about to be replaced under a state that vouches for it (a re-parse
        # of the same snapshot): withdraw the vouch first, or a crash between the two writes
        # would leave new, unchecked rows standing for the old input, loadable as such.
        save_parse_state(store, spec.name, category, replace(state, input_version="", validated=False))
    save_parsed(store, manifest, encoded.data)
    save_parse_state(
        store, spec.name, category,
        ParseState(snapshot_id=encoded.snapshot_id, input_version=version, **_standing_for(manifest),
                   validated=encoded.report.passed, products=encoded.products, rejects=encoded.rejects,
                   max_rejected_share=spec.validation.max_rejected_share, listing_moved=encoded.listing_moved),
    )
    figures = {"snapshot_id": manifest.snapshot_id, "parsed_snapshot_id": encoded.snapshot_id,
               "pages_parsed": encoded.pages, "products": encoded.products, "rejects": encoded.rejects,
               "unchanged": False, "validated_again": False}
    return PartitionParse(category, figures, encoded.report, _line(category, encoded.products, encoded.pages,
                                                                   encoded.snapshot_id, encoded.rejects, encoded.report),
                          listing_moved=encoded.listing_moved)


def _line(category: str, products: int, pages: int, snapshot_id: str, rejects: int, report: ValidationReport) -> str:
    return (
        f"{category}: parsed {counted(products, 'product')} from {counted(pages, 'page')} of snapshot {snapshot_id} "
        f"({counted(rejects, 'rejected card')}; schema {'passed' if report.passed else 'FAILED'})"
        + (": no product card found; if the category is not empty, check the spec's selectors.product (with "
           "pagination.results_count the schema check tells an empty listing from one it cannot read)"
           if pages and not products and not rejects and report.passed else "")
    )
