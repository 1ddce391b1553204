"""The worker's side of `actonce.tasks.task_host`: a process's runtime, as the tasks need it.

`WorkerHost` wraps one prefork child's `Runtime` and provides what the attempt and turn tasks ask
of their process: the loop, reflexr's executor, the dispatcher's sent marks, dead letters (with
each added once, returned for the task to announce) and the turn agent's Runner.
"""

from collections.abc import Coroutine
from datetime import UTC, datetime
from typing import Any

import artifactr
import artifactr.agent
import artifactr.core as a
from reflexr.core import Run
from reflexr.workspace import WorkspaceRef

from actonce.tasks.lifecycle import Reason, letter_reason
from actonce.tasks.observers import Letter
from actonce.tasks.task_host import TaskLimits
from actonce.tasks.tracing import in_current_context
from actonce.tasks.turns import TurnRequest, TurnRequests
from actonce.worker.dead_letters.letter import seen
from actonce.worker.dead_letters.store import DeadLetter, run_letter_id
from actonce.worker.dead_letters.turn_letters import next_turn_letter_id, turn_letter
from actonce.worker.dispatching.sent_marks import SentMarks
from actonce.worker.process.runtime import Runtime


class WorkerHost:
    """A `TaskHost` over one process's `Runtime`.

    Args:
        runtime: The process's runtime, opened.
    """

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        self._marks: SentMarks | None = None
        settings = runtime.settings
        self._limits = TaskLimits(
            max_message_bytes=settings.max_message_bytes,
            max_retry_delay_s=settings.max_retry_delay_s,
            turn_wait_s=settings.turn_wait_s,
            turn_max_asks=settings.turn_max_asks,
            turn_backoff_s=settings.turn_backoff_s,
        )

    @property
    def limits(self) -> TaskLimits:
        """The bounds `ACTONCE_MAX_MESSAGE_BYTES`, `ACTONCE_MAX_RETRY_DELAY_S` and the
        `ACTONCE_TURN_*` settings set on the tasks."""
        return self._limits

    @property
    def loop_runs_between_tasks(self) -> bool:
        """Whether the process's loop runs between tasks: in a threads worker, not in a prefork
        child."""
        return self.runtime.loop_runs_between_calls

    @property
    def turn_requests(self) -> TurnRequests:
        """The process's durable turn requests."""
        return self.runtime.turn_requests

    def run[T](self, coroutine: Coroutine[Any, Any, T]) -> T:
        """Run a coroutine on the process's loop, in the caller's trace (`in_current_context`:
        the loop keeps a context of its own, where the delivery's span would not be seen).

        On a threaded loop it is cancelled after `ACTONCE_TIME_LIMIT_S` (`TimeoutError`): a
        thread cannot be killed as a prefork child is, and Celery's thread pool has no limits.
        """
        return self.runtime.run(
            in_current_context(coroutine), timeout_s=self.runtime.settings.time_limit_s
        )

    def now(self) -> datetime:
        """Return the time on reflexr's clock."""
        return self.runtime.reflexr.clock()

    async def attempt(self, ref: WorkspaceRef, run_id: str) -> tuple[bool, Run | None]:
        """Attempt exactly `run_id` with reflexr's executor (see `Runtime.attempt`)."""
        return await self.runtime.attempt(ref, run_id)

    def hold_until(self, ref: WorkspaceRef, run: Run, eta: datetime) -> None:
        """Mark `run`'s retry as sent until `eta`, so the dispatcher's sweep skips it."""
        if self._marks is None:
            self._marks = SentMarks.of(self.runtime.settings)
        self._marks.mark(ref, run, until=eta)

    async def dead_letter_run(
        self, ref: WorkspaceRef, run: Run, *, task_id: str | None, queue: str | None
    ) -> Letter | None:
        """Keep the dead letter of a dead run, once per attempt.

        Returns:
            The letter if this call added it; None if another delivery of the same attempt (or
            the dispatcher's sweep) already had.
        """
        letter = _run_letter(ref, run, task_id=task_id, queue=queue)
        if not await self.runtime.dead_letters.add(letter):
            return None
        return seen(letter)

    async def dead_letter_message(
        self, raw: str, *, reason: Reason, error: str, task_id: str | None, queue: str | None
    ) -> Letter | None:
        """Keep the dead letter of a message that names no attempt; return it when new."""
        letter = DeadLetter.malformed(
            raw, error=error, dead_at=datetime.now(UTC), task_id=task_id, queue=queue, reason=reason
        )
        if not await self.runtime.dead_letters.add(letter):
            return None
        return seen(letter)

    async def dead_letter_turn(
        self,
        request: TurnRequest,
        *,
        reason: Reason,
        error: str,
        task_id: str | None,
        queue: str | None,
    ) -> Letter | None:
        """Keep the dead letter of a turn request given up on; return it when new."""
        letters = self.runtime.dead_letters
        letter_id = await next_turn_letter_id(letters, request)
        letter = turn_letter(
            letter_id, request, reason=reason, error=error, task_id=task_id, queue=queue
        )
        if not await letters.add(letter):
            return None
        return seen(letter, message_id=request.message_id)

    async def open_workspace(
        self, tenant_id: str, workspace_id: str, *, actor: a.ExternalAgentActor
    ) -> artifactr.Workspace:
        """Open an artifactr workspace as `actor`."""
        return await self.runtime.artifactr.open(tenant_id, workspace_id, actor=actor)

    def turn_runner(self) -> "artifactr.agent.Runner[Any]":
        """Return the process's Runner for the definition's turn agent."""
        return self.runtime.turn_runner()


def _run_letter(
    ref: WorkspaceRef, run: Run, *, task_id: str | None, queue: str | None
) -> DeadLetter:
    reason = letter_reason(run)
    error = run.error or ""
    if reason is Reason.ATTEMPTS_EXHAUSTED:
        error = f"{run.attempts} attempts; the last failed ({run.reason or 'no reason'}): {error}"
    return DeadLetter(
        id=run_letter_id(ref.tenant_id, ref.workspace_id, run.id, run.epoch),
        tenant_id=ref.tenant_id,
        workspace_id=ref.workspace_id,
        run_id=run.id,
        rule=run.rule,
        reason=reason,
        error=error,
        attempts=run.attempts,
        task_id=task_id,
        queue=queue,
        raw=None,
        dead_at=run.updated_at,
    )
