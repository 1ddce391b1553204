"""Turns through the pool: a rule's `send` in a worker leads to exactly one turn of the thread's
assistant, taken by a turn worker, however often the attempt is retried or redelivered.

The asyncio-level cases (a kill between commit and ask, a dead turn worker, a retry after the turn
ran) are in tests/tasks/test_turns.py; here the real pool carries them: prefork workers serving
both queues, the dispatcher, and a private Redis.
"""

import time

import artifactr.core as a
import pytest
from celery.result import AsyncResult
from pools import Scene

from demo.definition import THREAD_ID
from demo.feed import PEOPLE

pytestmark = pytest.mark.slow


def _turns_taking(scene: Scene, message_id: str, timeout_s: float = 40.0) -> list[str]:
    """Wait until a turn has carried `message_id` and finished; return the turns that did."""

    async def turns() -> tuple[list[str], bool]:
        workspace = await scene.pool.runtime.artifactr.open(
            "t_pool", scene.workspace_id, actor=PEOPLE
        )
        started: dict[str, list[str]] = {}
        ended: set[str] = set()
        for envelope in await workspace.read(threads={THREAD_ID}):
            event = envelope.event
            if isinstance(event, a.RunStarted):
                started[event.run_id] = list(event.message_ids)
            elif isinstance(event, a.RunEnded):
                ended.add(event.run_id)
        carrying = [run for run, ids in started.items() if message_id in ids]
        return carrying, bool(carrying) and all(run in ended for run in carrying)

    deadline = time.monotonic() + timeout_s
    while True:
        carrying, finished = scene.pool.run(turns())
        if finished or time.monotonic() > deadline:
            return carrying
        time.sleep(0.3)


def _thread_counts(scene: Scene) -> tuple[int, int, int]:
    """Every turn that started in the thread, every turn that ended, and the agent's replies:
    counted whatever messages they carried, so an extra turn is seen too."""

    async def read() -> tuple[int, int, int]:
        workspace = await scene.pool.runtime.artifactr.open(
            "t_pool", scene.workspace_id, actor=PEOPLE
        )
        log = await workspace.read(threads={THREAD_ID})
        return (
            sum(1 for e in log if isinstance(e.event, a.RunStarted)),
            sum(1 for e in log if isinstance(e.event, a.RunEnded)),
            sum(
                1
                for e in log
                if isinstance(e.event, a.MessagePosted) and e.actor.participant.startswith("agent:")
            ),
        )

    return scene.pool.run(read())


def _model_calls(scene: Scene) -> int:
    """The model calls of the thread's turns, as each ended turn recorded its usage."""

    async def read() -> int:
        workspace = await scene.pool.runtime.artifactr.open(
            "t_pool", scene.workspace_id, actor=PEOPLE
        )
        log = await workspace.read(threads={THREAD_ID})
        return sum(
            e.event.usage.requests
            for e in log
            if isinstance(e.event, a.RunEnded) and e.event.usage is not None
        )

    return scene.pool.run(read())


def _wait_task(scene: Scene, result: AsyncResult, timeout_s: float = 30.0) -> None:
    """Poll until an attempt message was carried out: its result is in the backend."""
    deadline = time.monotonic() + timeout_s
    while not result.ready():
        assert time.monotonic() < deadline, f"task {result.id} not done after {timeout_s}s"
        time.sleep(0.2)


def _sent_message(scene: Scene) -> str:
    census = scene.census()
    sent = [
        message_id
        for message_id, _ in census.messages.items()
        if message_id.startswith("msg_") and message_id in _message_ids(scene, kind="message")
    ]
    assert len(sent) == 1, f"one sent message expected, found {sent}"
    return sent[0]


def _message_ids(scene: Scene, *, kind: str) -> set[str]:
    async def read() -> set[str]:
        workspace = await scene.pool.runtime.artifactr.open(
            "t_pool", scene.workspace_id, actor=PEOPLE
        )
        return {
            envelope.event.message_id
            for envelope in await workspace.read(threads={THREAD_ID})
            if isinstance(envelope.event, a.MessagePosted)
            and envelope.event.kind == kind
            and getattr(envelope.actor, "client_id", "").startswith("reflexr:")
        }

    return scene.pool.run(read())


def test_a_sent_message_is_answered_by_exactly_one_turn(scene: Scene) -> None:
    # Given a run whose action sends a message to the thread's assistant
    scene.request("ask-once", ask=True)
    [run] = scene.settled()
    assert run.status == "succeeded", run
    # Then one message was committed and one turn carried it
    message_id = _sent_message(scene)
    assert _turns_taking(scene, message_id) and len(_turns_taking(scene, message_id)) == 1
    # counted as turns, replies and model calls, whatever message a turn carried
    assert _thread_counts(scene) == (1, 1, 1)
    assert _model_calls(scene) == 1
    assert scene.census().duplicates() == {}


def test_a_send_retried_after_failing_makes_one_message_and_one_turn(scene: Scene) -> None:
    # Given an attempt that sends, then fails, and is retried
    scene.request("ask-retried", ask=True, fail_first=True)
    [run] = scene.settled()
    assert (run.status, run.attempts) == ("succeeded", 2), run
    message_id = _sent_message(scene)
    turns = _turns_taking(scene, message_id)
    assert len(turns) == 1, turns
    assert _thread_counts(scene) == (1, 1, 1)
    # When the attempt is delivered again after it all settled, and that delivery is done
    _wait_task(scene, scene.send(run.id))
    # Then still one message, one turn, one reply and one model call
    assert _sent_message(scene) == message_id
    turns = _turns_taking(scene, message_id)
    assert len(turns) == 1, turns
    assert _thread_counts(scene) == (1, 1, 1)
    assert _model_calls(scene) == 1
    assert scene.census().duplicates() == {}
