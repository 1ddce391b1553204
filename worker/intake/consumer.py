"""The worker's consumer: every message of actonce's queues passes the intake check first.

`IntakeConsumer` is Celery's consumer, reading its queues through `intake_transport` (the seam,
and why it catches everything, is told there): a message of `actonce.attempts` or
`actonce.turns` that `intake.screen` refuses is never seen by kombu or Celery; it is gone from
the queue, kept as a dead letter with its reason, its raw bytes and every header it had, and
reported to Sentry once. The worker's main process serves on with the next message.

The main process has no event loop of its own, so each letter is written on a short-lived loop
and engine (`asyncio.run`), within `LETTER_TIMEOUT_S`: refused messages are rare, and a letter
must be durable before the message is forgotten. Celery's own refusal hooks stay as a second net,
keeping a letter of anything that still reaches them.

While the dead-letter store cannot be reached, a refused message is held in Redis and screened
again later (`intake.transport.NotKept`), and the store is tried at most once per back-off
(`health.backoff_s`: 1 s after the first failure, doubling to 30 s), whatever the number of
refused messages: between tries, one that comes back is held again without a try. One warning
line per failed try says so; the first letter kept after it says the store answers again. The
consumer serves the queue's valid messages meanwhile, so attempts run as soon as the store is
back, and each held message's letter is written once, at the first try that finds it back.
"""

import asyncio
import json
import logging
import time
from collections import deque
from datetime import UTC, datetime
from typing import Any, Final

from celery.exceptions import WorkerShutdown
from celery.worker.consumer import Consumer

from actonce.tasks import observers
from actonce.tasks.lifecycle import Reason
from actonce.tasks.observers import MessageRefused
from actonce.worker.dead_letters.letter import seen
from actonce.worker.dead_letters.store import DeadLetter, SqlDeadLetters
from actonce.worker.intake.check import (
    ACCEPTED_TASKS,
    IntakePolicy,
    Refusal,
    screen,
)
from actonce.worker.intake.transport import NotKept, guarded
from actonce.worker.process import current
from actonce.worker.process.health import backoff_s
from actonce.worker.process.runtime import make_engine
from actonce.worker.settings import Settings
from actonce.worker.storage.unreachable import describe

log = logging.getLogger("actonce.consumer")


class IntakeConsumer(Consumer):  # type: ignore[misc]
    """Celery's consumer, whose queues' messages pass `intake.screen` before Celery's decoding.

    A consumer that cannot be rebuilt (torn down again as soon as it is started, more than
    `REBUILDS_PER_MINUTE` times in a minute) stops the worker with status 1, where Celery would
    log "Frequent restarts detected" and try again for ever: the supervisor restarts it.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        inner: Any = getattr(self, "_restart_state")  # noqa: B009 - set by Celery, untyped
        self._restart_state = _BoundedRebuilds(inner)

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
    """Keep the dead letter of a refused message, and announce the refusal to the observers
    (`tasks.observers`: the log line and Sentry tell of the letter if it is new).

    Raises:
        Exception: Whatever the store raised: the letter is not kept, nothing is announced.
    """
    letter = DeadLetter.refused(
        item,
        reason=refusal.reason,
        error=refusal.error,
        dead_at=now,
        task_id=refusal.task_id,
        queue=queue,
    )
    added = asyncio.run(
        asyncio.wait_for(_add(settings.store_url("actonce"), letter), LETTER_TIMEOUT_S)
    )
    observers.announce(
        MessageRefused(
            reason=letter.reason,
            queue=queue,
            task_id=letter.task_id,
            letter=seen(letter) if added else None,
        )
    )
    return letter


LETTER_TIMEOUT_S: Final = 10.0
"""How long the main process waits for the store to keep one letter: a database whose packets
are dropped would otherwise hold it, and every queue it serves, for the driver's connect
timeout."""

REBUILDS_PER_MINUTE: Final = 30
"""How many times in a minute the consumer may be rebuilt before the worker gives up. Each
rebuild after a lost broker first retries the connection with growing pauses, so only a
consumer that fails as soon as it starts comes near this."""


# ─── how ──────────────────────────────────────────────────────────────────────


class _BoundedRebuilds:
    """Celery's restart bookkeeping, which raises `WorkerShutdown(1)` past the bound."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self._rebuilds: deque[float] = deque()

    def step(self, now: float | None = None) -> None:
        at = time.monotonic() if now is None else now
        self._rebuilds.append(at)
        while self._rebuilds and at - self._rebuilds[0] > 60:
            self._rebuilds.popleft()
        if len(self._rebuilds) > REBUILDS_PER_MINUTE:
            log.critical(
                "the consumer cannot be rebuilt: %d rebuilds in a minute; stopping the worker",
                len(self._rebuilds),
            )
            raise WorkerShutdown(1)
        self._inner.step(now)


class _StoreBackoff:
    """When this process may next try the dead-letter store, after failed tries in a row."""

    def __init__(self) -> None:
        self.failures = 0
        self.next_try = 0.0
        """The monotonic time before which the store is not tried again."""

    def wait_s(self) -> float:
        """Return how long until the store may be tried again; 0 when it may be now."""
        return max(0.0, self.next_try - time.monotonic())

    def failed(self) -> float:
        """Count a failed try; return the back-off before the next one."""
        self.failures += 1
        wait_s = backoff_s(self.failures)
        self.next_try = time.monotonic() + wait_s
        return wait_s

    def succeeded(self) -> int:
        """Count a try that kept its letter; return how many had failed in a row before it."""
        failed, self.failures, self.next_try = self.failures, 0, 0.0
        return failed


_store: Final = _StoreBackoff()
"""This process's back-off on the dead-letter store (the main process's; children never screen)."""


def _screen_and_keep(queue: str, item: bytes) -> bool:
    settings = current.settings()
    now = datetime.now(UTC)
    try:
        refusal = screen(item, queue, IntakePolicy.from_settings(settings), now)
    except Exception as failed:
        # A fault of the check itself must not turn into a message that loops: refuse it.
        log.exception("the intake check failed on a message from %s", queue)
        refusal = Refusal(Reason.MALFORMED_MESSAGE, f"the intake check failed: {failed!r}", None)
    if refusal is None:
        return True
    if (wait_s := _store.wait_s()) > 0:
        # Within the back-off: held again without a try, so an outage costs one try per step.
        raise NotKept(wait_s, "the dead-letter store is in its back-off")
    try:
        keep_refused(settings, item, refusal, queue, now)
    except Exception as error:
        wait_s = _store.failed()
        log.warning(
            "could not dead-letter a message refused from %s (%s): it is held in Redis and "
            "screened again in %.0fs",
            queue,
            describe("actonce", settings.store_url("actonce"), error),
            wait_s,
        )
        log.debug("the dead-letter store failed", exc_info=error)
        raise NotKept(wait_s, "the dead-letter store failed") from error
    if tries := _store.succeeded():
        log.info("the dead-letter store answers again after %d failed tries", tries)
    return False


def _keep_hooked(message: Any, error: str) -> None:
    """Keep a letter of a message Celery refused after the intake check let it through."""
    try:
        raw = getattr(message, "_raw", None)
        item = json.dumps(raw, default=repr).encode() if raw is not None else b""
        delivery = getattr(message, "delivery_info", None) or {}
        headers = getattr(message, "headers", None)
        task_id = headers.get("id") if isinstance(headers, dict) else None
        refusal = Refusal(
            Reason.MALFORMED_MESSAGE, error, task_id if isinstance(task_id, str) else None
        )
        queue = str(delivery.get("routing_key") or "")
        keep_refused(current.settings(), item, refusal, queue, datetime.now(UTC))
    except Exception:
        log.exception("could not dead-letter a message Celery refused")


async def _add(url: str, letter: DeadLetter) -> bool:
    engine = make_engine(url)
    try:
        return await SqlDeadLetters(engine).add(letter)
    finally:
        await engine.dispose()
