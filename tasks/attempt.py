"""The attempt task: one Celery message, one attempt of one run by reflexr's own executor.

The message carries ids only, `{tenant_id, workspace_id, run_id}`, as JSON. The task validates
them first; what does not validate is dead-lettered as `malformed_message` and the task fails,
the worker serving on. It then has reflexr's executor attempt exactly that run (lease, claim,
action under the rule's timeout, outcome fenced by epoch), reads the run back and settles on
what the lifecycle's table (`tasks.lifecycle.FATES`) says follows:

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
sends the run again. Each delivery is announced once to the process's observers
(`tasks.observers`), however it ends.
"""

import json
import logging
import time
from collections import Counter
from datetime import datetime
from typing import Any, Final

from celery import Task, shared_task
from celery.exceptions import SoftTimeLimitExceeded
from opentelemetry import trace
from opentelemetry.util.types import AttributeValue
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from reflexr.core import Run
from reflexr.workspace import WorkspaceRef

from actonce.tasks import observers, task_host
from actonce.tasks.lifecycle import FATES, Follows, Happened, Reason, Settlement, settle
from actonce.tasks.observers import AttemptSettled, Letter
from actonce.tasks.outbound import WRITES
from actonce.tasks.soft_limit import retry_after_soft_limit
from actonce.tasks.task_host import TaskHost
from actonce.tasks.tracing import continued
from actonce.tasks.unexpected import UnexpectedError, escaped

log = logging.getLogger("actonce.attempt")

ATTEMPT_TASK: Final = "actonce.attempt_run"
"""The registered name of the task that attempts one run; the dispatcher sends by this name."""


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
    with continued("actonce.attempt", self.request.headers, _delivery(self, kwargs)):
        return _attempt_delivered(self, args, kwargs)


def _attempt_delivered(
    self: Task[Any, Any], args: tuple[object, ...], kwargs: dict[str, object]
) -> dict[str, object]:
    runtime = task_host.current()
    started = time.monotonic()
    ref: AttemptRef | None = None
    try:
        # Inside: a malformed message's dead letter is a write too.
        ref = _validated(runtime, self, args, kwargs, started)
        return _attempt_and_settle(self, runtime, ref, started)
    except SoftTimeLimitExceeded:
        retry = retry_after_soft_limit(self, log, _what(ref))
        _announce(self, ref, Happened.SOFT_LIMIT, started)
        raise retry from None
    except Exception as error:
        # `escaped` raises again what ends the task on purpose, announced where it was decided.
        ending = escaped(self, error, log, kind="attempt", what=_what(ref))
        happened = Happened.UNEXPECTED
        if not isinstance(ending, UnexpectedError):
            happened = Happened.STORE_OUTAGE
        _announce(self, ref, happened, started)
        raise ending from None


def _delivery(task: Task[Any, Any], kwargs: dict[str, object]) -> dict[str, AttributeValue]:
    """The delivery span's attributes: the message's ids, when they are strings, and its try."""
    ids = {f"actonce.{name}": kwargs.get(name) for name in ("tenant_id", "workspace_id", "run_id")}
    fields: dict[str, AttributeValue] = {k: v for k, v in ids.items() if isinstance(v, str)}
    fields["actonce.retries"] = int(task.request.retries or 0)
    return fields


def _what(ref: "AttemptRef | None") -> str:
    return "attempt" if ref is None else f"attempt run_id={ref.run_id}"


def _attempt_and_settle(
    self: Task[Any, Any], runtime: TaskHost, ref: "AttemptRef", started: float
) -> dict[str, object]:
    writes: Counter[str] = Counter()
    finished, run = runtime.run(_attempt(runtime, ref, writes))
    if run is None:
        letter = _dead_letter_message(
            runtime,
            self,
            Reason.UNKNOWN_RUN,
            f"no run {ref.run_id} in {ref.tenant_id}/{ref.workspace_id}",
            json.dumps(ref.model_dump()),
        )
        _announce(self, ref, Happened.UNKNOWN_RUN, started, letter=letter)
        raise MalformedMessage(f"{Reason.UNKNOWN_RUN}: no run {ref.run_id} in {ref.workspace_id}")
    settlement = settle(run, finished=finished, now=runtime.now())
    follows = settlement.fate.follows
    letter = None
    if follows is Follows.RETRY:
        assert settlement.eta is not None
        runtime.hold_until(_workspace(ref), run, settlement.eta)
    elif follows is Follows.DEAD_LETTER:
        letter = runtime.run(
            runtime.dead_letter_run(
                _workspace(ref), run, task_id=self.request.id, queue=_queue(self)
            )
        )
        if letter is None:  # another delivery dead-lettered it already
            settlement = Settlement(Happened.NOT_CLAIMED)
    summary = _summary(ref, run, settlement, writes, time.monotonic() - started)
    _announce(
        self,
        ref,
        settlement.happened,
        started,
        run=run,
        writes=writes,
        letter=letter,
        now=runtime.now(),
    )
    if follows is Follows.RETRY:
        raise self.retry(eta=settlement.eta, max_retries=None)
    if letter is not None:
        # Ids and the reason code only: the run's error text may hold what an action wrote,
        # and this message is published in the task's result, its event and Flower.
        raise RunDeadLettered(f"{letter.reason}: run {run.id} of {run.rule}")
    return summary


def _announce(
    task: Task[Any, Any],
    ref: "AttemptRef | None",
    happened: Happened,
    started: float,
    *,
    run: Run | None = None,
    writes: Counter[str] | None = None,
    letter: Letter | None = None,
    now: datetime | None = None,
) -> None:
    settled_after_s = None
    if run is not None and now is not None and happened in _FINISHING:
        settled_after_s = (now - run.created_at).total_seconds()
    trace.get_current_span().set_attributes(
        {"actonce.outcome": happened.value, "actonce.follows": FATES[happened].follows.value}
    )
    observers.announce(
        AttemptSettled(
            happened=happened,
            task_id=task.request.id,
            queue=_queue(task),
            tenant_id=ref.tenant_id if ref else None,
            workspace_id=ref.workspace_id if ref else None,
            run_id=ref.run_id if ref else None,
            rule=run.rule if run else None,
            attempt=run.attempts if run else None,
            status=run.status if run else None,
            reason=run.reason if run else (letter.reason if letter else None),
            writes=dict(writes or {}),
            duration_s=time.monotonic() - started,
            retry_at=run.next_attempt_at if run and happened in _AT_REFLEXRS_TIME else None,
            letter=letter,
            settled_after_s=settled_after_s,
        )
    )


_AT_REFLEXRS_TIME: Final = frozenset({Happened.RETRYING, Happened.NOT_DUE})
_FINISHING: Final = frozenset({Happened.SUCCEEDED, Happened.DEAD})


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
    runtime: TaskHost,
    task: Task[Any, Any],
    args: tuple[object, ...],
    kwargs: dict[str, object],
    started: float,
) -> AttemptRef:
    raw = _raw(args, kwargs)
    if len(raw.encode()) > runtime.limits.max_message_bytes:
        error = f"oversized: {len(raw.encode())} bytes > {runtime.limits.max_message_bytes}"
        letter = _dead_letter_message(runtime, task, Reason.MALFORMED_MESSAGE, error, raw)
        _announce(task, None, Happened.MALFORMED, started, letter=letter)
        raise MalformedMessage(f"{Reason.MALFORMED_MESSAGE}: oversized")
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
        letter = _dead_letter_message(runtime, task, Reason.MALFORMED_MESSAGE, problems, raw)
        _announce(task, None, Happened.MALFORMED, started, letter=letter)
        # Field names and pydantic's codes only: the task's exception is published (its result,
        # its event, Flower), and an unknown field's name or a message's text is the sender's.
        codes = sorted({f"{_field(e['loc'])}: {e['type']}" for e in invalid.errors()})
        raise MalformedMessage(f"{Reason.MALFORMED_MESSAGE}: {'; '.join(codes)}") from None


def _field(location: tuple[int | str, ...]) -> str:
    """The field a validation error is about, if it is one of `AttemptRef`'s; else `other`."""
    name = str(location[0]) if location else "message"
    return name if name in AttemptRef.model_fields or name == "message" else "other"


def _dead_letter_message(
    runtime: TaskHost, task: Task[Any, Any], reason: Reason, error: str, raw: str
) -> Letter | None:
    return runtime.run(
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
        "outcome": settlement.happened.value,
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
