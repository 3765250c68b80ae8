"""Stop an asyncio crawl on SIGINT or SIGTERM: cancel it, let it unwind, then say so.

Dagster turns SIGINT and SIGTERM (Ctrl-C, ``kill``, "Terminate" in the UI, which
interrupts the run worker) into ``DagsterExecutionInterruptedError`` raised in whatever
code runs when the signal arrives. Inside an event loop that is often a callback (a
socket's read handler, a timer), and asyncio logs and drops a ``BaseException`` there
that is not ``KeyboardInterrupt`` or ``SystemExit`` (``asyncio.events.Handle._run``), or
reads it as a failed read that the fetcher retries: the crawl goes on. While
:func:`run_interruptible` runs a coroutine, those two signals cancel its main task
instead (tasks unwind through their ``CancelledError`` handlers: pages in flight give
their attempt back, slots are released, journals closed) and :class:`CrawlInterrupted`
is raised once the loop is closed. A second signal during that cleanup raises
``KeyboardInterrupt`` at once, which ends the cleanup. The previous handlers are restored
before it returns.
"""

from __future__ import annotations

import asyncio
import signal
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")

#: The signals that stop a crawl (Ctrl-C and what Dagster's "Terminate" sends: SIGINT; kill: SIGTERM).
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class CrawlInterrupted(Exception):
    """The coroutine was cancelled by a signal.

    Attributes:
        signal_name: ``"SIGINT"`` or ``"SIGTERM"``.
    """

    def __init__(self, signal_name: str):
        super().__init__(f"interrupted by {signal_name}")
        self.signal_name = signal_name


def run_interruptible(coro: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run(coro)``, where SIGINT or SIGTERM cancel ``coro`` (see the module docstring).

    Outside the main thread (Python delivers signals there only) it is plain ``asyncio.run``.

    Raises:
        CrawlInterrupted: a signal arrived while ``coro`` ran (also when ``coro`` had just
            finished: it was asked to stop; and when a second signal cut the cleanup short:
            its ``KeyboardInterrupt`` is the cause).
    """
    if threading.current_thread() is not threading.main_thread():
        return asyncio.run(coro)
    received: list[signal.Signals] = []
    main_task: asyncio.Task | None = None

    def on_signal(signum: int, _frame) -> None:
        if received:
            raise KeyboardInterrupt  # the second: stop now, as Python's default SIGINT handler does
        received.append(signal.Signals(signum))
        # Handlers run in this (the loop's) thread: a task not done has its loop running. Once
        # it is done (the loop may be closed), a signal only marks the crawl interrupted.
        if main_task is not None and not main_task.done():
            main_task.get_loop().call_soon_threadsafe(main_task.cancel)

    async def main() -> T:
        nonlocal main_task
        main_task = asyncio.current_task()
        if received:  # arrived before the loop ran
            raise asyncio.CancelledError
        return await coro

    previous: dict[signal.Signals, object] = {}
    try:
        for s in STOP_SIGNALS:  # one at a time: a signal between two still finds each restored below
            previous[s] = signal.signal(s, on_signal)
        result = asyncio.run(main())
    except BaseException as exc:  # the cancellation, or what a task raised while unwinding, or a second signal
        if received:
            raise CrawlInterrupted(received[0].name) from (None if isinstance(exc, asyncio.CancelledError) else exc)
        raise
    finally:
        for s, handler in reversed(previous.items()):
            # None: a handler set outside Python, which cannot be put back: Python's default then.
            signal.signal(s, handler if handler is not None else
                          signal.default_int_handler if s == signal.SIGINT else signal.SIG_DFL)
        coro.close()  # never awaited when the signal came first: no "never awaited" warning
    if received:
        raise CrawlInterrupted(received[0].name)
    return result
