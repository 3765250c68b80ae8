"""The bound on pages in progress (scrape_assets.page_slots): order, no leaks, backoff, first error."""

from __future__ import annotations

import asyncio
import gc
import logging
import socket
import warnings
import weakref

import pytest

from scrape_assets.crawl import all_or_cancel
from scrape_assets.faults import FaultSpec, make_fault_server
from scrape_assets.page_slots import MIN_SLOTS, PageSlots, slots_for
from scrape_assets_tests.conftest import serving
from scrape_assets_tests.fault_scenarios import DAY, fault_server, page_path


def test_slots_for_scales_with_concurrency_from_a_floor():
    assert [slots_for(c) for c in (1, 16, 64)] == [MIN_SLOTS, 256, 1024]
    with pytest.raises(ValueError, match="max_concurrency must be >= 1, got 0"):
        slots_for(0)
    with pytest.raises(ValueError, match="size must be >= 1, got 0"):
        PageSlots(0)


def test_free_slots_go_to_the_lowest_priority_then_first_come():
    async def main():
        slots = PageSlots(1)
        await slots.acquire(5)
        order = []

        async def waiter(name, priority):
            await slots.acquire(priority)
            order.append(name)
            slots.release()

        tasks = [asyncio.ensure_future(waiter(n, p)) for n, p in (("late-2", 2), ("first-0", 0), ("second-0", 0), ("1", 1))]
        await asyncio.sleep(0)
        assert order == [] and slots.free == 0
        slots.release()
        await asyncio.gather(*tasks)
        return order, slots.free

    assert asyncio.run(main()) == (["first-0", "second-0", "1", "late-2"], 1)


def test_a_cancelled_or_withdrawn_wait_leaks_no_slot():
    async def main():
        slots = PageSlots(2)
        await slots.acquire(0)
        await slots.acquire(0)
        waiting = asyncio.ensure_future(slots.acquire(0))
        await asyncio.sleep(0)
        waiting.cancel()  # cancelled while waiting: never had a slot
        withdrawn = slots.request(0)
        slots.release()  # goes to `withdrawn` (the cancelled wait is skipped)
        assert withdrawn.result() is True
        slots.withdraw(withdrawn)  # a slot given, then withdrawn: back to the free ones
        slots.release()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        return slots.free

    assert asyncio.run(main()) == 2


def test_release_without_a_slot_taken_is_an_error():
    async def main():
        PageSlots(1).release()

    with pytest.raises(RuntimeError, match="without a slot taken"):
        asyncio.run(main())


def test_coroutines_are_made_only_when_a_slot_is_free():
    """What bounds memory: never more than `size` pages started, one made ahead, the rest not made."""
    async def main():
        slots = PageSlots(3)
        made, ended, running, most = [], [], 0, 0
        gate = asyncio.Event()

        async def page(n):
            nonlocal running, most
            running += 1
            most = max(most, running)
            await gate.wait()
            running -= 1
            ended.append(n)

        def pages():
            for n in range(10):
                made.append(n)
                yield page(n)

        run = asyncio.ensure_future(all_or_cancel(pages(), slots=slots))
        for _ in range(5):
            await asyncio.sleep(0)
        made_before = list(made)
        gate.set()
        return made_before, await run, ended, most, slots.free

    made_before, result, ended, most, free = asyncio.run(main())
    assert made_before == [0, 1, 2, 3]  # 3 started, the 4th waiting for a slot
    assert result is None and sorted(ended) == list(range(10)) and most == 3 and free == 3


def test_finished_pages_are_not_kept_while_the_others_run():
    """A category of 100,000 pages must not keep 100,000 finished tasks until its end."""
    async def main():
        slots = PageSlots(4)
        refs, alive_early = [], []

        async def page(n):
            refs.append(weakref.ref(asyncio.current_task()))
            if n == 999:
                gc.collect()
                alive_early.append(sum(ref() is not None for ref in refs[:900]))
            await asyncio.sleep(0)

        await all_or_cancel((page(n) for n in range(1000)), slots=slots)
        return alive_early, slots.free

    assert asyncio.run(main()) == ([0], 4)


def test_a_category_ends_when_its_pages_do_not_when_earlier_ones_have_all_started():
    async def main():
        slots = PageSlots(2)
        loop = asyncio.get_running_loop()
        start = loop.time()

        async def page(seconds):
            await asyncio.sleep(seconds)

        async def category(priority, durations):
            await all_or_cancel((page(seconds) for seconds in durations), slots=slots, priority=priority)
            return loop.time() - start

        later = asyncio.ensure_future(category(1, [0.03, 0.06]))  # starts both pages at once
        await asyncio.sleep(0)
        first = asyncio.ensure_future(category(0, [0.1] * 20))  # then takes every slot freed for ~1 s
        return await later, await first

    later_s, first_s = asyncio.run(main())
    assert later_s < 0.5 < first_s


def test_a_failure_stops_the_starting_even_while_waiting_for_a_slot():
    async def main():
        slots = PageSlots(2)
        made = []

        async def page(n):
            if n == 1:
                await asyncio.sleep(0.01)
                raise OSError("disk full")
            await asyncio.sleep(30)  # would still be running: cancelled by the failure

        def pages():
            for n in range(100):
                made.append(n)
                yield page(n)

        with pytest.raises(OSError, match="disk full"):
            await asyncio.wait_for(all_or_cancel(pages(), slots=slots), 10)
        return made, slots.free

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # page 2, made but never started, is closed: no RuntimeWarning
        made, free = asyncio.run(main())
        gc.collect()
    assert made == [0, 1, 2] and free == 2


def test_the_first_failure_in_page_order_is_raised_the_others_reported():
    async def main():
        slots = PageSlots(4)
        others = []

        async def page(n):
            await asyncio.sleep(0.01)
            if n in (1, 2):
                raise ValueError(f"page {n}")

        with pytest.raises(ValueError, match="page 1"):
            await all_or_cancel((page(n) for n in range(4)), others.append, slots=slots)
        return [str(e) for e in others], slots.free

    assert asyncio.run(main()) == (["page 2"], 4)


def test_cancelling_the_run_cancels_its_pages_frees_every_slot_and_warns_of_nothing():
    async def main():
        slots = PageSlots(2)

        async def page(n):
            await asyncio.sleep(30)

        run = asyncio.ensure_future(all_or_cancel((page(n) for n in range(10)), slots=slots))
        await asyncio.sleep(0.01)
        run.cancel()
        with pytest.raises(asyncio.CancelledError):
            await run
        return slots.free

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # "coroutine ... was never awaited" would be a RuntimeWarning
        assert asyncio.run(main()) == 2
        gc.collect()


def test_a_page_backing_off_gives_its_slot_to_another_page():
    async def main():
        slots = PageSlots(1)
        log = []

        async def retrying():
            log.append("retrying: attempt 1")
            await slots.sleep(0.05)  # the fetcher's backoff sleep
            log.append("retrying: attempt 2")

        async def other():
            log.append("other")

        await asyncio.gather(all_or_cancel([retrying()], slots=slots, priority=0),
                             all_or_cancel([other()], slots=slots, priority=1))
        await slots.sleep(0)  # outside a page: a plain sleep
        return log, slots.free

    assert asyncio.run(main()) == (["retrying: attempt 1", "other", "retrying: attempt 2"], 1)


def test_a_storm_of_backoffs_starts_at_most_twice_the_slots():
    """Every page backing off once must not start every page (each would hold its task)."""
    async def main():
        slots = PageSlots(4)
        started = most = 0

        async def page(n):
            nonlocal started, most
            started += 1
            most = max(most, started)
            await slots.sleep(0.01)  # a 429 with Retry-After, once
            started -= 1

        await all_or_cancel((page(n) for n in range(200)), slots=slots)
        return most, slots.free

    assert asyncio.run(main()) == (8, 4)


def test_a_crawl_fetches_categories_in_order_and_a_backoff_does_not_stall_it(tmp_path, monkeypatch):
    """raw_pages's crawl over a real socket with one page slot: category order kept, and the
    pages of the next category are fetched while a page waits out its back-off (a 502 with
    Retry-After: a page's own wait; a 429's or 503's pauses the whole host, test_faults.py)."""
    from scrape_assets import page_slots
    from scrape_assets.defs.assets.raw_pages import crawl_partitions
    from scrape_assets.defs.resources import ObjectStoreResource, SiteResource

    monkeypatch.setattr(page_slots, "slots_for", lambda max_concurrency: 1)
    retried = page_path("nonfiction", 2)
    spec = FaultSpec.model_validate({"rules": [
        {"match": retried.replace(".", r"\.") + "$", "fault": "http_error", "status": 502, "first_n": 1,
         "retry_after_s": 1},
    ]})
    with fault_server(spec) as server:
        site = SiteResource(site="demo", base_url=server.base_url, requests_per_second=1000, max_concurrency=1)
        reports = asyncio.run(crawl_partitions(site, ObjectStoreResource(url=str(tmp_path / "objects")),
                                               ["nonfiction", "default"], new_snapshot=False, log=logging.getLogger("t")))
        paths = [r.path for r in server.requests if r.path != "/robots.txt"]
    assert [(r.pages_done, r.pages_failed) for r in reports] == [(6, 0), (12, 0)]
    first, second = paths.index(retried), len(paths) - 1 - paths[::-1].index(retried)
    later = {"nonfiction": [page_path("nonfiction", n) for n in range(3, 7)],
             "default": [page_path("default", n) for n in range(2, 13)]}
    # Priority: the later pages of the first category go before the second's; at most one of
    # the second's (the one slot) may start first, if its page 1 came back before the first's.
    last_first_category = max(paths.index(p) for p in later["nonfiction"])
    assert sum(paths.index(p) < last_first_category for p in later["default"]) <= 1
    # The 1-s wait gave the slot back: the second category went on meanwhile (all its
    # later pages but the one that may have started first).
    assert sum(first < paths.index(p) < second for p in later["default"]) >= len(later["default"]) - 1


def test_a_resumed_crawl_whose_robots_txt_fails_once_does_not_hang(tmp_path, monkeypatch):
    """Regression: on resume page 1 is done, so robots.txt is first fetched inside a page's
    slot. Its retry must not give that slot away: the pages started in its place would wait
    for the robots lock it holds, every slot taken, and the crawl would hang."""
    from scrape_assets import page_slots
    from scrape_assets.defs.assets.raw_pages import crawl_partitions
    from scrape_assets.defs.resources import ObjectStoreResource, SiteResource

    monkeypatch.setattr(page_slots, "slots_for", lambda max_concurrency: 2)
    with socket.socket() as probe:  # one port for both runs: the base URL is in the fetch config
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    store = ObjectStoreResource(url=str(tmp_path / "objects"))

    def crawl(rules, timeout_s):
        server = make_fault_server(FaultSpec.model_validate({"rules": rules}), "127.0.0.1", port, day=DAY)
        with serving(server):
            site = SiteResource(site="demo", base_url=server.base_url, requests_per_second=1000, max_concurrency=1)
            try:
                return asyncio.run(asyncio.wait_for(crawl_partitions(
                    site, store, ["default"], new_snapshot=False, log=logging.getLogger("t")), timeout_s))
            except asyncio.TimeoutError:
                return None

    # Run 1 dies (here: is cancelled) with page 1 done and pages 2..12 stalled in flight.
    assert crawl([{"match": r"default_15/page-\d+\.html$", "fault": "stall_after_headers", "max_stall_s": 30}], 2) is None
    # Run 2 resumes; robots.txt answers 503 once.
    reports = crawl([{"match": r"/robots\.txt$", "fault": "http_error", "status": 503, "first_n": 1, "retry_after_s": 0}], 30)
    assert reports is not None, "the resumed crawl hung"
    assert [(r.resumed, r.pages_done, r.pages_failed) for r in reports] == [(True, 12, 0)]


@pytest.mark.parametrize("with_slots", [False, True])
@pytest.mark.parametrize("steps_later", [0, 1, 2])
def test_a_lower_page_failing_just_after_a_higher_one_is_the_error_raised(with_slots, steps_later):
    """Page 1 fails first; page 0 fails `steps_later` loop steps after. Done before the
    cancelling starts (0 or 1 step): page 0's error is raised, the first in page order, with
    or without slots. Later (2 steps), page 0 is cancelled first and page 1's is raised."""
    async def main():
        page1_failed = asyncio.get_running_loop().create_future()

        async def page0():
            await page1_failed
            for _ in range(steps_later):
                await asyncio.sleep(0)
            raise ValueError("page 0")

        async def page1():
            await asyncio.sleep(0)
            page1_failed.set_result(None)
            raise ValueError("page 1")

        others = []
        slots = PageSlots(4) if with_slots else None
        with pytest.raises(ValueError) as raised:
            await all_or_cancel([page0(), page1()], others.append, slots=slots)
        return str(raised.value), [str(e) for e in others]

    assert asyncio.run(main()) == (("page 0", ["page 1"]) if steps_later < 2 else ("page 1", []))


def test_a_run_cancelled_as_its_last_category_fails_leaves_no_unretrieved_exception():
    """crawl_partitions's categories (no slots): the step stopped just as one fails."""
    async def main():
        loop = asyncio.get_running_loop()
        reported = []
        loop.set_exception_handler(lambda _loop, context: reported.append(context["message"]))
        run = None

        async def done():
            return "category A"

        async def fails():
            await asyncio.sleep(0)
            loop.call_soon(loop.call_soon, run.cancel)  # the step is stopped as this fails
            raise OSError("category B: storage down")

        run = asyncio.ensure_future(all_or_cancel([done(), fails()]))
        with pytest.raises(asyncio.CancelledError):
            await run
        del run
        gc.collect()
        await asyncio.sleep(0)
        return reported

    assert asyncio.run(main()) == []


def test_a_failure_stops_a_category_whose_freed_slot_went_to_another_category():
    """Category x (priority 1) has one slot's page failing while its next page waits for a slot;
    category y (priority 0) waits too, so the slot the failure frees goes to y. x must still stop
    at once (its wait withdrawn), not when y's long page gives a slot back."""
    async def main():
        slots = PageSlots(1)
        y_may_end = asyncio.Event()
        x_made = []

        async def x_page(n):
            if n == 0:
                await asyncio.sleep(0.05)
                raise OSError("disk full")
            await asyncio.sleep(30)

        def x_pages():
            for n in range(3):
                x_made.append(n)
                yield x_page(n)

        async def y_page():
            await y_may_end.wait()  # a slow page: holds the only slot

        x = asyncio.ensure_future(all_or_cancel(x_pages(), slots=slots, priority=1))
        await asyncio.sleep(0.01)  # x's page 0 holds the slot, its page 1 waits for one
        y = asyncio.ensure_future(all_or_cancel([y_page()], slots=slots, priority=0))
        try:
            with pytest.raises(OSError, match="disk full"):
                await asyncio.wait_for(asyncio.shield(x), 5)
            assert not y.done()  # y got the freed slot and is still on its page
        finally:
            y_may_end.set()
            await asyncio.gather(x, y, return_exceptions=True)
        return x_made, slots.free

    made, free = asyncio.run(main())
    assert made == [0, 1] and free == 1


def test_withdrawing_a_request_twice_frees_no_slot():
    """run_within withdraws its waiting request when a page fails, and again if it is cancelled
    before it wakes: the second withdraw of a request never granted must not free a slot."""
    async def main():
        slots = PageSlots(1)
        held = slots.request(0)
        waiting = slots.request(0)
        assert held.result() is True and not waiting.done()
        slots.withdraw(waiting)
        slots.withdraw(waiting)
        assert slots.free == 0  # the one slot is still held
        slots.release()
        return slots.free

    assert asyncio.run(main()) == 1


def test_a_page_cancelled_during_its_back_off_gives_back_no_slot_it_did_not_hold():
    """Page 0 is backing off (its slot given back) when page 1 fails: page 0 is cancelled in its
    sleep, and the slots come back to exactly their size, none released twice."""
    async def main():
        slots = PageSlots(2)
        loop_errors = []
        asyncio.get_running_loop().set_exception_handler(lambda _loop, context: loop_errors.append(context))

        async def page(n):
            if n == 0:
                await slots.sleep(30)  # the fetcher's back-off between two attempts
            await asyncio.sleep(0.05)
            raise OSError("disk full")

        with pytest.raises(OSError, match="disk full"):
            await asyncio.wait_for(all_or_cancel((page(n) for n in range(2)), slots=slots), 10)
        return slots.free, loop_errors

    free, loop_errors = asyncio.run(main())
    assert (free, loop_errors) == (2, [])
