"""`run_to_soft_limit`: billiard's soft-limit signal cancels the running coroutine, which unwinds,
and the call raises `SoftTimeLimitExceeded`, on either event loop; elsewhere it is `Runner.run`.

The signal is real (`os.kill` of this process, from another thread, once the coroutine runs), and
so is billiard's handler, installed as a prefork child has it. `test_pool_soft_limit` shows the
same through real worker processes.
"""

import asyncio
import functools
import os
import signal
import threading
from collections.abc import Iterator

import pytest
from billiard.exceptions import SoftTimeLimitExceeded
from billiard.pool import soft_timeout_sighandler

from actonce.worker.process.interpreter import LoopChoice, new_event_loop
from actonce.worker.process.soft_limit import run_to_soft_limit, soft_limit_armed

LOOPS: list[LoopChoice] = ["uvloop", "asyncio"]


@pytest.fixture
def billiards_handler() -> Iterator[None]:
    """Install billiard's soft-limit handler, as in a prefork child, for one test."""
    previous = signal.signal(signal.SIGUSR1, soft_timeout_sighandler)
    try:
        yield
    finally:
        signal.signal(signal.SIGUSR1, previous)


def _signal_once(started: threading.Event) -> threading.Thread:
    """Send this process billiard's soft-limit signal once `started` is set."""

    def send() -> None:
        if started.wait(10):
            os.kill(os.getpid(), signal.SIGUSR1)

    thread = threading.Thread(target=send)
    thread.start()
    return thread


@pytest.mark.usefixtures("billiards_handler")
@pytest.mark.parametrize("loop", LOOPS)
def test_the_soft_limit_cancels_the_coroutine_which_unwinds_and_the_call_raises(
    loop: LoopChoice,
) -> None:
    # Given a coroutine that cleans up with an await when cancelled, as reflexr releases a lease
    started = threading.Event()
    unwound: list[str] = []

    async def long_attempt() -> str:
        started.set()
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            await asyncio.sleep(0)
            unwound.append("lease released")
            raise
        return "finished"

    with asyncio.Runner(loop_factory=functools.partial(new_event_loop, loop)) as runner:
        # When the soft limit's signal comes while it runs
        sender = _signal_once(started)
        with pytest.raises(SoftTimeLimitExceeded):
            run_to_soft_limit(runner, long_attempt())
        sender.join()
        # Then it unwound, billiard's handler is back, and the loop serves the next coroutine
        assert unwound == ["lease released"]
        assert signal.getsignal(signal.SIGUSR1) is soft_timeout_sighandler
        assert run_to_soft_limit(runner, asyncio.sleep(0, "next")) == "next"


@pytest.mark.usefixtures("billiards_handler")
@pytest.mark.parametrize("loop", LOOPS)
def test_a_coroutine_that_finishes_despite_the_cancellation_returns_its_result(
    loop: LoopChoice,
) -> None:
    started = threading.Event()

    async def stubborn() -> str:
        started.set()
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            return "finished anyway"
        return "finished"

    with asyncio.Runner(loop_factory=functools.partial(new_event_loop, loop)) as runner:
        sender = _signal_once(started)
        assert run_to_soft_limit(runner, stubborn()) == "finished anyway"
        sender.join()


def test_outside_a_prefork_child_it_is_the_runners_run_and_leaves_the_signal_alone() -> None:
    # Given no billiard handler for the signal (the dispatcher, the CLI)
    before = signal.getsignal(signal.SIGUSR1)
    assert before is not soft_timeout_sighandler
    assert not soft_limit_armed()
    # When a coroutine runs, then it is run, and the signal's handler is untouched
    with asyncio.Runner() as runner:
        assert run_to_soft_limit(runner, asyncio.sleep(0, "done")) == "done"
    assert signal.getsignal(signal.SIGUSR1) is before


@pytest.mark.usefixtures("billiards_handler")
def test_off_the_main_thread_the_signal_is_not_this_threads_to_take() -> None:
    armed: list[bool] = []
    thread = threading.Thread(target=lambda: armed.append(soft_limit_armed()))
    thread.start()
    thread.join()
    assert armed == [False]
    assert soft_limit_armed()
