"""Manifests: atomic saves, resume rules, refused resume on a changed fetch config."""

from __future__ import annotations

import dataclasses
import json
import os
import threading
from datetime import datetime, timedelta, timezone

import pytest

from scrape_assets.errors import FetchConfigChangedError, ManifestError
from scrape_assets.manifest import (
    Manifest,
    PageEntry,
    differing_keys,
    latest_manifest,
    list_snapshots,
    load_manifest,
    snapshot_sort_key,
    open_snapshot,
)
from scrape_assets.storage import ObjectStore

CONFIG = {"site": "demo", "base_url": "http://x/", "max_attempts": 3, "requests_per_second": 5.0}
T0 = datetime(2026, 11, 30, 8, 45, 12, tzinfo=timezone.utc)


def _open(store, **kw):
    return open_snapshot(store, site="demo", category="travel", start_url="http://x/t/index.html", **kw)


def _two_pages_one_attempt_journalled(tmp_path) -> tuple[ObjectStore, Manifest]:
    """A new snapshot with pages 1 and 2 saved in full, then page 1's first attempt as the
    journal's one line (seq 1)."""
    store = ObjectStore(str(tmp_path))
    manifest, _ = _open(store, fetch_config=CONFIG, now=T0)
    manifest.pages[2] = PageEntry(url="http://x/t/page-2.html")
    manifest.save(store)
    manifest.pages[1].attempts = 1
    manifest.record(store, 1)
    return store, manifest


def test_new_snapshot_is_saved_with_page_one_pending(tmp_path):
    store = ObjectStore(str(tmp_path))
    manifest, resumed = _open(store, fetch_config=CONFIG, now=T0)
    assert resumed is False
    assert manifest.snapshot_id == "2026-11-30T084512Z"
    assert manifest.key == "demo/travel/2026-11-30T084512Z/manifest.json"
    assert manifest.page_key(7) == "demo/travel/2026-11-30T084512Z/pages/page-0007.html"
    loaded = load_manifest(store, "demo", "travel", manifest.snapshot_id)
    assert loaded.pages == {1: PageEntry(url="http://x/t/index.html")}
    assert loaded.fetch_config == CONFIG
    assert len(loaded.fetch_config_hash) == 64


def test_incomplete_snapshot_is_resumed_with_attempts(tmp_path):
    store = ObjectStore(str(tmp_path))
    manifest, _ = _open(store, fetch_config=CONFIG, now=T0)
    manifest.pages[1] = PageEntry(url="http://x/t/index.html", status="done", attempts=2, http_status=200)
    manifest.pages[2] = PageEntry(url="http://x/t/page-2.html", status="pending", attempts=1)
    manifest.save(store)
    again, resumed = _open(store, fetch_config=dict(CONFIG))
    assert resumed is True
    assert again.snapshot_id == manifest.snapshot_id
    assert again.pages[2].attempts == 1 and again.pages[1].status == "done"


def test_changed_config_refuses_resume_listing_keys_unless_new_snapshot(tmp_path):
    store = ObjectStore(str(tmp_path))
    _open(store, fetch_config=CONFIG, now=T0)
    changed = {**CONFIG, "max_attempts": 5, "requests_per_second": 1.0}
    with pytest.raises(FetchConfigChangedError) as info:
        _open(store, fetch_config=changed)
    assert info.value.differing_keys == ["max_attempts"]  # the rate is the pace only: not a reason to refuse
    # Each with what the snapshot was fetched with and what it is now, so the earlier settings can be restored.
    assert "(differing keys: max_attempts (was 3, now 5))" in str(info.value)
    # A key one side lacks says so; URLs lose their user info and query (the message reaches logs and alerts).
    from scrape_assets.manifest import resume_conflict

    refused = resume_conflict(store, site="demo", category="travel",
                              fetch_config={**CONFIG, "base_url": "http://u:secret@x/?token=t", "proxy": True})
    assert ("base_url (was 'http://x/', now 'http://x/ (differs where it is not shown)'), "
            "proxy (was absent, now True)") in str(refused)
    assert "secret" not in str(refused) and "token" not in str(refused)
    assert "new_snapshot: true" in str(info.value)
    fresh, resumed = _open(store, fetch_config=changed, new_snapshot=True, now=T0)
    assert resumed is False
    assert fresh.snapshot_id == "2026-11-30T084512Z-1"  # same second: still unique and sorted after
    assert list_snapshots(store, "demo", "travel") == ["2026-11-30T084512Z", "2026-11-30T084512Z-1"]


def test_a_snapshot_resumes_at_another_pace_and_records_the_pace_it_goes_on_at(tmp_path):
    """A rate lowered after a run of 429s, a longer timeout: what pages are asked is the same,
    so the snapshot resumes (before: refused until the earlier settings were restored)."""
    from scrape_assets.fetcher import FetchPolicy
    from scrape_assets.manifest import PACING_KEYS, config_hash, resume_conflict

    assert PACING_KEYS <= {f.name for f in dataclasses.fields(FetchPolicy)}
    store = ObjectStore(str(tmp_path))
    first, _ = _open(store, fetch_config={**CONFIG, "timeout_s": 20.0}, now=T0)
    slower = {**CONFIG, "requests_per_second": 0.5, "timeout_s": 60.0}
    assert resume_conflict(store, site="demo", category="travel", fetch_config=slower) is None
    told = []
    again, resumed = open_snapshot(store, site="demo", category="travel", start_url="http://x/t/index.html",
                                   fetch_config=slower, now=T0, on_repace=lambda m, changes: told.append(changes))
    assert (resumed, again.snapshot_id) == (True, first.snapshot_id)
    assert told == [{"requests_per_second": (5.0, 0.5), "timeout_s": (20.0, 60.0)}]
    saved = load_manifest(store, "demo", "travel", first.snapshot_id)
    assert (saved.fetch_config, saved.fetch_config_hash) == (slower, config_hash(slower))
    # A pace change together with another key still refuses, naming the other key only.
    with pytest.raises(FetchConfigChangedError) as info:
        _open(store, fetch_config={**CONFIG, "requests_per_second": 9.0, "user_agent": "other/1.0"})
    assert info.value.differing_keys == ["user_agent"]


def test_a_category_moved_to_another_start_url_refuses_to_resume_its_old_snapshot(tmp_path):
    """Its pages are another listing's: resuming would mix two listings in one snapshot."""
    from scrape_assets.manifest import resume_conflict

    store = ObjectStore(str(tmp_path))
    old, _ = _open(store, fetch_config=CONFIG, now=T0)  # incomplete, from http://x/t/index.html
    moved = "http://x/moved/index.html"
    refused = resume_conflict(store, site="demo", category="travel", fetch_config=CONFIG, start_url=moved)
    assert refused.differing_keys == ["start_url"] and refused.location == old.key
    assert "fetched with a different config or from another start URL (the spec moved the category) " \
        "(differing keys: start_url (was 'http://x/t/index.html', now 'http://x/moved/index.html'))" in str(refused)
    with pytest.raises(FetchConfigChangedError) as info:
        open_snapshot(store, site="demo", category="travel", start_url=moved, fetch_config=CONFIG, now=T0)
    assert info.value.differing_keys == ["start_url"]
    both = resume_conflict(store, site="demo", category="travel", fetch_config={**CONFIG, "max_attempts": 5},
                           start_url=moved)
    assert both.differing_keys == ["max_attempts", "start_url"]
    assert resume_conflict(store, site="demo", category="travel", fetch_config=CONFIG,
                           start_url="http://x/t/index.html") is None  # the same URL: resumed as before
    # Start URLs that differ only where they are not shown (a query) do not read as the same value.
    hidden = resume_conflict(store, site="demo", category="travel", fetch_config=CONFIG,
                             start_url="http://x/t/index.html?sort=S3CRET")
    assert "start_url (was 'http://x/t/index.html', now 'http://x/t/index.html (differs where it is not shown)')" \
        in str(hidden) and "S3CRET" not in str(hidden)
    fresh, resumed = open_snapshot(store, site="demo", category="travel", start_url=moved, fetch_config=CONFIG,
                                   new_snapshot=True, now=T0)
    assert resumed is False and fresh.pages[1].url == moved


def test_resume_conflict_answers_as_open_snapshot_would_without_writing(tmp_path):
    from datetime import timedelta

    from scrape_assets.manifest import resume_conflict

    store = ObjectStore(str(tmp_path))
    changed = {**CONFIG, "max_attempts": 5}

    def conflict(config, now, max_age=timedelta(hours=20)):
        return resume_conflict(store, site="demo", category="travel", fetch_config=config, now=now,
                               resume_max_age=max_age)

    assert conflict(changed, T0) is None  # nothing to resume
    first, _ = _open(store, fetch_config=CONFIG, now=T0)  # incomplete
    assert conflict(CONFIG, T0) is None
    refused = conflict(changed, T0 + timedelta(hours=1))
    assert refused.differing_keys == ["max_attempts"] and refused.location == first.key
    with pytest.raises(FetchConfigChangedError):  # open_snapshot agrees
        _open(store, fetch_config=changed, now=T0 + timedelta(hours=1), resume_max_age=timedelta(hours=20))
    # Too old to resume: a new snapshot would start, whatever its config.
    assert conflict(changed, T0 + timedelta(hours=21)) is None
    assert conflict(changed, T0 + timedelta(hours=21), max_age=None) is not None
    assert list_snapshots(store, "demo", "travel") == [first.snapshot_id]  # nothing written by asking


def test_more_than_ten_snapshots_in_one_second_stay_unique_and_in_order(tmp_path):
    # "-10" sorts before "-2" as text: the order must be numeric, or the 12th snapshot would
    # reuse (and overwrite) "-10" after "-9" was wrongly taken for the newest.
    store = ObjectStore(str(tmp_path))
    ids = [_open(store, fetch_config=CONFIG, new_snapshot=True, now=T0)[0].snapshot_id for _ in range(12)]
    assert ids == ["2026-11-30T084512Z"] + [f"2026-11-30T084512Z-{n}" for n in range(1, 12)]
    assert list_snapshots(store, "demo", "travel") == ids
    assert latest_manifest(store, "demo", "travel").snapshot_id == "2026-11-30T084512Z-11"
    assert sorted(["2026-11-30T084512Z-10", "2026-11-30T084513Z", "2026-11-30T084512Z-9"], key=snapshot_sort_key) == [
        "2026-11-30T084512Z-9", "2026-11-30T084512Z-10", "2026-11-30T084513Z"]


def test_an_incomplete_snapshot_older_than_resume_max_age_is_left_and_a_new_one_starts(tmp_path):
    store = ObjectStore(str(tmp_path))
    stale, _ = _open(store, fetch_config=CONFIG, now=T0)
    assert stale.created_at == "2026-11-30T08:45:12Z"  # the snapshot's start, from the same clock as its id
    max_age = timedelta(hours=20)
    # Within the age (and exactly at it): resumed, whatever day it is now.
    for later in (timedelta(hours=19), max_age):
        again, resumed = _open(store, fetch_config=CONFIG, now=T0 + later, resume_max_age=max_age)
        assert resumed is True and again.snapshot_id == stale.snapshot_id
    abandoned = []
    fresh, resumed = _open(store, fetch_config={**CONFIG, "max_attempts": 9}, now=T0 + timedelta(hours=25),
                           resume_max_age=max_age, on_abandon=abandoned.append)
    assert resumed is False and fresh.snapshot_id == "2026-12-01T094512Z"  # no FetchConfigChangedError either
    assert [m.snapshot_id for m in abandoned] == [stale.snapshot_id]
    assert load_manifest(store, "demo", "travel", stale.snapshot_id).is_complete is False  # left as it was
    # Without an age limit the stale one would have been resumed (the default of open_snapshot).
    assert _open(store, fetch_config={**CONFIG, "max_attempts": 9}, now=T0 + timedelta(days=9))[0].snapshot_id == fresh.snapshot_id


def test_a_complete_snapshot_of_a_dead_run_is_adopted_only_within_resume_max_age(tmp_path):
    """A run killed after completing a category but before recording it: the restart the
    same day takes the snapshot as it is; a run days later must fetch today's pages."""
    store = ObjectStore(str(tmp_path))
    done, _ = _open(store, fetch_config=CONFIG, now=T0)
    done.completed_at = "2026-11-30T08:46:00Z"
    done.save(store)
    max_age = timedelta(hours=20)
    adopted, resumed = _open(store, fetch_config=CONFIG, now=T0 + timedelta(hours=3), resume_max_age=max_age,
                             adopt_complete=lambda m: True)
    assert resumed is True and adopted.snapshot_id == done.snapshot_id
    abandoned = []
    fresh, resumed = _open(store, fetch_config=CONFIG, now=T0 + timedelta(days=7), resume_max_age=max_age,
                           adopt_complete=lambda m: True, on_abandon=abandoned.append)
    assert resumed is False and fresh.snapshot_id == "2026-12-07T084512Z"
    assert [m.snapshot_id for m in abandoned] == [done.snapshot_id]


def test_complete_snapshot_starts_a_new_one_and_latest_complete_is_found(tmp_path):
    store = ObjectStore(str(tmp_path))
    first, _ = _open(store, fetch_config=CONFIG, now=T0)
    first.completed_at = "2026-11-30T08:46:00Z"
    first.save(store)
    second, resumed = _open(store, fetch_config={**CONFIG, "max_attempts": 9}, now=T0.replace(hour=9))
    assert resumed is False  # a changed config is fine once the previous snapshot completed
    assert latest_manifest(store, "demo", "travel").snapshot_id == second.snapshot_id
    assert latest_manifest(store, "demo", "travel", complete=True).snapshot_id == first.snapshot_id


def test_a_snapshot_folder_copied_into_another_category_is_refused_saying_to_move_it(tmp_path):
    import shutil

    store = ObjectStore(str(tmp_path))
    manifest, _ = _open(store, fetch_config=CONFIG, now=T0)
    shutil.copytree(tmp_path / "demo" / "travel", tmp_path / "demo" / "mystery")
    with pytest.raises(ManifestError) as info:
        latest_manifest(store, "demo", "mystery")
    assert str(info.value) == (
        f"demo/mystery/{manifest.snapshot_id}/manifest.json: manifest belongs to demo/travel/{manifest.snapshot_id} (a "
        f"folder copied in?); move its folder out of {store.describe()}: mystery then goes on from its previous "
        "complete snapshot, or crawls anew")


def test_manifest_round_trip_and_corruption_is_reported(tmp_path):
    store = ObjectStore(str(tmp_path))
    manifest, _ = _open(store, fetch_config=CONFIG, now=T0)
    raw = store.read_bytes(manifest.key)
    assert Manifest.from_json(raw, "m").to_json() == raw
    # Non-finite floats in the fetch config (a timeout of inf) come back as written, not as null.
    odd = Manifest.from_json(raw, "m")
    odd.fetch_config = {**odd.fetch_config, "timeout_s": float("inf"), "big": 2**70}
    assert Manifest.from_json(odd.to_json(), "m").fetch_config == odd.fetch_config
    # One field per line, one page entry per line: readable and diffable by hand.
    manifest.pages[1].last_error = "timeout: read \u2026"
    manifest.pages[1].retry_at = "2026-12-03T19:30:05Z"
    manifest.pages[2] = PageEntry(url="http://x/t/page-2.html", status="done", attempts=1, content_hash="sha256:ab")
    manifest.pages[3] = PageEntry(url="http://x/t/page-3.html", status="done", final_url="http://x/moved/page-3.html",
                                  body_fetched_at="2026-12-01T08:00:00Z", meta_charset="cp1251")
    text = manifest.to_json().decode()

    def entry(p: PageEntry) -> dict:  # the optional fields only when set: older versions read the rest
        return {k: v for k, v in dataclasses.asdict(p).items()
                if k not in ("final_url", "retry_at", "failed_at", "body_fetched_at", "meta_charset") or v is not None}

    assert json.loads(text) == json.loads(json.dumps(dataclasses.asdict(manifest) | {
        "pages": {str(n): entry(p) for n, p in manifest.pages.items()}}))
    page_lines = [line for line in text.splitlines() if line.startswith('  "')]
    assert [json.loads("{" + line.rstrip(",") + "}") for line in page_lines] == [
        {str(n): entry(p)} for n, p in sorted(manifest.pages.items())]
    assert ["final_url" in line for line in page_lines] == [False, False, True]
    assert ["retry_at" in line for line in page_lines] == [True, False, False]
    assert ["body_fetched_at" in line for line in page_lines] == [False, False, True]
    assert ["meta_charset" in line for line in page_lines] == [False, False, True]
    assert Manifest.from_json(manifest.to_json(), "m").pages == manifest.pages
    store.write_bytes_atomic(manifest.key, raw[: len(raw) // 2])
    with pytest.raises(ManifestError, match="unreadable manifest"):
        load_manifest(store, "demo", "travel", manifest.snapshot_id)
    # Valid JSON of the wrong shape: what was expected, not a Python attribute error.
    whole = json.loads(text)
    for shape, got in (([], "expected a JSON object, got an array"),
                       ({k: v for k, v in whole.items() if k != "pages"}, "the `pages` key is missing"),
                       ({**whole, "pages": "x"}, "expected `pages` to be an object of page number -> entry object, "
                                                "got a string"),
                       ({**whole, "pages": {"1": 5}}, "expected `pages` to be an object of page number -> entry "
                                                     "object, got an object holding a non-object entry")):
        store.write_bytes_atomic(manifest.key, json.dumps(shape).encode())
        with pytest.raises(ManifestError) as info:
            load_manifest(store, "demo", "travel", manifest.snapshot_id)
        assert str(info.value) == (
            f"{manifest.key}: unreadable manifest: {got}; restore it, or move its folder out of {store.describe()}: "
            "travel then goes on from its previous complete snapshot, or crawls anew")


def test_concurrent_saves_never_leave_a_torn_manifest(tmp_path):
    """Readers racing many writers only ever see a complete manifest (atomic rename)."""
    store = ObjectStore(str(tmp_path))
    manifest, _ = _open(store, fetch_config=CONFIG, now=T0)
    stop = threading.Event()
    seen, errors = [], []

    def writer(offset):
        for i in range(40):
            m = Manifest.from_json(manifest.to_json(), "copy")
            for n in range(2, 60):
                m.pages[n] = PageEntry(url=f"http://x/t/page-{n}.html", attempts=i + offset)
            m.save(store)

    def reader():
        while not stop.is_set():
            try:
                seen.append(len(json.loads(store.read_bytes(manifest.key))["pages"]))
            except (ValueError, FileNotFoundError) as exc:  # pragma: no cover - the failure we test for
                errors.append(exc)

    r = threading.Thread(target=reader)
    r.start()
    writers = [threading.Thread(target=writer, args=(k,)) for k in range(3)]
    for w in writers:
        w.start()
    for w in writers:
        w.join()
    stop.set()
    r.join()
    assert errors == []
    assert set(seen) <= {1, 59} and 59 in seen
    leftovers = [n for n in os.listdir(tmp_path / manifest.prefix) if n.endswith(".tmp")]
    assert leftovers == []


def test_differing_keys():
    assert differing_keys({"a": 1, "b": 2}, {"a": 1, "b": 3, "c": 4}) == ["b", "c"]


def test_journal_records_replay_on_load_and_a_torn_tail_is_ignored(tmp_path):
    store, manifest = _two_pages_one_attempt_journalled(tmp_path)
    manifest.pages[1].status, manifest.pages[1].http_status = "done", 200
    manifest.record(store, 1)
    manifest.pages[2].attempts = 1
    manifest.record(store, 2)
    on_disk = json.loads(store.read_bytes(manifest.key))
    assert on_disk["pages"]["1"]["status"] == "pending"  # the file itself was not rewritten
    loaded = load_manifest(store, "demo", "travel", manifest.snapshot_id)
    assert (loaded.pages[1].status, loaded.pages[1].attempts, loaded.pages[2].attempts) == ("done", 1, 1)
    assert loaded.journal_seq == 3
    # A crash in the middle of an append leaves a torn last line: it is ignored.
    store.append_bytes(manifest.journal_key, b'{"seq":4,"page":2,"entry":{"url":"http://x/t/pa')
    loaded = load_manifest(store, "demo", "travel", manifest.snapshot_id)
    assert loaded.pages[2].status == "pending" and loaded.journal_seq == 3
    # A corrupt line in the middle is an error, not silently skipped.
    store.append_bytes(manifest.journal_key, b'\n{"seq":5,"page":2,"entry":{"url":"u","status":"done"}}\n')
    with pytest.raises(ManifestError, match="journal line 4 unreadable") as info:
        load_manifest(store, "demo", "travel", manifest.snapshot_id)
    assert str(info.value).startswith(f"{manifest.journal_key}: journal line 4 unreadable: ")
    assert str(info.value).endswith(f"; move its folder out of {store.describe()}: travel then goes on from its "
                                    "previous complete snapshot, or crawls anew")


def test_a_change_after_a_torn_journal_is_saved_in_full_not_glued_to_the_torn_line(tmp_path):
    from scrape_assets.errors import StorageError

    class _FullOnce(ObjectStore):  # the next append writes half its line, then the disk is full
        tear = False

        def append_bytes(self, key, data):
            if _FullOnce.tear:
                _FullOnce.tear = False
                super().append_bytes(key, data[: len(data) // 2])
                raise StorageError(key, "append failed: [Errno 28] No space left on device")
            return super().append_bytes(key, data)

    store = _FullOnce(str(tmp_path))
    manifest, _ = _open(store, fetch_config=CONFIG, now=T0)
    manifest.pages[1].attempts = 1
    manifest.record(store, 1)
    _FullOnce.tear = True
    manifest.pages[1].status = "done"
    with pytest.raises(StorageError):
        manifest.record(store, 1)
    # The same process goes on (another page's change): a full save, the torn journal gone.
    manifest.pages[1].status = "pending"  # what the crawl does with a change it could not record
    manifest.record(store, 1)
    assert not store.exists(manifest.journal_key)
    manifest.pages[1].attempts = 2
    manifest.record(store, 1)  # then lines again
    assert load_manifest(store, "demo", "travel", manifest.snapshot_id).pages[1].attempts == 2
    # A torn last line found when loading: the loaded manifest's first change is a full save too.
    store.append_bytes(manifest.journal_key, b'{"seq":99,"page":1,"entry":{"url":"http://x/t/pa')
    loaded = load_manifest(store, "demo", "travel", manifest.snapshot_id)
    loaded.pages[1].attempts = 3
    loaded.record(store, 1)
    assert not store.exists(manifest.journal_key)
    assert load_manifest(store, "demo", "travel", manifest.snapshot_id).pages[1].attempts == 3


def test_a_journal_line_glued_to_a_torn_one_by_an_older_version_is_read(tmp_path):
    """Before the full save after a torn append, a retry appended its lines right after the
    torn half-line: the line glued to it is read (from its ``{"seq":``), the torn part dropped."""
    store = ObjectStore(str(tmp_path))
    manifest, _ = _open(store, fetch_config=CONFIG, now=T0)
    manifest.save(store)
    store.append_bytes(manifest.journal_key, b'{"seq":1,"page":1,"entry":{"url":"http://x/t/page-1.html","sta'
                                             b'{"seq":2,"page":1,"entry":{"url":"http://x/t/page-1.html",'
                                             b'"status":"done","attempts":1}}\n'
                                             b'{"seq":3,"page":1,"entry":{"url":"http://x/t/page-1.html",'
                                             b'"status":"done","attempts":2}}\n')
    loaded = load_manifest(store, "demo", "travel", manifest.snapshot_id)
    assert (loaded.pages[1].status, loaded.pages[1].attempts, loaded.journal_seq) == ("done", 2, 3)


def test_a_new_snapshot_launch_goes_on_with_its_own_snapshot_on_retry_or_re_execution(tmp_path):
    """new_snapshot: a step retry (same run id) and a re-execution from failure (a new run whose
    parent or root opened the snapshot) continue the snapshot that launch opened; another launch,
    or the same one with another fetch config, starts a new one."""
    from datetime import timedelta

    store = ObjectStore(str(tmp_path))
    kw = dict(site="demo", category="travel", start_url="http://x/t/index.html", fetch_config=CONFIG,
              new_snapshot=True, resume_max_age=timedelta(hours=20))
    _open(store, fetch_config=CONFIG, now=T0 - timedelta(days=1))  # yesterday's, incomplete
    first, _ = open_snapshot(store, **kw, now=T0, run_id="parent")
    retry, resumed = open_snapshot(store, **kw, now=T0 + timedelta(minutes=1), run_id="parent")
    assert resumed and retry.snapshot_id == first.snapshot_id
    child, resumed = open_snapshot(store, **kw, now=T0 + timedelta(minutes=5), run_id="child",
                                   reexecuted_run_ids=["parent"])
    assert resumed and child.snapshot_id == first.snapshot_id and child.run_id == "child"
    grandchild, resumed = open_snapshot(store, **kw, now=T0 + timedelta(minutes=9), run_id="grandchild",
                                        reexecuted_run_ids=["child", "parent"])  # parent, root
    assert resumed and grandchild.snapshot_id == first.snapshot_id
    other, resumed = open_snapshot(store, **kw, now=T0 + timedelta(minutes=12), run_id="another launch")
    assert not resumed and other.snapshot_id != first.snapshot_id
    changed, resumed = open_snapshot(store, **{**kw, "fetch_config": {**CONFIG, "max_attempts": 9}},
                                     now=T0 + timedelta(minutes=14), run_id="again", reexecuted_run_ids=["another launch"])
    assert not resumed and changed.snapshot_id not in (first.snapshot_id, other.snapshot_id)


def test_journal_lines_keep_any_text_exactly(tmp_path):
    # Non-ASCII goes out as UTF-8 and a lone surrogate (which orjson refuses) escaped: both replay as written.
    store = ObjectStore(str(tmp_path))
    manifest, _ = _open(store, fetch_config=CONFIG, now=T0)
    errors = {1: "HTTP 503: Café “fermé” £", 2: "bad header \udcff byte"}
    for n, text in errors.items():
        manifest.pages.setdefault(n, PageEntry(url=f"http://x/t/page-{n}.html"))
        manifest.pages[n].status, manifest.pages[n].last_error = "failed", text
        manifest.record(store, n)
    lines = store.read_bytes(manifest.journal_key).splitlines()
    assert len(lines) == 2 and "Café “fermé” £".encode() in lines[0] and b"\\udcff" in lines[1]
    loaded = load_manifest(store, "demo", "travel", manifest.snapshot_id)
    assert {n: loaded.pages[n].last_error for n in errors} == errors and loaded.journal_seq == 2
    # The same through a full save (manifest.json): the entry with the surrogate escaped, the rest as UTF-8.
    manifest.save(store)
    raw = store.read_bytes(manifest.key)
    assert "Café “fermé” £".encode() in raw and b"\\udcff" in raw and not store.exists(manifest.journal_key)
    loaded = load_manifest(store, "demo", "travel", manifest.snapshot_id)
    assert {n: loaded.pages[n].last_error for n in errors} == errors and loaded.to_json() == raw


def test_compaction_folds_the_journal_and_stale_lines_are_not_replayed(tmp_path):
    store = ObjectStore(str(tmp_path))
    manifest, _ = _open(store, fetch_config=CONFIG, now=T0)
    manifest.pages[1].status = "done"
    manifest.record(store, 1)
    journal_before = store.read_bytes(manifest.journal_key)
    manifest.pages[1].status = "failed"  # a later state, folded in by a full save
    manifest.save(store)
    assert not store.exists(manifest.journal_key)
    # A crash between writing manifest.json and removing the journal leaves old lines behind.
    store.append_bytes(manifest.journal_key, journal_before)
    loaded = load_manifest(store, "demo", "travel", manifest.snapshot_id)
    assert loaded.pages[1].status == "failed" and loaded.journal_seq == 1


def test_journal_compacts_every_n_lines(tmp_path, monkeypatch):
    import scrape_assets.manifest as manifest_module

    monkeypatch.setattr(manifest_module, "COMPACT_EVERY", 5)
    store = ObjectStore(str(tmp_path))
    manifest, _ = _open(store, fetch_config=CONFIG, now=T0)
    for attempt in range(1, 8):
        manifest.pages[1].attempts = attempt
        manifest.record(store, 1)
    assert json.loads(store.read_bytes(manifest.key))["pages"]["1"]["attempts"] == 5
    assert len(store.read_bytes(manifest.journal_key).splitlines()) == 2
    assert load_manifest(store, "demo", "travel", manifest.snapshot_id).pages[1].attempts == 7


def test_a_journal_line_missing_only_its_newline_is_torn_not_replayed(tmp_path):
    """An append cut after the line's JSON but before its newline (a full disk) told its caller
    it failed: the line is not replayed, and the next change is a full save, not glued to it."""
    store, manifest = _two_pages_one_attempt_journalled(tmp_path)
    path = tmp_path / manifest.journal_key
    path.write_bytes(path.read_bytes()[:-1])  # all of the line but its "\n"
    resumed = load_manifest(store, "demo", "travel", manifest.snapshot_id)
    assert resumed.pages[1].attempts == 0 and resumed.journal_seq == 0
    resumed.pages[2].attempts = 1
    resumed.record(store, 2)  # a full save: nothing appended after the unterminated line
    assert not store.exists(manifest.journal_key)
    resumed.pages[1].attempts = 1
    resumed.record(store, 1)
    again = load_manifest(store, "demo", "travel", manifest.snapshot_id)
    assert (again.pages[1].attempts, again.pages[2].attempts) == (1, 1)


def test_a_failed_compaction_does_not_fail_a_change_already_in_the_journal(tmp_path, monkeypatch, caplog):
    """The line is appended, then folding the journal into manifest.json fails (a disk with
    room for a line, not for the manifest): the change is durable, so ``record`` does not
    raise (its caller would undo in memory a change the next run reads back); compaction is
    tried again COMPACT_RETRY_EVERY lines later."""
    import scrape_assets.manifest as manifest_module
    from scrape_assets.errors import StorageError

    monkeypatch.setattr(manifest_module, "COMPACT_EVERY", 3)
    monkeypatch.setattr(manifest_module, "COMPACT_RETRY_EVERY", 2)
    disk = {"full": False}

    class _NoRoomForTheManifest(ObjectStore):
        def write_bytes_atomic(self, key, data, *, sync_folder=True):
            if disk["full"]:
                raise StorageError(f"{self.describe()}/{key}", "write failed: [Errno 28] No space left on device")
            return super().write_bytes_atomic(key, data, sync_folder=sync_folder)

    store = _NoRoomForTheManifest(str(tmp_path))
    manifest, _ = _open(store, fetch_config=CONFIG, now=T0)
    disk["full"] = True
    for attempt in (1, 2, 3):  # the third line is the compaction's turn
        manifest.pages[1].attempts = attempt
        manifest.record(store, 1)
    assert "compaction failed" in caplog.text and "No space left" in caplog.text
    assert load_manifest(store, "demo", "travel", manifest.snapshot_id).pages[1].attempts == 3
    assert len(store.read_bytes(manifest.journal_key).splitlines()) == 3
    disk["full"] = False
    manifest.pages[1].attempts = 4
    manifest.record(store, 1)  # one line after the failed one: not yet
    assert store.exists(manifest.journal_key)
    manifest.pages[1].attempts = 5
    manifest.record(store, 1)  # two lines after: compacted
    assert not store.exists(manifest.journal_key)
    assert json.loads(store.read_bytes(manifest.key))["pages"]["1"]["attempts"] == 5


def test_remote_store_rewrites_the_manifest_on_every_record():
    store = ObjectStore("memory://manifests-test")
    manifest, _ = _open(store, fetch_config=CONFIG, now=T0)
    manifest.pages[1].status = "done"
    manifest.record(store, 1)
    assert json.loads(store.read_bytes(manifest.key))["pages"]["1"]["status"] == "done"
    assert not store.exists(manifest.journal_key)


# -- CrawlProgress (the crawl's log lines) ----------------------------------------------------


def test_crawl_progress_emits_every_interval_and_once_at_the_end():
    from scrape_assets.crawl import CrawlProgress

    now = [0.0]
    lines: list[str] = []
    progress = CrawlProgress(2, lines.append, every_s=5.0, clock=lambda: now[0])
    progress.planned("a", 3, already_done=1)  # resumed: one page done earlier
    progress.planned("b", 1)
    progress.planned("b", 4)  # discovery found more pages
    for _ in range(3):
        now[0] += 1.0
        progress.page_done()
    assert lines == []  # 3 s: nothing yet
    now[0] += 2.0
    progress.page_done()
    assert lines == ["5/7 pages done, 0 failed for good; 0/2 categories complete; 0.8 pages/s"]  # 4 fetched in 5 s
    progress.category_done()
    progress.page_failed("b: page 4 failed for good (http_404)")
    progress.category_done()
    assert lines[1:] == [
        "b: page 4 failed for good (http_404)",
        "5/7 pages done, 1 failed for good; 2/2 categories complete; 1 pages/s",
    ]


def test_crawl_progress_prints_the_last_line_once_not_a_periodic_one_just_before_it():
    from scrape_assets.crawl import CrawlProgress

    now = [0.0]
    lines: list[str] = []
    progress = CrawlProgress(2, lines.append, every_s=1.0, clock=lambda: now[0])
    progress.planned("a", 1)
    progress.planned("b", 1200)
    for _ in range(1200):
        now[0] += 0.5
        progress.page_done()
    progress.category_done()  # b
    assert lines[-1] == "1,200/1,201 pages done, 0 failed for good; 0/2 categories complete; 2 pages/s"
    periodic = len(lines)
    now[0] += 5.0  # the last page comes long after the last periodic line: still no line for it...
    progress.page_done()
    assert len(lines) == periodic
    progress.category_done()  # ... the run's last line follows it
    assert lines[periodic:] == ["1,201/1,201 pages done, 0 failed for good; 2/2 categories complete; 2 pages/s"]


def test_crawl_progress_keeps_its_periodic_lines_while_next_links_reveal_pages_one_by_one():
    from scrape_assets.crawl import CrawlProgress

    now = [0.0]
    lines: list[str] = []
    progress = CrawlProgress(1, lines.append, every_s=1.0, clock=lambda: now[0])
    for n in range(1, 6):  # page n is known once page n-1 is done (its next link); page 5 has none
        progress.planned("a", n, final=n == 5)
        now[0] += 1.0
        progress.page_done()  # every page known is done now, yet more may come (until page 5)
    progress.category_done()
    assert lines == [f"{n}/{n} pages done, 0 failed for good; 0/1 categories complete; 1 pages/s" for n in range(1, 5)] + [
        "5/5 pages done, 0 failed for good; 1/1 categories complete; 1 pages/s"]  # the last page: only the last line


def test_crawl_progress_stops_logging_failures_one_by_one_after_the_cap():
    from scrape_assets.crawl import MAX_FAILURE_LINES, CrawlProgress

    now = [0.0]
    lines: list[str] = []
    warnings: list[str] = []
    progress = CrawlProgress(1, lines.append, warn=warnings.append, every_s=1e9, clock=lambda: now[0])
    for n in range(MAX_FAILURE_LINES + 5):
        now[0] += 0.5
        progress.page_failed(f"page {n} failed")
    progress.category_done()
    # each lost page is a warning (it stands out among the INFO progress lines), up to the cap
    assert warnings[:MAX_FAILURE_LINES] == [f"page {n} failed" for n in range(MAX_FAILURE_LINES)]
    assert warnings[MAX_FAILURE_LINES].startswith("more pages failed for good: only counted")
    assert len(warnings) == MAX_FAILURE_LINES + 1
    # pages/s counts the failed pages too (2 a second here), not only those done
    assert lines == [f"0/0 pages done, {MAX_FAILURE_LINES + 5} failed for good; 1/1 categories complete; 2 pages/s"]


# -- BatchedLog (per-category lines of the other steps) ----------------------------------------


def test_batched_log_sends_lines_every_interval_and_the_rest_under_the_summary():
    from scrape_assets.batched_log import BatchedLog

    now = [0.0]
    sent: list[str] = []
    log = BatchedLog(sent.append, every_s=5.0, clock=lambda: now[0])
    log.add("a: parsed 10")
    now[0] = 4.0
    log.add("b: parsed 20")
    assert sent == []
    now[0] = 5.5
    log.add("c: parsed 30")
    log.add("d: parsed 40")
    log.close("4 categories: 100 products")
    assert sent == [
        "3 more:\n  a: parsed 10\n  b: parsed 20\n  c: parsed 30",
        "4 categories: 100 products\n  d: parsed 40",
    ]


def test_batched_log_sends_once_exactly_every_s_has_passed():
    """"If every_s has passed": at exactly every_s seconds after the last message, the lines go."""
    from scrape_assets.batched_log import BatchedLog

    now = [0.0]
    sent: list[str] = []
    log = BatchedLog(sent.append, every_s=5.0, clock=lambda: now[0])
    log.add("a: parsed 10")
    now[0] = 5.0
    log.add("b: parsed 20")
    assert sent == ["2 more:\n  a: parsed 10\n  b: parsed 20"]
    now[0] = 10.0  # exactly every_s after that message
    log.add("c: parsed 30")
    assert sent[-1] == "1 more:\n  c: parsed 30"


def test_sees_every_page_exactly_when_no_page_is_missing(tmp_path):
    manifest, _ = _open(ObjectStore(str(tmp_path)), fetch_config=CONFIG, now=T0)
    manifest.total_pages = 3
    manifest.pages = {n: PageEntry(url=f"http://x/t/page-{n}.html", status="done") for n in (1, 2, 3)}
    assert manifest.sees_every_page
    for status in ("failed", "pending"):
        manifest.pages[2] = dataclasses.replace(manifest.pages[2], status=status)
        assert not manifest.sees_every_page


def test_latest_manifest_reads_newest_first_and_passes_over_folders_that_are_not_snapshots(tmp_path):
    """A crash inside a snapshot's first write, a NAS's metadata folder, a copy made by hand: none is the latest."""
    from scrape_assets_tests.conftest import one_page_snapshot

    store = ObjectStore(str(tmp_path))
    one_page_snapshot(store, "2026-11-29T000000Z", complete=True)
    one_page_snapshot(store, "2026-11-30T000000Z", complete=True)
    one_page_snapshot(store, "2026-11-30T000000Z-2", complete=False)  # a same-second twin, still running
    store.write_bytes_atomic("demo/travel/2026-12-01T000000Z/pages/page-0001.html", b"<html>")  # no manifest yet
    copied = store.read_bytes("demo/travel/2026-11-29T000000Z/manifest.json")
    store.write_bytes_atomic("demo/travel/zz-backup/manifest.json", copied)  # would be read first, and refused
    (tmp_path / "demo" / "travel" / "@eaDir").mkdir()  # not even a valid key
    store.write_bytes_atomic("demo/travel/parse_state.json", b"{}")

    assert store.list_folders("demo/travel") == ["2026-11-29T000000Z", "2026-11-30T000000Z", "2026-11-30T000000Z-2",
                                                 "2026-12-01T000000Z", "@eaDir", "zz-backup"]  # folders only
    assert store.list_folders("demo/nowhere") == [] and store.list_folders("demo/travel/parse_state.json") == []
    assert latest_manifest(store, "demo", "travel").snapshot_id == "2026-11-30T000000Z-2"
    assert latest_manifest(store, "demo", "travel", complete=True).snapshot_id == "2026-11-30T000000Z"
    assert list_snapshots(store, "demo", "travel") == ["2026-11-29T000000Z", "2026-11-30T000000Z",
                                                       "2026-11-30T000000Z-2"]
    assert latest_manifest(store, "demo", "mystery") is None


def test_entry_fields_of_a_later_version_are_ignored_on_reading(tmp_path):
    """A manifest (and a journal line) written by a later version with a field this one does
    not know still loads, with the fields it knows."""
    store = ObjectStore(str(tmp_path))
    manifest = Manifest(site="demo", category="travel", snapshot_id="2026-12-03T190000Z", fetch_config={},
                        fetch_config_hash="h", start_url="http://x/t/index.html")
    manifest.pages[1] = PageEntry(url="http://x/t/index.html", status="done", attempts=1)
    data = json.loads(manifest.to_json())
    data["pages"]["1"]["seen_by_a_later_version"] = True
    loaded = Manifest.from_json(json.dumps(data).encode(), "m")
    assert loaded.pages == manifest.pages
    line = {"seq": 1, "page": 1, "entry": {**data["pages"]["1"], "status": "failed"}}
    loaded.replay_journal(json.dumps(line).encode() + b"\n", "j")
    assert (loaded.pages[1].status, loaded.journal_seq) == ("failed", 1)
    with pytest.raises(ManifestError, match="unreadable manifest"):  # a missing url is still refused
        del data["pages"]["1"]["url"]
        Manifest.from_json(json.dumps(data).encode(), "m")


def test_crawl_progress_counts_retries_once_there_is_one():
    from scrape_assets.crawl import CrawlProgress

    now = [0.0]
    lines: list[str] = []
    progress = CrawlProgress(1, lines.append, every_s=1.0, clock=lambda: now[0])
    progress.planned("a", 2)
    now[0] = 2.0
    progress.page_retried()  # a 503, retried after its back-off: the line shows it
    progress.page_retried()
    progress.page_done()
    progress.page_done()
    progress.category_done()
    assert lines == ["0/2 pages done, 0 failed for good, 1 retry; 0/1 categories complete; 0 pages/s",
                     "2/2 pages done, 0 failed for good, 2 retries; 1/1 categories complete; 1 pages/s"]


def test_the_data_version_changes_with_a_pages_number_or_the_url_it_was_redirected_to():
    """What the parse reads: which page holds which body (page_number of every row, the
    carry-forward of failed pages) and the URL its relative links resolve against."""
    def version(pages: dict[int, PageEntry]) -> str:
        manifest = Manifest(site="demo", category="travel", snapshot_id="2026-12-07T000000Z", fetch_config={},
                            fetch_config_hash="h", start_url="http://x/t/index.html")
        manifest.pages.update(pages)
        return manifest.data_version

    def done(n: int, body: str, final_url: str | None = None) -> PageEntry:
        return PageEntry(url=f"http://x/t/page-{n}.html", status="done", attempts=1,
                         content_hash=f"sha256:{body}", final_url=final_url)

    failed = PageEntry(url="http://x/t/page-2.html", status="failed", attempts=3)
    base = version({1: done(1, "a"), 2: failed, 3: done(3, "b")})
    assert version({1: done(1, "a"), 2: failed, 3: done(3, "b")}) == base  # the same content: the same version
    assert version({1: done(1, "a"), 2: done(2, "b"), 3: dataclasses.replace(failed, url="http://x/t/page-3.html")}) != base
    assert version({1: done(1, "a", "http://x/moved/page-1.html"), 2: failed, 3: done(3, "b")}) != base


def test_crawl_progress_keeps_one_decimal_of_a_rate_below_ten():
    from scrape_assets.crawl import CrawlProgress

    now = [0.0]
    lines: list[str] = []
    progress = CrawlProgress(1, lines.append, every_s=2.0, clock=lambda: now[0])
    progress.planned("a", 10)
    for _ in range(5):
        now[0] += 0.4
        progress.page_done()  # 5 pages in 2 s
    assert lines == ["5/10 pages done, 0 failed for good; 0/1 categories complete; 2.5 pages/s"]


def test_a_resumed_snapshot_records_the_run_that_reopened_it(tmp_path):
    """open_snapshot saves a resumed incomplete manifest when its run_id changes: a run that
    dies before its first full save still left its id on the snapshot (raw_pages' adoption and
    the re-execution rules read it)."""
    store = ObjectStore(str(tmp_path))
    first, resumed = _open(store, fetch_config=CONFIG, now=T0, run_id="run-1")
    assert not resumed
    again, resumed = _open(store, fetch_config=CONFIG, now=T0 + timedelta(minutes=5), run_id="run-2")
    assert resumed and again.snapshot_id == first.snapshot_id
    assert load_manifest(store, "demo", "travel", first.snapshot_id).run_id == "run-2"


def test_retry_time_is_rounded_up_to_the_second_and_never_in_the_past():
    from scrape_assets.manifest import retry_time, seconds_until

    assert retry_time(1.5, now=T0) == "2026-11-30T08:45:14Z"  # 08:45:13.5 rounded up, not down
    assert retry_time(2, now=T0) == "2026-11-30T08:45:14Z"
    assert retry_time(0.000001, now=T0) == "2026-11-30T08:45:13Z"
    assert retry_time(-30, now=T0) == "2026-11-30T08:45:12Z"
    assert seconds_until(retry_time(1.5, now=T0), now=T0) >= 1.5


def test_the_data_version_reads_a_utf8_label_as_utf_8():
    """``charset=utf8`` is UTF-8 as ``charset=UTF-8`` is: a site changing between those labels
    (or none) does not change the data version, and with it force a re-parse and reload."""
    def version(content_type):
        page = PageEntry(url="http://x/t/index.html", status="done", content_hash="sha256:ab", content_type=content_type)
        return Manifest(site="demo", category="travel", snapshot_id="2026-11-30T084512Z", fetch_config=CONFIG,
                        fetch_config_hash="h", start_url="http://x/t/index.html", pages={1: page}).data_version

    assert version("text/html; charset=utf8") == version("text/html; charset=UTF-8") == version("text/html")
    assert version("text/html; charset=windows-1252") != version("text/html")


def test_a_manifest_of_another_format_version_is_refused(tmp_path):
    """A manifest written by a later format (or without one) is not read as this one."""
    store = ObjectStore(str(tmp_path))
    manifest, _ = _open(store, fetch_config=CONFIG, now=T0)
    data = json.loads(store.read_bytes(manifest.key))
    for fmt, shown in ((2, "2"), (None, "None")):
        store.write_bytes_atomic(manifest.key, json.dumps({**data, "format": fmt}).encode())
        with pytest.raises(ManifestError, match=f"format {shown}, expected 1; restore it, or move its folder"):
            load_manifest(store, "demo", "travel", manifest.snapshot_id)


def test_has_snapshot_answers_no_for_an_id_that_is_no_storage_key(tmp_path):
    """partition_loads rows are checked with has_snapshot before a site claims old tables: a
    snapshot id that cannot even be a key (hand-edited, another tool's) is "not ours", not an error."""
    from scrape_assets.manifest import has_snapshot

    store = ObjectStore(str(tmp_path))
    manifest, _ = _open(store, fetch_config=CONFIG, now=T0)
    owns = has_snapshot(store, "demo")
    assert owns("travel", manifest.snapshot_id) is True
    assert owns("travel", "2026-01-01T000000Z") is False
    assert owns("travel", "../../etc") is False and owns("a b", manifest.snapshot_id) is False
