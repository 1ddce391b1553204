"""Dead letters for turns: a turn request whose budget of asks ran out, kept and replayable.

A turn letter is a `DeadLetter` with the reason `turn_not_taken`, the request's tenant,
workspace and rule, its asks as `attempts`, no run, and as `raw` the turn task's own message:
`{"tenant_id", "workspace_id", "message_id"}`, ids only, which is what a replay announces again.
No column is added to `actonce_dead_letters`. Its id is derived from the request's key and how
many of its letters were replayed before, so every delivery that gives up on the same budget
keeps one letter, and a request given up on again after a replay gets a new one.
"""

import json
from datetime import UTC, datetime
from typing import Final

from celery import Celery

from actonce.tasks.lifecycle import Reason
from actonce.tasks.turn_task import TurnRef
from actonce.tasks.turns import TurnRequest, TurnRequests
from actonce.worker.dead_letters.letter import DeadLetter, letter_id
from actonce.worker.dead_letters.store import DeadLetters
from actonce.worker.dispatching.turn_sends import send_turn

MAX_ROUNDS: Final = 10_000
"""How many replayed letters of one request `turn_letter_id` looks past, at most."""


def turn_letter_id(tenant_id: str, workspace_id: str, message_id: str, round_: int) -> str:
    """Return the id of a turn request's dead letter for its `round_`-th budget (0 first).

    Returns:
        `dl_` and the first 16 hex characters of the SHA-256 of `turn`, the key and the round,
        joined by NULs: never a run's letter id.
    """
    return letter_id("turn", tenant_id, workspace_id, message_id, str(round_))


async def next_turn_letter_id(letters: DeadLetters, request: TurnRequest) -> str:
    """Return the id the request's letter takes now: the first round not replayed yet."""
    for round_ in range(MAX_ROUNDS):
        letter_id = turn_letter_id(*request.key, round_)
        kept = await letters.get(letter_id)
        if kept is None or kept.replayed_at is None:
            return letter_id
    raise RuntimeError(f"{request.message_id} was replayed {MAX_ROUNDS} times")


def turn_letter(
    letter_id: str,
    request: TurnRequest,
    *,
    reason: str,
    error: str,
    task_id: str | None,
    queue: str | None,
) -> DeadLetter:
    """Return the dead letter of a turn request given up on, its turn message kept as `raw`."""
    message = TurnRef(
        tenant_id=request.tenant_id,
        workspace_id=request.workspace_id,
        message_id=request.message_id,
    )
    return DeadLetter(
        id=letter_id,
        tenant_id=request.tenant_id,
        workspace_id=request.workspace_id,
        rule=request.rule,
        reason=reason,
        error=error,
        attempts=request.asks,
        task_id=task_id,
        queue=queue,
        raw=message.model_dump_json(),
        dead_at=datetime.now(UTC),
    )


def turn_of(letter: DeadLetter) -> TurnRef | None:
    """Return the turn a letter gave up on, or None if it is not a turn letter."""
    if letter.reason != Reason.TURN_NOT_TAKEN or letter.run_id is not None or letter.raw is None:
        return None
    return TurnRef.model_validate(json.loads(letter.raw))


async def replay_turn(
    letters: DeadLetters, requests: TurnRequests, celery: Celery, letter: DeadLetter
) -> str:
    """Give a turn letter's request a fresh budget and announce it again; return what was done.

    Raises:
        LookupError: If the letter is not a turn letter, or its request is gone.
    """
    ref = turn_of(letter)
    if ref is None:
        raise LookupError(f"{letter.id} is not a turn letter")
    request = await requests.get(ref.tenant_id, ref.workspace_id, ref.message_id)
    if request is None:
        raise LookupError(f"{letter.id}: no turn request for {ref.message_id} any more")
    if request.taken_at is not None:
        await letters.mark_replayed(letter.id, datetime.now(UTC))
        return f"replayed {letter.id}: message {ref.message_id} was taken already; nothing sent"
    await requests.reset_asks(*request.key)
    await letters.mark_replayed(letter.id, datetime.now(UTC))
    send_turn(celery, request)
    return f"replayed {letter.id}: turn for message {ref.message_id} announced, asks reset"
