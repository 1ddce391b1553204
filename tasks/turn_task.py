"""The turn task: a turn worker has artifactr's Runner take a sent message's turn, once.

It runs on its own queue (`actonce.turns`), served by processes that hold the app's turn agent
(`Definition.turn_agent`), never inside an attempt. It reads the durable request the attempt
recorded before committing the message, then `tasks.turns.take_turn`: a request already taken
starts nothing; one whose thread is busy elsewhere, or whose message is not committed yet, is
retried after the Runner's claim could have lapsed. The dispatcher's sweep announces requests
whose message was lost again, so a dead turn worker loses no ask.
"""

import logging
from typing import Any, Final

from celery import Task, shared_task
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from actonce.tasks import host
from actonce.tasks.host import TaskHost
from actonce.tasks.outbound import rule_actor
from actonce.tasks.turns import take_turn

log = logging.getLogger("actonce.turns")

TURN_TASK: Final = "actonce.take_turn"
"""The registered name of the task that takes a thread's turn for a sent message."""

BUSY_RETRY_S: Final = 5
"""How long a busy or pending turn waits before it is asked again."""


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
    """Make sure a sent message's turn is taken, once."""
    runtime = host.current()
    try:
        ref = TurnRef.model_validate(kwargs)
    except ValidationError as invalid:
        raise UnknownTurn(f"malformed_message: {invalid.errors()[0]['msg']}") from None
    outcome = runtime.run(_take(runtime, ref))
    log.info("turn message_id=%s outcome=%s", ref.message_id, outcome)
    if outcome in ("busy", "pending"):
        raise self.retry(countdown=BUSY_RETRY_S, max_retries=None)
    return {"message_id": ref.message_id, "outcome": outcome}


async def _take(runtime: TaskHost, ref: TurnRef) -> str:
    request = await runtime.turn_requests.get(ref.tenant_id, ref.workspace_id, ref.message_id)
    if request is None:
        raise UnknownTurn(f"no turn request for {ref.message_id} in {ref.workspace_id}")
    workspace = await runtime.open_workspace(
        ref.tenant_id, ref.workspace_id, actor=rule_actor(request.rule)
    )
    return await take_turn(
        runner=runtime.turn_runner(),
        workspace=workspace,
        requests=runtime.turn_requests,
        request=request,
        wait_s=runtime.turn_wait_s,
    )
