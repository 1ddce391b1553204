"""The loop a `threads` worker's tasks share: their coroutines overlap, and none outlives its limit.

`LoopThread` is what lets one worker process keep several attempts in flight: each Celery thread
hands its coroutine over and blocks, while the one loop interleaves them all.
"""

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from actonce.worker.process.runtime import LoopThread


def test_coroutines_from_several_threads_run_at_once_on_the_one_loop() -> None:
    # Given a loop, and coroutines that each wait until all of them have started
    loop = LoopThread()
    callers = 4
    started = 0
    all_started: asyncio.Event | None = None

    async def meet(index: int) -> tuple[int, str]:
        nonlocal started, all_started
        all_started = all_started or asyncio.Event()
        started += 1
        if started == callers:
            all_started.set()
        # Only finishes if the others run meanwhile: one at a time, it would wait for ever.
        await asyncio.wait_for(all_started.wait(), timeout=10)
        return index, threading.current_thread().name

    # When as many threads as coroutines each hand one over
    try:
        with ThreadPoolExecutor(callers) as threads:
            results = list(threads.map(lambda i: loop.run(meet(i)), range(callers)))
    finally:
        loop.close()

    # Then every one finished, each on the loop's own thread
    assert results == [(i, "actonce-loop") for i in range(callers)]


def test_a_coroutine_past_its_limit_is_cancelled_and_the_caller_told() -> None:
    # Given a coroutine that would wait far longer than its limit
    loop = LoopThread()
    cancelled = threading.Event()

    async def linger() -> None:
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    # When it is run with a limit of a tenth of a second
    try:
        with pytest.raises(TimeoutError, match="cancelled"):
            loop.run(linger(), timeout_s=0.1)
        # Then it was cancelled on the loop, which serves on
        assert cancelled.wait(5)
        assert loop.run(asyncio.sleep(0, result="served")) == "served"
    finally:
        loop.close()


def test_closing_cancels_what_still_runs_and_refuses_more() -> None:
    # Given a task left running on the loop in the background
    loop = LoopThread()
    cancelled = threading.Event()

    async def background() -> None:
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    async def start() -> None:
        asyncio.get_running_loop().create_task(background())
        await asyncio.sleep(0)

    loop.run(start())

    # When the loop is closed
    loop.close()

    # Then the task was cancelled, and the loop takes no more coroutines
    assert cancelled.is_set()
    with pytest.raises(RuntimeError, match="after close"):
        loop.run(asyncio.sleep(0))
    loop.close()  # a second close does nothing
