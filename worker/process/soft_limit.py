"""Celery's soft time limit in a prefork child, as a cancellation of the task's coroutine.

billiard arms a task's soft limit by sending its child `SIGUSR1`, whose handler raises
`SoftTimeLimitExceeded` wherever the main thread happens to be. A child's task spends its time in
its coroutine, on the child's event loop, so the signal lands inside the loop's own machinery:
uvloop logs the exception as an error in a callback and the task runs on until the hard limit
kills the child; asyncio's loop lets it out of `run_until_complete`, leaving the coroutine, and
any turn it started, frozen in the stopped loop until the next task runs it again.

`run_to_soft_limit` takes the signal over while a coroutine runs: the signal cancels the
coroutine, which unwinds as cancelled code does (reflexr's executor releases the run's lease, a
turn is stopped), and the call then raises `SoftTimeLimitExceeded`, which the task handles where
it is called, as Celery's documentation asks. Outside a prefork child (no billiard handler for
the signal: the dispatcher, the CLI, a test) it is `Runner.run` and nothing more.
"""

import asyncio
import signal
import threading
from collections.abc import Coroutine
from types import FrameType
from typing import Any

from billiard.exceptions import SoftTimeLimitExceeded
from billiard.pool import SIG_SOFT_TIMEOUT, soft_timeout_sighandler


def run_to_soft_limit[T](runner: asyncio.Runner, coroutine: Coroutine[Any, Any, T]) -> T:
    """Run `coroutine` on `runner`, cancelling it if the task's soft time limit passes meanwhile.

    The coroutine may finish anyway (cancellation is a request): then its result is returned.

    Raises:
        SoftTimeLimitExceeded: If the soft limit passed and the coroutine ended cancelled.
    """
    if not soft_limit_armed():
        return runner.run(coroutine)
    passed: list[bool] = []  # set by the signal's handler
    try:
        return runner.run(_cancelled_at_soft_limit(coroutine, passed))
    except asyncio.CancelledError:
        if not passed:
            raise
        raise SoftTimeLimitExceeded("the task's soft time limit passed") from None


def soft_limit_armed() -> bool:
    """Whether this thread receives Celery's soft time limit as billiard's signal: the main
    thread of a prefork child."""
    return (
        SIG_SOFT_TIMEOUT is not None
        and threading.current_thread() is threading.main_thread()
        and signal.getsignal(SIG_SOFT_TIMEOUT) is soft_timeout_sighandler
    )


async def _cancelled_at_soft_limit[T](coroutine: Coroutine[Any, Any, T], passed: list[bool]) -> T:
    assert SIG_SOFT_TIMEOUT is not None  # soft_limit_armed() checked
    task = asyncio.current_task()
    assert task is not None
    loop = asyncio.get_running_loop()

    def on_soft_limit(signum: int, frame: FrameType | None) -> None:
        # Python runs this between two bytecodes of the main thread, wherever the loop is:
        # only a thread-safe call may touch the loop from here.
        passed.append(True)
        loop.call_soon_threadsafe(task.cancel, "the task's soft time limit passed")

    billiards = signal.signal(SIG_SOFT_TIMEOUT, on_soft_limit)
    try:
        return await coroutine
    finally:
        signal.signal(SIG_SOFT_TIMEOUT, billiards)
