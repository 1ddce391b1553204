"""The turn task: a turn worker has artifactr's Runner take a sent message's turn, once.

It runs on its own queue (`actonce.turns`), served by processes that hold the app's turn agent
(`Definition.turn_agent`), never inside an attempt. It reads the durable request the attempt
recorded before committing the message, then `tasks.turns.take_turn`: a request already taken
starts nothing; one whose turn ended without taking it is asked again once its back-off is over
(doubling each time); one whose thread is busy elsewhere is tried again after a back-off of this
delivery's own. The dispatcher's sweep announces a request again only once it is due and a grace
has passed, so a dead turn worker loses no ask, and an announcement during a back-off asks
nothing.

Every request has a budget, counted durably (`TurnRequest.asks`, so redeliveries and the sweep's
announcements share it) and spent only by an ask of the Runner that one conditional write
allowed (`TurnRequests.spend_ask`): concurrent deliveries cannot overshoot it. Once
`turn_max_asks` asks found the message untaken, the request is dead-lettered `turn_not_taken`
through the host (kept, reported to Sentry, listed by `actonce dead list`), the task ends
FAILURE (`TurnNotTaken`), and nothing asks for it again until an operator replays it. A turn
that cannot take its message therefore costs at most that many turns of the model.
"""

import logging
import time
from datetime import UTC, datetime, timedelta
from typing import Any, Final

from celery import Task, shared_task
from celery.exceptions import SoftTimeLimitExceeded
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from actonce.tasks import observers, task_host
from actonce.tasks.lifecycle import (
    FATES,
    Follows,
    Happened,
    Reason,
    turn_busy_retry_s,
    turn_longest_wait_s,
    turn_pending_look_s,
)
from actonce.tasks.observers import Letter, TurnSettled
from actonce.tasks.outbound import rule_actor
from actonce.tasks.soft_limit import retry_after_soft_limit
from actonce.tasks.task_host import TaskHost
from actonce.tasks.tracing import continued
from actonce.tasks.turns import AskBudget, TurnOutcome, TurnRequest, take_turn
from actonce.tasks.unexpected import UnexpectedError, escaped

log = logging.getLogger("actonce.turns")

TURN_TASK: Final = "actonce.take_turn"
"""The registered name of the task that takes a thread's turn for a sent message."""

HAPPENED: Final[dict[TurnOutcome, Happened]] = {
    "taken": Happened.TURN_TAKEN,
    "not_taken": Happened.TURN_NOT_TAKEN,
    "busy": Happened.TURN_BUSY,
    "pending": Happened.TURN_PENDING,
    "not_due": Happened.TURN_NOT_DUE_YET,
    "spent": Happened.TURN_BUDGET_SPENT,
}
"""What each of `take_turn`'s outcomes is in the lifecycle's table."""


class TurnRef(BaseModel):
    """Which sent message a turn worker makes sure is taken: ids only."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)

    tenant_id: str = Field(min_length=1, max_length=200)
    """The message's tenant."""

    workspace_id: str = Field(min_length=1, max_length=200)
    """The message's workspace."""

    message_id: str = Field(min_length=1, max_length=200)
    """The message's derived id, `msg_…`."""


class UnknownTurn(Exception):
    """Raised (as the task's FAILURE) for a turn message naming no recorded request."""


class TurnNotTaken(Exception):
    """Raised (as the task's FAILURE) when a request's budget of asks is spent and the message
    is still untaken; it names the message and the reason code, never content."""


@shared_task(
    bind=True,
    name=TURN_TASK,
    max_retries=None,
    acks_late=True,
    throws=(UnknownTurn, TurnNotTaken, UnexpectedError),
)
def take_turn_task(self: Task[Any, Any], **kwargs: object) -> dict[str, object]:
    """Make sure a sent message's turn is taken, once, within the request's budget of asks.

    Ends SUCCESS when the message was taken, or when this delivery had nothing to do: another
    delivery asked lately (``not_due``: that one's retry asks when it is due), or the message is
    not committed (``pending``: the attempt that commits it announces it). Retries at the end of
    the back-off after an ask its turn did not take, and with its own doubling back-off while the
    thread is busy. Ends FAILURE with `TurnNotTaken` once the budget is spent, the request
    dead-lettered `turn_not_taken` (once, whichever delivery gives up). A store that goes away
    meanwhile (`tasks.outage`) makes it retry, 1 s then doubling to 30 s: the request is durable,
    and an ask already spent stays counted. So does Celery's soft time limit (`tasks.soft_limit`),
    once the turn it interrupted is stopped.
    """
    runtime = task_host.current()
    try:
        ref = TurnRef.model_validate(kwargs)
    except ValidationError as invalid:
        raise UnknownTurn(f"{Reason.MALFORMED_MESSAGE}: {invalid.errors()[0]['msg']}") from None
    what = f"turn message_id={ref.message_id}"
    attributes = {
        "actonce.tenant_id": ref.tenant_id,
        "actonce.workspace_id": ref.workspace_id,
        "actonce.message_id": ref.message_id,
    }
    with continued("actonce.turn", self.request.headers, attributes):
        return _turn_delivered(self, runtime, ref, what)


def _turn_delivered(
    self: Task[Any, Any], runtime: TaskHost, ref: TurnRef, what: str
) -> dict[str, object]:
    started = time.monotonic()
    try:
        return _take_and_settle(self, runtime, ref, started)
    except SoftTimeLimitExceeded:
        retry = retry_after_soft_limit(self, log, what)
        _announce(self, ref, Happened.SOFT_LIMIT, started)
        raise retry from None
    except UnknownTurn:
        _announce(self, ref, Happened.UNKNOWN_TURN, started)
        raise
    except Exception as error:
        # `escaped` raises again what ends the task on purpose, announced where it was decided.
        ending = escaped(self, error, log, kind="turn", what=what)
        happened = Happened.UNEXPECTED
        if not isinstance(ending, UnexpectedError):
            happened = Happened.STORE_OUTAGE
        _announce(self, ref, happened, started)
        raise ending from None


def _announce(
    task: Task[Any, Any],
    ref: TurnRef,
    happened: Happened,
    started: float,
    *,
    outcome: str | None = None,
    request: TurnRequest | None = None,
    letter: Letter | None = None,
) -> None:
    observers.announce(
        TurnSettled(
            happened=happened,
            outcome=outcome or happened.value,
            task_id=getattr(task.request, "id", None),
            tenant_id=ref.tenant_id,
            workspace_id=ref.workspace_id,
            message_id=ref.message_id,
            asks=request.asks if request else 0,
            rule=request.rule if request else None,
            duration_s=time.monotonic() - started,
            letter=letter,
        )
    )


def _take_and_settle(
    self: Task[Any, Any], runtime: TaskHost, ref: TurnRef, started: float
) -> dict[str, object]:
    outcome, request = runtime.run(_take(runtime, ref))
    happened = HAPPENED[outcome]
    if happened is Happened.TURN_NOT_TAKEN and request.asks >= runtime.limits.turn_max_asks:
        # The last ask of the budget failed: give up now rather than after one more back-off.
        happened = Happened.TURN_BUDGET_SPENT
    fate = FATES[happened]
    letter: Letter | None = None
    countdown = 0.0
    if fate.follows is Follows.DEAD_LETTER:
        letter = runtime.run(_give_up(runtime, request, self.request))
    elif happened is Happened.TURN_NOT_TAKEN:
        # Ask again when the back-off the ask set is over: due_at, as the store computed it.
        due = request.due_at or datetime.now(UTC)
        countdown = max(0.0, (due - datetime.now(UTC)).total_seconds())
    elif happened is Happened.TURN_BUSY:
        # The budget is not spent on a thread held elsewhere, so this back-off bounds the rate;
        # the sweep leaves the request alone until it is over.
        countdown = turn_busy_retry_s(
            runtime.limits.turn_backoff_s, self.request.retries, _longest_wait_s(runtime)
        )
        runtime.run(_defer(runtime, request, countdown))
    elif happened is Happened.TURN_PENDING:
        # Nothing to retry: the attempt that commits the message announces it. A request whose
        # attempt never commits it is looked at again by the sweep, ever less often.
        waited = (datetime.now(UTC) - request.requested_at).total_seconds()
        runtime.run(
            _defer(runtime, request, turn_pending_look_s(runtime.limits.turn_backoff_s, waited))
        )
    _announce(self, ref, happened, started, outcome=outcome, request=request, letter=letter)
    if fate.follows is Follows.DEAD_LETTER:
        raise TurnNotTaken(
            f"{Reason.TURN_NOT_TAKEN}: message {request.message_id} in thread "
            f"{request.thread_id} untaken after {request.asks} asks"
        )
    if fate.follows is Follows.RETRY:
        raise self.retry(countdown=countdown, max_retries=None)
    return {"message_id": ref.message_id, "outcome": outcome, "asks": request.asks}


async def _take(runtime: TaskHost, ref: TurnRef) -> tuple[TurnOutcome, TurnRequest]:
    """Take the turn within the request's budget; return the outcome and the request as it
    stands afterwards (its asks, and when it is due).

    Raises:
        UnknownTurn: If no request is recorded for the message.
    """
    request = await runtime.turn_requests.get(ref.tenant_id, ref.workspace_id, ref.message_id)
    if request is None:
        raise UnknownTurn(f"no turn request for {ref.message_id} in {ref.workspace_id}")
    workspace = await runtime.open_workspace(
        ref.tenant_id, ref.workspace_id, actor=rule_actor(request.rule)
    )
    outcome = await take_turn(
        runner=runtime.turn_runner(),
        workspace=workspace,
        requests=runtime.turn_requests,
        request=request,
        wait_s=runtime.limits.turn_wait_s,
        stop_at_deadline=not runtime.loop_runs_between_tasks,
        budget=AskBudget(
            max_asks=runtime.limits.turn_max_asks,
            backoff_s=runtime.limits.turn_backoff_s,
            max_backoff_s=_longest_wait_s(runtime),
        ),
    )
    after = await runtime.turn_requests.get(*request.key)
    return outcome, after or request


def _longest_wait_s(runtime: TaskHost) -> float:
    """The longest a turn task waits before it asks again: its retry must not be refused."""
    return turn_longest_wait_s(runtime.limits.max_retry_delay_s)


async def _defer(runtime: TaskHost, request: TurnRequest, seconds: float) -> None:
    until = datetime.now(UTC) + timedelta(seconds=seconds)
    await runtime.turn_requests.defer(*request.key, until)


async def _give_up(runtime: TaskHost, request: TurnRequest, delivery: Any) -> Letter | None:
    return await runtime.dead_letter_turn(
        request,
        reason=Reason.TURN_NOT_TAKEN,
        error=(
            f"{request.asks} asks for the turn of {request.message_id} in thread "
            f"{request.thread_id} found it untaken: does the turn agent take messages?"
        ),
        task_id=getattr(delivery, "id", None),
        queue=(getattr(delivery, "delivery_info", None) or {}).get("routing_key"),
    )
