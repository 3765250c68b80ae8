"""A bound on the pages a run has in progress at once, so a crawl's memory does not grow with it.

A category's crawl learns its page count from page 1 and then has every other page to
fetch. Starting them all at once (one asyncio task each, all queued at the host's
concurrency slot) held every pending page of every category half-started: at 10,000
pages, 10,000 tasks with their request under way, about 4.5 KB each (~45 MB, the largest
part of ``raw_pages``'s own memory), ten times that at 100,000 pages. :class:`PageSlots`
lets a run start a page only when one of its ``size`` slots is free; the rest wait as page
numbers (their manifest entries), not as tasks.

- **Bound.** At most ``size`` pages hold a slot, plus at most ``size`` more waiting out a
  backoff without one (below): ``2 * size`` pages started and unfinished at most. Page 1
  of each category is fetched before its other pages are known, outside the slots.
- **Order.** A free slot goes to the waiting request with the lowest priority number (a
  category's place in the run), first come first served within one priority: categories
  are fetched one after another, as they were queued before, so a run's progress line
  counts whole categories done and a crashed run leaves whole categories complete.
- **Backoff.** A page waiting to retry (exponential backoff, a ``Retry-After``) gives its
  slot back while it sleeps (:meth:`PageSlots.sleep`, the fetcher's sleep between a
  page's attempts) and waits for one again afterwards, so pages failing slowly do not
  stall the healthy ones; when ``size`` pages already wait so, a page keeps its slot
  while it sleeps (a storm of 429s cannot start every page). A robots.txt fetch must not
  sleep this way: it holds its origin's lock, which the pages started in its place would
  wait for (:class:`~scrape_assets.fetcher.PageFetcher`'s ``robots_sleep``).
- **Size.** :func:`slots_for` gives ``max(256, 16 * max_concurrency)``: far more than the
  requests the host's concurrency lets out (the others wait there, queued as before), at
  ~4.5 KB a page a few MB at most.

Everything runs on one event loop (one ``asyncio.run``); nothing here is thread-safe.
"""

from __future__ import annotations

import asyncio
import contextvars
import heapq
import itertools
from dataclasses import dataclass
from typing import Any, Callable, Coroutine, TypeVar

T = TypeVar("T")

#: Fewest slots :func:`slots_for` gives, whatever the concurrency.
MIN_SLOTS = 256
#: Slots per request the host's concurrency allows (:func:`slots_for`).
SLOTS_PER_CONCURRENT_REQUEST = 16


def slots_for(max_concurrency: int) -> int:
    """Slots for a run whose per-host concurrency is ``max_concurrency`` (``>= 1``)."""
    if max_concurrency < 1:
        raise ValueError(f"max_concurrency must be >= 1, got {max_concurrency}")
    return max(MIN_SLOTS, SLOTS_PER_CONCURRENT_REQUEST * max_concurrency)


@dataclass
class _Hold:
    """The slot of the page running in this task (its context): held unless sleeping."""

    slots: "PageSlots"
    priority: int
    held: bool = True


_HOLD: contextvars.ContextVar[_Hold | None] = contextvars.ContextVar("scrape_assets_page_slot", default=None)


class PageSlots:
    """At most ``size`` pages holding a slot; free slots go to the lowest priority number first.

    Args:
        size: slots (``>= 1``).

    Raises:
        ValueError: ``size < 1``.
    """

    def __init__(self, size: int):
        if size < 1:
            raise ValueError(f"size must be >= 1, got {size}")
        self.size = size
        self._free = size
        # (priority, arrival, future): a future resolved True is a slot given; False (or
        # cancelled) a request withdrawn, skipped when its turn comes. Invariant: while
        # _free > 0 no live request waits (release gives to a waiter before freeing).
        self._waiting: list[tuple[int, int, asyncio.Future]] = []
        self._arrival = itertools.count()
        self._slotless = 0  # pages started that gave their slot back for a backoff (<= size)

    @property
    def free(self) -> int:
        """Slots not in use."""
        return self._free

    def request(self, priority: int) -> asyncio.Future:
        """A future resolved ``True`` once a slot is this caller's (at once when one is free).

        Give the slot back with :meth:`release`; give up waiting with :meth:`withdraw`.
        """
        future = asyncio.get_running_loop().create_future()
        if self._free > 0:
            self._free -= 1
            future.set_result(True)
        else:
            heapq.heappush(self._waiting, (priority, next(self._arrival), future))
        return future

    def withdraw(self, future: asyncio.Future) -> None:
        """Stop waiting on ``future`` from :meth:`request`; a slot it was given is released."""
        if not future.done():
            future.set_result(False)
        elif not future.cancelled() and future.result():
            self.release()

    def release(self) -> None:
        """Give a slot back: to the waiting request of the lowest priority number, else to the free ones."""
        while self._waiting:
            _, _, future = heapq.heappop(self._waiting)
            if not future.done():
                future.set_result(True)
                return
        if self._free >= self.size:
            raise RuntimeError("PageSlots.release() without a slot taken")
        self._free += 1

    async def acquire(self, priority: int) -> None:
        """Wait for a slot (cancel-safe: a slot given as the wait is cancelled is released)."""
        future = self.request(priority)
        try:
            await future
        except asyncio.CancelledError:
            self.withdraw(future)
            raise

    async def sleep(self, delay_s: float) -> None:
        """Sleep ``delay_s`` seconds, giving the calling page's slot back meanwhile (the
        fetcher's backoff sleep) unless ``size`` pages already wait so; then wait for a slot.
        Outside a page started by :func:`run_within`, a plain sleep."""
        hold = _HOLD.get()
        if hold is None or hold.slots is not self or not hold.held or self._slotless >= self.size:
            await asyncio.sleep(delay_s)
            return
        hold.held = False
        self._slotless += 1
        try:
            self.release()
            await asyncio.sleep(delay_s)
            await self.acquire(hold.priority)
            hold.held = True
        finally:
            self._slotless -= 1


async def _holding(hold: _Hold, coro: Coroutine[Any, Any, T]) -> T:
    _HOLD.set(hold)  # this task's context only
    return await coro


async def run_within(slots: PageSlots, priority: int, coros,
                     on_other_error: Callable[[BaseException], None] | None = None) -> None:
    """Run ``coros`` (an iterable, pulled lazily), each once a slot is free; results are dropped.

    A coroutine is made (``next``) just before it asks for its slot and started once it
    has one; its task gives the slot back when it ends. Only unfinished tasks are kept, so
    a category of 100,000 pages costs no more than one of 100. If one raises: none is
    started after it, the others are cancelled and waited for, and the first error (in
    ``coros`` order among those that had failed by then) is raised, the others going to
    ``on_other_error``, as :func:`~scrape_assets.crawl.all_or_cancel` does.
    """
    iterator = iter(coros)
    live: set[asyncio.Task] = set()
    failures: list[tuple[int, BaseException]] = []  # (index in coros, error), as they end
    changed = asyncio.Event()
    waiter: asyncio.Future | None = None
    ahead: Coroutine | None = None  # made, not started yet

    def ended(task: asyncio.Task, index: int, hold: _Hold, coro: Coroutine) -> None:
        live.discard(task)
        if hold.held:
            hold.held = False
            slots.release()
        if task.cancelled():
            coro.close()  # cancelled before it ran: not "never awaited"
        elif (error := task.exception()) is not None:  # retrieved: no "never retrieved" warning
            failures.append((index, error))
            if waiter is not None and not waiter.done():
                slots.withdraw(waiter)  # wake the loop below (granted False): no more pages start
        changed.set()

    try:
        for index, coro in enumerate(iterator):
            ahead = coro
            if failures:
                break
            waiter = slots.request(priority)
            try:
                granted = await waiter
            except asyncio.CancelledError:
                slots.withdraw(waiter)
                raise
            finally:
                waiter = None
            if not granted:
                break
            if failures:
                slots.release()
                break
            hold = _Hold(slots, priority)
            task = asyncio.ensure_future(_holding(hold, coro))
            ahead = None
            live.add(task)
            task.add_done_callback(lambda t, i=index, h=hold, c=coro: ended(t, i, h, c))
        while live and not failures:
            changed.clear()
            await changed.wait()
    finally:  # also when this coroutine is cancelled: nothing is left running behind it
        if ahead is not None:
            ahead.close()
        pending = list(live)
        # Failed by now: those whose `ended` ran, and those done whose `ended` is queued (it
        # runs before any cancelled task's): the first error is chosen among them.
        cancelling_from = len(failures) + sum(
            1 for task in pending if task.done() and not task.cancelled() and task.exception() is not None)
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
    if failures:
        # The errors that set off the cancelling first (in coros order), then those raised
        # while being cancelled.
        first = sorted(failures[:cancelling_from], key=lambda f: f[0]) + failures[cancelling_from:]
        for _, other in first[1:]:
            if on_other_error is not None:
                on_other_error(other)
        raise first[0][1]
