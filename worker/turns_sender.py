"""Sending turn requests to the turn workers: one message per request, ids only."""

from typing import Any

from celery import Celery

from actonce.tasks.turn_task import TURN_TASK
from actonce.tasks.turns import TurnRequest
from actonce.worker.settings import TURNS_QUEUE


def send_turn(celery: Celery, request: TurnRequest) -> Any:
    """Send the turn task for `request` to the turns queue: tenant, workspace and message ids."""
    return celery.send_task(
        TURN_TASK,
        kwargs={
            "tenant_id": request.tenant_id,
            "workspace_id": request.workspace_id,
            "message_id": request.message_id,
        },
        queue=TURNS_QUEUE,
        serializer="json",
    )
