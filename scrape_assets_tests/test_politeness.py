"""Tests for scrape_assets.politeness: robots.txt (RFC 9309) and per-host limits."""

from __future__ import annotations

import asyncio
import random
import time

import httpx
import pytest

from scrape_assets.politeness import (
    MAX_CRAWL_DELAY_S,
    HostLimiter,
    RobotsCache,
    RobotsDecision,
    robots_url_for,
    within_deadline,
)

UA = "scrape-assets/0.1 (+https://example.invalid/bot)"

ROBOTS = """\
User-agent: *
Disallow: /private/
Allow: /private/open.html

User-agent: OtherBot
Disallow: /
"""

ROBOTS_WITH_OUR_GROUP = """\
User-agent: *
Disallow: /private/

User-agent: scrape-assets
Disallow: /no-bots/
"""


def _client(handler) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.MockTransport(handler), follow_redirects=False)


def _robots_handler(status: int, body: str = "", requests: list[httpx.Request] | None = None):
    async def handler(request: httpx.Request) -> httpx.Response:
        if requests is not None:
            requests.append(request)
        assert request.url.path == "/robots.txt"
        return httpx.Response(status, text=body)

    return handler


def test_robots_url_is_per_origin():
    assert robots_url_for("https://Example.com/a/b?c=1#d") == "https://example.com/robots.txt"
    assert robots_url_for("http://example.com:8080/a") == "http://example.com:8080/robots.txt"
    assert robots_url_for("http://[::1]:81/x") == "http://[::1]:81/robots.txt"
    assert robots_url_for(httpx.URL("HTTP://Example.com:8080/a#b")) == "http://example.com:8080/robots.txt"
    # Cached per origin: the scheme is part of it (same host and port, other scheme).
    assert robots_url_for("https://example.com:8080/a") == "https://example.com:8080/robots.txt"
    assert robots_url_for("http://example.com:80/a") == robots_url_for("http://example.com/b") == "http://example.com/robots.txt"


def test_disallow_rules_are_respected():
    async def main():
        requests: list[httpx.Request] = []
        cache = RobotsCache()
        async with _client(_robots_handler(200, ROBOTS, requests)) as client:
            public = await cache.check(client, "http://shop.test/catalogue/page-1.html", UA)
            private = await cache.check(client, "http://shop.test/private/x.html", UA)
            opened = await cache.allowed(client, "http://shop.test/private/open.html", UA)
            other_agent = await cache.allowed(client, "http://shop.test/catalogue/page-1.html", "OtherBot/1.0")
        return requests, public, private, opened, other_agent

    requests, public, private, opened, other_agent = asyncio.run(main())
    assert public == RobotsDecision(True, None, "http://shop.test/robots.txt", "allowed by robots.txt")
    assert private == RobotsDecision(
        False, "robots_disallowed", "http://shop.test/robots.txt", "disallowed by http://shop.test/robots.txt"
    )
    assert opened is True  # the longer Allow wins (RFC 9309 §2.2.2)
    assert other_agent is False
    assert len(requests) == 1
    assert requests[0].headers["user-agent"] == UA


def test_group_naming_our_product_token_replaces_the_star_group():
    async def main():
        cache = RobotsCache()
        async with _client(_robots_handler(200, ROBOTS_WITH_OUR_GROUP)) as client:
            return (
                await cache.allowed(client, "http://shop.test/no-bots/a", UA),
                await cache.allowed(client, "http://shop.test/private/a", UA),
                await cache.allowed(client, "http://shop.test/private/a", "SomeBot/2"),
            )

    # RFC 9309 §2.2.1: only the most specific matching group applies.
    assert asyncio.run(main()) == (False, True, False)


def test_groups_match_the_user_agents_products_not_words_of_its_comment():
    """RFC 9309 §2.2.1: the group is chosen by the product token; protego alone, given the
    whole header, let a "crawler" group (a word of our default comment) replace the * group,
    while a bot named inside a browser-style header's comment must still find its group."""
    from scrape_assets.defs.resources import USER_AGENT as DEFAULT_USER_AGENT
    from scrape_assets.politeness import robots_agent_names

    robots = ("User-agent: *\nDisallow: /private/\n\nUser-agent: crawler\nDisallow: /cgi-bin/\n\n"
              "User-agent: acmebot\nDisallow: /\n")

    async def main(user_agent):
        cache = RobotsCache()
        async with _client(_robots_handler(200, robots)) as client:
            return (await cache.allowed(client, "http://shop.test/private/a", user_agent),
                    await cache.allowed(client, "http://shop.test/cgi-bin/a", user_agent),
                    await cache.allowed(client, "http://shop.test/catalogue/a", user_agent))

    assert "crawler" in DEFAULT_USER_AGENT
    assert asyncio.run(main(DEFAULT_USER_AGENT)) == (False, True, True)  # the * group
    assert asyncio.run(main("Crawler/2.0 (+mailto:ops@example.com)")) == (True, False, True)  # its own group
    assert asyncio.run(main("Mozilla/5.0 (compatible; acmebot/1.0; +https://acme.example/bot)")) == (
        False, False, False)  # acmebot's group: everything disallowed
    assert robots_agent_names(DEFAULT_USER_AGENT) == "scrape_assets"
    assert robots_agent_names("  acme-prices/1.0 (+mailto:ops@example.com)") == "acme-prices"
    assert robots_agent_names("Mozilla/5.0 (compatible; acmebot/1.0; +https://acme.example/bot)") == "acmebot"
    assert robots_agent_names("Mozilla/5.0 (compatible,barbot/2.1)") == "barbot"
    assert robots_agent_names("Mozilla/5.0 (Linux; Android 4.0; Build/IML74K)") == "Mozilla"  # no bot named
    assert robots_agent_names("acme (bot; https://acme.example/x/y)") == "acme"
    assert robots_agent_names("scrape_assets/0.1 (+acme.example/contact; www.acme.example/bot)") == "scrape_assets"
    assert robots_agent_names("(no product)") == "(no product)"


def test_a_robots_txt_starting_with_a_byte_order_mark_keeps_its_first_group():
    async def main():
        cache = RobotsCache()
        async with _client(_robots_handler(200, "\ufeff" + ROBOTS)) as client:
            return (await cache.allowed(client, "http://shop.test/private/x.html", UA),
                    await cache.allowed(client, "http://shop.test/catalogue/page-1.html", UA))

    assert asyncio.run(main()) == (False, True)  # "User-agent: *" read although the file starts with EF BB BF


def test_404_allows_everything():
    async def main():
        cache = RobotsCache()
        async with _client(_robots_handler(404, "not here")) as client:
            return await cache.check(client, "http://shop.test/private/x.html", UA)

    decision = asyncio.run(main())
    assert decision.allowed is True
    assert decision.reason is None
    assert "404" in decision.detail


class _Sleeps(list):
    """A fake ``asyncio.sleep`` that records the delays."""

    async def __call__(self, seconds: float) -> None:
        self.append(seconds)


@pytest.mark.parametrize("status", [500, 503, 429, 407])  # 407: our proxy refused us, not the site
def test_server_error_is_retried_then_disallows_everything_with_a_reason(status):
    requests: list[httpx.Request] = []
    sleeps = _Sleeps()

    async def main():
        cache = RobotsCache(max_attempts=3, backoff_base_s=0.5, sleep=sleeps, rng=random.Random(7))
        async with _client(_robots_handler(status, requests=requests)) as client:
            first = await cache.check(client, "http://shop.test/", UA)
            second = await cache.check(client, "http://shop.test/catalogue/", UA)
        return first, second

    first, second = asyncio.run(main())
    assert (first.allowed, first.reason) == (False, "robots_unreachable")
    assert (second.allowed, second.reason) == (False, "robots_unreachable")
    assert f"HTTP {status}" in first.detail and first.detail.endswith("; robots.txt requested 3 times")
    assert len(requests) == 3  # max_attempts, then the decision holds for the run: no more requests
    assert len(sleeps) == 2 and 0 <= sleeps[0] <= 0.5 and 0 <= sleeps[1] <= 1.0  # full jitter, doubling


@pytest.mark.parametrize("status", [404, 410, 401])
def test_a_4xx_robots_txt_is_not_retried(status):
    requests: list[httpx.Request] = []
    sleeps = _Sleeps()

    async def main():
        async with _client(_robots_handler(status, requests=requests)) as client:
            return await RobotsCache(sleep=sleeps).check(client, "http://shop.test/a", UA)

    assert asyncio.run(main()).allowed is True
    assert (len(requests), sleeps) == (1, [])


def test_a_transient_failure_is_retried_and_the_file_then_obeyed():
    answers = [httpx.Response(503, headers={"Retry-After": "7"}), "connect_error", httpx.Response(200, text=ROBOTS)]
    requests: list[httpx.Request] = []
    sleeps = _Sleeps()

    def handler(request: httpx.Request) -> httpx.Response:
        requests.append(request)
        answer = answers.pop(0)
        if answer == "connect_error":
            raise httpx.ConnectError("connection refused", request=request)
        return answer

    async def main():
        cache = RobotsCache(max_attempts=3, backoff_base_s=0.5, sleep=sleeps, rng=random.Random(7))
        async with _client(handler) as client:
            return (await cache.check(client, "http://shop.test/private/x.html", UA),
                    await cache.check(client, "http://shop.test/catalogue/", UA))

    private, public = asyncio.run(main())
    assert (private.allowed, private.reason, public.allowed) == (False, "robots_disallowed", True)
    assert len(requests) == 3
    assert sleeps[0] >= 7  # the 503's Retry-After (RFC 9110 §10.2.3) is honoured
    assert 0 <= sleeps[1] <= 1.0


def test_a_408_is_retried_then_read_as_a_4xx_and_a_url_we_cannot_send_is_not_retried():
    sleeps = _Sleeps()
    requests: list[httpx.Request] = []

    async def main():
        async with _client(_robots_handler(408, requests=requests)) as client:
            timed_out = await RobotsCache(max_attempts=3, sleep=sleeps).check(client, "http://shop.test/a", UA)

        def unsupported(request):
            requests.append(request)
            raise httpx.UnsupportedProtocol("no such scheme", request=request)

        async with _client(unsupported) as client:
            refused = await RobotsCache(max_attempts=3, sleep=sleeps).check(client, "http://other.test/a", UA)
        return timed_out, refused

    timed_out, refused = asyncio.run(main())
    # A page's request retries a 408 (RFC 9110 §15.5.9); the last answer is still a 4xx: allowed (RFC 9309 §2.3.1.3).
    assert (timed_out.allowed, timed_out.detail) == (True, "robots.txt answered HTTP 408; allowing all; robots.txt requested 3 times")
    # A page's request does not retry what cannot be sent (unsupported_url): one request, refused.
    assert (refused.allowed, refused.reason) == (False, "robots_unreachable")
    assert [r.url.host for r in requests] == ["shop.test"] * 3 + ["other.test"]
    assert len(sleeps) == 2


def test_a_proxys_407_honours_its_retry_after():
    sleeps = _Sleeps()

    async def handler(request):
        return httpx.Response(407, headers={"Retry-After": "5"})

    async def main():
        async with _client(handler) as client:
            return await RobotsCache(max_attempts=2, sleep=sleeps).check(client, "http://shop.test/a", UA)

    assert asyncio.run(main()).reason == "robots_unreachable"
    assert len(sleeps) == 1 and sleeps[0] >= 5


def test_retry_after_is_capped_for_robots_txt_too():
    sleeps = _Sleeps()

    async def main():
        cache = RobotsCache(max_attempts=2, retry_after_max_s=3, sleep=sleeps)
        handler = _robots_handler(429)

        async def with_header(request):
            response = await handler(request)
            response.headers["Retry-After"] = "86400"
            return response

        async with _client(with_header) as client:
            return await cache.check(client, "http://shop.test/a", UA)

    assert asyncio.run(main()).reason == "robots_unreachable"
    assert sleeps == [3]


def test_max_attempts_must_be_positive():
    with pytest.raises(ValueError, match="max_attempts must be >= 1, got 0"):
        RobotsCache(max_attempts=0)


def test_network_error_disallows_everything():
    def handler(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    async def main():
        async with _client(handler) as client:
            return await RobotsCache(max_attempts=1).check(client, "http://shop.test/a", UA)

    decision = asyncio.run(main())
    assert (decision.allowed, decision.reason) == (False, "robots_unreachable")
    assert "ConnectError" in decision.detail


def test_stalled_robots_txt_is_unreachable_after_the_deadline():
    async def handler(request: httpx.Request) -> httpx.Response:
        await asyncio.sleep(30)
        return httpx.Response(200, text="")

    sleeps = _Sleeps()

    async def main():
        async with _client(handler) as client:
            started = time.monotonic()
            decision = await RobotsCache(deadline_s=0.2, max_attempts=2, sleep=sleeps).check(client, "http://shop.test/a", UA)
            return decision, time.monotonic() - started

    decision, took_s = asyncio.run(main())
    assert decision.reason == "robots_unreachable"
    assert decision.detail.endswith("; robots.txt requested 2 times")
    assert len(sleeps) == 1  # a timed-out attempt is retried like a 5xx
    assert took_s < 5


def test_robots_redirect_is_followed():
    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.host == "shop.test":
            return httpx.Response(301, headers={"Location": "https://www.shop.test/robots.txt"})
        return httpx.Response(200, text="User-agent: *\nDisallow: /\n")

    async def main():
        async with _client(handler) as client:
            return await RobotsCache().check(client, "http://shop.test/a", UA)

    assert asyncio.run(main()).reason == "robots_disallowed"


def test_a_robots_redirect_to_another_host_waits_for_that_hosts_slot():
    """shop.test's robots.txt redirects to www.shop.test, which a 429 paused for 5 s: the
    second hop waits the pause out, as a page of that host would."""
    now, slept, asked = [0.0], [], []

    async def sleep(seconds):
        slept.append(seconds)
        now[0] += seconds

    def handler(request: httpx.Request) -> httpx.Response:
        asked.append((request.url.host, now[0]))
        if request.url.host == "shop.test":
            return httpx.Response(301, headers={"Location": "https://www.shop.test/robots.txt"})
        return httpx.Response(200, text="User-agent: *\nDisallow: /\n")

    limiter = HostLimiter(requests_per_second=1000, max_concurrency=2, sleep=sleep, clock=lambda: now[0])

    async def main():
        assert limiter.pause("www.shop.test", 5.0)
        async with _client(handler) as client:
            return await RobotsCache(limiter=limiter).check(client, "http://shop.test/a", UA)

    assert asyncio.run(main()).reason == "robots_disallowed"
    assert asked == [("shop.test", 0.0), ("www.shop.test", 5.0)] and slept == [5.0]


def test_a_robots_redirect_loop_allows_all_after_the_clients_limit():
    asked = []

    def handler(request: httpx.Request) -> httpx.Response:
        asked.append(request.url.path)
        return httpx.Response(302, headers={"Location": f"/robots-{len(asked)}.txt"})

    async def main():
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler), max_redirects=5) as client:
            return await RobotsCache().check(client, "http://shop.test/a", UA)

    decision = asyncio.run(main())
    assert decision.allowed and "redirected too often" in decision.detail
    assert len(asked) == 6  # the request and 5 redirects followed


def test_one_fetch_for_concurrent_askers():
    requests: list[httpx.Request] = []

    async def handler(request: httpx.Request) -> httpx.Response:
        requests.append(request)
        await asyncio.sleep(0.05)  # keep the first fetch in flight while the others ask
        return httpx.Response(200, text=ROBOTS)

    async def main():
        cache = RobotsCache()
        async with _client(handler) as client:
            same_host = await asyncio.gather(
                *(cache.allowed(client, f"http://shop.test/private/{i}", UA) for i in range(10))
            )
            other_host = await cache.allowed(client, "http://other.test/private/1", UA)
        return same_host, other_host

    same_host, other_host = asyncio.run(main())
    assert same_host == [False] * 10
    assert other_host is False
    assert [str(r.url) for r in requests] == ["http://shop.test/robots.txt", "http://other.test/robots.txt"]


def test_robots_fetch_takes_a_host_slot():
    limiter = HostLimiter(requests_per_second=1000, max_concurrency=1)

    async def main():
        async with _client(_robots_handler(404)) as client:
            async with limiter.slot("shop.test"):
                pending = asyncio.create_task(RobotsCache(limiter=limiter).check(client, "http://shop.test/a", UA))
                await asyncio.sleep(0.1)
                blocked = not pending.done()
            return blocked, await asyncio.wait_for(pending, 5)

    blocked, decision = asyncio.run(main())
    assert blocked is True
    assert decision.allowed is True


@pytest.mark.parametrize(("robots", "interval"), [
    ("User-agent: *\nCrawl-delay: 0.3\n", 0.3),  # slower than the spec's rate: obeyed
    ("User-agent: *\nCrawl-delay: 0.001\n", 0.05),  # faster: the spec's rate (20/s) stays
    ("User-agent: *\nCrawl-delay: 86400\n", MAX_CRAWL_DELAY_S),  # capped
    ("User-agent: otherbot\nCrawl-delay: 5\n", 0.05),  # another crawler's group
    ("User-agent: *\nCrawl-delay: soon\n", 0.05),  # no number
])
def test_a_crawl_delay_slows_the_hosts_requests_when_longer_than_the_rate(robots, interval):
    """robots.txt's Crawl-delay (not in RFC 9309, still how sites ask for a slower pace) was
    ignored: 0.5 s apart under "Crawl-delay: 3"."""
    limiter = HostLimiter(requests_per_second=20, max_concurrency=4)
    started: list[float] = []
    notes: list[str] = []

    async def main():
        async def robots_txt(request: httpx.Request) -> httpx.Response:
            started.append(time.monotonic())  # when robots.txt was asked: the first slot
            return httpx.Response(200, text=robots)

        async with _client(robots_txt) as client:
            assert (await RobotsCache(limiter=limiter, note=notes.append).check(client, "http://shop.test/a", UA)).allowed
            if interval < 1:
                async def one():
                    async with limiter.slot("shop.test"):
                        started.append(time.monotonic())
                await asyncio.gather(*(one() for _ in range(3)))

    asyncio.run(main())
    assert limiter.interval_s("Shop.Test") == pytest.approx(interval)
    if len(started) > 1:  # every slot after robots.txt's that far apart, the first too (it came 1 ms after)
        gaps = [b - a for a, b in zip(started, started[1:])]
        assert min(gaps) >= interval * 0.8
    slowed = interval > 0.05
    assert bool(notes) is slowed  # said in the run's log (a module logger's INFO line reached no one)
    if slowed:
        assert notes[0].startswith("http://shop.test/robots.txt asks for Crawl-delay ")


def test_a_damaged_or_slower_handoff_makes_the_next_run_wait_only_what_it_must():
    """A handoff file's numbers that are none (an int too large for a float stopped the run)
    wait for nothing; a slower earlier run's pace is not carried over, its Crawl-delay is
    (robots.txt is not read yet when the first request waits)."""
    limiter = HostLimiter(requests_per_second=5, max_concurrency=1)
    now = 1_000_000.0
    for damaged in ({"last_request_at": 10 ** 400}, {"paused_until": "soon"}, {"last_request_at": float("nan")},
                    {"paused_until": True}, {}):
        assert limiter.take_over("shop.test", damaged, now=now, max_wait_s=120) == 0.0
    assert limiter.take_over("shop.test", {"last_request_at": now, "crawl_delay_s": None}, now=now,
                             max_wait_s=120) == pytest.approx(0.2)  # this run's 5/s, not the last run's 0.1/s
    later = HostLimiter(requests_per_second=5, max_concurrency=1)
    assert later.take_over("shop.test", {"last_request_at": now, "crawl_delay_s": 3.0}, now=now,
                           max_wait_s=120) == pytest.approx(3.0)


def test_a_robots_txt_retry_after_pauses_the_host_so_the_next_run_waits_too():
    """robots.txt answering "429 Retry-After: 5" slept between its own attempts only: nothing
    paused the host, so nothing was handed to the next run (it asked again 0.5 s later)."""
    limiter = HostLimiter(requests_per_second=100, max_concurrency=1)

    async def main():
        async def too_many(request: httpx.Request) -> httpx.Response:
            return httpx.Response(429, headers={"Retry-After": "5"})

        async with _client(too_many) as client:
            return await RobotsCache(limiter=limiter, max_attempts=1).check(client, "http://shop.test/a", UA)

    decision = asyncio.run(main())
    assert decision.reason == "robots_unreachable"
    handoff = limiter.handoff("shop.test")
    assert handoff["paused_until"] == pytest.approx(time.time() + 5, abs=1)


def test_host_limiter_caps_concurrency():
    limiter = HostLimiter(requests_per_second=1000, max_concurrency=3)
    in_flight = 0
    max_in_flight = 0

    async def request():
        nonlocal in_flight, max_in_flight
        async with limiter.slot("shop.test"):
            in_flight += 1
            max_in_flight = max(max_in_flight, in_flight)
            await asyncio.sleep(0.05)
            in_flight -= 1

    async def main():
        await asyncio.gather(*(request() for _ in range(12)))

    asyncio.run(main())
    assert max_in_flight == 3
    assert in_flight == 0


def test_host_limiter_spaces_requests_by_the_rate():
    rps = 20.0
    slots = 6
    limiter = HostLimiter(requests_per_second=rps, max_concurrency=10)
    started: list[float] = []

    async def request():
        async with limiter.slot("shop.test"):
            started.append(time.monotonic())

    async def main():
        await asyncio.gather(*(request() for _ in range(slots)))

    asyncio.run(main())
    took_s = max(started) - min(started)
    expected_s = (slots - 1) / rps  # 0.25 s
    assert took_s >= expected_s * 0.8
    assert took_s < expected_s + 2.0  # generous: only guards against "waits far too long"


def test_host_limiter_hosts_are_independent_and_case_insensitive():
    limiter = HostLimiter(requests_per_second=1000, max_concurrency=1)

    async def main():
        async with limiter.slot("shop.test"):
            same_host = asyncio.create_task(_enter(limiter, "SHOP.test"))
            # Another host is not blocked by shop.test's only slot.
            await asyncio.wait_for(_enter(limiter, "other.test"), 5)
            await asyncio.sleep(0.05)
            blocked = not same_host.done()
        await asyncio.wait_for(same_host, 5)
        return blocked

    assert asyncio.run(main()) is True


def test_a_pause_holds_new_slots_of_its_host_until_it_ends():
    """A 429/503's Retry-After pauses the host: no slot is given to it before the pause ends;
    a shorter pause changes nothing, a longer one made while a slot waits is waited out too."""
    now, slept = [0.0], []

    async def sleep(seconds):
        slept.append(seconds)
        if len(slept) == 1:  # another 429 arrives while the first wait runs
            assert limiter.pause("shop.test", 7.0)
        now[0] += seconds

    limiter = HostLimiter(requests_per_second=1000, max_concurrency=2, sleep=sleep, clock=lambda: now[0])

    async def main():
        assert limiter.pause("Shop.test", 5.0)
        assert not limiter.pause("shop.test", 3.0)  # ends earlier: the running pause stands
        assert not limiter.pause("shop.test", 0.0)
        await _enter(limiter, "other.test")  # another host is not paused
        assert slept == []
        await _enter(limiter, "shop.test")
        assert slept == [5.0, 2.0] and now[0] == 7.0  # 5 s, then what the pause made at 0 s + 7 s left
        await _enter(limiter, "shop.test")  # over: no wait
        assert slept == [5.0, 2.0]

    asyncio.run(main())


def test_a_pause_holds_requests_that_were_waiting_for_the_rate_too():
    """Four requests hold the host's permits, three of them queued on the rate (4 a second);
    the first one's answer, 0.3 s later, pauses the host for 0.6 s: of the others, none goes
    out during the pause (one went out before it; real clock)."""
    limiter = HostLimiter(requests_per_second=4, max_concurrency=4)

    async def main():
        loop = asyncio.get_running_loop()
        entered = {}

        async def request(name):
            async with limiter.slot("shop.test"):
                entered[name] = loop.time()
                if name == "a":  # its answer, 0.3 s later: 429, Retry-After 0.6 s
                    await asyncio.sleep(0.3)
                    assert limiter.pause("shop.test", 0.6)
                    entered["paused"] = loop.time()

        await asyncio.gather(*(request(name) for name in "abcd"))
        return entered

    entered = asyncio.run(main())
    paused = entered["paused"]
    after = [entered[n] for n in "bcd" if entered[n] >= paused]
    assert len(after) >= 2 and min(after) >= paused + 0.6 - 0.02, {k: round(v - paused, 3) for k, v in entered.items()}


async def _enter(limiter: HostLimiter, host: str) -> None:
    async with limiter.slot(host):
        pass


@pytest.mark.parametrize(
    ("rps", "concurrency", "message"),
    [(0, 1, "requests_per_second must be > 0"), (1, 0, "max_concurrency must be >= 1")],
)
def test_host_limiter_rejects_bad_limits(rps, concurrency, message):
    with pytest.raises(ValueError, match=message):
        HostLimiter(requests_per_second=rps, max_concurrency=concurrency)


def test_within_deadline_returns_the_result_or_times_out():
    async def main():
        assert await within_deadline(1, asyncio.sleep(0, result="page")) == "page"
        with pytest.raises(TimeoutError):
            await within_deadline(0.01, asyncio.sleep(5))

    asyncio.run(main())


def test_within_deadline_does_not_swallow_a_cancel_that_arrives_as_the_work_ends():
    """The race of ``asyncio.wait_for`` before 3.12: the work is done, the caller cancelled: cancelled wins."""

    async def main():
        answer = asyncio.get_running_loop().create_future()
        task = asyncio.create_task(within_deadline(10, answer))
        await asyncio.sleep(0)  # the task now waits for the answer
        answer.set_result("page")
        task.cancel()  # in the same loop iteration: both are pending for the task
        try:
            await task
        except asyncio.CancelledError:
            return "cancelled"
        return "swallowed"

    assert asyncio.run(main()) == "cancelled"


def test_robots_txt_is_read_up_to_512_kib_and_the_rest_is_dropped():
    """RFC 9309 §2.5: at least the first 500 KiB are parsed; ours reads 512 KiB
    (ROBOTS_MAX_BYTES) and drops what follows, even when it arrived in the same chunk."""
    from scrape_assets.politeness import ROBOTS_MAX_BYTES

    head, edge, late = "User-agent: *\nDisallow: /private/\n", "Disallow: /edge/\n", "Disallow: /late/\n"
    room = ROBOTS_MAX_BYTES - len(head) - len(edge)
    padding = ("#" * 99 + "\n") * (room // 100) + "#" * (room % 100 - 1) + "\n"
    body = head + padding + edge + late
    assert len((head + padding + edge).encode()) == ROBOTS_MAX_BYTES  # /edge/ ends the 512 KiB, /late/ follows

    async def main():
        cache = RobotsCache()
        async with _client(_robots_handler(200, body)) as client:
            return [(await cache.check(client, f"http://shop.test/{path}/a.html", UA)).allowed
                    for path in ("private", "edge", "late", "catalogue")]

    assert asyncio.run(main()) == [False, False, True, True]


def test_a_request_error_of_no_known_kind_is_retried_as_a_network_failure():
    """An httpx.RequestError that retry.classify_exception does not know (a TypeError there)
    is taken for a network failure: retried, not the origin refused at once."""
    requests: list[httpx.Request] = []
    sleeps = _Sleeps()

    def handler(request: httpx.Request) -> httpx.Response:
        requests.append(request)
        if len(requests) == 1:
            raise httpx.RequestError("something odd", request=request)
        return httpx.Response(200, text=ROBOTS)

    async def main():
        cache = RobotsCache(max_attempts=3, sleep=sleeps, rng=random.Random(7))
        async with _client(handler) as client:
            return (await cache.check(client, "http://shop.test/private/x.html", UA),
                    await cache.check(client, "http://shop.test/catalogue/", UA))

    private, public = asyncio.run(main())
    assert (private.allowed, private.reason, public.allowed) == (False, "robots_disallowed", True)
    assert len(requests) == 2 and len(sleeps) == 1


@pytest.mark.parametrize("status", [203, 204])
def test_any_2xx_robots_txt_is_parsed_not_only_200(status):
    """RFC 9309 §2.3.1.1: a successful (2xx) answer is the file; a 203 from a caching proxy
    or a 204 (an empty file: everything allowed) is not "unreachable"."""
    async def main():
        cache = RobotsCache()
        async with _client(_robots_handler(status, ROBOTS if status != 204 else "")) as client:
            return (await cache.check(client, "http://shop.test/private/x.html", UA),
                    await cache.check(client, "http://shop.test/catalogue/", UA))

    private, public = asyncio.run(main())
    assert (public.allowed, public.reason, public.detail) == (True, None, "allowed by robots.txt")
    assert (private.allowed, private.reason) == ((False, "robots_disallowed") if status == 203 else (True, None))
