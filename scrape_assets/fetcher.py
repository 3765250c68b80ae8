"""Fetch one URL politely, with retries: robots.txt, per-host limits, backoff, size caps.

:class:`PageFetcher` is the only code that talks HTTP for pages. One instance per run is
shared by every page of that run, so its :class:`~scrape_assets.politeness.HostLimiter` and
:class:`~scrape_assets.politeness.RobotsCache` see all of the run's requests. What is retried
and how long to wait is decided by the pure functions of :mod:`scrape_assets.retry`.

Outcomes of :meth:`PageFetcher.fetch`::

    200, 203, 304                         FetchedPage
    other 2xx (202, 204, 206...), a 200   retried with backoff, then TransientFetchError
    with an empty body                    "http_<status>" / "empty_body" (no page in it)
    a compression not asked for (zstd...) PermanentFetchError "unsupported_content_encoding"
    a transfer coding but chunked         PermanentFetchError "unsupported_transfer_encoding"
    robots.txt forbids / is unreachable   PermanentFetchError "robots_disallowed" / "robots_unreachable"
    (after max_attempts requests for it)
    other 4xx                             PermanentFetchError "http_<status>", no retry
    redirect to another scheme/host/port  PermanentFetchError "offsite_redirect"
    redirect back to a visited URL        PermanentFetchError "redirect_loop"
    more than max_redirects redirects     PermanentFetchError "too_many_redirects"
    body larger than max_body_bytes       PermanentFetchError "body_too_large"
    5xx, 408, 429, timeout, connection    retried with backoff; once max_attempts are used:
    error, short/reset body, a compressed TransientFetchError "http_<status>", "timeout",
    stream cut short or corrupt           "connection_error", "incomplete_body", "decoding_error"

A 429 or 503 with ``Retry-After`` also pauses the whole host (every new request of the run
to it, robots.txt included) for that long, capped at ``retry_after_max_s``: a 429 (RFC
6585 §4) says the server limits our rate, a 503 (RFC 9110 §15.6.4) that it is overloaded or
down, not one URL; the pages not yet sent would only collect more of the same answers.

Deadline: httpx's read timeout applies to each socket read, so a server trickling one byte
per second never trips it. Every request (one redirect hop) therefore also runs under a total
deadline of :attr:`FetchPolicy.request_deadline_s` (``3 * timeout_s``), counted from when its
politeness slot was granted; exceeding it is a ``"timeout"``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import http.cookiejar
import logging
import random
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from email.utils import parsedate_to_datetime
from typing import Any

import httpx
import idna

from scrape_assets.content_coding import (
    ACCEPT_ENCODING,
    COMPRESSIONS,
    DECODED,
    BodyTooLarge,
    codings,
    decode_body,
    transfer_coded,
)
from scrape_assets.counts import counted
from scrape_assets.errors import FetchError, PermanentFetchError, TransientFetchError, exception_text
from scrape_assets.hostnames import DEFAULT_PORTS, url_host_problem
from scrape_assets.http_transport import AiohttpTransport
from scrape_assets.politeness import HOST_WIDE_STATUSES, HostLimiter, RobotsCache, within_deadline
from scrape_assets.retry import backoff_delay_s, classify_exception, classify_status, parse_retry_after
from scrape_assets.spec import USER_AGENT_EXPECTED, Politeness, user_agent_problem

logger = logging.getLogger(__name__)

#: Statuses whose ``Location`` the fetcher follows (RFC 9110 §15.4); only GET is ever sent.
REDIRECT_STATUSES = frozenset({301, 302, 303, 307, 308})



@dataclass(frozen=True)
class FetchPolicy:
    """How pages are fetched; frozen into the manifest so a resumed run fetches the same way.

    Attributes:
        user_agent: the ``User-Agent`` header; its products name us to robots.txt groups
            (:func:`~scrape_assets.politeness.robots_agent_names`).
        requests_per_second: most requests started per second per host (``> 0``).
        max_concurrency: most requests in flight per host (``>= 1``).
        max_attempts: HTTP attempts per page, counting those of an interrupted earlier run.
        timeout_s: httpx connect, read, write and pool timeout, seconds; see also
            :attr:`request_deadline_s`.
        backoff_base_s: ceiling of the first retry delay, seconds; doubles per attempt.
        backoff_max_s: ceiling of any jittered retry delay, seconds.
        retry_after_max_s: the longest ``Retry-After`` honoured, seconds (longer ones are capped).
        max_body_bytes: largest accepted body, bytes, both as sent (compressed) and after
            content decoding (each decoding step's output).
        max_redirects: most same-origin redirects followed in one attempt.
        obey_robots_txt: check robots.txt (RFC 9309) before fetching.

    Raises:
        ValueError: a field is out of range (the message names it).
    """

    user_agent: str
    requests_per_second: float
    max_concurrency: int
    max_attempts: int = 3
    timeout_s: float = 20.0
    backoff_base_s: float = 0.5
    backoff_max_s: float = 30.0
    retry_after_max_s: float = 120.0
    max_body_bytes: int = 10_000_000
    max_redirects: int = 5
    obey_robots_txt: bool = True

    def __post_init__(self) -> None:
        problems = []
        agent_problem = user_agent_problem(self.user_agent)
        if agent_problem:
            problems.append(f"user_agent must be {USER_AGENT_EXPECTED}; {self.user_agent!r}: {agent_problem}")
        if not self.requests_per_second > 0:
            problems.append(f"requests_per_second must be > 0, got {self.requests_per_second}")
        for name in ("max_concurrency", "max_attempts", "max_body_bytes"):
            if getattr(self, name) < 1:
                problems.append(f"{name} must be >= 1, got {getattr(self, name)}")
        if not self.timeout_s > 0:
            problems.append(f"timeout_s must be > 0, got {self.timeout_s}")
        for name in ("backoff_base_s", "backoff_max_s", "retry_after_max_s", "max_redirects"):
            if getattr(self, name) < 0:
                problems.append(f"{name} must be >= 0, got {getattr(self, name)}")
        if problems:
            raise ValueError("invalid FetchPolicy: " + "; ".join(problems))

    @classmethod
    def from_politeness(cls, politeness: Politeness, *, user_agent: str, **overrides: Any) -> FetchPolicy:
        """Build a policy from a site spec's :class:`~scrape_assets.spec.Politeness` block.

        Args:
            politeness: the spec's per-host limits and robots.txt switch.
            user_agent: the ``User-Agent`` to send.
            **overrides: any other :class:`FetchPolicy` field (``max_attempts=5``...).
        """
        return cls(
            user_agent=user_agent,
            requests_per_second=politeness.requests_per_second,
            max_concurrency=politeness.max_concurrency,
            obey_robots_txt=politeness.obey_robots_txt,
            **overrides,
        )

    @property
    def request_deadline_s(self) -> float:
        """Total seconds one request (one redirect hop, body included) may take: ``3 * timeout_s``."""
        return self.timeout_s * 3

    def as_dict(self) -> dict[str, Any]:
        """The fields as a JSON-serialisable dict (the manifest's frozen fetch config)."""
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class FetchedPage:
    """One successfully fetched page (200 or 203, or 304 for a conditional GET).

    Attributes:
        url: the requested URL.
        final_url: the URL that answered, after same-origin redirects.
        http_status: the final status (200, 203, or 304).
        headers: response headers, lower-case names; repeated headers joined with ``", "``.
        body: the body after content decoding (gzip...), at most ``max_body_bytes``; empty for 304.
        elapsed_ms: time spent in the successful attempt's requests, milliseconds, excluding
            waits for a politeness slot.
        attempts: attempts made in this call (``1`` when the first one succeeded); prior
            attempts of an interrupted run are not included.
        redirected: whether a redirect was followed (``final_url`` is then another URL;
            without one it is ``url`` as httpx normalises it: lower-case host, no default port).
    """

    url: str
    final_url: str
    http_status: int
    headers: dict[str, str]
    body: bytes
    elapsed_ms: float
    attempts: int
    redirected: bool = False


def build_client(
    policy: FetchPolicy, *, mounts: dict[str, httpx.AsyncBaseTransport] | None = None, proxy_url: str | None = None
) -> httpx.AsyncClient:
    """Create the run's HTTP client, configured for :class:`PageFetcher`.

    Timeouts are ``policy.timeout_s`` each; redirects are not followed automatically (the
    fetcher follows same-origin ones itself; robots.txt requests opt in and may follow up to
    ``max_redirects``). Requests go out through :class:`~scrape_assets.http_transport.AiohttpTransport`
    (about 5x less CPU per request than httpx's own pool, measured in BENCHMARKS.md), whose pool
    holds ``max_concurrency`` connections and two spare ones (robots.txt redirects to another
    host); :class:`PageFetcher` sends pages to it directly, past the client (see its
    ``_download``), with the client's headers. No cookies are kept: a ``Set-Cookie`` is
    ignored, so each page is fetched as a first visit, the same in a resumed snapshot as in
    an uninterrupted one. Use one client per site, run and event loop, and close it (``async with``).

    Args:
        policy: the fetch policy.
        mounts: transports by URL pattern, e.g. ``{"http://demo.scrape-assets.invalid":
            DemoTransport()}`` to serve the demo site in-process.
        proxy_url: an ``http://[user:pass@]host:port`` forward proxy for every request that
            goes out on the network (robots.txt included; mounted transports are not
            affected). Not part of the fetch config: a snapshot may resume through another proxy.

    Returns:
        A new, unopened :class:`httpx.AsyncClient`.

    Raises:
        ValueError: ``proxy_url`` is not an ``http://[user:pass@]host:port`` URL (the message
            names the rule broken, not the value).
    """
    client = httpx.AsyncClient(
        headers={"User-Agent": policy.user_agent},
        cookies=http.cookiejar.CookieJar(policy=http.cookiejar.DefaultCookiePolicy(allowed_domains=[])),
        timeout=httpx.Timeout(policy.timeout_s),
        follow_redirects=False,
        max_redirects=policy.max_redirects,
        transport=AiohttpTransport(max_connections=policy.max_concurrency + 2, proxy=proxy_url),
        mounts=mounts,
    )
    # the codings decode_body reads, not httpx's choice (zstd when zstandard is installed); set
    # in place, so the headers keep httpx's order
    client.headers["Accept-Encoding"] = ACCEPT_ENCODING
    return client


#: Statuses whose body is the page asked for (203: a proxy's transformed copy of a 200).
_PAGE_STATUSES = frozenset({200, 203, 304})


def sendable_validator(value: str | None) -> str | None:
    """``value`` (an ``ETag`` or ``Last-Modified`` a server sent) when it can be sent back in
    ``If-None-Match`` / ``If-Modified-Since``, else None.

    RFC 9110 §8.8.3 lets an entity tag carry obs-text (bytes 0x80-0xFF); the HTTP client
    sends header values as ASCII only, so such a validator would fail every later request of
    its page. Dropping it costs a full GET (the content hash still decides whether the page
    changed). Also None for an empty value or one with control characters.
    """
    if value and value.isascii() and value.isprintable():
        return value
    return None


#: Request headers that make a GET conditional on a saved copy (RFC 9110 §13.1), lower case.
_CONDITIONAL_HEADERS = frozenset({"if-none-match", "if-modified-since", "if-match", "if-unmodified-since", "if-range"})


def _without_fragment(url: str) -> str | None:
    """``url`` as the fetcher writes a request's URL (httpx's normal form, no fragment); None
    when it is no URL (then it matches no request)."""
    try:
        return str(httpx.URL(url).copy_with(fragment=None))
    except httpx.InvalidURL:
        return None


def _opaque_tag(etag: str) -> str:
    """An entity tag without its weakness indicator, for the weak comparison (RFC 9110 §8.8.3.2)."""
    etag = etag.strip()
    return etag[2:] if etag[:2] in ("W/", "w/") else etag


def validators_differ(headers: Mapping[str, str], saved) -> str | None:
    """Why a 304 does not identify the saved copy, or None when it does (or says nothing).

    RFC 9111 §4.3.4: a 304 that carries an entity tag identifies the stored response with
    that tag (compared weakly here, RFC 9110 §8.8.3.2: a server may weaken a tag on the
    way), so one carrying a tag when the saved copy kept none (the site sent none then)
    identifies no copy of ours: a site that began sending tags while its
    ``Last-Modified`` lags the content would otherwise have its new tag stored on the old
    body, and every later 304 reuse it. A tag that could not have been kept (one that
    cannot be sent back, :func:`sendable_validator`) is ignored. Without a tag, a
    ``Last-Modified`` must equal the saved copy's (as instants). A 304 carrying neither
    is taken for the copy it was asked about. A mismatch (a server
    that honours ``If-Modified-Since`` only, a page changed within the same second) means
    the page changed: it must be fetched whole, not reused.

    Args:
        headers: the 304's headers, lower-case names.
        saved: the saved copy's manifest entry (``etag``, ``last_modified``).
    """
    etag = headers.get("etag")
    if etag and saved.etag:
        if _opaque_tag(etag) != _opaque_tag(saved.etag):
            return f"its ETag {etag} is not the saved copy's ({saved.etag})"
        return None
    if sendable_validator(etag):  # a tag that cannot be kept (non-ASCII) was dropped from the copy too
        return f"its ETag {etag} names no saved copy (the saved copy has no ETag)"
    last_modified = headers.get("last-modified")
    if last_modified and saved.last_modified and last_modified != saved.last_modified:
        try:
            same = parsedate_to_datetime(last_modified) == parsedate_to_datetime(saved.last_modified)
        except (TypeError, ValueError, IndexError, OverflowError):  # a year past 9999, say
            same = False
        if not same:
            return f"its Last-Modified {last_modified} is not the saved copy's ({saved.last_modified})"
    return None


def _origin(url: httpx.URL) -> tuple[str, str, int | None]:
    return url.scheme, url.host, url.port or DEFAULT_PORTS.get(url.scheme)


@functools.lru_cache(maxsize=65536)
def resource_key(url: str) -> str:
    """The URL as the fetcher requests it, to tell two links to one resource apart from two
    resources: the fragment dropped (never sent, RFC 9110 section 4.2.4), scheme and host in
    lower case, an explicit default port removed (``http://Shop.example:80/a#top`` ->
    ``http://shop.example/a``). A string that is no URL (a port that is no number) is its own key."""
    try:
        return str(httpx.URL(url).copy_with(fragment=None))
    except httpx.InvalidURL:
        return url


def same_origin(url: str, other: str) -> bool:
    """Whether two absolute URLs share scheme, host and port (RFC 6454 §4), compared as the
    fetcher compares a redirect's target: host case and an explicit default port do not
    matter (``http://Shop.example:80/a`` and ``http://shop.example/b`` are one origin).
    False when either is no URL (a port that is no number, a host that is no IDNA name)."""
    try:
        return _origin(httpx.URL(url)) == _origin(httpx.URL(other))
    except (httpx.InvalidURL, UnicodeError):  # UnicodeError: a host that is no IDNA name
        return False


@dataclass
class _Progress:
    """What one request got before it failed (filled in from inside the deadline)."""

    status: int | None = None
    headers_received: bool = False


class PageFetcher:
    """Fetches pages politely with retries; one instance per run (see the module docstring).

    Its limiter and robots.txt cache hold asyncio primitives: use an instance within one event
    loop (one ``asyncio.run``), sharing it between all the run's concurrent ``fetch`` calls.

    Args:
        client: the run's client, from :func:`build_client` (must not follow redirects).
        policy: the fetch policy.
        sleep: awaited with the back-off delay in seconds between a page's attempts (fake it in tests).
        robots_sleep: the same between robots.txt's attempts, and how a new limiter waits out a
            host's pause (default: ``sleep``). It must not give up anything pages wait for: a
            robots.txt fetch holds its origin's lock, a paused request its host's connection
            permit, so ``raw_pages`` passes :func:`asyncio.sleep` here and its page slots'
            sleep as ``sleep`` (see :mod:`scrape_assets.page_slots`).
        rng: jitter source; a fresh unseeded ``random.Random`` when ``None``.
        clock: monotonic clock in seconds, for ``elapsed_ms`` and a new limiter's pauses.
        limiter: per-host limits; a new ``HostLimiter`` from the policy when ``None``.
        warn: where the warning of a host's pause goes (``raw_pages``: the run's log);
            default this module's logger.
        robots: robots.txt cache; when ``None`` a new ``RobotsCache`` sharing ``limiter``,
            ``robots_sleep``, ``rng`` and the policy's deadline, ``max_attempts`` and backoff.
    """

    def __init__(
        self,
        client: httpx.AsyncClient,
        policy: FetchPolicy,
        *,
        sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep,
        rng: random.Random | None = None,
        clock: Callable[[], float] = time.monotonic,
        limiter: HostLimiter | None = None,
        robots: RobotsCache | None = None,
        robots_sleep: Callable[[float], Awaitable[Any]] | None = None,
        warn: Callable[[str], Any] | None = None,
    ):
        self.client = client
        self.policy = policy
        self._sleep = sleep
        self._rng = rng if rng is not None else random.Random()
        self._clock = clock
        self._warn = warn or logger.warning
        self.limiter = limiter or HostLimiter(policy.requests_per_second, policy.max_concurrency,
                                              sleep=robots_sleep or sleep, clock=clock)
        self.robots = robots or RobotsCache(
            limiter=self.limiter, deadline_s=policy.request_deadline_s, max_attempts=policy.max_attempts,
            backoff_base_s=policy.backoff_base_s, backoff_max_s=policy.backoff_max_s,
            retry_after_max_s=policy.retry_after_max_s, sleep=robots_sleep or sleep, rng=self._rng, note=self._warn,
        )

    async def fetch(
        self,
        url: str,
        *,
        prior_attempts: int = 0,
        on_attempt: Callable[[int], Awaitable[None]] | None = None,
        headers: Mapping[str, str] | None = None,
        on_attempt_cancelled: Callable[[int], None] | None = None,
        validators_url: str | None = None,
        on_retry: Callable[[TransientFetchError, float], Awaitable[None]] | None = None,
        wait_s: float = 0.0,
    ) -> FetchedPage:
        """Fetch ``url`` with GET, following same-origin redirects, retrying transient failures.

        Args:
            url: absolute http(s) URL.
            prior_attempts: attempts already made on this page by an interrupted earlier run;
                at most ``max_attempts - prior_attempts`` attempts are made now.
            on_attempt: awaited when each attempt is about to be sent, inside its politeness
                slot, with the attempt's total number (``prior_attempts + 1``, ...), e.g. to
                persist the count in the manifest; an attempt still waiting for a slot is not
                counted. Its exceptions propagate.
            headers: extra request headers, e.g. ``If-None-Match`` for a conditional GET.
            validators_url: the URL whose saved copy the conditional headers (``If-None-Match``,
                ``If-Modified-Since``) describe: they are sent only on the request (hop) to
                that URL, so a page saved from its redirect target is asked there, and a redirect
                elsewhere is followed without them (RFC 9110 §15.4). None: ``url`` itself.
            on_attempt_cancelled: called (not awaited; it should not raise) with the attempt's
                number when the task is cancelled while that attempt is in flight: after
                ``on_attempt`` returned for it and before its outcome (the site answered
                nothing, or nothing we kept; a later redirect hop waiting for its slot
                included), e.g. to uncount it. Not called for a cancel while the first hop waits
                for a slot (nothing counted yet) or during the backoff after a failed attempt
                (that one counts).
            on_retry: awaited after a failed attempt that will be retried, before the
                back-off, with the error and the back-off in seconds (``Retry-After``
                honoured, RFC 9110 §10.2.3), e.g. to persist when the page may be asked
                again, so that a run resuming after a crash waits too. Its exceptions propagate.
            wait_s: seconds to wait before the first attempt (what remains of an earlier
                run's back-off for this page), with the back-off's sleep; at most
                ``max(policy.retry_after_max_s, policy.backoff_max_s)``.

        Returns:
            The :class:`FetchedPage` (status 200, 203, or 304 from the URL that was sent the
            conditional ``headers``).

        Raises:
            PermanentFetchError: not worth retrying (see the module docstring's table); also
                ``"invalid_url"`` for a non-http(s) URL or one with credentials (``user:pw@``;
                a redirect to one is ``"invalid_redirect"``); ``"unexpected_304"`` for a 304 from
                a request (hop) that carried no validator.
            TransientFetchError: the attempts are used up (``attempts`` is the total, prior ones
                included); ``"attempts_exhausted"`` when ``prior_attempts >= max_attempts``.
                ``reason``/``http_status``/``retry_after_s`` describe the last failure.
        """
        if prior_attempts < 0:
            raise ValueError(f"prior_attempts must be >= 0, got {prior_attempts}")
        try:
            return await self._fetch(url, prior_attempts, on_attempt, dict(headers or {}), on_attempt_cancelled,
                                     validators_url, on_retry, wait_s)
        except FetchError as exc:
            # INFO: the error is raised to the caller, who reports it (the crawler: one line per
            # page failed for good, and the dead letters); a WARNING here printed it twice.
            logger.info(
                "giving up on %s after %d attempt(s): %s%s",
                url,
                exc.attempts,
                exc.reason,
                f" ({exc.detail})" if exc.detail else "",
            )
            raise

    async def _fetch(
        self,
        url: str,
        prior_attempts: int,
        on_attempt: Callable[[int], Awaitable[None]] | None,
        extra_headers: dict[str, str],
        on_attempt_cancelled: Callable[[int], None] | None = None,
        validators_url: str | None = None,
        on_retry: Callable[[TransientFetchError, float], Awaitable[None]] | None = None,
        wait_s: float = 0.0,
    ) -> FetchedPage:
        try:
            parsed = httpx.URL(url)
        except httpx.InvalidURL as exc:
            raise PermanentFetchError(url, "invalid_url", str(exc), attempts=prior_attempts) from exc
        if parsed.scheme not in DEFAULT_PORTS or not parsed.raw_host:
            raise PermanentFetchError(url, "invalid_url", "expected an absolute http(s) URL", attempts=prior_attempts)
        if problem := url_host_problem(parsed):
            raise PermanentFetchError(url, "invalid_url", f"its host is no name to look up: {problem}",
                                      attempts=prior_attempts)
        if parsed.userinfo:
            raise PermanentFetchError(url, "invalid_url", "credentials in a URL are not sent (user:password@host)",
                                      attempts=prior_attempts)
        await self._check_robots(url, url, prior_attempts, parsed)
        max_attempts = self.policy.max_attempts
        if prior_attempts >= max_attempts:
            raise TransientFetchError(
                url, "attempts_exhausted", f"{prior_attempts} of {max_attempts} attempts already made",
                attempts=prior_attempts,
            )
        if wait_s > 0:  # an earlier run's back-off (or Retry-After) for this page, not over yet
            wait_s = min(wait_s, max(self.policy.retry_after_max_s, self.policy.backoff_max_s))
            logger.info("%s: waiting %.2f s more before attempt %d, as the earlier run's back-off asked", url, wait_s,
                        prior_attempts + 1)
            await self._sleep(wait_s)
        attempt = prior_attempts
        while True:
            attempt += 1
            try:
                return await self._attempt(
                    url, parsed, attempt, attempt - prior_attempts, extra_headers, on_attempt, on_attempt_cancelled,
                    validators_url,
                )
            except TransientFetchError as exc:
                if attempt >= max_attempts:
                    raise
                delay = backoff_delay_s(
                    attempt,
                    base_s=self.policy.backoff_base_s,
                    max_s=self.policy.backoff_max_s,
                    retry_after_s=exc.retry_after_s,
                    retry_after_max_s=self.policy.retry_after_max_s,
                    rng=self._rng,
                )
                logger.info("attempt %d/%d on %s failed (%s); retrying in %.2f s", attempt, max_attempts, url, exc.reason, delay)
                if on_retry is not None:
                    await on_retry(exc, delay)
                await self._sleep(delay)

    async def _check_robots(self, page_url: str, url: str, attempts: int, parsed: httpx.URL | None = None) -> None:
        if not self.policy.obey_robots_txt:
            return
        decision = await self.robots.check(self.client, url, self.policy.user_agent, parsed=parsed)
        if not decision.allowed:
            reason = decision.reason or "robots_disallowed"
            raise PermanentFetchError(page_url, reason, decision.detail, attempts=attempts)

    async def _attempt(
        self, url: str, parsed: httpx.URL, attempt: int, attempts_in_call: int, extra_headers: dict[str, str],
        on_attempt: Callable[[int], Awaitable[None]] | None = None,
        on_attempt_cancelled: Callable[[int], None] | None = None,
        validators_url: str | None = None,
    ) -> FetchedPage:
        """One attempt (``parsed`` is ``url`` parsed): the request and its same-origin redirects.

        Raises FetchError subclasses.
        """
        counted = False

        async def count(n: int) -> None:
            nonlocal counted
            if on_attempt is not None:
                await on_attempt(n)
            counted = True

        try:
            return await self._attempt_hops(url, parsed, attempt, attempts_in_call, extra_headers, count,
                                            validators_url)
        except asyncio.CancelledError:
            if counted and on_attempt_cancelled is not None:
                on_attempt_cancelled(attempt)  # in flight when cancelled: its outcome is not the site's
            raise

    async def _attempt_hops(
        self, url: str, parsed: httpx.URL, attempt: int, attempts_in_call: int, extra_headers: dict[str, str],
        on_attempt: Callable[[int], Awaitable[None]] | None,
        validators_url: str | None = None,
    ) -> FetchedPage:
        # httpx gives fragment == "" for both "a" and "a#": look at the string for the "#".
        current = parsed.copy_with(fragment=None) if "#" in url else parsed
        origin = _origin(current)
        visited = {str(current)}
        redirects = 0
        elapsed_s = 0.0
        conditional = [name for name in extra_headers if name.lower() in _CONDITIONAL_HEADERS]
        # Usually the copy came from this very URL (its final_url is str(current)): no parse (~30 µs a page).
        validators_at = (str(current) if validators_url is None or validators_url == str(current)
                         else _without_fragment(validators_url))
        unconditional = {k: v for k, v in extra_headers.items() if k not in conditional} if conditional else extra_headers
        while True:
            hop_headers = extra_headers if str(current) == validators_at else unconditional
            status, headers, body, took_s = await self._request(url, current, attempt, hop_headers, on_attempt)
            on_attempt = None  # counted once per attempt, on its first hop
            elapsed_s += took_s
            location = headers.get("location")
            if status in REDIRECT_STATUSES and location:
                target = self._redirect_target(url, current, location, status, attempt)
                if _origin(target) != origin:
                    raise PermanentFetchError(
                        url, "offsite_redirect", f"{current} -> {target}", http_status=status, attempts=attempt
                    )
                if str(target) in visited:
                    raise PermanentFetchError(
                        url, "redirect_loop", f"{current} -> {target} was visited", http_status=status, attempts=attempt
                    )
                redirects += 1
                if redirects > self.policy.max_redirects:
                    raise PermanentFetchError(
                        url, "too_many_redirects", f"more than {self.policy.max_redirects}",
                        http_status=status, attempts=attempt,
                    )
                await self._check_robots(url, str(target), attempt, target)
                visited.add(str(target))
                current = target
                continue
            decision = classify_status(status)
            if decision == "ok":
                if status not in _PAGE_STATUSES:
                    # 202 (a bot check's "come back later"), 204, an unasked-for 206: no listing page
                    # in it, and taken as one it would parse to no products and empty the category.
                    raise TransientFetchError(url, f"http_{status}", f"a GET answered {status}, not 200 with the page",
                                              http_status=status, attempts=attempt)
                if status != 304 and not body:
                    raise TransientFetchError(url, "empty_body", f"HTTP {status} with an empty body",
                                              http_status=status, attempts=attempt)
                if status == 304 and not (conditional and hop_headers is extra_headers):
                    # This hop was sent no validator (a redirect target the saved copy did not come
                    # from, or no copy at all): its 304 names no copy of ours (RFC 9110 §15.4.5).
                    raise PermanentFetchError(url, "unexpected_304", "304 Not Modified without a conditional request",
                                              http_status=304, attempts=attempt)
                return FetchedPage(
                    url=url,
                    final_url=str(current),
                    http_status=status,
                    headers=headers,
                    body=body,
                    elapsed_ms=elapsed_s * 1000.0,
                    attempts=attempts_in_call,
                    redirected=redirects > 0,
                )
            # the page's URL is the dead letter's: say when the answer came from where it redirected
            hop_detail = f"answered by {current}, after {counted(redirects, 'redirect')}" if redirects else ""
            if decision == "retry":
                retry_after_s = parse_retry_after(headers.get("retry-after"), datetime.now(timezone.utc))
                if retry_after_s and status in HOST_WIDE_STATUSES:
                    self._pause_host(current, status, retry_after_s)
                raise TransientFetchError(
                    url, f"http_{status}", hop_detail, http_status=status, retry_after_s=retry_after_s, attempts=attempt
                )
            raise PermanentFetchError(url, f"http_{status}", hop_detail, http_status=status, attempts=attempt)

    def _pause_host(self, target: httpx.URL, status: int, retry_after_s: float) -> None:
        seconds = min(retry_after_s, self.policy.retry_after_max_s)
        if self.limiter.pause(target.host, seconds):
            self._warn(f"{target} answered {status} (Retry-After {round(retry_after_s, 1):g} s): no request to {target.host} for "
                       f"{seconds:.1f} s (if this keeps happening, lower the spec's politeness.requests_per_second)")

    def _unsupported_codings(self, content_encoding: str) -> list[str]:
        """The compressions in a ``Content-Encoding`` value that the client's ``Accept-Encoding``
        did not offer, or that :func:`~scrape_assets.content_coding.decode_body` does not
        decode. A value that names no compression (``identity``, or a server's nonsense such as
        ``UTF-8``) is ignored, as httpx and aiohttp ignore it: the body is then what was sent."""
        if not content_encoding:
            return []
        accepted = {c.split(";")[0].strip().lower() for c in self.client.headers.get("accept-encoding", "").split(",")}
        accepted |= {"x-gzip"} if "gzip" in accepted else set()  # x-gzip: RFC 9110 §8.4.1.3
        return [c for c in codings(content_encoding) if c in COMPRESSIONS and not (c in accepted and c in DECODED)]

    @staticmethod
    def _redirect_target(url: str, current: httpx.URL, location: str, status: int, attempt: int) -> httpx.URL:
        try:
            target = current.join(location).copy_with(fragment=None)
        except httpx.InvalidURL as exc:
            raise PermanentFetchError(
                url, "invalid_redirect", f"Location {location!r}: {exc}", http_status=status, attempts=attempt
            ) from exc
        if problem := url_host_problem(target):
            raise PermanentFetchError(url, "invalid_redirect", f"Location {location!r}: its host is no name to look up:"
                                      f" {problem}", http_status=status, attempts=attempt)
        if target.userinfo:
            raise PermanentFetchError(url, "invalid_redirect", "a Location with credentials (user:password@host)",
                                      http_status=status, attempts=attempt)
        return target

    async def _request(
        self, url: str, target: httpx.URL, attempt: int, extra_headers: dict[str, str],
        on_attempt: Callable[[int], Awaitable[None]] | None = None,
    ) -> tuple[int, dict[str, str], bytes, float]:
        """One GET within a politeness slot and the deadline: ``(status, headers, body, seconds)``."""
        progress = _Progress()
        deadline_s = self.policy.request_deadline_s
        async with self.limiter.slot(target.host):
            if on_attempt is not None:
                await on_attempt(attempt)  # the slot is ours: this attempt is about to be sent
            started = self._clock()
            try:
                status, headers, body = await within_deadline(deadline_s, self._download(url, target, attempt, extra_headers,
                                                                                  progress))
            except (httpx.RequestError, TimeoutError, asyncio.TimeoutError) as exc:
                decision, reason = classify_exception(exc, headers_received=progress.headers_received)
                if isinstance(exc, (TimeoutError, asyncio.TimeoutError)):
                    detail = f"no complete response from {target} within the {deadline_s:g} s deadline"
                else:
                    # the hop's URL only when it is not the page's own (a redirect's target): the
                    # dead letter's url column and the crawl's warning name the page already
                    hop = f"{target}: " if str(target) != url else ""
                    detail = f"{hop}{exception_text(exc, limit=10_000)}"
                error_type = TransientFetchError if decision == "retry" else PermanentFetchError
                raise error_type(url, reason, detail, http_status=progress.status, attempts=attempt) from exc
            return status, headers, body, self._clock() - started

    async def _download(
        self, url: str, target: httpx.URL, attempt: int, extra_headers: dict[str, str], progress: _Progress
    ) -> tuple[int, dict[str, str], bytes]:
        request_headers = {"User-Agent": self.policy.user_agent, **extra_headers}
        transport = self.client._transport_for_url(target)  # httpx's own routing (mounts); httpx is pinned
        if isinstance(transport, AiohttpTransport):
            if self.client.is_closed:  # as httpx refuses: a closed transport would open a new session
                raise RuntimeError("Cannot send a request, as the client has been closed.")
            # The network path: straight to aiohttp, without httpx's client, request and
            # response objects (half the CPU per request), with the same headers on the wire:
            # the client's defaults merged with ours, as httpx's build_request merges them.
            headers = self.client.headers.copy()
            headers.update(request_headers)
            direct = await transport.get(target, headers, self.client.timeout.as_dict())
            try:
                return await self._read(url, attempt, progress, direct.status, direct.headers, direct.aiter_raw())
            finally:
                direct.release()
        try:
            async with self.client.stream("GET", target, headers=request_headers, follow_redirects=False) as response:
                if response.is_stream_consumed:  # a transport that answered with its content whole (the
                    # in-process demo): httpx read and decoded it already, its raw bytes are gone
                    return await self._read(url, attempt, progress, response.status_code, response.headers,
                                            response.aiter_bytes(), decoded=True)
                return await self._read(url, attempt, progress, response.status_code, response.headers,
                                        response.aiter_raw())
        except idna.IDNAError as exc:
            if progress.headers_received:
                raise
            # httpx's client builds a redirect's next request even with follow_redirects=False,
            # reading the Location's host: one that is no IDNA name fails there, before the answer
            # reaches us (the aiohttp path above hands it to _redirect_target, which names the
            # Location and its status)
            raise PermanentFetchError(url, "invalid_redirect", f"a Location whose host is no IDNA 2008 name ({exc})",
                                      attempts=attempt) from exc

    async def _read(
        self, url: str, attempt: int, progress: _Progress, status: int, response_headers: httpx.Headers,
        body: AsyncIterator[bytes], *, decoded: bool = False,
    ) -> tuple[int, dict[str, str], bytes]:
        """The response's ``(status, headers, body)``; the body only of a success, within
        ``max_body_bytes``. ``body``: the bytes as sent, decoded here, unless ``decoded``."""
        progress.status = status
        progress.headers_received = True
        headers = {name.lower(): value for name, value in response_headers.items()}
        if status in REDIRECT_STATUSES or classify_status(status) != "ok":
            return status, headers, b""  # the body of a redirect or an error is not needed
        if status != 304 and (unsupported := self._unsupported_codings(headers.get("content-encoding", ""))):
            # a body in a coding we never offered cannot be read (RFC 9110 §8.4)
            raise PermanentFetchError(
                url, "unsupported_content_encoding",
                f"Content-Encoding {', '.join(unsupported)}; this client accepts "
                f"{self.client.headers.get('accept-encoding', 'identity')}", http_status=status, attempts=attempt,
            )
        limit = self.policy.max_body_bytes
        if status != 304 and transfer_coded(headers.get("transfer-encoding", "")):  # its bytes would be the page
            raise PermanentFetchError(
                url, "unsupported_transfer_encoding",
                f"Transfer-Encoding {headers['transfer-encoding']}; this client reads chunked only",
                http_status=status, attempts=attempt)
        declared = headers.get("content-length", "")
        if declared.isdigit() and int(declared) > limit:
            raise PermanentFetchError(
                url, "body_too_large", f"Content-Length {declared} > max_body_bytes {limit}",
                http_status=status, attempts=attempt,
            )
        chunks: list[bytes] = []
        size = 0
        async for chunk in body:  # as sent: a compressed body larger than the limit is refused too
            size += len(chunk)
            if size > limit:
                raise PermanentFetchError(
                    url, "body_too_large", f"more than max_body_bytes {limit} bytes received",
                    http_status=status, attempts=attempt,
                )
            chunks.append(chunk)
        if status == 304 or decoded or status not in _PAGE_STATUSES:
            # a 304 has no body; another 2xx (206: part of a body) is no page and is refused as
            # http_<status> by the caller: not decoded (a part of a stream would read as cut short)
            return status, headers, b"" if status == 304 else b"".join(chunks)
        try:
            return status, headers, decode_body(b"".join(chunks), headers.get("content-encoding", ""), limit)
        except BodyTooLarge as exc:
            raise PermanentFetchError(url, "body_too_large", f"{exc} (max_body_bytes)", http_status=status,
                                      attempts=attempt) from None
