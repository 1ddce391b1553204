"""A Celery consumer that dead-letters what it cannot deliver, instead of dropping it.

Celery acks and drops a message it cannot decode (not JSON, a pickle body refused by
`accept_content`), and rejects one of an unknown format or task. Each of those is first kept as a
dead letter with its raw body and the reason `malformed_message` (reported to Sentry once, by
ids and code), then handled as Celery would; the worker serves on. This runs in the worker's
parent process, which has no event loop of its own, so each letter is written on a short-lived
loop and engine: they are rare.
"""

import asyncio
import logging
from datetime import UTC, datetime
from typing import Any

from celery.worker.consumer import Consumer

from actonce.worker import process, reporting
from actonce.worker.dead_letters import DeadLetter, SqlDeadLetters
from actonce.worker.runtime import make_engine

log = logging.getLogger("actonce.consumer")


class DeadLetteringConsumer(Consumer):  # type: ignore[misc]
    """Celery's consumer, keeping a dead letter of every message it would drop."""

    def on_decode_error(self, message: Any, exc: Exception) -> None:
        # Celery's own handler logs the body at CRITICAL (and Sentry makes an event of it): the
        # letter keeps the body and the log names ids, so this acks the message as Celery would.
        self._keep(message, getattr(message, "body", b""), f"cannot decode: {exc}")
        message.ack()

    def on_unknown_message(self, body: Any, message: Any) -> None:
        self._keep(message, body, "not a task message")
        super().on_unknown_message(body, message)

    def on_unknown_task(self, body: Any, message: Any, exc: Exception) -> None:
        self._keep(message, body, f"unknown task: {exc}")
        super().on_unknown_task(body, message, exc)

    def on_invalid_task(self, body: Any, message: Any, exc: Exception) -> None:
        self._keep(message, body, f"invalid task: {exc}")
        super().on_invalid_task(body, message, exc)

    def _keep(self, message: Any, body: Any, error: str) -> None:
        try:
            headers = getattr(message, "headers", None) or {}
            task_id = headers.get("id") if isinstance(headers, dict) else None
            delivery = getattr(message, "delivery_info", None) or {}
            letter = DeadLetter.malformed(
                body if isinstance(body, bytes | str) else repr(body),
                error=error,
                dead_at=datetime.now(UTC),
                task_id=task_id,
                queue=delivery.get("routing_key"),
            )
            if not asyncio.run(_add(process.settings().store_url("actonce"), letter)):
                return  # a redelivery of a message already kept, and reported
            # Ids and the code only: the decoder's error may quote the body.
            log.warning("dead letter %s reason=malformed_message task=%s", letter.id, task_id)
            reporting.report_dead_letter(letter)
        except Exception:
            log.exception("could not dead-letter an undeliverable message")


async def _add(url: str, letter: DeadLetter) -> bool:
    engine = make_engine(url)
    try:
        return await SqlDeadLetters(engine).add(letter)
    finally:
        await engine.dispose()
