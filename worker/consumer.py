"""The worker's consumer: every message of actonce's queues passes the intake check first.

`IntakeConsumer` is Celery's consumer, reading its queues through `intake_transport` (the seam,
and why it catches everything, is told there): a message of `actonce.attempts` or
`actonce.turns` that `intake.screen` refuses is never seen by kombu or Celery; it is gone from
the queue, kept as a dead letter with its reason, its raw bytes and every header it had, and
reported to Sentry once. The worker's main process serves on with the next message.

The main process has no event loop of its own, so each letter is written on a short-lived loop
and engine (`asyncio.run`): refused messages are rare, and a letter must be durable before the
message is forgotten. Celery's own refusal hooks stay as a second net, keeping a letter of
anything that still reaches them.
"""

import asyncio
import json
import logging
from datetime import UTC, datetime
from typing import Any

from celery.worker.consumer import Consumer

from actonce.worker import process, reporting
from actonce.worker.dead_letters import DeadLetter, SqlDeadLetters
from actonce.worker.intake import (
    ACCEPTED_TASKS,
    MALFORMED_MESSAGE,
    IntakePolicy,
    Refusal,
    screen,
)
from actonce.worker.intake_transport import guarded
from actonce.worker.runtime import make_engine
from actonce.worker.settings import Settings

log = logging.getLogger("actonce.consumer")


class IntakeConsumer(Consumer):  # type: ignore[misc]
    """Celery's consumer, whose queues' messages pass `intake.screen` before Celery's decoding."""

    def connection_for_read(self, heartbeat: float | None = None) -> Any:
        """Return the consuming connection, on the guarded Redis transport."""
        transport = guarded(frozenset(ACCEPTED_TASKS), _screen_and_keep)
        return self.ensure_connected(
            self.app.connection_for_read(heartbeat=heartbeat, transport=transport)
        )

    def on_decode_error(self, message: Any, exc: Exception) -> None:
        _keep_hooked(message, f"cannot decode: {type(exc).__name__}")
        super().on_decode_error(message, exc)

    def on_unknown_message(self, body: Any, message: Any) -> None:
        _keep_hooked(message, "not a task message")
        super().on_unknown_message(body, message)

    def on_unknown_task(self, body: Any, message: Any, exc: Exception) -> None:
        _keep_hooked(message, "unknown task")
        super().on_unknown_task(body, message, exc)

    def on_invalid_task(self, body: Any, message: Any, exc: Exception) -> None:
        _keep_hooked(message, f"invalid task: {type(exc).__name__}")
        super().on_invalid_task(body, message, exc)


def keep_refused(
    settings: Settings, item: bytes, refusal: Refusal, queue: str, now: datetime
) -> DeadLetter:
    """Keep the dead letter of a refused message; log and report it to Sentry if it is new.

    Raises:
        Exception: Whatever the store raised: the letter is not kept.
    """
    letter = DeadLetter.refused(
        item,
        reason=refusal.reason,
        error=refusal.error,
        dead_at=now,
        task_id=refusal.task_id,
        queue=queue,
    )
    if asyncio.run(_add(settings.store_url("actonce"), letter)):
        log.warning(
            "dead letter %s reason=%s queue=%s task=%s: %s",
            letter.id,
            letter.reason,
            queue,
            letter.task_id,
            letter.error,
        )
        reporting.report_dead_letter(letter)
    return letter


# ─── how ──────────────────────────────────────────────────────────────────────


def _screen_and_keep(queue: str, item: bytes) -> bool:
    settings = process.settings()
    now = datetime.now(UTC)
    try:
        refusal = screen(item, queue, IntakePolicy.from_settings(settings), now)
    except Exception as failed:
        # A fault of the check itself must not turn into a message that loops: refuse it.
        log.exception("the intake check failed on a message from %s", queue)
        refusal = Refusal(MALFORMED_MESSAGE, f"the intake check failed: {failed!r}", None)
    if refusal is None:
        return True
    keep_refused(settings, item, refusal, queue, now)
    return False


def _keep_hooked(message: Any, error: str) -> None:
    """Keep a letter of a message Celery refused after the intake check let it through."""
    try:
        raw = getattr(message, "_raw", None)
        item = json.dumps(raw, default=repr).encode() if raw is not None else b""
        delivery = getattr(message, "delivery_info", None) or {}
        headers = getattr(message, "headers", None)
        task_id = headers.get("id") if isinstance(headers, dict) else None
        refusal = Refusal(MALFORMED_MESSAGE, error, task_id if isinstance(task_id, str) else None)
        queue = str(delivery.get("routing_key") or "")
        keep_refused(process.settings(), item, refusal, queue, datetime.now(UTC))
    except Exception:
        log.exception("could not dead-letter a message Celery refused")


async def _add(url: str, letter: DeadLetter) -> bool:
    engine = make_engine(url)
    try:
        return await SqlDeadLetters(engine).add(letter)
    finally:
        await engine.dispose()
