"""parse_partitions: the same files whether parsed serially or by worker processes; errors cross back intact."""

from __future__ import annotations

import json
import os
import pickle
import shutil
import time
from pathlib import Path

import pytest

from scrape_assets import parse_run
from scrape_assets.errors import FetchConfigChangedError, ManifestError, PermanentFetchError, SpecError
from scrape_assets.extract import input_version, load_parse_state
from scrape_assets.manifest import latest_manifest
from scrape_assets.spec import load_spec
from scrape_assets.storage import ObjectStore
from scrape_assets_tests.conftest import crawl_demo

CATEGORIES = ["travel", "mystery", "classics", "default", "poetry"]  # 1 to 12 pages each
SPEC = load_spec("demo")
EXPECTED_PRODUCTS = {"travel": 11, "mystery": 32, "classics": 19, "default": 232, "poetry": 19}  # demo_site.CATEGORY_TABLE


@pytest.fixture(scope="module")
def crawled(tmp_path_factory) -> Path:
    """The five categories crawled once from the in-process demo catalogue."""
    root = tmp_path_factory.mktemp("crawled") / "objects"
    crawl_demo(root, CATEGORIES)
    return root


def _copy(crawled: Path, tmp_path: Path, name: str) -> ObjectStore:
    shutil.copytree(crawled, tmp_path / name)
    return ObjectStore(str(tmp_path / name))


def _outputs(store: ObjectStore) -> dict:
    out = {}
    for category in CATEGORIES:
        manifest = latest_manifest(store, "demo", category, complete=True)
        out[category] = (store.read_bytes(f"{manifest.prefix}/parsed.json"), load_parse_state(store, "demo", category))
    return out


PIDS_FILE = "SCRAPE_TEST_PIDS_FILE"


def _recording_parse(store, manifest, spec):  # module level: the pool pickles it by name
    with open(os.environ[PIDS_FILE], "a") as pids:
        pids.write(f"{os.getpid()}\n")
    return _REAL_PARSE(store, manifest, spec)


_REAL_PARSE = parse_run._parse_and_validate


def test_workers_write_the_same_files_as_a_serial_parse_from_other_processes(crawled, tmp_path, monkeypatch):
    serial, parallel = _copy(crawled, tmp_path, "serial"), _copy(crawled, tmp_path, "parallel")
    pids = tmp_path / "pids.txt"
    monkeypatch.setenv(PIDS_FILE, str(pids))
    monkeypatch.setattr(parse_run, "_parse_and_validate", _recording_parse)

    one = list(parse_run.parse_partitions(serial, SPEC, CATEGORIES, workers=1))
    assert set(pids.read_text().split()) == {str(os.getpid())}
    pids.unlink()
    two = list(parse_run.parse_partitions(parallel, SPEC, CATEGORIES, workers=2))
    worker_pids = set(pids.read_text().split())
    assert len(worker_pids) == 2 and str(os.getpid()) not in worker_pids

    assert [r.category for r in two] == CATEGORIES  # results in category order
    assert [(r.figures, r.report, r.line) for r in one] == [(r.figures, r.report, r.line) for r in two]
    assert _outputs(serial) == _outputs(parallel)
    assert {r.category: r.figures["products"] for r in two} == EXPECTED_PRODUCTS
    assert all(r.report.passed and r.figures["pages_parsed"] >= 1 for r in two)

    again = list(parse_run.parse_partitions(parallel, SPEC, CATEGORIES, workers=2))  # same input: skipped
    assert [r.figures["unchanged"] for r in again] == [True] * len(CATEGORIES)
    assert [r.report for r in again] == [None] * len(CATEGORIES)


def test_a_worker_error_reaches_the_caller_with_its_context_and_earlier_categories_are_saved(crawled, tmp_path):
    store = _copy(crawled, tmp_path, "broken")
    manifest = latest_manifest(store, "demo", "default", complete=True)
    store.delete(manifest.page_key(3))

    results = parse_run.parse_partitions(store, SPEC, CATEGORIES, workers=2)
    assert [next(results).category for _ in range(3)] == ["travel", "mystery", "classics"]
    with pytest.raises(ManifestError, match=r"page 3 is marked done but demo/default/.*/pages/page-0003.html is missing"):
        next(results)
    assert load_parse_state(store, "demo", "classics") is not None
    assert load_parse_state(store, "demo", "default") is None  # nothing written for the broken one


def _dying_parse(store, manifest, spec):  # module level: the pool pickles it by name
    if manifest.category == "travel":
        time.sleep(2)  # a long category, still in its worker when the other worker dies
    if manifest.category == "default":
        os._exit(137)  # as the kernel's OOM killer ends a worker
    return _REAL_PARSE(store, manifest, spec)


def test_a_worker_killed_mid_parse_names_the_unfinished_categories_and_the_finished_are_saved(crawled, tmp_path,
                                                                                                monkeypatch):
    store = _copy(crawled, tmp_path, "objects")
    monkeypatch.setattr(parse_run, "_parse_and_validate", _dying_parse)
    with pytest.raises(parse_run.ParseWorkerDied) as info:
        list(parse_run.parse_partitions(store, SPEC, CATEGORIES, workers=2))
    assert str(info.value).startswith("a parse worker process died (killed by the system: out of memory?) while "
                                      "parsing one of travel, default; the categories parsed before are saved")
    saved = {c for c in CATEGORIES if load_parse_state(store, "demo", c) is not None}
    assert saved == {"mystery", "classics"}  # parsed by the other worker before it died: not parsed again
    monkeypatch.setattr(parse_run, "_parse_and_validate", _REAL_PARSE)
    again = list(parse_run.parse_partitions(store, SPEC, CATEGORIES, workers=2))
    assert [r.figures["pages_parsed"] > 0 for r in again] == [True, False, False, True, True]


def test_no_complete_snapshot_and_bad_worker_counts_are_clear_errors(tmp_path):
    store = ObjectStore(str(tmp_path))
    with pytest.raises(ManifestError) as info:
        list(parse_run.parse_partitions(store, SPEC, ["travel"], workers=2))
    assert str(info.value) == (f"demo/travel: no complete snapshot in {tmp_path}: materialize raw_pages for this "
                               "partition first (or is this the storage it was scraped into?)")
    with pytest.raises(ValueError, match="workers must be >= 1, got 0"):
        list(parse_run.parse_partitions(store, SPEC, ["travel"], workers=0))
    assert 1 <= parse_run.default_workers() <= parse_run.MAX_DEFAULT_WORKERS


@pytest.mark.parametrize(
    "error",
    [
        ManifestError("demo/travel/manifest.json", "page 3 is missing"),
        FetchConfigChangedError("demo/travel", ["max_attempts", "timeout_s"]),
        SpecError("sites/x.yaml", "selectors.title", "expected a CSS selector"),
        PermanentFetchError("http://h/p", "http_404", "Not Found", http_status=404, attempts=1),
    ],
    ids=lambda e: type(e).__name__,
)
def test_errors_survive_pickling_between_processes(error):
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is type(error)
    assert str(copy) == str(error) and copy.__dict__ == error.__dict__


KILLED_PARENT = """
import fcntl, logging, multiprocessing, os, sys, time
from scrape_assets import parse_run
from scrape_assets.spec import load_spec
from scrape_assets.storage import ObjectStore
lock = open(sys.argv[2], "w")
fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)  # as store.locks() holds a partition lock
results = parse_run.parse_partitions(ObjectStore(sys.argv[1]), load_spec("demo"), sys.argv[3].split(","), workers=2)
next(results)
print(" ".join(str(p.pid) for p in multiprocessing.active_children()), flush=True)
time.sleep(600)
"""


def test_workers_die_with_a_killed_step_and_release_its_partition_locks(crawled, tmp_path):
    import signal
    import subprocess
    import sys
    import time

    from scrape_assets_tests.conftest import REPO_ROOT

    store = _copy(crawled, tmp_path, "killed")
    lock_file = tmp_path / "parsed_products.lock"
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    step = subprocess.Popen([sys.executable, "-c", KILLED_PARENT, str(store.root.path), str(lock_file), ",".join(CATEGORIES)],
                            stdout=subprocess.PIPE, text=True, env=env)
    workers = [int(pid) for pid in step.stdout.readline().split()]
    assert len(workers) == 2
    step.send_signal(signal.SIGKILL)
    step.wait(timeout=30)

    def alive(pid: int) -> bool:
        try:
            with open(f"/proc/{pid}/stat") as stat:
                return stat.read().split(") ")[1][0] != "Z"  # a zombie has exited
        except FileNotFoundError:
            return False

    deadline = time.monotonic() + 10
    while any(alive(pid) for pid in workers) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(alive(pid) for pid in workers)
    import fcntl

    with open(lock_file, "w") as lock:  # nobody holds the step's lock any more
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)


def _freeze_recorder(path: str):
    def freeze() -> None:  # runs in the worker (the patched module is inherited through fork)
        with open(path, "a") as out:
            out.write(f"{os.getpid()}\n")
    return freeze


def test_workers_freeze_what_they_inherit_unless_turned_off(crawled, tmp_path, monkeypatch):
    record = tmp_path / "frozen.txt"
    monkeypatch.setattr(parse_run.gc, "freeze", _freeze_recorder(str(record)))
    list(parse_run.parse_partitions(_copy(crawled, tmp_path, "a"), SPEC, CATEGORIES, workers=2))
    frozen_in = record.read_text().split()
    assert len(frozen_in) == 2 and str(os.getpid()) not in frozen_in  # each worker, never the step's process
    record.unlink()
    monkeypatch.setenv("SCRAPE_GC_FREEZE", "0")
    list(parse_run.parse_partitions(_copy(crawled, tmp_path, "b"), SPEC, CATEGORIES, workers=2))
    assert not record.exists()


def test_parsed_json_keeps_prices_exact_and_refuses_unknown_types(tmp_path):
    from decimal import Decimal

    from scrape_assets.extract import ParsedSnapshot, encode_parsed

    row = {"product_id": "7", "title": "Ça coûte £", "price": Decimal("1234567890.10"), "rating": 3}
    parsed = ParsedSnapshot(category="travel", snapshot_id="s1", products=[row], pages=[], rejects=[])
    data = encode_parsed(parsed)
    assert json.loads(data)["products"] == [{**row, "price": "1234567890.10"}]  # exact digits, UTF-8 text
    assert "Ça coûte £".encode() in data
    with pytest.raises(TypeError, match="not JSON serializable"):  # only a Decimal becomes a string
        encode_parsed(ParsedSnapshot(category="travel", snapshot_id="s1", products=[{**row, "price": {1.5}}]))


@pytest.mark.parametrize(
    ("sizes", "expected"),
    [
        ({"results": {1: 40, 2: 40}, "pages": {1: 2, 2: 2}}, None),
        ({"results": {}, "pages": {}}, None),  # a listing that shows neither cannot be checked
        ({"results": {2: 1200, 3: 1200}, "pages": {}}, None),  # page 1 without a count: the others agree
        ({"results": {1: 40, 2: 40, 3: 39}, "pages": {}}, "page 1 says 40 results, page 3 says 39"),
        ({"results": {1: 1040, 2: 1060}, "pages": {1: 52, 2: 53}},
         "page 1 says 1,040 results, page 2 says 1,060; page 1 says 52 pages, page 2 says 53"),
    ],
)
def test_pages_disagreeing_on_the_listings_size_say_how(sizes, expected):
    from scrape_assets.extract import _listing_moved

    assert _listing_moved(sizes) == expected


@pytest.mark.parametrize(
    ("counts", "cards", "figures"),
    [
        ({1: 35, 2: 35}, {1: 20, 2: 15}, False),  # the same total on every page
        ({1: 40, 2: 60}, {1: 20, 2: 20}, False),  # grew between the fetches: totals that changed
        ({1: 60, 3: 41}, {1: 20, 2: 20, 3: 1}, False),  # shrank
        ({1: 60, 2: 55, 3: 55}, {1: 21, 2: 21, 3: 14}, False),  # shrank, a card repeated on every page
        ({1: 60, 2: 55}, {1: 22, 2: 20}, False),  # shrank, two cards featured on page 1
        ({1: 1, 2: 13}, {1: 12, 2: 12}, True),  # "Showing 1-12 of 32" read as 1, then 13
        ({1: 20, 2: 15}, {1: 20, 2: 15}, True),  # "Showing 20 of 35" read as 20, then 15
        ({1: 20, 2: 40, 3: 45}, {1: 20, 2: 20, 3: 5}, True),  # "Showing 40 of 45" read as 40
        ({2: 20, 3: 5}, {2: 20, 3: 5}, True),  # no page 1: its own cards still tell
        ({}, {1: 20}, False),
    ],
)
def test_results_counts_that_are_figures_of_each_page_are_not_compared(counts, cards, figures):
    from scrape_assets.extract import _page_figures

    assert _page_figures(counts, cards) is figures


def test_parsed_json_keeps_a_moved_listing_and_reads_an_older_file_as_unmoved(crawled, tmp_path):
    from scrape_assets.extract import encode_parsed, load_current, load_parsed, save_parsed
    from scrape_assets.manifest import load_manifest

    store = _copy(crawled, tmp_path, "s")
    list(parse_run.parse_partitions(store, SPEC, ["travel"], workers=1))
    parsed, state = load_current(store, SPEC.name, "travel")
    manifest = load_manifest(store, SPEC.name, "travel", state.snapshot_id)
    assert parsed.listing_moved is None and b"listing_moved" not in encode_parsed(parsed)  # the demo's pages agree
    parsed.listing_moved = "page 1 says 11 results, page 2 says 12"
    save_parsed(store, manifest, parsed)
    assert load_parsed(store, manifest).listing_moved == "page 1 says 11 results, page 2 says 12"
    written_before = {k: v for k, v in json.loads(encode_parsed(parsed)).items() if k != "listing_moved"}
    store.write_bytes_atomic(f"{manifest.prefix}/parsed.json", json.dumps(written_before).encode())
    assert load_parsed(store, manifest).listing_moved is None


def test_load_parsed_can_leave_prices_as_their_exact_strings(crawled, tmp_path):
    """products_table's way (decimal_prices=False): the same rows, each price the string parsed.json holds."""
    from decimal import Decimal

    from scrape_assets.extract import load_current, load_parsed
    from scrape_assets.manifest import load_manifest

    store = _copy(crawled, tmp_path, "s")
    list(parse_run.parse_partitions(store, SPEC, ["travel"], workers=1))
    exact, state = load_current(store, SPEC.name, "travel")
    as_text = load_parsed(store, load_manifest(store, SPEC.name, "travel", state.snapshot_id), decimal_prices=False)
    assert len(as_text.products) == EXPECTED_PRODUCTS["travel"]
    assert all(isinstance(p["price"], Decimal) for p in exact.products)
    assert all(isinstance(p["price"], str) for p in as_text.products)
    assert [{**p, "price": Decimal(p["price"])} for p in as_text.products] == exact.products
    assert [p["price"] for p in as_text.products] == [str(p["price"]) for p in exact.products]  # exact digits


def test_a_crash_while_re_parsing_a_snapshot_leaves_no_state_vouching_for_unchecked_rows(crawled, tmp_path, monkeypatch):
    """A re-parse of the same snapshot (new parse rules) replaces parsed.json, then its state. A
    crash between the two writes left the old state (validated, the old input version) vouching
    for the new rows: products_table, if that input had not been loaded yet, loaded rows no
    check had passed. The state is withdrawn before parsed.json is replaced."""
    from scrape_assets.extract import save_parse_state

    store = _copy(crawled, tmp_path, "objects")
    list(parse_run.parse_partitions(store, SPEC, ["travel"]))
    before = load_parse_state(store, "demo", "travel")
    assert before.validated
    new_rules = SPEC.model_copy(update={"currency": "EUR"})  # another input version, the same snapshot

    def crash_on_the_new_state(store_, site, category, state):
        if state.input_version == parse_run.input_version(
                latest_manifest(store, "demo", "travel", complete=True), new_rules):
            raise KeyboardInterrupt("killed between parsed.json and its state")
        save_parse_state(store_, site, category, state)

    monkeypatch.setattr(parse_run, "save_parse_state", crash_on_the_new_state)
    with pytest.raises(KeyboardInterrupt):
        list(parse_run.parse_partitions(store, new_rules, ["travel"]))
    after = load_parse_state(store, "demo", "travel")
    assert (after.snapshot_id, after.validated, after.input_version) == (before.snapshot_id, False, "")
    monkeypatch.undo()  # the next parse (no crash) parses again and vouches for its rows
    [result] = parse_run.parse_partitions(store, new_rules, ["travel"])
    assert result.figures["pages_parsed"] == 1 and load_parse_state(store, "demo", "travel").validated


@pytest.mark.parametrize(("regex", "shown"), [
    (r"_(\d*7)/index\.html$", r"'_(\d*7)/index\.html$'"),
    (r"_(\d*7)/index\.html$(?!')", '"' + r"_(\d*7)/index\.html$(?!')" + '"'),  # holds a quote mark: in the other
])
def test_reject_reasons_quoting_each_cards_value_are_counted_as_one_cause(crawled, regex, shown):
    """A product_id regex that misses most URLs: every reject quotes its own URL, yet the
    check's most common reasons count them as one cause, shown by its first card."""
    from scrape_assets.extract import extract_snapshot
    from scrape_assets.schemas import REJECTED_SHARE_CHECK

    spec = SPEC.model_copy(update={"product_id": SPEC.product_id.model_copy(update={"regex": regex})})
    store = ObjectStore(str(crawled))
    manifest = latest_manifest(store, "demo", "mystery", complete=True)
    parsed = extract_snapshot(store, manifest, spec, fetch_base_url=manifest.fetch_config.get("base_url", spec.base_url))
    rejected = len(parsed.rejects)
    assert 0 < len(parsed.products) < rejected  # ids ending in 7 only
    assert len({r["reason"] for r in parsed.rejects}) == rejected  # each reason names its card's URL
    report = parse_run._validate(parsed, spec)
    (reasons,) = [c["reject_reasons"] for c in report.failure_cases if c["check"] == REJECTED_SHARE_CHECK][:1]
    assert reasons == {parsed.rejects[0]["reason"]: rejected}
    assert parsed.rejects[0]["reason"].startswith(f"product_id: {shown} does not match 'http")


def test_reason_kinds_blank_quoted_values_and_numbers_only():
    from scrape_assets.validation_report import common_reasons, reason_kind

    assert reason_kind("price: 0.00 in '£0,00' is not above zero") == "price: … in … is not above zero"
    assert reason_kind('url: "it\'s" cannot be resolved') == "url: … cannot be resolved"
    reasons = ["rating: no element matches 'p.star'", "price: no number in 'N/A' (expected an amount such as '£51.77')",
               "price: no number in 'TBA' (expected an amount such as '£51.77')", "rating: no element matches 'p.stars'"]
    # one kind per template; shown by its first reason; most common first, ties in the order met
    assert common_reasons(reasons) == {"rating: no element matches 'p.star'": 2,
                                       "price: no number in 'N/A' (expected an amount such as '£51.77')": 2}
    assert common_reasons(reasons, limit=1) == {"rating: no element matches 'p.star'": 2}


def test_a_state_from_before_the_share_was_recorded_is_validated_again_once(crawled, tmp_path):
    """A parse state written before it recorded validation.max_rejected_share: its verdict's
    share is unknown, so the saved rows are validated again (no parse), once; a key a later
    version adds is ignored on reading (a rollback keeps its states)."""
    store = _copy(crawled, tmp_path, "objects")
    [first] = parse_run.parse_partitions(store, SPEC, ["travel"])
    assert first.figures["pages_parsed"] == 1
    assert load_parse_state(store, "demo", "travel").max_rejected_share == SPEC.validation.max_rejected_share
    key = "demo/travel/parse_state.json"
    old = {k: v for k, v in json.loads(store.read_bytes(key)).items() if k != "max_rejected_share"}
    store.write_bytes_atomic(key, json.dumps({**old, "added_by_a_later_version": 1}).encode())

    [again] = parse_run.parse_partitions(store, SPEC, ["travel"])
    assert again.figures["pages_parsed"] == 0 and again.figures["unchanged"] and again.figures["validated_again"]
    assert again.report.passed
    assert again.line.endswith("validated again under validation.max_rejected_share 0.05 (its state recorded none: "
                               "once after upgrading) (schema passed)")
    assert load_parse_state(store, "demo", "travel").max_rejected_share == 0.05
    [third] = parse_run.parse_partitions(store, SPEC, ["travel"])
    assert third.report is None and not third.figures["validated_again"]


@pytest.mark.parametrize("old, new", [
    ("availability: {css: p.availability}", "availability: {css: p.instock.availability}"),  # a selector
    ("results_count: form.form-horizontal strong", "results_count: form strong"),  # the pagination rules
    ("currency: GBP\n", "currency: GBP\ndecimal_mark: \".\"\n"),  # decimal_mark set
])
def test_an_edit_of_the_specs_parsing_rules_re_parses_the_saved_pages_and_a_politeness_edit_does_not(
        crawled, tmp_path, old, new):
    """The parse input is the pages, the parser and the spec's parsing rules: a selector, a
    pagination rule or the decimal mark edited in the spec (no new snapshot, no new
    PARSER_VERSION) parses the saved pages again; an edit of anything else (politeness) leaves
    the category unchanged."""
    store = _copy(crawled, tmp_path, "objects")
    demo = (Path(parse_run.__file__).parent / "sites" / "demo.yaml").read_text()
    [first] = parse_run.parse_partitions(store, SPEC, ["travel"])
    assert first.figures["unchanged"] is False
    polite = tmp_path / "demo-polite.yaml"
    polite.write_text(demo.replace("requests_per_second: 50.0", "requests_per_second: 5.0"))
    [same] = parse_run.parse_partitions(store, load_spec(str(polite)), ["travel"])
    assert (same.figures["unchanged"], same.figures["pages_parsed"]) == (True, 0)
    selector = tmp_path / "demo-selector.yaml"
    assert demo.count(old) == 1
    selector.write_text(demo.replace(old, new))
    edited = load_spec(str(selector))
    [again] = parse_run.parse_partitions(store, edited, ["travel"])
    assert (again.figures["unchanged"], again.figures["pages_parsed"], again.figures["products"]) == (False, 1, 11)
    state = load_parse_state(store, "demo", "travel")
    assert state.input_version == input_version(latest_manifest(store, "demo", "travel", complete=True), edited)
    [settled] = parse_run.parse_partitions(store, edited, ["travel"])
    assert settled.figures["unchanged"] is True


@pytest.mark.parametrize("recorded", [{"max_rejected_share": 0.5}, {"validated": False}])
def test_rows_validated_again_stand_for_the_latest_snapshot(crawled, tmp_path, recorded):
    """An unchanged input whose rows are validated again (another share, or they failed last
    time): the parse state then stands for the latest complete snapshot and its completion
    time, as when nothing is validated, or products_table would file the day's prices under
    the earlier snapshot and day."""
    import dataclasses

    from scrape_assets.extract import save_parse_state

    store = _copy(crawled, tmp_path, "objects")
    list(parse_run.parse_partitions(store, SPEC, ["travel"]))
    state = load_parse_state(store, "demo", "travel")
    # As if parsed from yesterday's snapshot, whose pages today's snapshot has unchanged.
    save_parse_state(store, "demo", "travel", dataclasses.replace(
        state, latest_snapshot_id="2026-11-29T000000Z", latest_completed_at="2026-11-29T00:10:00Z", **recorded))
    [again] = parse_run.parse_partitions(store, SPEC, ["travel"])
    assert again.figures["unchanged"] and again.figures["validated_again"] and again.report.passed
    latest = latest_manifest(store, "demo", "travel", complete=True)
    after = load_parse_state(store, "demo", "travel")
    assert (after.latest_snapshot_id, after.latest_completed_at) == (latest.snapshot_id, latest.completed_at)
    assert (after.validated, after.max_rejected_share) == (True, SPEC.validation.max_rejected_share)
