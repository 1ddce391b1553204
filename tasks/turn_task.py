"""The turn task: a turn worker has artifactr's Runner take a sent message's turn, once.

It runs on its own queue (`actonce.turns`), served by processes that hold the app's turn agent
(`Definition.turn_agent`), never inside an attempt. It reads the durable request the attempt
recorded before committing the message, then `tasks.turns.take_turn`: a request already taken
starts nothing; one whose thread is busy elsewhere, whose message is not committed yet, or whose
turn ended without taking it, is asked again after a back-off that doubles each time. The
dispatcher's sweep announces requests whose message was lost again, so a dead turn worker loses
no ask.

Every request has a budget, counted durably (`TurnRequest.asks`, so redeliveries and the sweep's
announcements share it): once `turn_max_asks` asks found the message untaken, the request is
dead-lettered `turn_not_taken` through the host (kept, reported to Sentry, listed by
`actonce dead list`), and nothing asks for it again until an operator replays it. A turn that
cannot take its message therefore costs at most that many turns of the model.
"""

import logging
from typing import Any, Final

from celery import Task, shared_task
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from actonce.tasks import host
from actonce.tasks.host import TaskHost
from actonce.tasks.outbound import rule_actor
from actonce.tasks.turns import TurnRequest, take_turn

log = logging.getLogger("actonce.turns")

TURN_TASK: Final = "actonce.take_turn"
"""The registered name of the task that takes a thread's turn for a sent message."""

TURN_NOT_TAKEN: Final = "turn_not_taken"
"""The reason of a dead letter for a turn request whose budget of asks ran out."""

MAX_BACKOFF_S: Final = 300.0
"""The longest a turn waits between two asks, however many came before."""


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


@shared_task(bind=True, name=TURN_TASK, max_retries=None, acks_late=True, throws=(UnknownTurn,))
def take_turn_task(self: Task[Any, Any], **kwargs: object) -> dict[str, object]:
    """Make sure a sent message's turn is taken, once, within the request's budget of asks."""
    runtime = host.current()
    try:
        ref = TurnRef.model_validate(kwargs)
    except ValidationError as invalid:
        raise UnknownTurn(f"malformed_message: {invalid.errors()[0]['msg']}") from None
    outcome, asks = runtime.run(_take(runtime, ref, self.request))
    log.info("turn message_id=%s outcome=%s asks=%s", ref.message_id, outcome, asks)
    if outcome in ("busy", "pending", "not_taken"):
        # Retries are bounded by the durable count of asks: the next delivery dead-letters
        # the request once it is spent, rather than asking.
        backoff_s = min(MAX_BACKOFF_S, runtime.turn_backoff_s * 2 ** max(0, asks - 1))
        raise self.retry(countdown=backoff_s, max_retries=None)
    return {"message_id": ref.message_id, "outcome": outcome, "asks": asks}


async def _take(runtime: TaskHost, ref: TurnRef, delivery: Any) -> tuple[str, int]:
    """Take the turn, or dead-letter the request when its asks are spent; return the outcome
    and the request's asks so far."""
    request = await runtime.turn_requests.get(ref.tenant_id, ref.workspace_id, ref.message_id)
    if request is None:
        raise UnknownTurn(f"no turn request for {ref.message_id} in {ref.workspace_id}")
    if request.taken_at is None and request.asks >= runtime.turn_max_asks:
        await _give_up(runtime, request, delivery)
        return "dead", request.asks
    workspace = await runtime.open_workspace(
        ref.tenant_id, ref.workspace_id, actor=rule_actor(request.rule)
    )
    outcome = await take_turn(
        runner=runtime.turn_runner(),
        workspace=workspace,
        requests=runtime.turn_requests,
        request=request,
        wait_s=runtime.turn_wait_s,
    )
    asks = request.asks + 1
    if outcome != "taken" and asks >= runtime.turn_max_asks:
        # The last ask of the budget failed: give up now rather than after one more back-off.
        await _give_up(runtime, request.model_copy(update={"asks": asks}), delivery)
        return "dead", asks
    return outcome, asks


async def _give_up(runtime: TaskHost, request: TurnRequest, delivery: Any) -> None:
    added = await runtime.dead_letter_turn(
        request,
        reason=TURN_NOT_TAKEN,
        error=(
            f"{request.asks} asks for the turn of {request.message_id} in thread "
            f"{request.thread_id} found it untaken: does the turn agent take messages?"
        ),
        task_id=getattr(delivery, "id", None),
        queue=(getattr(delivery, "delivery_info", None) or {}).get("routing_key"),
    )
    if added:
        log.warning(
            "turn message_id=%s given up after %s asks: dead letter %s",
            request.message_id,
            request.asks,
            TURN_NOT_TAKEN,
        )
