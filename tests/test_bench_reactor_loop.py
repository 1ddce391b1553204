"""The bench's tight loop over relayr's reactor starts the next pass at once while a pass did
work, and waits only after a pass that did nothing."""

import asyncio
from typing import Any, cast

import pytest
from reflexr.workspace import Reactor

from bench.reactor_loop import EXECUTE_LIMIT, loop_until


class Passes:
    """A reactor whose passes finish the attempts given, in order, and stop the loop after the
    last: it counts the passes and the limit each `execute` was given."""

    def __init__(self, finished: list[int], stop: asyncio.Event) -> None:
        self.finished, self.stop = list(finished), stop
        self.passes = 0
        self.limits: list[int] = []

    async def evaluate(self) -> int:
        return 0

    async def execute(self, *, limit: int) -> int:
        self.passes += 1
        self.limits.append(limit)
        done = self.finished.pop(0)
        if not self.finished:
            self.stop.set()
        return done


@pytest.mark.timeout(30)
def test_the_loop_waits_only_after_a_pass_that_did_nothing() -> None:
    async def main() -> tuple[int, Passes]:
        stop = asyncio.Event()
        reactor = Passes([5, 5, 5, 0], stop)
        # An idle wait of an hour: a wait after a busy pass would hang the test.
        finished = await loop_until(cast(Reactor[Any], reactor), stop, idle_s=3600.0)
        return finished, reactor

    finished, reactor = asyncio.run(main())
    assert (finished, reactor.passes) == (15, 4)
    assert reactor.limits == [EXECUTE_LIMIT] * 4
