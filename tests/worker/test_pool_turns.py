"""Turns through the pool: a rule's `send` in a worker leads to exactly one turn of the thread's
assistant, taken by a turn worker, however often the attempt is retried or redelivered.

The asyncio-level cases (a kill between commit and ask, a dead turn worker, a retry after the turn
ran) are in tests/tasks/test_turns.py; here the real pool carries them: prefork workers serving
both queues, the dispatcher, and a private Redis.
"""

import time

import artifactr.core as a
import pytest
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
    assert scene.census().duplicates() == {}


def test_a_send_retried_after_failing_makes_one_message_and_one_turn(scene: Scene) -> None:
    # Given an attempt that sends, then fails, and is retried
    scene.request("ask-retried", ask=True, fail_first=True)
    [run] = scene.settled()
    assert (run.status, run.attempts) == ("succeeded", 2), run
    message_id = _sent_message(scene)
    turns = _turns_taking(scene, message_id)
    assert len(turns) == 1, turns
    # When the attempt is delivered again after it all settled
    scene.send(run.id)
    time.sleep(3)
    # Then still one message and one turn
    assert _sent_message(scene) == message_id
    turns = _turns_taking(scene, message_id)
    assert len(turns) == 1, turns
    assert scene.census().duplicates() == {}
