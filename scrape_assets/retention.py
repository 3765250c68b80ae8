"""Snapshot retention: delete old snapshots of a partition without breaking the ones kept.

Every daily run adds a snapshot folder per category (see :mod:`scrape_assets.manifest`).
Unchanged pages are not stored again: a later snapshot's manifest points at the earlier
body (``body_key``), so deleting old folders by hand would break the snapshots that read
them. :func:`prune` keeps, per category:

* the ``keep`` newest *complete* snapshots (``keep >= 1``);
* the snapshot whose ``parsed.json`` is current and the one it stands for (the parse
  state): ``products_table`` and re-parse backfills read them;
* every snapshot newer than the newest complete one (in flight: a run resumes it);
* in the snapshots it deletes, every page body a kept snapshot reads (``body_key``): the
  folder then holds only those bodies, no manifest, and is no longer a snapshot.

Everything else under a deleted snapshot's folder goes: ``manifest.json`` first (the
snapshot disappears at once, so a crash mid-way leaves only unreferenced files, which
the next prune removes), then the journal, ``parsed.json``, ``dead_letters.json``, page
bodies, and temp files left by crashes. Older incomplete snapshots are abandoned (a run
only resumes the newest) and count as deletable.

A category is pruned while holding all four of its partition locks (``raw_pages``,
``parsed_products``, ``products_table``, ``dead_letters``; :mod:`scrape_assets.locks`),
without waiting: a category a run is writing is skipped and reported, never half-pruned.
The other way round, a run that starts while prune holds a category's locks stops at once
like any run meeting another writer, unless ``SCRAPE_LOCK_WAIT_S`` lets it wait (pruning
takes well under a second per category on a local disk): schedule prune away from the
daily run, or give runs a lock wait. A dry run takes no locks and writes nothing (its
figures can be stale if a run is writing meanwhile). A category whose files cannot be read
or deleted is skipped with the reason; the others go on.

Limits: on a remote object store (S3) there are no locks: prune only while no run of
the site is active. Only the categories of the current spec are pruned
(:func:`categories_left_alone` finds the others' folders). The warehouse
(``products``, ``price_history``) and Dagster's run history are not touched: materialization
metadata may name snapshots that no longer exist.
"""

from __future__ import annotations

import re
from contextlib import ExitStack
from dataclasses import dataclass, field

from scrape_assets.errors import ManifestError, PartitionLockedError, StorageError
from scrape_assets.extract import load_parse_state
from scrape_assets.locks import partition_lock
from scrape_assets.manifest import list_snapshots, load_manifest, snapshot_folders
from scrape_assets.spec import PARTITION_KEY_PATTERN
from scrape_assets.storage import ObjectStore

#: The partition lock scopes of the four assets that write under a category.
WRITER_SCOPES = ("raw_pages", "parsed_products", "products_table", "dead_letters")


@dataclass
class PrunePlan:
    """What pruning one category deletes and keeps.

    Attributes:
        kept: snapshot ids kept, oldest first.
        kept_for_parse: those of ``kept`` kept only because the parse state names them (an
            unchanged category's current ``parsed.json`` lives in an older snapshot).
        deleted: snapshot ids deleted (their manifests go), oldest first.
        objects: storage keys deleted, each deleted snapshot's ``manifest.json`` first.
        bytes_freed: total size of ``objects``, bytes.
        bodies_kept: page bodies left in deleted snapshots' folders because a kept snapshot reads them.
        objects_deleted: how many of ``objects`` are gone (all of them after a complete prune).
        skipped: why the category was not (or only partly) pruned, else None.
        in_flight: those of ``kept`` newer than the newest complete snapshot (all of them
            when none is complete): a run resumes the newest.
    """

    category: str
    kept: list[str] = field(default_factory=list)
    kept_for_parse: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)
    objects: list[str] = field(default_factory=list)
    bytes_freed: int = 0
    bodies_kept: int = 0
    objects_deleted: int = 0
    skipped: str | None = None
    in_flight: list[str] = field(default_factory=list)

    def line(self, *, dry_run: bool = False) -> str:
        """One human-readable line, e.g. ``travel: kept 2 snapshots (newest complete <id>, 1 in
        flight), deleted 3 (41 objects, 1.2 MB)``."""
        if self.skipped:
            return f"{self.category}: skipped: {self.skipped}"
        if not (self.kept or self.objects):
            return f"{self.category}: no snapshots"
        verb = "would delete" if dry_run else "deleted"
        complete = [s for s in self.kept if s not in self.in_flight]
        newest = (f"newest complete {complete[-1]}" if complete else "none complete yet") + (
            f", {len(self.in_flight)} in flight" if self.in_flight else "")
        text = (f"{self.category}: kept {len(self.kept)} snapshot{'s' * (len(self.kept) != 1)}"
                f"{' (' + newest + ')' if self.kept else ''}, {verb} {len(self.deleted)} "
                f"({len(self.objects)} objects, {_megabytes(self.bytes_freed)})")
        if self.kept_for_parse:
            text += f"; kept {', '.join(self.kept_for_parse)} for the parse state (current parsed.json)"
        if self.bodies_kept:
            text += (f"; {self.bodies_kept} page bod{'y' if self.bodies_kept == 1 else 'ies'} of deleted snapshots "
                     "kept: newer snapshots read them")
        return text


def _check_keep(keep: int) -> None:
    if keep < 1:
        raise ValueError(f"keep must be >= 1 (the newest complete snapshot is always kept), got {keep}")


def _megabytes(n: int) -> str:
    return f"{n / 1e6:.1f} MB"


def plan_prune(store: ObjectStore, site: str, category: str, keep: int) -> PrunePlan:
    """Decide what pruning ``category`` to ``keep`` complete snapshots deletes (reads only).

    Raises:
        ValueError: ``keep < 1``.
        ManifestError: a snapshot's manifest or the parse state is unreadable (what is
            complete or current, and which bodies are read, is unknown: nothing can be
            decided safely).
        StorageError, OSError: a snapshot folder cannot be listed.
    """
    _check_keep(keep)
    snapshots = list_snapshots(store, site, category)
    manifests = {s: load_manifest(store, site, category, s) for s in snapshots}
    complete = [s for s in snapshots if manifests[s].is_complete]
    keep_ids = set(complete[-keep:])
    # In flight (the next run resumes the newest); nothing complete yet: nothing is old.
    in_flight = snapshots[snapshots.index(complete[-1]) + 1:] if complete else list(snapshots)
    keep_ids.update(in_flight)
    state = load_parse_state(store, site, category)  # ManifestError when unreadable: which parsed.json is current is unknown
    for_parse = set()
    if state is not None:
        for_parse = {s for s in (state.snapshot_id, state.latest_snapshot_id) if s in manifests} - keep_ids
        keep_ids |= for_parse
    protected = {manifests[s].body_key(n) for s in keep_ids for n in manifests[s].pages}
    plan = PrunePlan(category, kept=[s for s in snapshots if s in keep_ids],
                     kept_for_parse=[s for s in snapshots if s in for_parse], in_flight=in_flight)
    folders = [n for n in snapshot_folders(store, site, category) if n not in keep_ids]
    manifest_keys, other_keys = [], []
    for snapshot_id in folders:
        if snapshot_id in manifests:
            plan.deleted.append(snapshot_id)
        for key, size in sorted(store.list_files(f"{site}/{category}/{snapshot_id}")):
            if key in protected:
                plan.bodies_kept += 1
                continue
            (manifest_keys if key.endswith("/manifest.json") else other_keys).append(key)
            plan.bytes_freed += size
    # Every deleted snapshot's manifest before any other file: a later one of them may read a
    # body of an earlier one (a 304), and a prune cut short must not leave a snapshot whose
    # body is gone.
    plan.objects = manifest_keys + other_keys
    return plan


def apply_prune(store: ObjectStore, plan: PrunePlan) -> None:
    """Delete ``plan.objects`` in order, then the folders left empty (local disks).

    Hold the category's writer locks while calling this (:func:`prune` does).
    ``plan.objects_deleted`` counts the deletions done, so a failure part-way is reported
    as it is.

    Raises:
        StorageError, OSError: a delete failed (the objects before it are gone; the
            manifests of all the deleted snapshots go first, so no snapshot is left
            half-readable, nor reading a body already deleted).
    """
    for key in plan.objects:
        store.delete_listed(key)
        plan.objects_deleted += 1
    for snapshot_folder in sorted({"/".join(key.split("/")[:3]) for key in plan.objects}):  # site/category/id
        store.sweep_temp_files(snapshot_folder, prune=True)  # empty folders go; those with kept bodies stay


def categories_left_alone(store: ObjectStore, site: str, categories: list[str]) -> list[str]:
    """Category folders of ``site`` not in ``categories`` (removed from the spec) with snapshot folders, sorted.

    :func:`prune` does not visit them (see the README's "Removing a category"). A folder
    counts when its name is a partition key (:data:`PARTITION_KEY_PATTERN`) and it holds a
    folder named like a snapshot, with a manifest or not. One listing of the site's folder,
    then one per such folder.

    Raises:
        StorageError: a listing failed.
    """
    known = set(categories)
    return [name for name in store.list_folders(site)
            if name not in known and re.fullmatch(PARTITION_KEY_PATTERN, name) and snapshot_folders(store, site, name)]


def prune(
    store: ObjectStore, site: str, categories: list[str], keep: int, *, owner: str, dry_run: bool = False
) -> list[PrunePlan]:
    """Prune each category to ``keep`` complete snapshots (see the module docstring).

    Args:
        keep: complete snapshots to keep per category (``>= 1``).
        owner: who prunes, recorded in the lock files (e.g. ``"scrape-assets prune (pid 123)"``).
        dry_run: plan and report only: no lock taken, nothing written or deleted.

    Returns:
        One plan per category, in order (a category without any snapshot folder: an empty
        plan, no lock taken, nothing written). A category a run is writing, with an unreadable
        manifest or parse state, or whose files could not be listed or deleted, has
        ``skipped`` set (the reason); it lost nothing it needs (see the deletion order).

    Raises:
        ValueError: ``keep < 1``.
    """
    _check_keep(keep)  # before any lock is taken
    plans = []
    for category in categories:
        plan = PrunePlan(category)
        try:
            if not snapshot_folders(store, site, category):
                # Nothing to prune, and no lock taken: a lock file would make the category's
                # folder (a mistyped SCRAPE_DATA_DIR would fill up with empty folders).
                plans.append(plan)
                continue
            with ExitStack() as locks:
                for scope in WRITER_SCOPES if not dry_run else ():
                    locks.enter_context(partition_lock(store, site, category, owner=owner, scope=scope))
                plan = plan_prune(store, site, category, keep)
                if not dry_run:
                    apply_prune(store, plan)
        except PartitionLockedError as exc:
            plan.skipped = f"being written by {exc.holder}"
        except ManifestError as exc:
            plan.skipped = f"not pruned, to be safe: {exc}"
        except (StorageError, OSError) as exc:
            part = f"partly pruned ({plan.objects_deleted} of {len(plan.objects)} objects deleted): "
            plan.skipped = f"{part if plan.objects_deleted else ''}storage failed ({type(exc).__name__}: {exc})"
        plans.append(plan)
    return plans

