"""Sending turn requests to the turn workers: one message per request, ids only; and naming
the request a queued message announces."""

from typing import Any

from celery import Celery

from actonce.tasks.tracing import carried
from actonce.tasks.turn_task import TURN_TASK
from actonce.tasks.turns import TurnRequest
from actonce.worker.intake.check import arguments_of
from actonce.worker.settings import TURNS_QUEUE


def send_turn(celery: Celery, request: TurnRequest) -> Any:
    """Send the turn task for `request` to the turns queue: tenant, workspace and message ids,
    and the trace of the delivery that sends it (the attempt that sent the message), if any."""
    return celery.send_task(
        TURN_TASK,
        kwargs={
            "tenant_id": request.tenant_id,
            "workspace_id": request.workspace_id,
            "message_id": request.message_id,
        },
        queue=TURNS_QUEUE,
        serializer="json",
        headers=carried() or None,
    )


def turn_name(tenant_id: str, workspace_id: str, message_id: str) -> str:
    """The name of a turn request among the dispatcher's marks (`SentMarks.claim_keys`)."""
    return f"turn:{tenant_id}:{workspace_id}:{message_id}"


def announced(item: bytes, max_bytes: int) -> str | None:
    """The `turn_name` of the request the queued message `item` announces (kombu's envelope, as
    Redis holds it), or `None` if it announces none: another task, or nothing readable."""
    kwargs = arguments_of(item, max_bytes) or {}
    match kwargs:
        case {
            "tenant_id": str(tenant_id),
            "workspace_id": str(workspace_id),
            "message_id": str(message_id),
        } if len(kwargs) == 3:
            return turn_name(tenant_id, workspace_id, message_id)
    return None
