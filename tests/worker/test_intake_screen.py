"""The intake check on its own: what actonce itself sends passes, and where its bounds lie; and
the dispatcher's reading of a queued turn announcement, which shares its parsing.

The messages are made by Celery and kombu themselves (kombu's in-memory transport builds the
same envelope its Redis transport writes), so a change in either that the check would refuse
fails here, quickly, before the pool's hostile-input suite runs.
"""

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from celery import Celery
from kombu.transport.memory import Channel as MemoryChannel

from actonce.tasks.attempt import ATTEMPT_TASK
from actonce.tasks.lifecycle import Reason
from actonce.tasks.turn_task import TURN_TASK
from actonce.tasks.turns import TurnRequest
from actonce.worker.app import celery_config
from actonce.worker.dispatching.dispatcher import send_attempt
from actonce.worker.dispatching.turn_sends import announced, send_turn, turn_name
from actonce.worker.intake.check import IntakePolicy, is_id, screen
from actonce.worker.settings import ATTEMPTS_QUEUE, TURNS_QUEUE, Settings

NOW = datetime(2026, 12, 3, 12, 0, tzinfo=UTC)
SETTINGS = Settings.from_env({})
POLICY = IntakePolicy.from_settings(SETTINGS)


def sent_by_celery(send: Any) -> bytes:
    """Return the bytes of the one message `send(celery)` publishes, as Redis would hold them.

    Its results go to Celery's in-memory backend: a task sent with its result kept subscribes
    to the backend as it is sent, and the settings' Redis backend is a server this test has not.
    """
    celery = Celery("actonce", set_as_current=False)
    celery.conf.update(
        celery_config(SETTINGS) | {"broker_url": "memory://", "result_backend": "cache+memory://"}
    )
    MemoryChannel.queues.clear()
    send(celery)
    (queue,) = [queue for queue in MemoryChannel.queues.values() if queue.qsize()]
    return json.dumps(queue.get_nowait()).encode()


def test_an_attempt_the_dispatcher_sends_is_accepted() -> None:
    item = sent_by_celery(lambda celery: send_attempt(celery, "t_1", "ws_1", "fir_1"))
    assert screen(item, ATTEMPTS_QUEUE, POLICY, NOW) is None


def test_a_turn_message_is_accepted_on_the_turns_queue_only() -> None:
    kwargs = {"tenant_id": "t_1", "workspace_id": "ws_1", "message_id": "msg_1"}
    item = sent_by_celery(
        lambda celery: celery.send_task(TURN_TASK, kwargs=kwargs, queue=TURNS_QUEUE)
    )
    assert screen(item, TURNS_QUEUE, POLICY, NOW) is None
    refused = screen(item, ATTEMPTS_QUEUE, POLICY, NOW)
    assert refused is not None and refused.reason == "unknown_task", refused


def test_a_retry_at_the_longest_delay_is_accepted_and_one_beyond_it_refused() -> None:
    kwargs = {"tenant_id": "t_1", "workspace_id": "ws_1", "run_id": "fir_1"}

    def at(delay_s: float) -> bytes:
        eta = datetime.now(UTC) + timedelta(seconds=delay_s)
        return sent_by_celery(
            lambda celery: celery.send_task(
                ATTEMPT_TASK, kwargs=kwargs, queue=ATTEMPTS_QUEUE, eta=eta
            )
        )

    now = datetime.now(UTC)
    assert screen(at(SETTINGS.max_retry_delay_s), ATTEMPTS_QUEUE, POLICY, now) is None
    refused = screen(at(POLICY.max_eta_s + 120), ATTEMPTS_QUEUE, POLICY, now)
    assert refused is not None and refused.reason == "eta_out_of_range", refused


def test_an_envelope_over_the_bound_is_refused_before_it_is_read() -> None:
    item = sent_by_celery(lambda celery: send_attempt(celery, "t_1", "ws_1", "fir_1"))
    tight = IntakePolicy(max_message_bytes=len(item) - 1, max_eta_s=POLICY.max_eta_s)
    refused = screen(item, ATTEMPTS_QUEUE, tight, NOW)
    assert refused is not None and (refused.reason, refused.task_id) == ("oversized", None)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("fir_01HZX", True),
        ("0b9d6c1e-8f5e-4a58-9d0e-1c5a3b2f4e6d", True),
        ("a" * 200, True),
        ("a" * 201, False),
        ("", False),
        ("ws\x00x", False),
        ("ws x", False),
        ("ws/x", False),
        ("-leading", False),
        ("ws_\u00e9", False),
        (7, False),
    ],
)
def test_what_counts_as_an_id(value: object, expected: bool) -> None:
    assert is_id(value) is expected


def test_the_dispatcher_names_the_request_a_queued_turn_announces_and_nothing_else() -> None:
    # Given a turn announcement as `send_turn` sends it, an attempt, and what else may lie there
    request = TurnRequest(
        tenant_id="t_1",
        workspace_id="ws_1",
        message_id="msg_1",
        thread_id="th_1",
        rule="rule",
        requested_at=NOW,
    )
    turn = sent_by_celery(lambda celery: send_turn(celery, request))
    attempt = sent_by_celery(lambda celery: send_attempt(celery, "t_1", "ws_1", "fir_1"))
    max_bytes = SETTINGS.max_message_bytes

    # Then the announcement is named as the dispatcher marks its request, and nothing else is
    assert announced(turn, max_bytes) == turn_name("t_1", "ws_1", "msg_1") == "turn:t_1:ws_1:msg_1"
    assert announced(attempt, max_bytes) is None
    assert announced(turn, len(turn) - 1) is None  # read only up to the bound
    for item in (b"", b"\xff", b"[]", b'{"body": "!!"}', b'{"body": 3}', b"1" * 10):
        assert announced(item, max_bytes) is None, item


def test_every_refusal_names_one_of_the_lifecycles_reasons() -> None:
    items = [b"not json", b"\xff" * 10, json.dumps({"body": 1}).encode()]

    reasons = {
        refused.reason for item in items if (refused := screen(item, ATTEMPTS_QUEUE, POLICY, NOW))
    }

    assert reasons and reasons <= set(Reason), reasons
