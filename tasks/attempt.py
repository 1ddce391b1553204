"""The attempt task: one Celery message, one attempt of one run by reflexr's own executor.

The message carries ids only, `{tenant_id, workspace_id, run_id}`, as JSON. The task validates
them first; what does not validate is dead-lettered as `malformed_message` and the task fails,
the worker serving on. It then has reflexr's executor attempt exactly that run (lease, claim,
action under the rule's timeout, outcome fenced by epoch), reads the run back and settles:

- `succeeded` → SUCCESS, with a summary (ids, never content);
- `retrying` → `self.retry` at the time reflexr set from the rule's `RetryPolicy`, the only
  retry policy: Flower shows RETRY;
- `not_due` → retried at its due time, not dropped;
- `dead` → a dead letter (once per attempt, whoever delivers it), then FAILURE naming the reason;
- `not_claimed` → a duplicate delivery, a run held elsewhere, finished, cancelled or skipped:
  the task ends quietly and has changed nothing.
"""

import json
import logging
import time
from collections import Counter
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final, Literal

from celery import Task
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from reflexr.core import Run
from reflexr.workspace import WorkspaceRef

from actonce.tasks.errors import RETRYABLE_CODES
from actonce.tasks.outbound import WRITES
from actonce.worker import process, reporting
from actonce.worker.app import ATTEMPT_TASK, app
from actonce.worker.dead_letters import DeadLetter, run_letter_id
from actonce.worker.dedupe import SentMarks
from actonce.worker.runtime import Runtime

log = logging.getLogger("actonce.attempt")

type Outcome = Literal["succeeded", "retrying", "not_due", "dead", "not_claimed"]


class AttemptRef(BaseModel):
    """Which run a message asks a worker to attempt: ids only."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)

    tenant_id: str = Field(min_length=1, max_length=200)
    """The run's tenant."""

    workspace_id: str = Field(min_length=1, max_length=200)
    """The run's workspace."""

    run_id: str = Field(min_length=1, max_length=200)
    """The run's id, `fir_…`, unique within its workspace."""


class MalformedMessage(Exception):
    """Raised (as the task's FAILURE) for a message that is not an attempt: dead-lettered."""


class RunDeadLettered(Exception):
    """Raised (as the task's FAILURE) when the attempt left the run dead: dead-lettered."""


@dataclass(frozen=True)
class Settlement:
    """What the task does after an attempt, decided from the run as reflexr left it."""

    outcome: Outcome
    """Which way the task ends."""

    eta: datetime | None = None
    """When to deliver the run again, for `retrying` and `not_due`."""


def settle(run: Run, *, finished: bool, now: datetime) -> Settlement:
    """Return how the task ends for `run`, read back after this delivery's attempt.

    Args:
        run: The run as reflexr left it.
        finished: Whether this delivery's attempt ran to an outcome (reflexr's `execute` → 1).
        now: The current time, on the clock reflexr uses.
    """
    if run.status == "succeeded":
        return Settlement("succeeded" if finished else "not_claimed")
    if run.status == "dead":
        return Settlement("dead")
    if run.status in ("retrying", "pending"):
        if run.next_attempt_at > now:
            outcome: Outcome = "retrying" if run.status == "retrying" else "not_due"
            return Settlement(outcome, eta=run.next_attempt_at)
        # Due, yet declined: another run of its scope goes first. The dispatcher sends it
        # when it is first; retrying now would spin.
        return Settlement("not_claimed")
    return Settlement("not_claimed")  # running elsewhere, cancelled or skipped


@app.task(
    bind=True,
    name=ATTEMPT_TASK,
    max_retries=None,
    acks_late=True,
    throws=(MalformedMessage, RunDeadLettered),
)
def attempt_run(self: Task[Any, Any], *args: object, **kwargs: object) -> dict[str, object]:
    """Attempt one run of a reflexr rule, and settle the Celery task on reflexr's verdict."""
    runtime = process.current()
    started = time.monotonic()
    ref = _validated(runtime, self, args, kwargs)
    writes: Counter[str] = Counter()
    finished, run = runtime.run(_attempt(runtime, ref, writes))
    if run is None:
        _dead_letter_message(
            runtime,
            self,
            "unknown_run",
            f"no run {ref.run_id} in {ref.tenant_id}/{ref.workspace_id}",
            json.dumps(ref.model_dump()),
        )
        raise MalformedMessage(f"unknown_run: no run {ref.run_id} in {ref.workspace_id}")
    settlement = settle(run, finished=finished, now=runtime.reflexr.clock())
    summary = _summary(ref, run, settlement, writes, time.monotonic() - started)
    log.info("attempt %s", " ".join(f"{k}={v}" for k, v in summary.items()))
    if settlement.outcome in ("retrying", "not_due"):
        assert settlement.eta is not None
        SentMarks.of(runtime.settings).mark(ref, run, until=settlement.eta)
        raise self.retry(eta=settlement.eta, max_retries=None)
    if settlement.outcome == "dead":
        letter = _run_letter(ref, run, self)
        if runtime.run(runtime.dead_letters.add(letter)):
            log.warning(
                "dead letter %s run=%s rule=%s reason=%s attempts=%s",
                letter.id,
                run.id,
                run.rule,
                letter.reason,
                run.attempts,
            )
            reporting.report_dead_letter(letter)
            raise RunDeadLettered(f"{letter.reason}: run {run.id} of {run.rule}: {letter.error}")
        summary["outcome"] = "not_claimed"  # another delivery dead-lettered it already
    return summary


async def _attempt(
    runtime: Runtime, ref: AttemptRef, writes: Counter[str]
) -> tuple[bool, Run | None]:
    # Set inside the coroutine: the runner runs it in the loop's own context, not the caller's.
    WRITES.set(writes)
    workspace = WorkspaceRef(ref.tenant_id, ref.workspace_id)
    # A run that does not exist is offered to no one (the one-run view finds nothing) and reads
    # back as None: no read beforehand is needed.
    return await runtime.attempt(workspace, ref.run_id)


def _validated(
    runtime: Runtime, task: Task[Any, Any], args: tuple[object, ...], kwargs: dict[str, object]
) -> AttemptRef:
    raw = _raw(args, kwargs)
    if len(raw.encode()) > runtime.settings.max_message_bytes:
        error = f"oversized: {len(raw.encode())} bytes > {runtime.settings.max_message_bytes}"
        _dead_letter_message(runtime, task, "malformed_message", error, raw)
        raise MalformedMessage(f"malformed_message: {error}")
    fields = dict(kwargs)
    if args:
        fields.update(zip(("tenant_id", "workspace_id", "run_id"), args, strict=False))
        if len(args) > 3:
            fields["extra_arguments"] = list(args[3:])
    try:
        return AttemptRef.model_validate(fields)
    except ValidationError as invalid:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or 'message'}: {e['msg']}"
            for e in invalid.errors()
        )
        _dead_letter_message(runtime, task, "malformed_message", problems, raw)
        raise MalformedMessage(f"malformed_message: {problems}") from None


def _dead_letter_message(
    runtime: Runtime, task: Task[Any, Any], reason: str, error: str, raw: str
) -> None:
    letter = DeadLetter.malformed(
        raw,
        error=error,
        dead_at=datetime.now(UTC),
        task_id=task.request.id,
        queue=_queue(task),
        reason=reason,
    )
    if runtime.run(runtime.dead_letters.add(letter)):
        log.warning(
            "dead letter %s reason=%s task=%s: %s", letter.id, reason, task.request.id, error
        )
        reporting.report_dead_letter(letter)


def _run_letter(ref: AttemptRef, run: Run, task: Task[Any, Any]) -> DeadLetter:
    exhausted = run.reason in _RETRYABLE_REASONS
    reason = "attempts_exhausted" if exhausted else (run.reason or "attempts_exhausted")
    error = run.error or ""
    if exhausted or run.reason is None:
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
        task_id=task.request.id,
        queue=_queue(task),
        raw=None,
        dead_at=run.updated_at,
    )


def _summary(
    ref: AttemptRef, run: Run, settlement: Settlement, writes: Counter[str], seconds: float
) -> dict[str, object]:
    return {
        "run_id": ref.run_id,
        "tenant_id": ref.tenant_id,
        "workspace_id": ref.workspace_id,
        "rule": run.rule,
        "attempt": run.attempts,
        "outcome": settlement.outcome,
        "status": run.status,
        "reason": run.reason,
        "made": writes["made"],
        "already": writes["already"],
        "refused": writes["refused"],
        "conflicts": writes["conflicts"],
        "duration_ms": round(seconds * 1000, 1),
    }


def _raw(args: tuple[object, ...], kwargs: dict[str, object]) -> str:
    try:
        return json.dumps({"args": list(args), "kwargs": kwargs}, sort_keys=True)
    except (TypeError, ValueError):
        return repr({"args": args, "kwargs": kwargs})


def _queue(task: Task[Any, Any]) -> str | None:
    delivery = task.request.delivery_info or {}
    queue = delivery.get("routing_key") or delivery.get("queue")
    return str(queue) if queue else None


_RETRYABLE_REASONS: Final[frozenset[str | None]] = RETRYABLE_CODES | {
    None,
    "version_conflict",
    "timeout",
    "abandoned",
}
"""Reasons of failures reflexr retries: a run dead with one of them ran out of attempts."""
