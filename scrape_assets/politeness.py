"""Politeness: robots.txt (RFC 9309) and per-host rate and concurrency limits.

One :class:`RobotsCache` and one :class:`HostLimiter` live for one run and are shared by
every page of that run (the :class:`~scrape_assets.fetcher.PageFetcher` owns them).

robots.txt outcomes (RFC 9309 §2.3.1), decided once per origin per run::

    2xx                       parse with protego; each URL allowed or "robots_disallowed"
    4xx except 407, 429       "unavailable" (§2.3.1.3): every URL allowed (a 408 retried first)
    407, 429, 5xx             retried; then "unreachable" (§2.3.1.4): every URL refused,
    network error, timeout    "robots_unreachable"
    more redirects than the   "unavailable" (§2.3.1.2 lets crawlers treat it so): allowed
    client follows (5)
    anything else (1xx, 3xx   "unreachable": refused (we cannot tell what the site wants)
    without Location)

429 is read as "unreachable" although it is a 4xx: a site rate-limiting its robots.txt is
telling us to back off, which is how Google's crawler treats it too. 407 comes from our own
proxy (it refused our credentials), not the site: it says nothing about what the site allows,
so it refuses too instead of allowing all. What a page's request would retry (the statuses
and network errors of :func:`~scrape_assets.retry.classify_status` and
:func:`~scrape_assets.retry.classify_exception`) is retried here too, up to ``max_attempts``
requests with exponential backoff, full jitter and ``Retry-After`` honoured
(:func:`~scrape_assets.retry.backoff_delay_s`); the last answer then decides as above, so
one dropped connection does not refuse every page of the host for the run. The pages of
that origin wait meanwhile: with a dead origin, up to ``max_attempts`` times the request
deadline plus the backoff (a redirected robots.txt: the deadline of each hop, as for pages). The next run fetches robots.txt again.
Refusing is a decision, not an error, so :meth:`RobotsCache.check` returns a
:class:`RobotsDecision` whose ``reason`` tells the crawler which dead-letter reason to record.
``Crawl-delay`` is not part of RFC 9309, but sites still use it to ask for a slower pace:
when the group that applies to us names one longer than the spec's rate asks, the origin's
host gets at most one request per that many seconds for the rest of the run (capped at
:data:`MAX_CRAWL_DELAY_S`); a shorter one changes nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import math
import random
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from typing import Literal, TypeVar

import httpx
import idna
from aiolimiter import AsyncLimiter
from protego import Protego

from scrape_assets.content_coding import decode_body, transfer_coded
from scrape_assets.errors import exception_text
from scrape_assets.hostnames import url_host_problem
from scrape_assets.retry import backoff_delay_s, classify_exception, classify_status, parse_retry_after

logger = logging.getLogger(__name__)

#: RFC 9309 §2.5: crawlers must parse at least the first 500 KiB; we read 512 KiB, drop the rest.
ROBOTS_MAX_BYTES = 512 * 1024  # decoded; as many raw bytes of a compressed one at most

#: Statuses whose Retry-After pauses the whole host, not only the request (RFC 9110 §15.5.20, §15.6.4).
HOST_WIDE_STATUSES = frozenset({429, 503})

#: The longest ``Crawl-delay`` honoured, in seconds (a site asking for more gets this pace).
MAX_CRAWL_DELAY_S = 60.0

RobotsReason = Literal["robots_disallowed", "robots_unreachable"]


_T = TypeVar("_T")


async def within_deadline(deadline_s: float, work: Awaitable[_T]) -> _T:
    """``await work``, or raise ``TimeoutError`` after ``deadline_s`` seconds (``work`` cancelled).

    ``asyncio.timeout``: ``work`` runs in the caller's task, where ``asyncio.wait_for``
    (before 3.12) wraps it in a new task, costs more per request and may swallow a cancel
    that arrives as ``work`` ends (the caller then goes on as if it had not been cancelled).
    """
    async with asyncio.timeout(deadline_s):
        return await work


@dataclass(frozen=True)
class RobotsDecision:
    """Whether robots.txt lets us fetch one URL, and why not.

    Attributes:
        allowed: ``True`` when the URL may be fetched.
        reason: ``None`` when allowed; otherwise ``"robots_disallowed"`` (a rule forbids the
            URL) or ``"robots_unreachable"`` (robots.txt answered 407/429/5xx or not at all,
            after its retries, so the whole origin is refused for this run). Use it as the
            dead-letter reason.
        robots_url: the robots.txt URL the decision comes from.
        detail: a human-readable explanation (``"robots.txt answered HTTP 503"``...).
    """

    allowed: bool
    reason: RobotsReason | None
    robots_url: str
    detail: str = ""


@dataclass(frozen=True)
class _RobotsFile:
    state: Literal["parsed", "unavailable", "unreachable"]
    robots_url: str
    detail: str
    parser: Protego | None = None


def robots_url_for(url: str | httpx.URL) -> str:
    """The robots.txt URL of ``url``'s origin (scheme, host, port; RFC 9309 §2.3).

    Raises:
        httpx.InvalidURL: ``url`` cannot be parsed.
    """
    parsed = url if isinstance(url, httpx.URL) else httpx.URL(url)
    return _origin_robots_url(parsed.scheme, parsed.host, parsed.port)


@functools.lru_cache(maxsize=256)
def _origin_robots_url(scheme: str, host: str, port: int | None) -> str:
    # Building a URL costs as much as parsing one: once per origin, not once per page.
    return str(httpx.URL(scheme=scheme, host=host, port=port, path="/robots.txt"))


_FIRST_PRODUCT = re.compile(r"[^\s/()]+")
#: A product with a version anywhere in the header, a comment's too ("compatible; acmebot/1.0"):
#: an RFC 9110 token without a dot, right after the start, a space, "(", ";" or ",", followed
#: by "/" and a digit. A URL's parts are not: "+https://bot.example/info" (":" is no token
#: character, "bot.example" follows a "/"), "acme.example/contact" (a dot), "Build/IML74K"
#: (no digit).
_PRODUCT = re.compile(r"(?:^|(?<=[\s(;,]))([A-Za-z0-9!#$%&'*+^_`|~-]+)/(?=\d)")


@functools.lru_cache(maxsize=8)
def robots_agent_names(user_agent: str) -> str:
    """The names robots.txt groups are matched against, space-separated: the ``User-Agent``
    header's products (RFC 9110 §10.1.5: ``product = token ["/" product-version]``), the
    first one and any other with a numbered version, inside a comment too, but no other
    word of a comment (RFC 9309 §2.2.1 matches a crawler's product token).

    ``"scrape_assets/0.1.0 (polite catalogue crawler)"`` gives ``"scrape_assets"``;
    ``"Mozilla/5.0 (compatible; acmebot/1.0; +https://acme.example/bot)"`` gives
    ``"acmebot"`` (a header starting ``Mozilla/`` is the browser-compatible form crawlers
    use: the bot is the product it names, not ``Mozilla``), so a site's ``User-agent:
    acmebot`` group applies and a ``User-agent: crawler`` group does not. A header that
    does not start with a product (``"(bot)"``) is used whole.
    """
    text = user_agent.strip()
    first = _FIRST_PRODUCT.match(text)
    if first is None:
        return user_agent
    names = [first.group()]
    for name in _PRODUCT.findall(text):
        if name.lower() not in (n.lower() for n in names):
            names.append(name)
    if len(names) > 1 and names[0].lower() == "mozilla":
        names.pop(0)
    return " ".join(names)


class RobotsCache:
    """Fetches and caches robots.txt once per origin, for one run.

    Concurrency-safe: when many tasks ask about the same origin at once, one request is made
    and the others wait for its result. See the module docstring for the outcome table.

    Args:
        limiter: when given, each robots.txt request takes a slot of the origin's host like any
            page request does (not while it waits to retry).
        deadline_s: total seconds allowed for one robots.txt request including its body (a
            server trickling bytes never trips httpx's per-read timeout); past it that
            attempt failed. Each redirect hop is one request with its own deadline, as a
            page's is (the fetcher's ``deadline_s``): an attempt that follows redirects may
            take up to ``client.max_redirects + 1`` deadlines.
        max_attempts: robots.txt requests per origin per run when they answer 407, 429, 5xx,
            time out or fail to connect (``>= 1``; 1: never retried); after the last the
            origin is "unreachable".
        backoff_base_s, backoff_max_s, retry_after_max_s: the backoff between those attempts,
            seconds, as for pages (:func:`~scrape_assets.retry.backoff_delay_s`).
        sleep: awaited with each backoff delay (tests pass a recorder).
        rng: the jitter's random source (seeded in tests).
        note: called with a line when a robots.txt ``Crawl-delay`` slows its host, or its 429
            or 503 with ``Retry-After`` pauses it (the run's log); default this module's
            logger's warning.

    Raises:
        ValueError: ``max_attempts < 1``.
    """

    def __init__(
        self,
        *,
        limiter: HostLimiter | None = None,
        deadline_s: float = 60.0,
        max_attempts: int = 3,
        backoff_base_s: float = 0.5,
        backoff_max_s: float = 30.0,
        retry_after_max_s: float = 120.0,
        sleep: Callable[[float], Awaitable[object]] = asyncio.sleep,
        rng: random.Random | None = None,
        note: Callable[[str], object] | None = None,
    ):
        if max_attempts < 1:
            raise ValueError(f"max_attempts must be >= 1, got {max_attempts}")
        self._limiter = limiter
        self._deadline_s = deadline_s
        self._max_attempts = max_attempts
        self._backoff = {"base_s": backoff_base_s, "max_s": backoff_max_s, "retry_after_max_s": retry_after_max_s}
        self._sleep = sleep
        self._rng = rng if rng is not None else random.Random()
        self._files: dict[str, _RobotsFile] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self._note = note or logger.warning

    async def allowed(self, client: httpx.AsyncClient, url: str, user_agent: str) -> bool:
        """``True`` when robots.txt lets ``user_agent`` fetch ``url``; see :meth:`check`."""
        return (await self.check(client, url, user_agent)).allowed

    async def check(
        self, client: httpx.AsyncClient, url: str, user_agent: str, *, parsed: httpx.URL | None = None
    ) -> RobotsDecision:
        """Decide whether ``user_agent`` may fetch ``url``, fetching robots.txt on first use.

        Args:
            client: the run's HTTP client (redirects are followed for robots.txt only).
            url: the absolute http(s) URL about to be fetched.
            user_agent: the full User-Agent header. Groups are matched against its products
                (:func:`robots_agent_names`, RFC 9309 §2.2.1), case-insensitively by
                protego: ``User-agent: scrape-assets`` matches ``scrape-assets/0.1
                (+https://...)``, while a group named after a word of its comment
                (``crawler``) does not replace the ``*`` group. Limit (protego): a group
                whose name starts one of those names (``scrape`` for ``scrape_assets``) matches too.
            parsed: ``httpx.URL(url)`` when the caller has it already (saves parsing it again).

        Returns:
            The :class:`RobotsDecision`. Never raises for network problems or HTTP statuses:
            those become ``robots_unreachable`` decisions.

        Raises:
            httpx.InvalidURL: ``url`` cannot be parsed.
        """
        robots = await self._file(client, robots_url_for(url if parsed is None else parsed), user_agent)
        robots_url = robots.robots_url
        if robots.state == "unreachable":
            return RobotsDecision(False, "robots_unreachable", robots_url, robots.detail)
        if robots.state == "unavailable" or robots.parser is None:
            return RobotsDecision(True, None, robots_url, robots.detail)
        if robots.parser.can_fetch(url, robots_agent_names(user_agent)):
            return RobotsDecision(True, None, robots_url, "allowed by robots.txt")
        return RobotsDecision(False, "robots_disallowed", robots_url, f"disallowed by {robots_url}")

    async def sitemaps(self, client: httpx.AsyncClient, url: str, user_agent: str) -> list[str]:
        """The ``Sitemap:`` URLs of the robots.txt of ``url``'s origin, in file order, fetching it on first use.

        The sitemaps.org protocol's "Specifying the Sitemap location in your robots.txt
        file" (https://www.sitemaps.org/protocol.html#submit_robots): absolute URLs,
        outside any ``User-agent`` group. ``[]`` when the file lists none or could not be
        fetched (never raises for network problems or HTTP statuses).

        Raises:
            httpx.InvalidURL: ``url`` cannot be parsed.
        """
        robots = await self._file(client, robots_url_for(url), user_agent)
        return list(robots.parser.sitemaps) if robots.parser is not None else []

    async def _file(self, client: httpx.AsyncClient, robots_url: str, user_agent: str) -> _RobotsFile:
        """The origin's robots.txt, fetched once per run (concurrent callers wait for the one request)."""
        robots = self._files.get(robots_url)
        if robots is None:
            lock = self._locks.setdefault(robots_url, asyncio.Lock())
            async with lock:
                robots = self._files.get(robots_url)
                if robots is None:
                    robots = await self._fetch(client, robots_url, user_agent)
                    self._files[robots_url] = robots
                    self._obey_crawl_delay(robots, user_agent)
        return robots

    def _obey_crawl_delay(self, robots: _RobotsFile, user_agent: str) -> None:
        """Space the origin host's requests by its robots.txt ``Crawl-delay`` (for our group),
        when longer than the spec's rate asks, at most :data:`MAX_CRAWL_DELAY_S`."""
        if self._limiter is None or robots.parser is None:
            return
        try:
            delay = robots.parser.crawl_delay(robots_agent_names(user_agent))
        except (TypeError, ValueError):  # a value protego could not read: none
            return
        if delay is None or not 0 < float(delay) < float("inf"):
            return
        interval = min(float(delay), MAX_CRAWL_DELAY_S)
        host = httpx.URL(robots.robots_url).host
        if self._limiter.space_at_least(host, interval):
            self._note(f"{robots.robots_url} asks for Crawl-delay {float(delay):g} s: at most one request every "
                       f"{interval:g} s to {host}" + (f" (capped at {MAX_CRAWL_DELAY_S:g} s)" if interval < delay else "")
                       + f", slower than the spec's politeness.requests_per_second")

    async def _fetch(self, client: httpx.AsyncClient, robots_url: str, user_agent: str) -> _RobotsFile:
        """The origin's robots.txt after at most ``max_attempts`` requests (see the module docstring)."""
        attempt = 0
        while True:
            attempt += 1
            robots, retry_after = await self._attempt(client, robots_url, user_agent)
            if retry_after is None:  # a decision, not a failure to retry
                return robots
            told = parse_retry_after(retry_after or None, datetime.now(timezone.utc))
            if attempt >= self._max_attempts:
                return robots if attempt == 1 else replace(robots, detail=f"{robots.detail}; robots.txt requested {attempt} times")
            delay = backoff_delay_s(attempt, retry_after_s=told, rng=self._rng, **self._backoff)
            logger.info("%s: attempt %d/%d failed (%s); retrying in %.2f s", robots_url, attempt, self._max_attempts,
                        robots.detail, delay)
            await self._sleep(delay)

    async def _attempt(self, client: httpx.AsyncClient, robots_url: str, user_agent: str) -> tuple[_RobotsFile, str | None]:
        """One request: the outcome, and ``None`` when it is final or else the ``Retry-After``
        value to honour before retrying (``""`` when the answer had none)."""
        try:
            url: str | None = robots_url
            for _hop in range(client.max_redirects + 1):
                # Each hop in its own host's slot: a robots.txt redirected to another host
                # waits for that host's rate, concurrency and pause as a page would.
                answering = url
                async with self._slot(httpx.URL(url).host):
                    status, retry_after, body, url = await within_deadline(
                        self._deadline_s, self._download(client, url, user_agent)
                    )
                if url is None:
                    break
                if problem := url_host_problem(httpx.URL(url)):
                    # as a redirect to a host that does not resolve (unreachable), without retries
                    return _RobotsFile("unreachable", robots_url, f"robots.txt redirected to {url}, whose host is no"
                                                                  f" name to look up ({problem})"), None
            else:
                raise httpx.TooManyRedirects(f"more than {client.max_redirects} redirects from {robots_url}")
        except httpx.TooManyRedirects as exc:
            return _RobotsFile("unavailable", robots_url, f"robots.txt redirected too often ({exc}); allowing all"), None
        except idna.IDNAError as exc:  # httpx reads a Location's host to build the redirect's request
            return _RobotsFile("unreachable", robots_url, f"robots.txt redirected to a host that is no IDNA 2008 name"
                                                          f" ({exc})"), None
        except (httpx.RequestError, TimeoutError, asyncio.TimeoutError) as exc:
            what = exception_text(exc, limit=10_000)
            # Retried as a page's request would be (a URL we cannot send is not: unsupported_url...).
            try:
                retry = classify_exception(exc, headers_received=False)[0] == "retry"
            except TypeError:  # an httpx.RequestError of no known kind: taken as a network failure
                retry = True
            return _RobotsFile("unreachable", robots_url, f"robots.txt could not be fetched ({what})"), ("" if retry else None)
        # Retried as a page would be (429, 408, 5xx, a proxy's 407); the last answer decides (RFC 9309 §2.3.1).
        retry_after = retry_after if classify_status(status) == "retry" else None
        if status in HOST_WIDE_STATUSES and retry_after:
            self._pause_host(answering, status, retry_after)
        if 200 <= status <= 299:
            # UTF-8 (RFC 9309 §2.3); "-sig" drops a byte order mark, which would otherwise hide the
            # first line (often "User-agent: *") from protego.
            parser = Protego.parse(body.decode("utf-8-sig", errors="replace"))
            return _RobotsFile("parsed", robots_url, f"robots.txt answered HTTP {status}", parser), None
        if status == 407:  # our proxy refused us: says nothing about the site's robots.txt
            return _RobotsFile("unreachable", robots_url, "robots.txt: the proxy answered HTTP 407 (credentials?)"), retry_after
        if 400 <= status <= 499 and status != 429:
            return _RobotsFile("unavailable", robots_url, f"robots.txt answered HTTP {status}; allowing all"), retry_after
        return _RobotsFile("unreachable", robots_url, f"robots.txt answered HTTP {status}"), retry_after

    def _pause_host(self, url: str, status: int, retry_after: str) -> None:
        """A 429 or 503 with Retry-After pauses the host that answered, as a page's does (and so
        the pause reaches the next run, see :meth:`HostLimiter.handoff`), capped as pages' are."""
        told = parse_retry_after(retry_after, datetime.now(timezone.utc))
        if self._limiter is None or told is None:
            return
        host, seconds = httpx.URL(url).host, min(told, self._backoff["retry_after_max_s"])
        if self._limiter.pause(host, seconds):
            self._note(f"{url} answered {status} (Retry-After {round(told, 1):g} s): no request to {host} for {seconds:.1f} s")

    def _slot(self, host: str) -> contextlib.AbstractAsyncContextManager:
        """The limiter's slot for ``host``; nothing to wait for without a limiter."""
        return self._limiter.slot(host) if self._limiter is not None else contextlib.nullcontext()

    @staticmethod
    async def _download(client: httpx.AsyncClient, url: str, user_agent: str) -> tuple[int, str, bytes, str | None]:
        """``(status, Retry-After value or "", body, redirect target)`` of one request (no
        redirect followed: the caller takes each hop's slot); the body only of a 2xx, at most
        ROBOTS_MAX_BYTES; the target only of a redirect with a ``Location``."""
        async with client.stream("GET", url, headers={"User-Agent": user_agent}, follow_redirects=False) as response:
            if response.next_request is not None:  # 301, 302, 303, 307, 308 with a Location (RFC 9309 §2.3.1.2)
                return response.status_code, "", b"", str(response.next_request.url)
            if not 200 <= response.status_code <= 299:
                return response.status_code, response.headers.get("retry-after", ""), b"", None
            if transfer_coded(response.headers.get("transfer-encoding", "")):
                raise httpx.DecodingError(f"Transfer-Encoding {response.headers['transfer-encoding']}: only chunked is read")
            if response.is_stream_consumed:  # content given whole by an in-process transport: httpx decoded it
                return response.status_code, "", response.content[:ROBOTS_MAX_BYTES], None
            chunks: list[bytes] = []
            size = 0
            async for chunk in response.aiter_raw():  # decoded below: a stream cut short is an error
                chunks.append(chunk)
                size += len(chunk)
                if size >= ROBOTS_MAX_BYTES:
                    break
            body = decode_body(b"".join(chunks), response.headers.get("content-encoding", ""), ROBOTS_MAX_BYTES,
                               truncate=True, complete=size < ROBOTS_MAX_BYTES)
            return response.status_code, "", body, None


def _seconds(value: object) -> float | None:
    """A finite number of a handoff file as a float, else None (a damaged file waits for nothing)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        value = float(value)
    except OverflowError:  # an int too large for a float
        return None
    return value if math.isfinite(value) else None


class HostLimiter:
    """Per-host request rate and concurrency limits, shared by all pages of a run.

    Each host gets its own ``asyncio.Semaphore(max_concurrency)`` and a leaky bucket
    (``aiolimiter.AsyncLimiter(1, 1 / requests_per_second)``) holding one request: requests
    start at least ``1 / requests_per_second`` seconds apart, with no initial burst. A slot first
    waits for a concurrency permit, then for the rate; the permit is held until the ``async
    with`` block exits, so back-off sleeps belong outside the block.

    :meth:`pause` holds every new slot of a host for a while (a 429 or 503 with
    ``Retry-After``, RFC 9110 §10.2.3: the server's wait applies to it, not to one URL);
    requests already in flight go on.

    Args:
        requests_per_second: most requests started per second per host (``> 0``).
        max_concurrency: most requests in flight at once per host (``>= 1``).
        sleep: how a slot waits out a pause (seconds; injectable for tests).
        clock: seconds of a monotonic clock, the pauses' time base (injectable for tests).

    Raises:
        ValueError: a limit is out of range.

    Example::

        async with limiter.slot("books.toscrape.com"):
            response = await client.get(url)
    """

    def __init__(self, requests_per_second: float, max_concurrency: int, *,
                 sleep: Callable[[float], Awaitable[object]] = asyncio.sleep, clock: Callable[[], float] = time.monotonic):
        if not requests_per_second > 0:
            raise ValueError(f"requests_per_second must be > 0, got {requests_per_second}")
        if max_concurrency < 1:
            raise ValueError(f"max_concurrency must be >= 1, got {max_concurrency}")
        self.requests_per_second = requests_per_second
        self.max_concurrency = max_concurrency
        self._hosts: dict[str, tuple[asyncio.Semaphore, AsyncLimiter]] = {}
        self._sleep, self._clock = sleep, clock
        self._paused_until: dict[str, float] = {}  # host -> clock() before which no slot is given
        self._last_started: dict[str, float] = {}  # host -> clock() when its latest slot was given
        self._intervals: dict[str, float] = {}  # host -> seconds between slots, when longer than 1/rps
        #: Called with the host (lower case) when a pause of it begins or is extended (the
        #: crawl records it at once for the next run: a run killed during the pause cannot later).
        self.on_pause: Callable[[str], object] | None = None

    def handoff(self, host: str) -> dict | None:
        """What the next run fetching ``host`` must respect, for :meth:`take_over`: ``{"last_request_at":
        epoch seconds of the latest slot given or None, "paused_until": epoch seconds of the end of
        a pause (Retry-After) still to come or None, "crawl_delay_s": the robots.txt Crawl-delay
        obeyed or None}``; None when no slot was given and none is paused."""
        key = host.lower()
        last, paused = self._last_started.get(key), self._paused_until.get(key)
        if paused is not None and paused <= self._clock():
            paused = None
        if last is None and paused is None:
            return None
        to_wall = time.time() - self._clock()  # this clock is monotonic, its origin this process's
        return {"last_request_at": None if last is None else last + to_wall,
                "paused_until": None if paused is None else paused + to_wall,
                "crawl_delay_s": self._intervals.get(key)}

    def take_over(self, host: str, handoff: dict, *, now: float, max_wait_s: float) -> float:
        """Pause ``host`` until the gap this limiter's :attr:`requests_per_second` (or the
        previous run's ``crawl_delay_s``, when longer: robots.txt is not read yet) asks after
        the previous run's last request (``handoff`` of :meth:`handoff`, read from storage), or
        the end of its pause, at most ``max_wait_s`` (a clock stepped since). A number that is
        not one (a damaged file) counts as absent. ``now``: epoch seconds.

        Returns:
            The seconds paused (0 when the gap has passed).
        """
        last, paused, delay = (_seconds(handoff.get(name)) for name in ("last_request_at", "paused_until", "crawl_delay_s"))
        gap = max(self.interval_s(host), min(delay or 0.0, MAX_CRAWL_DELAY_S))  # this run's pace, or the site's ask
        ends = [t for t in (None if last is None else last + gap, paused) if t is not None]
        wait = min(max(ends, default=now) - now, max_wait_s)
        if wait > 0 and self.pause(host, wait):
            return wait
        return 0.0

    def pause(self, host: str, seconds: float) -> bool:
        """Give no new slot for ``host`` during the next ``seconds`` (finite, capped by the caller).

        Returns:
            Whether this moved the end of the host's pause later (a shorter pause than the
            one already running changes nothing).
        """
        key = host.lower()
        until, current = self._clock() + seconds, self._paused_until.get(key)
        if not seconds > 0 or (current is not None and until <= current):
            return False
        self._paused_until[key] = until
        if self.on_pause is not None:
            self.on_pause(key)
        return True

    def _limits_for(self, host: str) -> tuple[asyncio.Semaphore, AsyncLimiter]:
        key = host.lower()
        limits = self._hosts.get(key)
        if limits is None:
            limits = (asyncio.Semaphore(self.max_concurrency), AsyncLimiter(1, self.interval_s(key)))
            self._hosts[key] = limits
        return limits

    def interval_s(self, host: str) -> float:
        """Least seconds between two requests to ``host``: 1 / :attr:`requests_per_second`, or
        longer after :meth:`space_at_least` (a robots.txt ``Crawl-delay``)."""
        return max(1.0 / self.requests_per_second, self._intervals.get(host.lower(), 0.0))

    def space_at_least(self, host: str, seconds: float) -> bool:
        """Give ``host`` at most one slot every ``seconds`` from now on, when that is slower than
        its pace now; returns whether it was."""
        key = host.lower()
        if not seconds > self.interval_s(key):
            return False
        self._intervals[key] = seconds
        if key in self._hosts:  # requests already waiting for the old pace keep it; later ones get this one
            self._hosts[key] = (self._hosts[key][0], AsyncLimiter(1, seconds))
        if (last := self._last_started.get(key)) is not None:
            # A new limiter gives its first slot at once: not sooner than the new gap after the last one.
            self.pause(key, last + seconds - self._clock())
        return True

    @asynccontextmanager
    async def slot(self, host: str) -> AsyncIterator[None]:
        """Hold one request slot for ``host`` (case-insensitive, without port) while inside."""
        semaphore, rate = self._limits_for(host)
        key = host.lower()
        async with semaphore:
            waited = None
            while True:
                if self._paused_until:  # (no host ever paused: no lookup per request)
                    waited = await self._wait_out_pause(key, waited)
                await rate.acquire()
                # A pause that began while this request waited for the rate: wait it out too.
                until = self._paused_until.get(key) if self._paused_until else None
                if until is None or until == waited or until <= self._clock():
                    break
            self._last_started[key] = self._clock()
            yield

    async def _wait_out_pause(self, key: str, waited: float | None) -> float | None:
        """Sleep until ``key``'s pause is over; return the end of the last pause slept out
        (``waited``, the one already slept out, is not slept again: a test's sleep may not move
        the clock)."""
        while (until := self._paused_until.get(key)) is not None and until != waited and until > self._clock():
            await self._sleep(until - self._clock())
            waited = until  # slept it out, unless it was extended meanwhile (then the loop goes on)
        return waited
