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

A store that goes away on the way (`tasks.outage`) makes the task retry, not fail: its outcome
may be committed while its dead letter is not. So does Celery's soft time limit
(`tasks.soft_limit`): the next delivery records the stopped attempt as failed, and the rule's
retry policy decides. Any other error that escapes is logged with its traceback and the task
fails with an `UnexpectedError` naming its type, never its text (`tasks.unexpected`); the sweep
sends the run again.
"""

import json
import logging
import time
from collections import Counter
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final, Literal

from celery import Task, shared_task
from celery.exceptions import SoftTimeLimitExceeded
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from reflexr.core import Run
from reflexr.workspace import WorkspaceRef

from actonce.tasks import task_host
from actonce.tasks.outbound import WRITES
from actonce.tasks.soft_limit import retry_after_soft_limit
from actonce.tasks.task_host import TaskHost
from actonce.tasks.unexpected import UnexpectedError, escaped

log = logging.getLogger("actonce.attempt")

ATTEMPT_TASK: Final = "actonce.attempt_run"
"""The registered name of the task that attempts one run; the dispatcher sends by this name."""

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


@shared_task(
    bind=True,
    name=ATTEMPT_TASK,
    max_retries=None,
    acks_late=True,
    throws=(MalformedMessage, RunDeadLettered, UnexpectedError),
)
def attempt_run(self: Task[Any, Any], *args: object, **kwargs: object) -> dict[str, object]:
    """Attempt one run of a reflexr rule, and settle the Celery task on reflexr's verdict.

    A store that goes away meanwhile (`tasks.outage`) makes the task retry, 1 s then doubling
    to 30 s, for as long as it lasts: the next delivery finds the run as the last committed
    transaction left it and settles on that.
    """
    runtime = task_host.current()
    started = time.monotonic()
    ref: AttemptRef | None = None
    try:
        # Inside: a malformed message's dead letter is a write too.
        ref = _validated(runtime, self, args, kwargs)
        return _attempt_and_settle(self, runtime, ref, started)
    except SoftTimeLimitExceeded:
        raise retry_after_soft_limit(self, log, _what(ref)) from None
    except Exception as error:
        raise escaped(self, error, log, kind="attempt", what=_what(ref)) from None


def _what(ref: "AttemptRef | None") -> str:
    return "attempt" if ref is None else f"attempt run_id={ref.run_id}"


def _attempt_and_settle(
    self: Task[Any, Any], runtime: TaskHost, ref: "AttemptRef", started: float
) -> dict[str, object]:
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
    settlement = settle(run, finished=finished, now=runtime.now())
    summary = _summary(ref, run, settlement, writes, time.monotonic() - started)
    log.info("attempt %s", " ".join(f"{k}={v}" for k, v in summary.items()))
    if settlement.outcome in ("retrying", "not_due"):
        assert settlement.eta is not None
        runtime.hold_until(_workspace(ref), run, settlement.eta)
        raise self.retry(eta=settlement.eta, max_retries=None)
    if settlement.outcome == "dead":
        reason = runtime.run(
            runtime.dead_letter_run(
                _workspace(ref), run, task_id=self.request.id, queue=_queue(self)
            )
        )
        if reason is not None:
            # Ids and the reason code only: the run's error text may hold what an action wrote,
            # and this message is published in the task's result, its event and Flower.
            raise RunDeadLettered(f"{reason}: run {run.id} of {run.rule}")
        summary["outcome"] = "not_claimed"  # another delivery dead-lettered it already
    return summary


def _workspace(ref: "AttemptRef") -> WorkspaceRef:
    return WorkspaceRef(ref.tenant_id, ref.workspace_id)


async def _attempt(
    runtime: TaskHost, ref: AttemptRef, writes: Counter[str]
) -> tuple[bool, Run | None]:
    # Set inside the coroutine: the runner runs it in the loop's own context, not the caller's.
    WRITES.set(writes)
    # A run that does not exist is offered to no one (the one-run view finds nothing) and reads
    # back as None: no read beforehand is needed.
    return await runtime.attempt(_workspace(ref), ref.run_id)


def _validated(
    runtime: TaskHost, task: Task[Any, Any], args: tuple[object, ...], kwargs: dict[str, object]
) -> AttemptRef:
    raw = _raw(args, kwargs)
    if len(raw.encode()) > runtime.max_message_bytes:
        error = f"oversized: {len(raw.encode())} bytes > {runtime.max_message_bytes}"
        _dead_letter_message(runtime, task, "malformed_message", error, raw)
        raise MalformedMessage("malformed_message: oversized")
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
        # Field names and pydantic's codes only: the task's exception is published (its result,
        # its event, Flower), and an unknown field's name or a message's text is the sender's.
        codes = sorted({f"{_field(e['loc'])}: {e['type']}" for e in invalid.errors()})
        raise MalformedMessage(f"malformed_message: {'; '.join(codes)}") from None


def _field(location: tuple[int | str, ...]) -> str:
    """The field a validation error is about, if it is one of `AttemptRef`'s; else `other`."""
    name = str(location[0]) if location else "message"
    return name if name in AttemptRef.model_fields or name == "message" else "other"


def _dead_letter_message(
    runtime: TaskHost, task: Task[Any, Any], reason: str, error: str, raw: str
) -> None:
    runtime.run(
        runtime.dead_letter_message(
            raw, reason=reason, error=error, task_id=task.request.id, queue=_queue(task)
        )
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
