"""The dispatcher: evaluates rules, polls due runs, and sends one attempt message per due run.

It runs reflexr's own `tick` (schedules) and `evaluate` (rules → pending runs), then polls
`due_runs` across workspaces and sends `{tenant_id, workspace_id, run_id}` to the attempts queue.
A (run, epoch, status) is sent once while its mark lives (`worker.dedupe`); whatever slips through
is a duplicate that reflexr's claim declines. It is also the sweeper: a run whose retry message
was lost, or whose worker died (an orphan past its lease), is due again and is sent again.
Several dispatchers may run: reflexr leases evaluation per workspace, and marks dedupe sending.
"""

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Final

from celery import Celery
from reflexr.workspace import RunPolicy

from tasks.turns import sweep
from worker.app import ATTEMPT_TASK
from worker.dedupe import SentMarks
from worker.runtime import Runtime
from worker.settings import ATTEMPTS_QUEUE
from worker.turns_sender import send_turn

TURN_GRACE: Final = timedelta(seconds=30)
"""How long a turn request may stay untaken before the sweep announces it again."""

TURN_SWEEP_EVERY: Final = timedelta(seconds=5)
"""How often the dispatcher looks for untaken turn requests."""

TURN_RESEND_S: Final = 60
"""How long after announcing a request again the sweep leaves it be."""

log = logging.getLogger("actonce.dispatcher")


@dataclass(frozen=True)
class Polled:
    """What one poll did."""

    fired: int
    """Runs reflexr's evaluation created."""

    due: int
    """Runs found due."""

    sent: int
    """Attempt messages sent."""


class Dispatcher:
    """Feeds the pool from reflexr's stores.

    Args:
        runtime: A runtime opened with `one_run=False`, on this process's loop.
        celery: The app whose broker the attempts queue is on.
    """

    def __init__(self, runtime: Runtime, celery: Celery) -> None:
        self._runtime = runtime
        self._celery = celery
        self._marks = SentMarks.of(runtime.settings)
        self._reactor = runtime.reactor()
        self._next_turn_sweep = datetime.now(UTC)
        self._next_due_scan = 0.0

    async def poll(self) -> Polled:
        """Tick schedules, evaluate rules, and send every due run not sent already.

        Due runs are looked for on a dispatcher's first poll, when a poll fired some, when the
        last look filled a batch, and every `sweep_interval_s` otherwise: under load every waiting
        run is due on every poll, and reading and marking them all ten times a second cost the
        dispatcher a third of a core.
        """
        runtime = self._runtime
        await self._reactor.tick()
        fired = await self._reactor.evaluate()
        if not (fired or time.monotonic() >= self._next_due_scan):
            await self._sweep_turns()
            return Polled(fired=fired, due=0, sent=0)
        due = await runtime.reflexr.storage.due_runs(
            now=runtime.reflexr.clock(),
            limit=runtime.settings.dispatch_batch,
            policy=RunPolicy.of(runtime.reflexr.rules.values()),
        )
        full = len(due) >= runtime.settings.dispatch_batch
        self._next_due_scan = 0.0 if full else time.monotonic() + runtime.settings.sweep_interval_s
        sent = 0
        for (ref, run), unsent in zip(due, self._marks.claim_many(due), strict=True):
            if unsent:
                send_attempt(self._celery, ref.tenant_id, ref.workspace_id, run.id)
                sent += 1
        await self._sweep_turns()
        if sent:
            log.debug("poll fired=%s due=%s sent=%s", fired, len(due), sent)
        return Polled(fired=fired, due=len(due), sent=sent)

    async def _sweep_turns(self) -> None:
        """Announce again each turn request still untaken after a grace: its message was lost."""
        now = datetime.now(UTC)
        if now < self._next_turn_sweep:
            return
        self._next_turn_sweep = now + TURN_SWEEP_EVERY
        stale = await sweep(
            self._runtime.turn_requests, requested_before=now - TURN_GRACE, limit=100
        )
        for request in stale:
            if self._marks.claim_key(f"turn:{':'.join(request.key)}", ttl_s=TURN_RESEND_S):
                send_turn(self._celery, request)

    async def serve(self, stop: asyncio.Event) -> None:
        """Poll every `poll_interval_s` until `stop` is set; a failed poll is logged and retried."""
        interval_s = self._runtime.settings.poll_interval_s
        while not stop.is_set():
            started = time.monotonic()
            try:
                await self.poll()
            except Exception:
                log.exception("poll failed; retrying after %.1fs", max(interval_s, 1.0))
                await _wait(stop, max(interval_s, 1.0))
                continue
            await _wait(stop, max(0.0, interval_s - (time.monotonic() - started)))


def send_attempt(celery: Celery, tenant_id: str, workspace_id: str, run_id: str) -> Any:
    """Send one attempt message: ids only, JSON, to the attempts queue."""
    return celery.send_task(
        ATTEMPT_TASK,
        kwargs={"tenant_id": tenant_id, "workspace_id": workspace_id, "run_id": run_id},
        queue=ATTEMPTS_QUEUE,
        serializer="json",
    )


async def _wait(stop: asyncio.Event, seconds: float) -> None:
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), timeout=seconds)
