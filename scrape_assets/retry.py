"""Retry decisions: pure functions, no I/O, no clock, no global randomness.

The fetcher (:mod:`scrape_assets.fetcher`) asks three questions here, in the spirit of
Scrapy's ``RETRY_HTTP_CODES`` / ``get_retry_request``:

1. Is this HTTP status a success, worth retrying, or final? (:func:`classify_status`)
2. Is this exception from the HTTP client worth retrying, and under which reason?
   (:func:`classify_exception`)
3. How long do we wait before the next attempt? (:func:`parse_retry_after`,
   :func:`backoff_delay_s`)

Status table (``classify_status``)::

    2xx, 304                              "ok"         (304: conditional GET hit)
    408, 429, 500, 502, 503, 504,         "retry"      (RETRY_HTTP_CODES)
    522, 524, and every other 5xx
    407                                   "retry"      (Proxy Authentication Required comes from
                                                        our proxy, not the site: RFC 9110 §15.5.8)
    other 4xx (400, 401, 403, 404, 410..) "permanent"  (the request itself is wrong)
    1xx, other 3xx, anything else         "permanent"  (a 3xx that reaches the retry layer
                                                        means the redirect could not be followed)
"""

from __future__ import annotations

import asyncio
import random
import re
from datetime import datetime, timezone
from email.utils import parsedate_to_datetime
from typing import Literal

import httpx

#: HTTP statuses worth retrying. Any other 5xx is retried as well (see :func:`classify_status`);
#: 522/524 are Cloudflare's "connection timed out" / "a timeout occurred" to the origin.
RETRY_HTTP_CODES: frozenset[int] = frozenset({408, 429, 500, 502, 503, 504, 522, 524})

StatusClass = Literal["ok", "retry", "permanent"]

_DELAY_SECONDS = re.compile(r"^[+-]?\d+(\.\d+)?$")
#: An IMF-fixdate (RFC 9110 §5.6.7), to split a field line a repeated header was joined into.
_IMF_FIXDATE = re.compile(r"[A-Za-z]{3}, \d{2} [A-Za-z]{3} \d{4} \d{2}:\d{2}:\d{2} GMT")


def classify_status(status: int) -> StatusClass:
    """Classify an HTTP status for the retry loop (see the module docstring's table).

    Args:
        status: the HTTP status code of the final response (redirects already followed).

    Returns:
        ``"ok"`` for 2xx and 304; ``"retry"`` for :data:`RETRY_HTTP_CODES`, any other 5xx and
        407 (our proxy's, not the site's refusal); ``"permanent"`` for everything else (other
        4xx, 1xx, unfollowed 3xx, out-of-range codes).
    """
    if 200 <= status <= 299 or status == 304:
        return "ok"
    if status in RETRY_HTTP_CODES or 500 <= status <= 599 or status == 407:
        return "retry"
    return "permanent"


def classify_exception(exc: BaseException, *, headers_received: bool) -> tuple[StatusClass, str]:
    """Classify an exception raised while one HTTP request was in flight.

    Table (first match wins)::

        httpx.TimeoutException, TimeoutError      ("retry", "timeout")      connect/read/write/pool
                                                                            timeout, or the fetcher's
                                                                            per-request deadline
        httpx.UnsupportedProtocol                 ("permanent", "unsupported_url")
        httpx.LocalProtocolError                  ("permanent", "local_protocol_error")  our request
                                                                            is malformed; resending
                                                                            will not help
        httpx.ProxyError                          ("retry", "proxy_error")  the proxy refused a
                                                                            CONNECT tunnel (its status
                                                                            is in the message)
        httpx.TransportError after headers        ("retry", "incomplete_body")  reset mid-body, or
                                                                            fewer bytes than
                                                                            Content-Length
                                                                            (httpx.RemoteProtocolError)
        httpx.TransportError before headers       ("retry", "connection_error")  refused, reset,
                                                                            DNS failure, proxy down
        httpx.DecodingError                       ("retry", "decoding_error")  e.g. a gzip stream
                                                                            cut short

    Args:
        exc: the exception raised by httpx (or ``TimeoutError`` from the fetcher's deadline).
        headers_received: whether the response status line and headers had arrived.

    Returns:
        ``(decision, reason)``; ``decision`` is ``"retry"`` or ``"permanent"``.

    Raises:
        TypeError: ``exc`` is not one of the types above; the caller should let it propagate
            (a bug, not a network condition).
    """
    if isinstance(exc, (httpx.TimeoutException, TimeoutError, asyncio.TimeoutError)):
        return "retry", "timeout"
    if isinstance(exc, httpx.UnsupportedProtocol):
        return "permanent", "unsupported_url"
    if isinstance(exc, httpx.LocalProtocolError):
        return "permanent", "local_protocol_error"
    if isinstance(exc, httpx.ProxyError):
        return "retry", "proxy_error"
    if isinstance(exc, httpx.TransportError):
        return "retry", "incomplete_body" if headers_received else "connection_error"
    if isinstance(exc, httpx.DecodingError):
        return "retry", "decoding_error"
    raise TypeError(f"not a network exception: {type(exc).__name__}: {exc}")


def parse_retry_after(value: str | None, now: datetime) -> float | None:
    """Parse a ``Retry-After`` header value into seconds to wait.

    RFC 9110 §10.2.3: ``Retry-After = HTTP-date / delay-seconds``. Leniencies: a sign or a
    fractional part on delay-seconds is accepted, and the obsolete RFC 850 / asctime date forms
    are accepted (``email.utils.parsedate_to_datetime``); a date without a zone is read as UTC.
    A header sent more than once arrives joined with commas (``"120, 120"``, RFC 9110 §5.3):
    the longest of its values, when each is a delay or an IMF-fixdate.

    Args:
        value: the raw header value, or ``None`` when the header is absent.
        now: the current time; a naive datetime is taken as UTC.

    Returns:
        Seconds to wait (``>= 0``): negative delays and dates in the past give ``0.0``; a
        delay too large for a float gives ``math.inf`` (callers cap it, see
        :func:`backoff_delay_s`). ``None`` when the header is absent, empty, or neither form
        parses.
    """
    if value is None:
        return None
    text = value.strip()
    if not text:
        return None
    if _DELAY_SECONDS.match(text):
        return max(0.0, float(text))  # digits past a float's range: inf ("longer than anything"), capped by callers
    dates = _IMF_FIXDATE.findall(text)
    if (dates and text != dates[0]) or (not dates and "," in text and _DELAY_SECONDS.match(text.split(",")[0].strip())):
        return _repeated_retry_after(text, dates, now)  # more than one value (parsedate would read the first)
    try:
        when = parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    if now.tzinfo is None:
        now = now.replace(tzinfo=timezone.utc)
    return max(0.0, (when - now).total_seconds())


def _repeated_retry_after(text: str, dates: list[str], now: datetime) -> float | None:
    """A ``Retry-After`` sent more than once, joined by the client into one line with commas
    (``"120, 120"``; RFC 9110 §5.3): the longest wait of its values, None unless each is
    one. A date holds a comma itself, so ``dates`` (the IMF-fixdates in ``text``) are taken
    whole; a line mixing dates and delays, or anything else, is None."""
    values = dates if dates else [part.strip() for part in text.split(",")]
    if (dates and ", ".join(dates) != text) or not all(v in dates or _DELAY_SECONDS.match(v) for v in values):
        return None
    return max(parse_retry_after(value, now) for value in values)


def backoff_delay_s(
    attempt: int,
    *,
    base_s: float,
    max_s: float,
    retry_after_s: float | None,
    retry_after_max_s: float,
    rng: random.Random,
) -> float:
    """Seconds to sleep after failed attempt number ``attempt``, before the next one.

    Exponential backoff with full jitter (AWS Architecture Blog, "Exponential Backoff And
    Jitter"): uniform in ``[0, min(max_s, base_s * 2 ** (attempt - 1))]``, so attempt 1 waits
    up to ``base_s``, attempt 2 up to ``2 * base_s``, and so on. When the server sent
    ``Retry-After`` (RFC 9110 §10.2.3), the delay is never shorter than it, capped at
    ``retry_after_max_s`` so a hostile or buggy server cannot park the run for a day.

    Args:
        attempt: the 1-based number of the attempt that just failed (counting attempts of an
            interrupted earlier run, so the backoff keeps growing across a resume).
        base_s: ceiling of the first delay, seconds (``>= 0``).
        max_s: ceiling of any jittered delay, seconds (``>= 0``).
        retry_after_s: the parsed ``Retry-After`` in seconds (:func:`parse_retry_after`), or
            ``None``.
        retry_after_max_s: the most a ``Retry-After`` may make us wait, seconds (``>= 0``).
        rng: the random source for the jitter (seeded in tests).

    Returns:
        The delay in seconds, in ``[0, max(max_s, retry_after_max_s)]``.

    Raises:
        ValueError: ``attempt < 1`` or a negative bound.
    """
    if attempt < 1:
        raise ValueError(f"attempt must be >= 1, got {attempt}")
    if base_s < 0 or max_s < 0 or retry_after_max_s < 0:
        raise ValueError(
            f"delays must be >= 0, got base_s={base_s}, max_s={max_s}, retry_after_max_s={retry_after_max_s}"
        )
    # 2 ** 1024 overflows a float; any exponent past 62 is far beyond every sensible max_s.
    ceiling = min(max_s, base_s * 2.0 ** min(attempt - 1, 62))
    delay = rng.uniform(0.0, ceiling)
    if retry_after_s is not None:
        delay = max(delay, min(max(retry_after_s, 0.0), retry_after_max_s))
    return delay
