"""Tests for scrape_assets.retry: the pure retry decisions."""

from __future__ import annotations

import random
from datetime import datetime, timedelta, timezone
from email.utils import format_datetime

import httpx
import pytest

from scrape_assets.retry import (
    RETRY_HTTP_CODES,
    backoff_delay_s,
    classify_exception,
    classify_status,
    parse_retry_after,
)

NOW = datetime(2025, 3, 1, 12, 0, 0, tzinfo=timezone.utc)


@pytest.mark.parametrize(
    ("status", "expected"),
    [
        (200, "ok"),
        (204, "ok"),
        (304, "ok"),
        (404, "permanent"),
        (403, "permanent"),
        (400, "permanent"),
        (410, "permanent"),
        (407, "retry"),  # our proxy's refusal, not the site's
        (408, "retry"),
        (429, "retry"),
        (500, "retry"),
        (503, "retry"),
        (522, "retry"),
        (599, "retry"),
        (301, "permanent"),
        (302, "permanent"),
        (100, "permanent"),
    ],
)
def test_classify_status_table(status, expected):
    assert classify_status(status) == expected


def test_every_retry_code_is_classified_retry():
    assert RETRY_HTTP_CODES == frozenset({408, 429, 500, 502, 503, 504, 522, 524})
    assert {classify_status(code) for code in RETRY_HTTP_CODES} == {"retry"}


@pytest.mark.parametrize(
    ("exc", "headers_received", "expected"),
    [
        (httpx.ReadTimeout("slow"), True, ("retry", "timeout")),
        (httpx.ConnectTimeout("slow"), False, ("retry", "timeout")),
        (TimeoutError(), True, ("retry", "timeout")),
        (httpx.ConnectError("refused"), False, ("retry", "connection_error")),
        (httpx.ReadError("reset"), False, ("retry", "connection_error")),
        (httpx.ProxyError("403, message='Forbidden'"), False, ("retry", "proxy_error")),
        (httpx.ReadError("reset"), True, ("retry", "incomplete_body")),
        (httpx.RemoteProtocolError("peer closed"), True, ("retry", "incomplete_body")),
        (httpx.DecodingError("bad gzip"), True, ("retry", "decoding_error")),
        (httpx.UnsupportedProtocol("ftp"), False, ("permanent", "unsupported_url")),
        (httpx.LocalProtocolError("bad header"), False, ("permanent", "local_protocol_error")),
    ],
)
def test_classify_exception_table(exc, headers_received, expected):
    assert classify_exception(exc, headers_received=headers_received) == expected


def test_classify_exception_rejects_non_network_errors():
    with pytest.raises(TypeError, match="KeyError"):
        classify_exception(KeyError("x"), headers_received=False)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("120", 120.0),
        ("  0 ", 0.0),
        ("-5", 0.0),
        ("1.5", 1.5),
        (None, None),
        ("", None),
        ("soon", None),
        ("Wed, 99 Foo 2025 99:99:99 GMT", None),
        ("9" * 400, float("inf")),  # past a float's range: the longest wait, capped by the back-off
        ("-" + "9" * 400, 0.0),
        # Sent twice, joined into one line by the client (RFC 9110 §5.3): the longest wait.
        ("120, 120", 120.0),
        ("30,120", 120.0),
        ("Sat, 01 Mar 2025 12:00:30 GMT, Sat, 01 Mar 2025 12:01:00 GMT", 60.0),
        ("120, soon", None),
        ("Sat, 01 Mar 2025 12:00:30 GMT, 120", None),
    ],
)
def test_parse_retry_after_values(value, expected):
    assert parse_retry_after(value, NOW) == expected


def test_parse_retry_after_http_date_in_the_future():
    value = format_datetime(NOW + timedelta(seconds=30), usegmt=True)  # "Sat, 01 Mar 2025 12:00:30 GMT"
    assert value == "Sat, 01 Mar 2025 12:00:30 GMT"
    assert parse_retry_after(value, NOW) == pytest.approx(30.0)


def test_parse_retry_after_http_date_in_the_past_is_zero():
    assert parse_retry_after("Sat, 01 Mar 2025 11:00:00 GMT", NOW) == 0.0


def test_parse_retry_after_naive_now_is_utc():
    naive_now = NOW.replace(tzinfo=None)
    assert parse_retry_after("Sat, 01 Mar 2025 12:01:00 GMT", naive_now) == pytest.approx(60.0)


def test_a_retry_after_too_large_for_a_float_waits_the_cap_not_the_jitter():
    assert _delay(1, random.Random(1), retry_after_s=parse_retry_after("9" * 400, NOW)) == 120.0


def _delay(attempt, rng, retry_after_s=None, **overrides):
    kwargs = dict(base_s=0.5, max_s=30.0, retry_after_s=retry_after_s, retry_after_max_s=120.0, rng=rng)
    kwargs.update(overrides)
    return backoff_delay_s(attempt, **kwargs)


@pytest.mark.parametrize(("attempt", "ceiling"), [(1, 0.5), (2, 1.0), (3, 2.0), (4, 4.0), (7, 30.0), (100, 30.0), (5000, 30.0)])
def test_backoff_stays_within_the_exponential_ceiling(attempt, ceiling):
    rng = random.Random(1234)
    delays = [_delay(attempt, rng) for _ in range(200)]
    assert min(delays) >= 0.0
    assert max(delays) <= ceiling
    # Full jitter spreads over the whole range, not only near the ceiling.
    assert min(delays) < ceiling * 0.1
    assert max(delays) > ceiling * 0.9


def test_backoff_is_reproducible_with_a_seeded_rng():
    first = [_delay(a, random.Random(7)) for a in (1, 2, 3)]
    second = [_delay(a, random.Random(7)) for a in (1, 2, 3)]
    assert first == second


def test_backoff_never_shorter_than_retry_after():
    rng = random.Random(99)
    delays = [_delay(2, rng, retry_after_s=7.0) for _ in range(100)]
    assert min(delays) == 7.0  # jitter ceiling at attempt 2 is 1.0 s, so Retry-After wins
    delays = [_delay(8, rng, retry_after_s=7.0) for _ in range(200)]
    assert min(delays) >= 7.0
    assert max(delays) <= 30.0
    assert max(delays) > 7.0  # the jittered backoff wins when it is longer


def test_backoff_caps_retry_after():
    assert _delay(1, random.Random(0), retry_after_s=86_400.0) == 120.0
    assert _delay(1, random.Random(0), retry_after_s=86_400.0, retry_after_max_s=10.0) == 10.0


@pytest.mark.parametrize("attempt", [0, -1])
def test_backoff_rejects_attempt_below_one(attempt):
    with pytest.raises(ValueError, match="attempt must be >= 1"):
        _delay(attempt, random.Random(0))


def test_a_zoneless_retry_after_date_is_utc_on_a_machine_in_another_zone(monkeypatch):
    """asctime dates carry no zone; HTTP dates are UTC (RFC 9110 §5.6.7), whatever TZ says."""
    import datetime
    import time

    from scrape_assets.retry import parse_retry_after

    monkeypatch.setenv("TZ", "Asia/Tokyo")
    time.tzset()
    try:
        now = datetime.datetime(1994, 11, 6, 8, 49, 0, tzinfo=datetime.timezone.utc)
        assert parse_retry_after("Sun Nov  6 08:49:37 1994", now) == 37.0
    finally:
        monkeypatch.undo()
        time.tzset()


# Boundaries a further mutation audit found unpinned (each test fails on its mutation).
@pytest.mark.parametrize(("status", "expected"), [(299, "ok"), (300, "permanent"), (199, "permanent"), (600, "permanent")])
def test_classify_status_at_the_edges_of_its_ranges(status, expected):
    assert classify_status(status) == expected


@pytest.mark.parametrize("bound", ["base_s", "max_s", "retry_after_max_s"])
def test_backoff_rejects_a_negative_bound(bound):
    with pytest.raises(ValueError, match=rf"(^|, | ){bound}=-1.0"):
        _delay(1, random.Random(0), **{bound: -1.0})
