"""Fault injection: the pipeline run through Dagster against a faulty demo server on 127.0.0.1.

Every scenario of :data:`fault_scenarios.SCENARIOS` (one fault per kind, a few variants) runs
all four assets for ``travel`` and ``mystery`` in one run and is held to its exact outcome: page
statuses, attempts, HTTP statuses and reasons in the manifest and the dead letters, requests
seen by the server, the success rate recorded, stored bytes (never a truncated page saved as
done), waits after Retry-After (from the server's log) and the deadline on stalled pages.
Storage faults fail the step; its RetryPolicy (or the next run) resumes the same snapshot.
Nothing here sleeps for a fixed time: waits are measured, not assumed.
"""

from __future__ import annotations

import hashlib
import os
import re
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

import httpx
import pytest
import yaml

from scrape_assets.demo_site import respond
from scrape_assets.errors import SpecError
from scrape_assets.extract import load_parsed
from scrape_assets.faults import (
    CONTENT_KINDS,
    FAULT_KINDS,
    FaultSpec,
    content_body,
    load_fault_spec,
    parse_fault_spec,
    retry_after_waits,
)
from scrape_assets_tests.fault_scenarios import (
    CATEGORIES,
    DAY,
    SCENARIOS,
    SCENARIOS_BY_NAME,
    WAIT_TOLERANCE_S,
    Outcome,
    Scenario,
    expected_body,
    expected_products,
    fault_server,
    page_path,
    run_scenario,
    run_storage_fails_then_resumes,
    run_storage_flaky_manifest,
    run_storage_heals_on_retry,
    snapshot_ids,
)

REPO_ROOT = Path(__file__).resolve().parents[1]
REQUEST_DEADLINE_S = 1.5  # 3 x timeout_s (0.5 s): FetchPolicy.request_deadline_s
BACKOFF_BASE_S = 0.5  # FetchPolicy.backoff_base_s: the jittered wait after attempt k is <= 0.5 * 2**(k-1)
SLACK_S = 1.5  # scheduling noise on a loaded machine (the bound is still far below a hang)


def _events(outcome: Outcome, event_type: str) -> list:
    return [e for e in outcome.result.all_events if e.event_type_value == event_type]


def _materialized(outcome: Outcome) -> set[str]:
    return {e.asset_key.path[0] for e in outcome.result.get_asset_materialization_events()}


# --- one test per fault scenario ----------------------------------------------------------------


@pytest.mark.timeout(60)
@pytest.mark.parametrize("scenario", SCENARIOS, ids=[s.name for s in SCENARIOS])
def test_fault_scenario_reaches_its_exact_outcome(scenario: Scenario, tmp_path, instance):
    outcome = run_scenario(scenario, tmp_path, instance)
    base = outcome.server.base_url
    assert outcome.result.success is scenario.run_succeeded

    # raw_pages always finishes: a page that never recovers never fails the run.
    assert "raw_pages" in _materialized(outcome)
    assert set(outcome.manifests) == set(CATEGORIES)
    assert all(m.is_complete for m in outcome.manifests.values())

    # Every page's exact status, attempts, HTTP status and reason.
    actual = outcome.pages
    assert set(actual) == set(scenario.pages)
    for key, want in scenario.pages.items():
        got = actual[key]
        assert (got.status, got.attempts, got.http_status, got.reason) == (
            want.status, want.attempts, want.http_status, want.reason
        ), key
        category, n = key.split("/")
        url = base + page_path(category, int(n)).lstrip("/")
        if want.detail is not None:
            entry = outcome.manifests[category].pages[int(n)]
            assert entry.last_error == want.full_reason(url, base), key
        # The server saw exactly the attempts the manifest counts (redirect hops aside).
        assert outcome.requests_for(key) == scenario.requests.get(key, want.attempts), key

    # The success rate recorded on raw_pages (run-wide and per category).
    raw = outcome.materialization("raw_pages")
    assert raw["pages_done"] == sum(p.status == "done" for p in scenario.pages.values())
    assert raw["pages_failed"] == sum(p.status == "failed" for p in scenario.pages.values())
    assert raw["success_rate"] == scenario.success_rate
    for category in CATEGORIES:
        pages = [p for k, p in scenario.pages.items() if k.startswith(f"{category}/")]
        rate = sum(p.status == "done" for p in pages) / len(pages)
        assert raw["by_category"][category]["success_rate"] == round(rate, 4)

    # No truncated or partial page was ever saved as done; failed pages left no bytes behind.
    spec = scenario.fault_spec
    for category, manifest in outcome.manifests.items():
        for n, entry in manifest.pages.items():
            key = manifest.body_key(n)
            if entry.status == "done":
                stored = outcome.store.read_bytes(key)
                assert stored == expected_body(spec, page_path(category, n), outcome.requests_for(f"{category}/{n}"))
                assert entry.content_hash == "sha256:" + hashlib.sha256(stored).hexdigest()
                assert entry.bytes == len(stored)
            else:
                assert not outcome.store.exists(key)
        folder = outcome.store.root.joinpath(*manifest.prefix.split("/"))
        assert not [p for p in Path(folder.path).rglob("*.tmp")]

    # The blocking schema check, and what it lets through.
    check = outcome.checks["parsed_products_match_schema"]
    assert check.passed is scenario.schema_check_passed
    if scenario.schema_check_passed:
        assert _materialized(outcome) == {"raw_pages", "parsed_products", "products_table", "dead_letters"}
        rows = outcome.product_rows()
        assert {(r["category"], r["product_id"], r["title"], r["price"]) for r in rows} == expected_products(
            scenario.pages, spec
        )
        letters = outcome.dead_letter_rows()
        failed = {k: p for k, p in actual.items() if p.status == "failed"}
        assert len(letters) == len(failed)
        for row in letters:
            key = next(k for k in failed if row["url"] == base + page_path(*_split(k)).lstrip("/"))
            entry = outcome.manifests[row["category"]].pages[int(key.split("/")[1])]
            assert (row["stage"], row["reason"], row["http_status"], row["attempts"]) == (
                "fetch", entry.last_error, failed[key].http_status, failed[key].attempts
            )
    else:
        assert _materialized(outcome) == {"raw_pages", "parsed_products"}
        assert outcome.product_rows() == [] and outcome.dead_letter_rows() == []

    # Waits after Retry-After, measured from the server's log.
    waits = retry_after_waits(outcome.server)
    if scenario.retry_after_s is None:
        assert waits == []
    else:
        asked = [e for e in outcome.server.fault_log if e.retry_after is not None]
        followed = [e for e in asked if e.attempt < outcome.seen[e.path]]
        assert len(waits) == len(followed) >= 1
        for wait in waits:
            assert wait.asked_s >= scenario.retry_after_s - WAIT_TOLERANCE_S  # an HTTP-date is rounded up
            assert wait.waited_s >= wait.asked_s - WAIT_TOLERANCE_S, wait

    # A stalled or trickling page cannot hold the run past its deadline.
    if scenario.bounded_by_deadline:
        log = [e for e in outcome.server.fault_log if e.path == page_path("mystery", 2)]
        assert [e.attempt for e in log] == [1, 2, 3]
        for k, (this, following) in enumerate(zip(log, log[1:]), start=1):
            assert following.at_s - this.answered_s <= REQUEST_DEADLINE_S + BACKOFF_BASE_S * 2 ** (k - 1) + SLACK_S
        bound = 3 * REQUEST_DEADLINE_S + BACKOFF_BASE_S * (1 + 2) + SLACK_S
        assert raw["by_category"]["mystery"]["duration_s"] <= bound

    EXTRA_CHECKS.get(scenario.name, lambda o: None)(outcome)


def _split(key: str) -> tuple[str, int]:
    category, n = key.split("/")
    return category, int(n)


# Scenario-specific assertions, run on the same outcome (one Dagster run per scenario).


def _charset(content_type: str):
    def check(outcome: Outcome) -> None:
        for manifest in outcome.manifests.values():
            assert {e.content_type for e in manifest.pages.values()} == {content_type}
        titles = [r["title"] for r in outcome.product_rows()]
        assert len(titles) == 11 + 32
        # Non-ASCII titles and the pound sign survive the missing or wrong charset exactly.
        assert {"The Endless Café", "Tomás's Orchard"} <= set(titles)
        assert not any("Ã" in t or "\ufffd" in t for t in titles)

    return check


def _layout_guard_names_mystery_page_2(rejects: int):
    def check(outcome: Outcome) -> None:
        check_result = outcome.checks["parsed_products_match_schema"]
        guard = [c for c in check_result.metadata["failure_cases"].value if c["check"] == "layout_guard"]
        assert [(c["failure_case"]["category"], c["failure_case"]["page_number"]) for c in guard] == [("mystery", 2)]
        store, manifest = outcome.store, outcome.manifests["mystery"]
        parsed = load_parsed(store, manifest)
        assert len(parsed.products) == 20  # page 1 only
        assert [r["reason"] for r in parsed.rejects] == ["price: no element matches 'p.price_color'"] * rejects

    return check


def _empty_category(outcome: Outcome) -> None:
    raw = outcome.materialization("raw_pages")
    assert raw["by_category"]["travel"]["products_expected"] == 0
    assert [r for r in outcome.product_rows() if r["category"] == "travel"] == []
    assert outcome.materialization("products_table")["rows_by_category"] == {"travel": 0, "mystery": 32}


def _robots_disallow(outcome: Outcome) -> None:
    paths = [r.path for r in outcome.server.requests]
    assert paths.count("/robots.txt") == 1
    assert not [p for p in paths if "mystery_3" in p]  # refused before any request


def _robots_unreachable(outcome: Outcome) -> None:
    # Retried as a page would be (max_attempts), then every page of the host refused unasked.
    assert [r.path for r in outcome.server.requests] == ["/robots.txt"] * 3


def _robots_recovered(outcome: Outcome) -> None:
    paths = [r.path for r in outcome.server.requests]
    assert paths[:3] == ["/robots.txt"] * 3 and paths.count("/robots.txt") == 3
    assert [e.status for e in outcome.server.fault_log if e.fault] == [503, 503]


def _rates_are_reproducible(outcome: Outcome) -> None:
    drawn = {}
    for event in outcome.server.fault_log:
        drawn.setdefault(event.path, []).append(event.fault)
    assert drawn == {
        "/robots.txt": [None],
        page_path("travel", 1): [None],
        page_path("mystery", 1): ["reset_mid_body", "http_error", None],
        page_path("mystery", 2): ["http_error", "reset_mid_body", "http_error"],
    }
    spec = SCENARIOS_BY_NAME["rates-seed-38"].fault_spec
    for path, kinds in drawn.items():  # the spec alone predicts every draw
        assert [getattr(spec.choose(path, a), "fault", None) for a in range(1, len(kinds) + 1)] == kinds


def _offsite_never_followed(outcome: Outcome) -> None:
    assert outcome.seen[page_path("mystery", 2)] == 1
    assert [e.status for e in outcome.server.fault_log if e.fault] == [302]


EXTRA_CHECKS = {
    "charset_missing": _charset("text/html"),
    "charset_wrong": _charset("text/html; charset=iso-8859-1"),
    "layout_changed": _layout_guard_names_mystery_page_2(rejects=12),
    "zero_products-broken-page": _layout_guard_names_mystery_page_2(rejects=0),
    "zero_products-empty-category": _empty_category,
    "robots_disallow": _robots_disallow,
    "http_error-robots-txt-503": _robots_unreachable,
    "http_error-robots-txt-503-recovers": _robots_recovered,
    "rates-seed-38": _rates_are_reproducible,
    "redirect_offsite": _offsite_never_followed,
}


def test_every_fault_kind_has_a_scenario():
    assert {s.kind for s in SCENARIOS} == set(FAULT_KINDS) | {"rates"}


# --- storage faults: the run fails (or the step retries), then resumes ---------------------------


def _storage_error(outcome: Outcome, event_type: str):
    """The StorageError behind the step's failure or retry request (Dagster wraps it)."""
    (event,) = _events(outcome, event_type)
    error = event.event_specific_data.error
    while error is not None and error.cls_name != "StorageError":
        error = error.cause
    assert error is not None, event.event_specific_data.error
    return error


@pytest.mark.timeout(90)
def test_storage_unwritable_fails_the_run_then_the_next_run_resumes_the_snapshot(tmp_path, instance):
    first, second = run_storage_fails_then_resumes(tmp_path, instance)
    # An infrastructure fault fails the run, after the step's RetryPolicy retries (3).
    assert not first.result.success
    assert len(_events(first, "STEP_UP_FOR_RETRY")) == 3
    assert [e.step_key for e in _events(first, "STEP_FAILURE")] == ["raw_pages"]
    stopped = first.manifests["mystery"]
    location = tmp_path / "objects" / stopped.page_key(2)
    error = _storage_error(first, "STEP_FAILURE")
    assert error.message.startswith(f"scrape_assets.errors.StorageError: {location}: write failed: [Errno 21] Is a directory")
    assert _materialized(first) == set()
    # The page is not blamed: its four fetches (one per step attempt) were given back, none is a dead letter.
    assert not stopped.is_complete
    assert [(p.status, p.attempts) for _, p in sorted(stopped.pages.items())] == [("done", 1), ("pending", 0)]
    assert first.seen[page_path("mystery", 2)] == 4
    assert first.seen[page_path("mystery", 1)] == 1  # done before the fault: never refetched

    assert second.result.success
    resumed = second.manifests["mystery"]
    assert resumed.snapshot_id == stopped.snapshot_id and snapshot_ids(second, "mystery") == [stopped.snapshot_id]
    assert [(p.status, p.attempts) for _, p in sorted(resumed.pages.items())] == [("done", 1), ("done", 1)]
    assert second.seen[page_path("mystery", 1)] == 1
    assert second.seen[page_path("mystery", 2)] == 5
    raw = second.materialization("raw_pages")
    assert raw["by_category"]["mystery"]["resumed"] is True
    assert (raw["requests_made"], raw["pages_done"], raw["pages_failed"], raw["success_rate"]) == (1, 2, 0, 1.0)
    assert second.store.read_bytes(resumed.body_key(2)) == respond("GET", page_path("mystery", 2), day=DAY).body
    assert len(second.product_rows()) == 32 and second.dead_letter_rows() == []


@pytest.mark.timeout(60)
def test_storage_unwritable_then_freed_the_retry_policy_resumes_within_the_run(tmp_path, instance):
    outcome = run_storage_heals_on_retry(tmp_path, instance)
    assert outcome.result.success
    assert len(_events(outcome, "STEP_UP_FOR_RETRY")) == 1
    assert [e.step_key for e in _events(outcome, "STEP_RESTARTED")] == ["raw_pages"]
    manifest = outcome.manifests["mystery"]
    location = tmp_path / "objects" / manifest.page_key(2)
    assert f"{location}: write failed: [Errno 21] Is a directory" in _storage_error(outcome, "STEP_UP_FOR_RETRY").message
    assert snapshot_ids(outcome, "mystery") == [manifest.snapshot_id]
    # Page 2's first fetch could not be stored: fetched again, and that attempt was given back.
    assert [(p.status, p.attempts) for _, p in sorted(manifest.pages.items())] == [("done", 1), ("done", 1)]
    assert outcome.seen[page_path("mystery", 2)] == 2
    assert outcome.seen[page_path("mystery", 1)] == 1  # done before the failure: not refetched
    assert outcome.seen["/robots.txt"] == 2  # once per step attempt
    assert outcome.materialization("raw_pages")["by_category"]["mystery"]["resumed"] is True
    assert outcome.store.read_bytes(manifest.body_key(2)) == respond("GET", page_path("mystery", 2), day=DAY).body
    assert len(outcome.product_rows()) == 32 and outcome.dead_letter_rows() == []


@pytest.mark.timeout(60)
def test_storage_failing_once_is_retried_by_the_retry_policy_and_no_page_is_fetched_twice(tmp_path, instance):
    outcome = run_storage_flaky_manifest(tmp_path, instance)
    assert outcome.result.success
    assert len(_events(outcome, "STEP_UP_FOR_RETRY")) == 1
    manifest = outcome.manifests["mystery"]
    assert snapshot_ids(outcome, "mystery") == [manifest.snapshot_id]
    assert [(p.status, p.attempts) for _, p in sorted(manifest.pages.items())] == [("done", 1), ("done", 1)]
    assert outcome.seen[page_path("mystery", 1)] == 1
    assert outcome.seen[page_path("mystery", 2)] == 1
    raw = outcome.materialization("raw_pages")
    assert raw["by_category"]["mystery"]["resumed"] is True and raw["success_rate"] == 1.0
    assert len(outcome.product_rows()) == 32


# --- the server itself ---------------------------------------------------------------------------


@pytest.mark.timeout(60)
def test_a_trickled_page_says_its_connection_closes_so_no_next_request_meets_the_close(tmp_path):
    """A trickle closes the connection after a complete body: without ``Connection: close``
    the client sent its next page on that connection and met the close, a failed attempt
    (a phantom one, the server never saw the request): with one attempt allowed, pages
    2 and 3 of fantasy failed as "Server disconnected"."""
    import asyncio
    import logging

    from scrape_assets.defs.assets.raw_pages import crawl_partitions
    from scrape_assets.defs.resources import ObjectStoreResource, SiteResource
    from scrape_assets.manifest import latest_manifest
    from scrape_assets.storage import ObjectStore

    spec = FaultSpec.model_validate({"rules": [{"match": "^/catalogue/category/", "fault": "trickle",
                                                "bytes_per_s": 100_000}]})
    with fault_server(spec) as server:
        site = SiteResource(site="demo", base_url=server.base_url, max_attempts=1)
        asyncio.run(crawl_partitions(site, ObjectStoreResource(url=str(tmp_path)), ["fantasy", "mystery"],
                                     log=logging.getLogger("test"), new_snapshot=False))
        counts = server.attempt_counts
    for category, pages in (("fantasy", 3), ("mystery", 2)):
        manifest = latest_manifest(ObjectStore(str(tmp_path)), "demo", category)
        assert {n: (p.status, p.attempts) for n, p in manifest.pages.items()} == {
            n: ("done", 1) for n in range(1, pages + 1)}
        assert all(counts[page_path(category, n)] == 1 for n in range(1, pages + 1))


@pytest.mark.timeout(30)
def test_stalled_and_trickling_handlers_end_when_the_server_shuts_down():
    spec = FaultSpec.model_validate(
        {"rules": [{"match": "travel", "fault": "stall_after_headers"}, {"match": "mystery", "fault": "trickle", "bytes_per_s": 10}]}
    )
    clients = []
    with fault_server(spec) as server:
        for category in ("travel", "mystery"):
            client = socket.create_connection(server.server_address[:2], timeout=10)
            client.sendall(f"GET {page_path(category, 1)} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
            assert client.recv(65536).startswith(b"HTTP/1.1 200 OK")  # headers arrive, then nothing much
            clients.append(client)
    for client in clients:  # shutdown released both handlers: they closed their connections
        while chunk := client.recv(65536):
            assert len(chunk) < 1000
        client.close()


@pytest.mark.timeout(30)
def test_a_stalled_handler_notices_the_client_hanging_up():
    spec = FaultSpec.model_validate({"rules": [{"match": "travel", "fault": "stall_after_headers"}]})
    with fault_server(spec) as server:
        done = threading.Event()
        original = server.finish_request

        def finish_request(request, client_address):
            original(request, client_address)
            done.set()

        server.finish_request = finish_request
        client = socket.create_connection(server.server_address[:2], timeout=10)
        client.sendall(f"GET {page_path('travel', 1)} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        assert client.recv(65536).startswith(b"HTTP/1.1 200 OK")
        client.close()
        assert done.wait(timeout=5)  # long before max_stall_s (60 s)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", ["reset_mid_body", "short_body", "trickle", "stall_after_headers", "bad_gzip",
                                  "oversize_body", "gzip_bomb"])
def test_a_body_fault_breaks_a_full_answer_even_to_a_conditional_get(kind):
    """With the page's own ETag the demo would answer 304; the fault still breaks a 200 (a 304 has
    no body to break: a stall after it hung the connection's next request, on another page)."""
    original = respond("GET", page_path("travel", 1), day=DAY)
    spec = FaultSpec.model_validate({"rules": [{"match": "travel", "fault": kind}]})
    with fault_server(spec) as server:
        client = socket.create_connection(server.server_address[:2], timeout=10)
        client.sendall(f"GET {page_path('travel', 1)} HTTP/1.1\r\nHost: x\r\n"
                       f"If-None-Match: {original.headers['ETag']}\r\n\r\n".encode())
        assert client.recv(65536).startswith(b"HTTP/1.1 200 OK")
        client.close()
        (event,) = server.fault_log
        assert (event.fault, event.status) == (kind, 200)


def test_http_date_retry_after_is_never_earlier_than_asked():
    spec = FaultSpec.model_validate(
        {"rules": [{"match": "travel", "fault": "http_429", "retry_after_s": 2, "retry_after_form": "http-date"}]}
    )
    with fault_server(spec) as server:
        response = httpx.get(server.base_url + page_path("travel", 1).lstrip("/"))
    assert response.status_code == 429
    assert re.fullmatch(r"[A-Z][a-z]{2}, \d{2} [A-Z][a-z]{2} \d{4} \d{2}:\d{2}:\d{2} GMT", response.headers["retry-after"])
    (event,) = server.fault_log
    assert 2.0 <= event.retry_after_s < 3.0


@pytest.mark.parametrize(("status", "form"), [(429, "seconds"), (503, "http-date")])
def test_a_retry_after_pauses_every_request_to_the_host_not_only_the_page(tmp_path, instance, status, form):
    """The site answers travel's page 429 (or 503) with Retry-After: 1 s once. Nothing more
    reaches it before that second is over: not the page, not mystery's pages waiting for
    the host's one connection; then every page is fetched."""
    from scrape_assets_tests.conftest import make_resources, materialize

    fault = {"fault": "http_429"} if status == 429 else {"fault": "http_error", "status": 503}
    spec = FaultSpec.model_validate({"rules": [
        {"match": r"travel_2/index\.html$", **fault, "retry_after_s": 1, "retry_after_form": form, "first_n": 1}]})
    with fault_server(spec) as server:
        resources = make_resources(tmp_path, base_url=server.base_url, max_concurrency=1)
        result = materialize(instance, resources, list(CATEGORIES), raise_on_error=False)
        assert result.success
    # said in the run's log (the UI's), not only on the step's stderr
    warned = [e.user_message for e in instance.all_logs(result.run_id) if "): no request to" in e.user_message]
    assert len(warned) == 1 and re.fullmatch(
        re.escape(f"{server.base_url}{page_path('travel', 1).lstrip('/')} answered {status} (Retry-After ")
        + r"[12](\.\d)? s\): no request to 127\.0\.0\.1 for [12]\.\d s "  # a date's seconds to 0.1 s
        + re.escape("(if this keeps happening, lower the spec's politeness.requests_per_second)"), warned[0]), warned
    log = server.fault_log
    (refused,) = [e for e in log if e.status == status]
    later = [e for e in log if e.at_s > refused.answered_s]
    assert sorted(e.path for e in later) == sorted([page_path("travel", 1), page_path("mystery", 1),
                                                    page_path("mystery", 2)])
    assert min(e.at_s for e in later) >= refused.answered_s + refused.retry_after_s - WAIT_TOLERANCE_S


@pytest.mark.parametrize("kind", sorted(CONTENT_KINDS | {"robots_disallow"}))
def test_a_content_fault_is_a_changed_page_for_conditional_gets(kind):
    """The original page's validators get the changed page (200, new ETag); the new ETag gets 304."""
    if kind == "robots_disallow":
        url_path, rule = "/robots.txt", {"fault": kind, "prefix": "/catalogue/"}
    else:
        url_path, rule = page_path("travel", 1), {"match": "travel", "fault": kind}
    original = respond("GET", url_path, day=DAY)
    spec = FaultSpec.model_validate({"rules": [rule]})
    with fault_server(spec) as server:
        url = server.base_url + url_path.lstrip("/")
        changed = httpx.get(url, headers={"If-None-Match": original.headers["ETag"],
                                          "If-Modified-Since": original.headers["Last-Modified"]})
        assert changed.status_code == 200 and changed.content == content_body(spec.rules[0], original.body)
        assert changed.headers["etag"] != original.headers["ETag"]
        again = httpx.get(url, headers={"If-None-Match": changed.headers["etag"]})
        assert again.status_code == 304 and again.content == b"" and again.headers["etag"] == changed.headers["etag"]
        # If-Modified-Since alone cannot tell a changed page from its date: the page is sent.
        assert httpx.get(url, headers={"If-Modified-Since": original.headers["Last-Modified"]}).status_code == 200
    # Without a content fault the demo's own answer stands.
    with fault_server(FaultSpec()) as server:
        url = server.base_url + url_path.lstrip("/")
        assert httpx.get(url, headers={"If-None-Match": original.headers["ETag"]}).status_code == 304


def test_rules_first_n_counts_requests_per_path_and_falls_through():
    spec = FaultSpec.model_validate({"rules": [
        {"match": "page-2", "fault": "http_429", "first_n": 1},
        {"match": "page-2", "fault": "http_error", "status": 500, "first_n": 2},
    ]})
    path = page_path("mystery", 2)
    assert [getattr(spec.choose(path, a), "fault", None) for a in (1, 2, 3)] == ["http_429", "http_error", None]
    assert spec.choose(page_path("mystery", 1), 1) is None


def test_the_access_log_names_each_answer_its_attempt_and_fault():
    """What ``serve-demo --faults`` prints: one line per request, with the fault applied."""
    import io

    spec = FaultSpec.model_validate({"rules": [{"match": "page-2", "fault": "http_error", "status": 503, "first_n": 1}]})
    with fault_server(spec) as server:
        server.access_log = io.StringIO()
        url = server.base_url + page_path("mystery", 2).lstrip("/")
        assert [httpx.get(url).status_code for _ in range(2)] == [503, 200]
    lines = server.access_log.getvalue().splitlines()
    assert [re.sub(r"^\d\d:\d\d:\d\d ", "", line) for line in lines] == [
        f"GET {page_path('mystery', 2)} 503 [attempt 1, fault http_error]",
        f"GET {page_path('mystery', 2)} 200 [attempt 2]",
    ]


# --- the spec file -------------------------------------------------------------------------------


def test_example_spec_ships_and_loads():
    spec = load_fault_spec(REPO_ROOT / "scrape_assets" / "faults_example.yaml")
    assert [r.fault for r in spec.rules] == [
        "http_error", "http_429", "short_body", "stall_after_headers", "charset_missing", "robots_disallow"
    ]
    assert spec.rates.seed == 7 and spec.rates.probabilities() == {"http_error": 0.05, "reset_mid_body": 0.02}


def test_the_module_docstring_example_is_a_valid_spec():
    import textwrap

    import scrape_assets.faults as faults

    example = faults.__doc__.split("Spec format (YAML or JSON; unknown keys are errors)::\n")[1].split("\nFault kinds")[0]
    spec = parse_fault_spec(textwrap.dedent(example), "faults.py docstring")
    assert [r.fault for r in spec.rules] == ["http_error", "http_429", "robots_disallow"]
    assert spec.rates.probabilities() == {"http_error": 0.10, "reset_mid_body": 0.05}


def test_json_spec_loads(tmp_path):
    path = tmp_path / "faults.json"
    path.write_text('{"rules": [{"match": "x", "fault": "gzip_bomb", "decompressed_bytes": 1000}]}')
    assert load_fault_spec(path).rules[0].decompressed_bytes == 1000


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("rules: [{match: x, fault: nope}]", "rules.0.fault: unknown fault kind 'nope': expected one of http_error, "),
        ("rules: [{match: x}]", "rules.0.fault: required key is missing: expected one of http_error, "),
        ("rules: [{match: x, fault: http_error, status: 302}]", "rules.0.status: Input should be greater than or equal to 400 (got 302)"),
        ("rules: [{match: x, fault: trickle, bytes_per_sec: 5}]", "rules.0.bytes_per_sec: unknown key"),
        ("rules: [{fault: robots_disallow}]", "rules.0.prefix: required key is missing"),
        ("rules: [{match: '(', fault: bad_gzip}]", "rules.0.match: expected a regular expression: missing )"),
        ("rules: [{match: x, fault: bad_gzip, first_n: 0}]", "rules.0.first_n: Input should be greater than or equal to 1 (got 0)"),
        ("rates: {http_error: 0.1}", "rates.seed: required key is missing"),
        ("rates: {seed: 1, http_error: 0.7, bad_gzip: 0.5}", "rates: expected probabilities summing to at most 1, got 1.2"),
        ("[1, 2]", "expected a mapping with 'rules' and/or 'rates', got list"),
        ("rules: [", "not valid YAML"),
    ],
)
def test_bad_specs_name_the_file_the_key_and_what_was_expected(tmp_path, text, message):
    path = tmp_path / "faults.yaml"
    path.write_text(text)
    with pytest.raises(SpecError) as raised:
        load_fault_spec(path)
    assert str(raised.value).startswith(f"{path}: ")
    assert message in str(raised.value)


def test_missing_or_non_utf8_spec_file_is_a_spec_error(tmp_path):
    with pytest.raises(SpecError, match="cannot read fault spec"):
        load_fault_spec(tmp_path / "nope.yaml")
    latin1 = tmp_path / "latin1.yaml"
    latin1.write_bytes("rules: []  # d\u00e9j\u00e0\n".encode("latin-1"))
    with pytest.raises(SpecError) as raised:
        load_fault_spec(latin1)
    assert str(raised.value) == f"{latin1}: expected UTF-8 text, found byte 0xe9 at offset 14"


def test_empty_spec_breaks_nothing():
    assert parse_fault_spec("", "empty.yaml") == FaultSpec()


# --- the command line ----------------------------------------------------------------------------


@pytest.mark.timeout(60)
def test_serve_demo_with_faults_applies_them_and_stops_on_ctrl_c(tmp_path):
    spec = tmp_path / "faults.yaml"
    spec.write_text(yaml.safe_dump({"rules": [{"match": "travel_2/", "fault": "http_error", "status": 502, "first_n": 1}]}))
    cli = Path(sys.executable).with_name("scrape-assets")
    env = {**os.environ, "SCRAPE_DEMO_DATE": DAY.isoformat()}
    process = subprocess.Popen([str(cli), "serve-demo", "--port", "0", "--faults", str(spec)], env=env,
                               stdout=subprocess.PIPE, text=True)
    try:
        line = process.stdout.readline()
        match = re.fullmatch(
            r"demo catalogue on (http://127\.0\.0\.1:\d+/) \(12 categories, 38 pages; day " + DAY.isoformat()
            + r", SCRAPE_DEMO_DATE\) with faults from (.+): "
            r"1 rule\(s\); one line per request below, Ctrl-C stops\n", line,
        )
        assert match and match[2] == str(spec), line
        url = match[1] + page_path("travel", 1).lstrip("/")
        assert httpx.get(url).status_code == 502
        assert httpx.get(url).content == respond("GET", page_path("travel", 1), day=DAY).body
        logged = [re.sub(r"^\d\d:\d\d:\d\d ", "", process.stdout.readline()) for _ in range(2)]
        assert logged == [f"GET {page_path('travel', 1)} 502 [attempt 1, fault http_error]\n",
                          f"GET {page_path('travel', 1)} 200 [attempt 2]\n"]
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=10) == 0
    finally:
        process.kill()
        process.stdout.close()


def test_serve_demo_with_a_bad_fault_spec_gives_one_clear_error(tmp_path):
    spec = tmp_path / "faults.yaml"
    spec.write_text("rules: [{match: x, fault: http_error, statuz: 500}]")
    cli = Path(sys.executable).with_name("scrape-assets")
    done = subprocess.run([str(cli), "serve-demo", "--port", "0", "--faults", str(spec)], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 2
    assert done.stderr.strip() == (
        f"scrape-assets: error: {spec}: rules.0.statuz: unknown key (see the fault kinds and options in "
        "scrape_assets/faults.py)"
    )


# --- the reliability matrix ----------------------------------------------------------------------


@pytest.mark.timeout(60)
def test_fault_matrix_rows(tmp_path):
    from reliability.fault_matrix import markdown, run_fault_matrix

    (row,) = run_fault_matrix(tmp_path, names=["redirect_offsite"])
    assert row == {
        "kind": "redirect_offsite", "scenario": "redirect_offsite", "pages_done": 2, "pages_failed": 1,
        "reasons": {"mystery/2": "offsite_redirect"},
        "http_status": {"travel/1": 200, "mystery/1": 200, "mystery/2": 302},
        "attempts": {"travel/1": 1, "mystery/1": 1, "mystery/2": 1},
        "waits_ok": None, "success_rate": 0.6667, "schema_check_passed": True, "run_succeeded": True,
        "duration_s": row["duration_s"],
    }
    assert "| redirect_offsite | redirect_offsite | 2 | 1 | mystery/2: offsite_redirect, 302, 1 |" in markdown([row])
    with pytest.raises(KeyError, match="unknown fault scenario"):
        run_fault_matrix(tmp_path, names=["no-such-fault"])


def test_storage_refusing_a_write_mid_crawl_fails_the_step_once_without_a_retry(tmp_path, instance, monkeypatch):
    """A category's folder this process may not write (another user's; EPERM) is no outage:
    the step fails at once, not after the RetryPolicy's three retries (~22 s), and the page
    is not blamed."""
    import errno

    from scrape_assets.errors import StorageError
    from scrape_assets.manifest import latest_manifest
    from scrape_assets.storage import ObjectStore
    from scrape_assets_tests.conftest import make_resources, materialize

    original = ObjectStore.write_bytes_atomic

    def refuse_mystery_page_2(self, key, data, **kwargs):
        if "/mystery/" in key and key.endswith("page-0002.html"):
            try:
                raise PermissionError(errno.EPERM, "Operation not permitted", key)
            except PermissionError as exc:
                raise StorageError(key, f"write failed: {exc}") from exc
        return original(self, key, data, **kwargs)

    monkeypatch.setattr(ObjectStore, "write_bytes_atomic", refuse_mystery_page_2)
    with fault_server(FaultSpec()) as server:
        result = materialize(instance, make_resources(tmp_path, base_url=server.base_url), ["mystery"],
                             raise_on_error=False)
    assert not result.success
    events = [e.event_type_value for e in result.all_events]
    assert "STEP_UP_FOR_RETRY" not in events and events.count("STEP_FAILURE") == 1
    (failure,) = [e for e in result.all_events if e.event_type_value == "STEP_FAILURE"]
    description = failure.event_specific_data.error.message
    assert "Operation not permitted" in description and "no retry changes a refusal" in description
    manifest = latest_manifest(ObjectStore(str(tmp_path / "objects")), "demo", "mystery")
    assert [(p.status, p.attempts) for _, p in sorted(manifest.pages.items())] == [("done", 1), ("pending", 0)]


# --- behaviours pinned by the mutation audit -------------------------------------------------------


def _raw_get(server, path: str, method: str = "GET") -> socket.socket:
    client = socket.create_connection(server.server_address[:2], timeout=10)
    client.sendall(f"{method} {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    return client


def _read_to_end(client: socket.socket) -> tuple[bytes, str]:
    """Everything the server sent, and how the connection ended: ``"fin"`` or ``"reset"``."""
    data = b""
    try:
        while chunk := client.recv(65536):
            data += chunk
    except ConnectionResetError:
        return data, "reset"
    finally:
        client.close()
    return data, "fin"


def test_a_rule_wins_over_rates_and_rates_draw_only_where_their_match_says():
    spec = FaultSpec.model_validate({
        "rules": [{"match": "travel", "fault": "http_429", "first_n": 1}],
        "rates": {"seed": 1, "http_error": 1.0},
    })
    travel = page_path("travel", 1)
    assert [spec.choose(travel, a).fault for a in (1, 2)] == ["http_429", "http_error"]
    assert spec.choose(page_path("mystery", 2), 1).fault == "http_error"
    # The default rates match is every listing page: robots.txt, the home page and the sitemap are spared.
    assert [spec.choose(path, 1) for path in ("/robots.txt", "/", "/sitemap.xml")] == [None, None, None]


def test_rates_summing_to_exactly_one_are_accepted():
    spec = parse_fault_spec("rates: {seed: 3, http_error: 0.7, bad_gzip: 0.2, short_body: 0.1}", "rates.yaml")
    assert spec.rates.probabilities() == {"http_error": 0.7, "short_body": 0.1, "bad_gzip": 0.2}
    assert all(spec.choose(page_path("travel", 1), a) is not None for a in range(1, 50))  # every request breaks


def test_status_fault_defaults_and_the_retry_after_seconds_form():
    """http_error: 503 without Retry-After; http_429: Retry-After 1; whole seconds sent as an
    integer (RFC 9110 delay-seconds), a fraction as it is."""
    spec = FaultSpec.model_validate({"rules": [
        {"match": "travel_2/", "fault": "http_error"},
        {"match": "mystery_3/index", "fault": "http_429"},
        {"match": "mystery_3/page-2", "fault": "http_429", "retry_after_s": 2.0},
        {"match": "^/$", "fault": "http_error", "status": 500, "retry_after_s": 1.5},
    ]})
    with fault_server(spec) as server:
        answers = [httpx.get(server.base_url + path.lstrip("/"))
                   for path in (page_path("travel", 1), page_path("mystery", 1), page_path("mystery", 2), "/")]
    assert [(a.status_code, a.headers.get("retry-after")) for a in answers] == [
        (503, None), (429, "1"), (429, "2"), (500, "1.5")]
    assert [e.retry_after_s for e in server.fault_log] == [None, 1.0, 2.0, 1.5]


def test_an_http_date_retry_after_logs_what_the_date_asks_from_the_moment_it_was_sent():
    import email.utils
    import time

    spec = FaultSpec.model_validate(
        {"rules": [{"match": "travel", "fault": "http_429", "retry_after_s": 2, "retry_after_form": "http-date"}]}
    )
    with fault_server(spec) as server:
        before = time.time()
        response = httpx.get(server.base_url + page_path("travel", 1).lstrip("/"))
        after = time.time()
    (event,) = server.fault_log
    date = email.utils.parsedate_to_datetime(response.headers["retry-after"]).timestamp()
    assert date == int(date)  # whole seconds, rounded up from now + 2
    # The date minus what the log says was asked is the moment the header was written.
    assert before - 0.001 <= date - event.retry_after_s <= after + 0.001


def test_a_head_request_to_a_status_fault_gets_no_body_and_the_connection_stays_usable():
    spec = FaultSpec.model_validate({"rules": [{"match": "travel", "fault": "http_error", "status": 503, "first_n": 1}]})
    with fault_server(spec) as server, httpx.Client(base_url=server.base_url) as client:
        head = client.head(page_path("travel", 1))
        assert (head.status_code, head.content) == (503, b"")
        assert int(head.headers["content-length"]) > 0  # the length the GET's error page has
        page = client.get(page_path("travel", 1))
        assert (page.status_code, page.content) == (200, respond("GET", page_path("travel", 1), day=DAY).body)


def test_reset_mid_body_sends_half_the_body_then_a_tcp_reset():
    body = respond("GET", page_path("travel", 1), day=DAY).body
    spec = FaultSpec.model_validate({"rules": [{"match": "travel", "fault": "reset_mid_body"}]})
    with fault_server(spec) as server:
        data, ending = _read_to_end(_raw_get(server, page_path("travel", 1)))
    head, _, sent = data.partition(b"\r\n\r\n")
    assert ending == "reset"
    assert f"Content-Length: {len(body)}".encode() in head
    # At most half the body arrives (a reset may drop bytes the client had not read yet).
    assert sent == body[: len(sent)] and len(sent) <= len(body) // 2


def test_short_body_sends_half_the_body_then_closes_the_connection():
    body = respond("GET", page_path("travel", 1), day=DAY).body
    spec = FaultSpec.model_validate({"rules": [{"match": "travel", "fault": "short_body"}]})
    with fault_server(spec) as server:
        client = _raw_get(server, page_path("travel", 1))
        client.settimeout(5)  # a FIN comes at once; a connection kept open would time out here
        data, ending = _read_to_end(client)
    head, _, sent = data.partition(b"\r\n\r\n")
    assert (ending, sent) == ("fin", body[: len(body) // 2])
    assert f"Content-Length: {len(body)}".encode() in head


@pytest.mark.timeout(30)
@pytest.mark.parametrize("rule", [{"fault": "stall_after_headers", "max_stall_s": 0.1},
                                  {"fault": "trickle", "bytes_per_s": 1_000_000},
                                  {"fault": "oversize_body", "body_bytes": 100_000, "declare_length": False}],
                         ids=lambda r: r["fault"])
def test_faults_that_close_the_connection_say_so_in_the_head(rule):
    spec = FaultSpec.model_validate({"rules": [{"match": "travel", **rule}]})
    with fault_server(spec) as server:
        data, ending = _read_to_end(_raw_get(server, page_path("travel", 1)))
    head = data.partition(b"\r\n\r\n")[0].decode().split("\r\n")
    assert head[0] == "HTTP/1.1 200 OK" and "Connection: close" in head and ending == "fin"


def test_a_304_to_a_changed_page_carries_its_etag_and_last_modified():
    original = respond("GET", page_path("travel", 1), day=DAY)
    spec = FaultSpec.model_validate({"rules": [{"match": "travel", "fault": "layout_changed"}]})
    with fault_server(spec) as server:
        url = server.base_url + page_path("travel", 1).lstrip("/")
        changed = httpx.get(url)
        again = httpx.get(url, headers={"If-None-Match": changed.headers["etag"]})
    assert again.status_code == 304
    assert (again.headers["etag"], again.headers["last-modified"]) == (changed.headers["etag"],
                                                                      original.headers["Last-Modified"])


def test_retry_after_waits_measure_to_the_next_request_of_the_path():
    spec = FaultSpec.model_validate({"rules": [{"match": "travel", "fault": "http_429", "retry_after_s": 0}]})
    with fault_server(spec) as server:
        url = server.base_url + page_path("travel", 1).lstrip("/")
        assert [httpx.get(url).status_code for _ in range(3)] == [429] * 3
    log = server.fault_log
    assert [e.retry_after for e in log] == ["0"] * 3
    assert retry_after_waits(server) == [
        (page_path("travel", 1), 1, 0.0, log[1].at_s - log[0].answered_s),
        (page_path("travel", 1), 2, 0.0, log[2].at_s - log[1].answered_s),
    ]


def test_zero_products_without_counts_removes_cards_count_and_pager():
    from scrape_assets.faults import remove_products

    page = respond("GET", page_path("mystery", 1), day=DAY).body
    assert b'<ul class="pager">' in page and b"<strong>32</strong> results" in page
    broken = remove_products(page)
    assert b'<ul class="pager">' in broken and b"<strong>32</strong> results" in broken
    assert b"product_pod" not in broken
    empty = remove_products(page, keep_counts=False)
    assert b'class="pager"' not in empty and b"product_pod" not in empty
    assert b"<strong>0</strong> results." in empty and b"<strong>32</strong>" not in empty


@pytest.mark.parametrize("rules", [[], [{"match": "travel", "fault": "layout_changed"}]], ids=["no-fault", "layout_changed"])
def test_head_to_the_faulty_server_gets_the_get_headers(rules):
    """RFC 9110 §8.6: Content-Length in a HEAD answer, if sent, is the GET's length, as the plain
    demo server sends; the fault server sent 0 (from the empty HEAD body) and, for a content
    fault, the original page's ETag (found by the sixteenth mutation audit)."""
    spec = FaultSpec.model_validate({"rules": rules})
    original = respond("GET", page_path("travel", 1), day=DAY).body
    body = content_body(spec.rules[0], original) if rules else original
    with fault_server(spec) as server:
        url = server.base_url + page_path("travel", 1).lstrip("/")
        get, head = httpx.get(url), httpx.head(url)
    assert get.content == body
    assert (head.status_code, head.content) == (200, b"")
    assert head.headers["content-length"] == get.headers["content-length"] == str(len(body))
    assert head.headers["etag"] == get.headers["etag"]  # a content fault's HEAD named the original page's tag


@pytest.mark.parametrize("text", [
    "rules: [{match: travel, fault: http_429, retry_after_s: .inf}]",
    "rules: [{match: travel, fault: http_error, retry_after_s: .inf, retry_after_form: http-date}]",
    "rules: [{match: travel, fault: trickle, bytes_per_s: .inf}]",
])
def test_an_infinite_option_is_a_spec_error_not_a_crash_per_request(text):
    """.inf passed ge=0 / gt=0; every matching request then died in the handler with
    OverflowError (int(inf), round(inf)) and the client saw the connection drop."""
    with pytest.raises(SpecError):
        parse_fault_spec(text, "faults.yaml")


_HEAD_THEN_GET_OPTIONS = {"trickle": {"bytes_per_s": 100000}, "stall_after_headers": {"max_stall_s": 1},
                          "oversize_body": {"body_bytes": 200000}, "gzip_bomb": {"decompressed_bytes": 100000},
                          "robots_disallow": {"prefix": "/x/"}}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", sorted(FAULT_KINDS))
def test_a_get_after_a_faulted_head_on_a_keep_alive_connection_is_answered(kind):
    """A HEAD's fault applies to its head only (no body to break): a fault that ends the
    connection after the head announces it (Connection: close), so a keep-alive client's next
    request goes on a new connection instead of one about to die (reset_mid_body, short_body
    and oversize_body did not, and the GET failed)."""
    import http.client

    spec = FaultSpec.model_validate({"rules": [{"match": "travel", "fault": kind, "first_n": 1,
                                                **_HEAD_THEN_GET_OPTIONS.get(kind, {})}]})
    plain = respond("GET", page_path("travel", 1), day=DAY).body
    with fault_server(spec) as server:
        connection = http.client.HTTPConnection(*server.server_address[:2], timeout=5)
        try:
            connection.request("HEAD", page_path("travel", 1))
            connection.getresponse().read()
            connection.request("GET", page_path("travel", 1))  # the rule's first_n is spent: a plain answer
            answer = connection.getresponse()
            assert (answer.status, answer.read()) == (200, plain)
        finally:
            connection.close()


def test_a_retry_after_beyond_an_http_dates_range_is_a_spec_error():
    """retry_after_s: 1e12 as an HTTP-date overflowed the handler (year 33715), a dropped
    connection instead of the fault: bounded at 10,000,000 s (~116 days)."""
    with pytest.raises(SpecError, match="less than or equal to 10000000"):
        parse_fault_spec("rules: [{match: travel, fault: http_429, retry_after_s: 1.0e12, retry_after_form: http-date}]",
                         "faults.yaml")
