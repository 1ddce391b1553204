"""Turns from the pool: a rule's message is sent once, and the turn it asks for is never lost.

artifactr's `Runner.send` commits a message, then asks for the thread's turn, in two transactions:
a process that stops between them leaves the message untaken, and a retried send finds its id
used and asks nothing (lattice-relayr.md, pitfall 4). The pool closes that gap in three steps:

1. `send_once` records a `TurnRequest` first, in actonce's own store, then commits the message
   directly as the rule's actor, under its derived id, then announces the request (the pool
   enqueues a turn task). A retried send finds the request and the message there and announces
   again; a lost announcement is found by `sweep`.
2. A turn worker, a process holding the app's `Runner` and agent, calls `take_turn` per request:
   it asks the Runner for the thread's turn, waits for it, and marks the request taken once
   artifactr's own cursors say the Runner took the message. No turn runs in an attempt's loop.
3. `sweep` lists the requests not taken yet, to be announced again.

What "taken" means, read in artifactr-ai 0.2.1's runner source: a thread's cursor
``artifactr.runner/{thread}/taken`` is saved in the transaction of the write that consumes
messages: the ``run_started`` of the run a message prompts (as far as the message), the
``run_ended`` of a run whose watcher delivered later messages, an answer to a paused run, or the
Runner's own step past messages it may not act on. A message is taken once that cursor (before
any run saved it, the upgrade cursor or what the agent was last told, as the Runner reads it) has
reached the ``seq`` of its ``message_posted``. Checked by running it: mid-turn, the cursor stood
at the message's ``seq``; a message committed directly by a rule's `ExternalAgentActor` asked
for nothing, and the thread's next `Runner.ask`, by the rule's handle, took it and answered it.

How a turn worker that dies is recovered, observed with a `claim_ttl` of 1 s and the worker's
event loop frozen where it stood (its claim never renewed nor released):

- A fresh Runner's `ask` within `claim_ttl` finds the thread claimed (`ThreadBusy`, swallowed:
  it returns None) and looks again a `claim_ttl` later, in the background of its own loop.
- Died after claiming, before the run's ``run_started``: the message is not taken. Once the claim
  lapsed, that background look (or a later `ask`) started the turn, and the message was answered
  once.
- Died mid-turn, after ``run_started`` (in the model call): the message was taken as the run
  started. The run stayed ``running`` until the thread was next claimed; that claimant recorded
  it ``failed``, reason ``abandoned``, and planned nothing for the message: neither `ask` nor
  `Runner.recover` answered it again, and `take_turn` reports it taken. Answering it would take
  a new message.
"""

import asyncio
import logging
import weakref
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Final, Literal, Protocol

import artifactr
import artifactr.agent
import artifactr.core as a
import sqlalchemy as sa
from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, field_validator
from sqlalchemy.ext.asyncio import AsyncEngine

from actonce.tasks.sql import UtcDateTime, aware_utc, insert_once

logger = logging.getLogger("actonce.turns")

type TurnOutcome = Literal["taken", "busy", "pending", "not_taken", "not_due", "spent"]
"""What `take_turn` found: the Runner took the message; a turn holds the thread (here or in
another process), so try later; the message is not committed yet (its attempt announces it once
it is); the turn this ask ran ended without taking it, so try later, within the request's budget
of asks; another delivery asked lately and the back-off is not over, so this one asks nothing;
or the budget of asks is spent."""

type _Key = tuple[str, str, str]
"""A request's key: tenant, workspace and message id (message ids are unique in a workspace)."""


class TurnRequest(BaseModel):
    """A rule's request for a thread's turn, for one message it sent: durable until taken."""

    model_config = ConfigDict(frozen=True)

    tenant_id: str
    """The tenant of the artifactr workspace the message is in."""

    workspace_id: str
    """The artifactr workspace the message is in, with the run's tenant and id."""

    thread_id: a.ThreadId
    """The thread whose turn is asked for."""

    message_id: a.MessageId
    """The message's derived id: the same on every attempt that sends it."""

    rule: str
    """The rule whose run sent it; its actor is `reflexr:<rule>`."""

    requested_at: AwareDatetime
    """When it was first requested, in UTC."""

    taken_at: AwareDatetime | None = None
    """When a turn worker found that the Runner took the message; None until then."""

    asks: int = Field(default=0, ge=0)
    """How many times a turn worker asked the Runner for the message's turn: each may have run
    one turn, so one model bill. Looks that found the message taken, missing or not due yet, and
    asks that found the thread held elsewhere, are not counted."""

    asked_at: AwareDatetime | None = None
    """When the last counted ask was made; None before the first."""

    due_at: AwareDatetime | None = None
    """When the request may next be looked at: after its back-off, or its turn task's next try.
    The dispatcher re-announces a request only a grace after this (or after `requested_at`)."""

    @field_validator("requested_at", "taken_at", "asked_at", "due_at", mode="after")
    @classmethod
    def _in_utc(cls, value: datetime | None) -> datetime | None:
        return None if value is None else value.astimezone(UTC)

    @property
    def key(self) -> _Key:
        """What identifies the request: tenant, workspace and message id."""
        return (self.tenant_id, self.workspace_id, self.message_id)


@dataclass(frozen=True)
class AskBudget:
    """How many asks a turn request gets and how far apart they are: what `take_turn` spends.

    The n-th ask may follow the one before it only `backoff(n - 1)` later: `backoff_s`, doubled
    after each ask, never more than `max_backoff_s`.
    """

    max_asks: int = 5
    """Asks before the request is given up on (the turn task dead-letters it)."""

    backoff_s: float = 5.0
    """The wait after the first ask before the second."""

    max_backoff_s: float = 300.0
    """The longest wait between two asks."""

    def backoff(self, asks: int) -> timedelta:
        """Return the wait after the `asks`-th ask before the next one may be made (0 before the
        first)."""
        if asks <= 0:
            return timedelta(0)
        return timedelta(seconds=min(self.max_backoff_s, self.backoff_s * 2 ** (asks - 1)))


class TurnRequests(Protocol):
    """Where turn requests are kept: a port, with `SqlTurnRequests` and an in-memory twin."""

    async def request(self, req: TurnRequest) -> bool:
        """Record a request once, by its key; return whether it is new. A repeat changes nothing."""
        ...

    async def get(
        self, tenant_id: str, workspace_id: str, message_id: a.MessageId
    ) -> TurnRequest | None:
        """Return the request for a message, or None if there is none."""
        ...

    async def pending(
        self,
        *,
        requested_before: datetime,
        limit: int,
        max_asks: int | None = None,
        due_before: datetime | None = None,
    ) -> list[TurnRequest]:
        """Return up to `limit` untaken requests made before `requested_before`, oldest first;
        with `max_asks`, only those asked fewer times (the others were given up on); with
        `due_before`, only those with no `due_at` or one before it."""
        ...

    async def reset_asks(self, tenant_id: str, workspace_id: str, message_id: a.MessageId) -> None:
        """Give a request a fresh budget: no asks, no back-off; nothing if there is none."""
        ...

    async def spend_ask(
        self,
        tenant_id: str,
        workspace_id: str,
        message_id: a.MessageId,
        *,
        seen: int,
        now: datetime,
        budget: AskBudget,
    ) -> bool:
        """Count one ask, if it may be made now; return whether it was counted.

        It is counted, in one conditional write, only while the request is untaken, still has
        the `seen` asks the caller read, has budget left, and its back-off since the last ask
        is over; `asked_at` becomes `now` and `due_at` the end of the next back-off. Of
        concurrent callers that read the same count, at most one is counted.
        """
        ...

    async def refund_ask(
        self,
        tenant_id: str,
        workspace_id: str,
        message_id: a.MessageId,
        *,
        spent: int,
        at: datetime,
    ) -> bool:
        """Take back the ask counted as the `spent`-th at `at`, which started no turn; return
        whether it did. Nothing changes if another ask was counted since; the back-off stays."""
        ...

    async def defer(
        self, tenant_id: str, workspace_id: str, message_id: a.MessageId, until: datetime
    ) -> None:
        """Make an untaken request due no sooner than `until`; an earlier `due_at` moves, a
        later one stays."""
        ...

    async def mark_taken(
        self, tenant_id: str, workspace_id: str, message_id: a.MessageId, at: datetime
    ) -> None:
        """Mark the request taken at `at`; the first mark stands, and a missing one is skipped."""
        ...

    async def purge_settled(self, *, older_than: datetime, max_asks: int) -> int:
        """Remove the requests settled before `older_than`; return how many were removed.

        Settled means taken (`taken_at` before `older_than`), or given up on: untaken, asked
        `max_asks` times or more (the turn task dead-letters it then), the last ask before
        `older_than`. A request still waiting for its turn is kept, however old. Once a
        given-up request is removed, replaying its `turn_not_taken` letter finds nothing to
        announce: purge after deciding not to replay it.

        Raises:
            ValueError: If `older_than` is naive, or `max_asks` is below 1.
        """
        ...


class InMemoryTurnRequests:
    """Turn requests in this process: for tests and single-process apps; lost when it stops."""

    def __init__(self) -> None:
        self._requests: dict[_Key, TurnRequest] = {}

    async def request(self, req: TurnRequest) -> bool:
        """Record a request once, by its key; return whether it is new. A repeat changes nothing."""
        if req.key in self._requests:
            return False
        self._requests[req.key] = req
        return True

    async def get(
        self, tenant_id: str, workspace_id: str, message_id: a.MessageId
    ) -> TurnRequest | None:
        """Return the request for a message, or None if there is none."""
        return self._requests.get((tenant_id, workspace_id, message_id))

    async def pending(
        self,
        *,
        requested_before: datetime,
        limit: int,
        max_asks: int | None = None,
        due_before: datetime | None = None,
    ) -> list[TurnRequest]:
        """Return up to `limit` untaken requests made before `requested_before`, oldest first;
        with `max_asks`, only those asked fewer times; with `due_before`, only those due
        before it."""
        waiting = [
            req
            for req in self._requests.values()
            if req.taken_at is None
            and req.requested_at < requested_before
            and (max_asks is None or req.asks < max_asks)
            and (due_before is None or req.due_at is None or req.due_at < due_before)
        ]
        return sorted(waiting, key=lambda req: req.requested_at)[:limit]

    async def reset_asks(self, tenant_id: str, workspace_id: str, message_id: a.MessageId) -> None:
        """Give a request a fresh budget: no asks, no back-off; nothing if there is none."""
        key = (tenant_id, workspace_id, message_id)
        if (req := self._requests.get(key)) is not None:
            self._requests[key] = req.model_copy(
                update={"asks": 0, "asked_at": None, "due_at": None}
            )

    async def spend_ask(
        self,
        tenant_id: str,
        workspace_id: str,
        message_id: a.MessageId,
        *,
        seen: int,
        now: datetime,
        budget: AskBudget,
    ) -> bool:
        """Count one ask, if it may be made now (see `TurnRequests.spend_ask`)."""
        key = (tenant_id, workspace_id, message_id)
        req = self._requests.get(key)
        # No await between the check and the write: one event loop makes them one step.
        if req is None or req.taken_at is not None or req.asks != seen:
            return False
        if seen >= budget.max_asks:
            return False
        if req.asked_at is not None and req.asked_at > now - budget.backoff(seen):
            return False
        self._requests[key] = req.model_copy(
            update={
                "asks": seen + 1,
                "asked_at": now.astimezone(UTC),
                "due_at": (now + budget.backoff(seen + 1)).astimezone(UTC),
            }
        )
        return True

    async def refund_ask(
        self,
        tenant_id: str,
        workspace_id: str,
        message_id: a.MessageId,
        *,
        spent: int,
        at: datetime,
    ) -> bool:
        """Take back an ask that started no turn (see `TurnRequests.refund_ask`)."""
        key = (tenant_id, workspace_id, message_id)
        req = self._requests.get(key)
        if req is None or req.taken_at is not None or req.asks != spent or req.asked_at != at:
            return False
        self._requests[key] = req.model_copy(update={"asks": spent - 1})
        return True

    async def defer(
        self, tenant_id: str, workspace_id: str, message_id: a.MessageId, until: datetime
    ) -> None:
        """Make an untaken request due no sooner than `until`."""
        key = (tenant_id, workspace_id, message_id)
        req = self._requests.get(key)
        if req is not None and req.taken_at is None and (req.due_at is None or req.due_at < until):
            self._requests[key] = req.model_copy(update={"due_at": until.astimezone(UTC)})

    async def mark_taken(
        self, tenant_id: str, workspace_id: str, message_id: a.MessageId, at: datetime
    ) -> None:
        """Mark the request taken at `at`; the first mark stands, and a missing one is skipped."""
        key = (tenant_id, workspace_id, message_id)
        if (req := self._requests.get(key)) is not None and req.taken_at is None:
            self._requests[key] = TurnRequest.model_validate({**req.model_dump(), "taken_at": at})

    async def purge_settled(self, *, older_than: datetime, max_asks: int) -> int:
        """Remove the requests settled before `older_than` (see `TurnRequests.purge_settled`)."""
        before = _purge_cutoff(older_than, max_asks)
        settled = [
            key
            for key, req in self._requests.items()
            if (req.taken_at is not None and req.taken_at < before)
            or (
                req.taken_at is None
                and req.asks >= max_asks
                and req.asked_at is not None
                and req.asked_at < before
            )
        ]
        for key in settled:
            del self._requests[key]
        return len(settled)


METADATA: Final = sa.MetaData()
"""actonce's turn-request table, apart from every other store's metadata."""

TURN_REQUESTS: Final = sa.Table(
    "actonce_turn_requests",
    METADATA,
    sa.Column("tenant_id", sa.String, primary_key=True),
    sa.Column("workspace_id", sa.String, primary_key=True),
    sa.Column("message_id", sa.String, primary_key=True),
    sa.Column("thread_id", sa.String, nullable=False),
    sa.Column("rule", sa.String, nullable=False),
    sa.Column("requested_at", UtcDateTime, nullable=False),
    sa.Column("taken_at", UtcDateTime, nullable=True),
    sa.Column("asks", sa.Integer, nullable=False, server_default="0"),
    sa.Column("asked_at", UtcDateTime, nullable=True),
    sa.Column("due_at", UtcDateTime, nullable=True),
    sa.Index("actonce_turn_requests_pending", "taken_at", "requested_at"),
)
"""The table `SqlTurnRequests` keeps requests in, one row per message."""


class SqlTurnRequests:
    """Turn requests in SQL, shared by every process: SQLite (aiosqlite) or PostgreSQL (asyncpg).

    The table comes from actonce's migrations (`actonce migrate`); this module declares it.

    Args:
        engine: An async engine on the database that holds `actonce_turn_requests`.

    Raises:
        ValueError: If the engine's dialect is neither SQLite nor PostgreSQL.
    """

    def __init__(self, engine: AsyncEngine) -> None:
        if engine.dialect.name not in _DIALECTS:
            raise ValueError(
                f"turn requests are kept in SQLite or PostgreSQL, as sqlite+aiosqlite:///x.db or "
                f"postgresql+asyncpg://host/db, not {engine.dialect.name}"
            )
        self._engine = engine

    async def request(self, req: TurnRequest) -> bool:
        """Record a request once, by its key; return whether it is new. A repeat changes nothing."""
        row = req.model_dump()
        async with self._engine.begin() as connection:
            return await insert_once(connection, TURN_REQUESTS, row)

    async def get(
        self, tenant_id: str, workspace_id: str, message_id: a.MessageId
    ) -> TurnRequest | None:
        """Return the request for a message, or None if there is none."""
        select = sa.select(TURN_REQUESTS).where(_is(tenant_id, workspace_id, message_id))
        async with self._engine.connect() as connection:
            row = (await connection.execute(select)).mappings().first()
        return None if row is None else TurnRequest.model_validate(dict(row))

    async def pending(
        self,
        *,
        requested_before: datetime,
        limit: int,
        max_asks: int | None = None,
        due_before: datetime | None = None,
    ) -> list[TurnRequest]:
        """Return up to `limit` untaken requests made before `requested_before`, oldest first;
        with `max_asks`, only those asked fewer times; with `due_before`, only those due
        before it."""
        where = [
            TURN_REQUESTS.c.taken_at.is_(None),
            TURN_REQUESTS.c.requested_at < requested_before,
        ]
        if max_asks is not None:
            where.append(TURN_REQUESTS.c.asks < max_asks)
        if due_before is not None:
            where.append(
                sa.or_(TURN_REQUESTS.c.due_at.is_(None), TURN_REQUESTS.c.due_at < due_before)
            )
        select = (
            sa.select(TURN_REQUESTS)
            .where(*where)
            .order_by(TURN_REQUESTS.c.requested_at)
            .limit(limit)
        )
        async with self._engine.connect() as connection:
            rows = (await connection.execute(select)).mappings().all()
        return [TurnRequest.model_validate(dict(row)) for row in rows]

    async def spend_ask(
        self,
        tenant_id: str,
        workspace_id: str,
        message_id: a.MessageId,
        *,
        seen: int,
        now: datetime,
        budget: AskBudget,
    ) -> bool:
        """Count one ask, if it may be made now (see `TurnRequests.spend_ask`).

        One UPDATE whose WHERE holds every condition: PostgreSQL re-checks it on the row it
        waited for (so a second caller that read the same count finds it changed), and SQLite
        runs one writer at a time; the row count says whether this caller was counted.
        """
        c = TURN_REQUESTS.c
        if seen >= budget.max_asks:
            return False
        update = (
            sa.update(TURN_REQUESTS)
            .where(
                _is(tenant_id, workspace_id, message_id),
                c.taken_at.is_(None),
                c.asks == seen,
                c.asks < budget.max_asks,
                sa.or_(c.asked_at.is_(None), c.asked_at <= now - budget.backoff(seen)),
            )
            .values(asks=c.asks + 1, asked_at=now, due_at=now + budget.backoff(seen + 1))
        )
        async with self._engine.begin() as connection:
            return bool((await connection.execute(update)).rowcount == 1)

    async def refund_ask(
        self,
        tenant_id: str,
        workspace_id: str,
        message_id: a.MessageId,
        *,
        spent: int,
        at: datetime,
    ) -> bool:
        """Take back an ask that started no turn (see `TurnRequests.refund_ask`)."""
        c = TURN_REQUESTS.c
        update = (
            sa.update(TURN_REQUESTS)
            .where(
                _is(tenant_id, workspace_id, message_id),
                c.taken_at.is_(None),
                c.asks == spent,
                c.asked_at == at,
            )
            .values(asks=c.asks - 1)
        )
        async with self._engine.begin() as connection:
            return bool((await connection.execute(update)).rowcount == 1)

    async def defer(
        self, tenant_id: str, workspace_id: str, message_id: a.MessageId, until: datetime
    ) -> None:
        """Make an untaken request due no sooner than `until`."""
        c = TURN_REQUESTS.c
        update = (
            sa.update(TURN_REQUESTS)
            .where(
                _is(tenant_id, workspace_id, message_id),
                c.taken_at.is_(None),
                sa.or_(c.due_at.is_(None), c.due_at < until),
            )
            .values(due_at=until)
        )
        async with self._engine.begin() as connection:
            await connection.execute(update)

    async def reset_asks(self, tenant_id: str, workspace_id: str, message_id: a.MessageId) -> None:
        """Give a request a fresh budget: no asks, no back-off; nothing if there is none."""
        update = (
            sa.update(TURN_REQUESTS)
            .where(_is(tenant_id, workspace_id, message_id))
            .values(asks=0, asked_at=None, due_at=None)
        )
        async with self._engine.begin() as connection:
            await connection.execute(update)

    async def mark_taken(
        self, tenant_id: str, workspace_id: str, message_id: a.MessageId, at: datetime
    ) -> None:
        """Mark the request taken at `at`; the first mark stands, and a missing one is skipped."""
        update = (
            sa.update(TURN_REQUESTS)
            .where(_is(tenant_id, workspace_id, message_id), TURN_REQUESTS.c.taken_at.is_(None))
            .values(taken_at=at)
        )
        async with self._engine.begin() as connection:
            await connection.execute(update)

    async def purge_settled(self, *, older_than: datetime, max_asks: int) -> int:
        """Remove the requests settled before `older_than` (see `TurnRequests.purge_settled`).

        One `DELETE`: a request a turn worker takes or asks for meanwhile is either removed as
        it was read or kept as it was changed, never half of each.
        """
        before = _purge_cutoff(older_than, max_asks)
        c = TURN_REQUESTS.c
        taken = sa.and_(c.taken_at.is_not(None), c.taken_at < before)
        given_up = sa.and_(c.taken_at.is_(None), c.asks >= max_asks, c.asked_at < before)
        delete = sa.delete(TURN_REQUESTS).where(sa.or_(taken, given_up))
        async with self._engine.begin() as connection:
            return int((await connection.execute(delete)).rowcount)


async def send_once(
    *,
    workspace: artifactr.Workspace,
    requests: TurnRequests,
    request: TurnRequest,
    content: str,
    announce: Callable[[TurnRequest], Awaitable[None]],
) -> None:
    """Send a rule's message that asks for its thread's turn: committed once, its ask kept.

    The request is recorded before the message is committed, so no stop between the two loses
    the ask; then the message is committed directly (no turn starts here), and the request is
    announced to the turn workers. Every step is safe to repeat: a retried or redelivered send
    finds the request recorded and the message's id used, and announces again, unless a turn
    worker has already found the message taken. A failing `announce` is logged, not raised:
    `sweep` finds the request again. Whether the rule may start turns is the caller's check
    (`NotAllowed` before this is called).

    Args:
        workspace: The artifactr workspace, opened as the rule's actor.
        requests: Where the request is kept until taken.
        request: The request, with the message's derived id and the thread.
        content: The message's text.
        announce: Hands the request to a turn worker, as by enqueueing its turn task.

    Raises:
        artifactr.Rejection: If artifactr refuses the message other than for a used id (its
            thread is missing, the actor may not post there, the text is invalid); the request
            stays recorded and pending.
    """
    if not await requests.request(request):
        recorded = await requests.get(*request.key)
        if recorded is not None and recorded.taken_at is not None:
            logger.info(
                "message %s in thread %s was taken already; nothing to announce",
                request.message_id,
                request.thread_id,
            )
            return
    message = a.PostMessage(
        thread_id=request.thread_id,
        message_id=request.message_id,
        content=content,
        kind="message",
    )
    try:
        await workspace.commit(message)
    except a.InvalidState:
        # A message's only InvalidState is a used id: an earlier attempt committed it.
        logger.info("message %s was committed by an earlier attempt", request.message_id)
    try:
        await announce(request)
    except Exception:
        logger.warning(
            "announcing the turn for message %s in thread %s failed; the sweep announces it again",
            request.message_id,
            request.thread_id,
            exc_info=True,
        )


async def take_turn(
    *,
    runner: artifactr.agent.Runner[Any],
    workspace: artifactr.Workspace,
    requests: TurnRequests,
    request: TurnRequest,
    wait_s: float,
    budget: AskBudget | None = None,
    stop_at_deadline: bool = False,
) -> TurnOutcome:
    """Have the Runner take a request's message: what a turn worker does for one request.

    A request marked taken returns at once, starting nothing. Otherwise it reads artifactr:
    a message taken is marked so, one not committed yet is left to the attempt that commits it
    (and announces it then). Only a message committed and untaken is asked for, and only once
    `requests.spend_ask` counted the ask: within the budget, after the back-off since the last
    ask, and by one of several deliveries that race. It then waits, up to `wait_s` in all, for
    each turn this process runs in the thread until one has taken the message; a turn still
    running then goes on in this process's loop, which must keep running (or is stopped, with
    `stop_at_deadline`). When another holder has the thread, the ask started nothing here and
    is taken back (`refund_ask`); the Runner also looks again a `claim_ttl` later, in the
    background, and may start the turn then.

    Taken means artifactr's cursor ``artifactr.runner/{thread}/taken`` has reached the message,
    as the Runner itself reads it, so a turn that died after it started (recorded ``abandoned``
    by the thread's next claimant) counts as taken and is not run again.

    Args:
        runner: This process's Runner, with the app's agent.
        workspace: The artifactr workspace, opened as the rule's actor: the turn acts for it.
        requests: Where the request is kept; its asks are counted and it is marked taken here.
        request: The request to carry out.
        wait_s: How long to wait for turns to end, in seconds.
        budget: How many asks the request gets, and their back-off; `AskBudget()` if None.
        stop_at_deadline: Stop this process's turns still running in the thread when
            `wait_s` runs out (artifactr records them ``stopped``), after waiting for their
            hand-overs, for a loop that stops when this call returns (a prefork child's): left
            there, a turn would freeze until the next task, its claim lapsing, its reply never
            posted. They are stopped by closing `runner` (`Runner.aclose`): a stopped run hands
            the thread over, and a message still untaken would start the next turn at once. The
            caller's process then needs a new Runner (`retired`). A message whose turn had
            started counts as taken, as for a turn whose worker died. A call cancelled
            meanwhile (the task's soft time limit) stops them at once, then ends cancelled.

    It asks at most once per call: when the turn it ran (and any the Runner handed the thread
    over to) ended without taking the message, it returns ``not_taken``, and the caller asks
    again once the back-off is over (the request's `due_at`), within the budget.

    Returns:
        ``taken`` once the Runner took the message; ``busy`` while a turn holds the thread, in
        this process or another (which hands it over, or whose claim lapses), or `wait_s` ran
        out first; ``pending`` while the message is not committed; ``not_taken`` when the turn
        this call asked for ended without taking it; ``not_due`` when the back-off since the
        last ask is not over (or another delivery just asked); ``spent`` when the budget is.

    Raises:
        ValueError: If the request names a notice, which never starts a turn.
        artifactr.Rejection: If artifactr refuses the ask, as when the rule's actor may not
            start the thread's turn (`Forbidden`).
        asyncio.CancelledError: If the call was cancelled. An ask it spent stays spent, unless
            `stop_at_deadline` stopped its turn before the turn started, or no turn had
            started yet (the message still untaken, no model called): that ask is taken back.
    """
    budget = budget or AskBudget()
    recorded = await requests.get(*request.key)
    if recorded is not None and recorded.taken_at is not None:
        return "taken"
    state = await _state(workspace, request)
    if state == "taken":
        await requests.mark_taken(*request.key, datetime.now(UTC))
        return "taken"
    if state == "missing":
        return "pending"
    seen = recorded.asks if recorded is not None else 0
    if seen >= budget.max_asks:
        return "spent"
    asked_at = datetime.now(UTC)
    if not await requests.spend_ask(*request.key, seen=seen, now=asked_at, budget=budget):
        # Not counted: read why. Another delivery may have just asked, or taken it.
        again = await requests.get(*request.key)
        if again is not None and again.taken_at is not None:
            return "taken"
        if again is None or again.asks >= budget.max_asks:
            return "spent"
        return "not_due"
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait_s
    ran = False
    ended = False  # a turn of this call's ended on its own: the ask bought a turn
    # One ask per call: a turn that ends without taking the message (an agent that cannot take
    # it) must not be asked for again at once, or the model is billed without end.
    # None from ask: another holder has the thread, or this process's hand-over took it.
    try:
        handle = await runner.ask(workspace, request.thread_id) or runner.running(request.thread_id)
        while handle is not None and loop.time() < deadline:
            ran = True
            await asyncio.wait({handle.task}, timeout=max(0.0, deadline - loop.time()))
            ended = ended or handle.task.done()
            state = await _state(workspace, request)
            if state != "untaken" or not handle.task.done():
                break  # taken; or a turn of this process runs on: the caller tries again later
            # The Runner's own hand-over may have started the next turn: wait for it, asking for
            # nothing.
            following = runner.running(request.thread_id)
            handle = following if following is not None and following is not handle else None
        # The turns waited for, or stopped, at the end may have taken it since it was read.
        settled = stop_at_deadline and await _leave_nothing_running(
            runner, request, deadline, f"after {wait_s}s (ACTONCE_TURN_WAIT_S)"
        )
    except asyncio.CancelledError:
        # Cancelled by the task's soft time limit (`actonce.worker.process.soft_limit`), in a
        # process whose loop stops when this call returns: leave no turn there to freeze.
        if stop_at_deadline:
            await _leave_nothing_running(
                runner, request, loop.time(), "at the task's soft time limit"
            )
            if not ended:
                await _refund_if_untaken(workspace, requests, request, spent=seen + 1, at=asked_at)
        raise
    if not ran or settled:
        state = await _state(workspace, request)
    if state == "taken":
        await requests.mark_taken(*request.key, datetime.now(UTC))
        return "taken"
    if not ran:
        # No turn ran here: the thread is another holder's, whose turn will carry the message
        # or whose claim lapses. The budget counts turns, so this ask is taken back.
        await requests.refund_ask(*request.key, spent=seen + 1, at=asked_at)
        return "busy"
    return "not_taken" if runner.running(request.thread_id) is None else "busy"


async def sweep(
    requests: TurnRequests,
    *,
    requested_before: datetime,
    limit: int,
    max_asks: int | None = None,
    due_before: datetime | None = None,
) -> list[TurnRequest]:
    """Return the requests to announce again: not taken, and requested before a time.

    Choose `requested_before` a little in the past (longer than a turn task's usual wait), so
    requests whose turn is still being taken are not announced twice; announcing twice is safe.
    With `max_asks`, a request asked that many times is left out: its budget is spent and it was
    dead-lettered (a replay gives it a fresh one). With `due_before` (the same grace in the
    past), a request in its back-off is left out: its turn task asks again when it is due, and
    only a request still untaken a grace after that was lost.
    """
    return await requests.pending(
        requested_before=requested_before, limit=limit, max_asks=max_asks, due_before=due_before
    )


# ─── how ──────────────────────────────────────────────────────────────────────


async def _leave_nothing_running(
    runner: artifactr.agent.Runner[Any], request: TurnRequest, deadline: float, when: str
) -> bool:
    """Wait until `deadline` (loop time) for this process's turns in the request's thread, the
    ones their hand-overs start included; if one still runs then, log `when` as the reason and
    close the Runner, which stops every run and hand-over of this process's (`retired`). Return
    whether there was any."""
    loop = asyncio.get_running_loop()
    found = False
    while True:
        await runner.drain()  # a turn that ended may be starting the thread's next one
        running = runner.running(request.thread_id)
        if running is None:
            return found
        found = True
        if loop.time() < deadline:
            await asyncio.wait({running.task}, timeout=deadline - loop.time())
            continue
        logger.warning(
            "turn run=%s in thread %s still running %s: stopped, since this process's loop "
            "stops between tasks; its messages count as taken",
            running.run_id,
            request.thread_id,
            when,
        )
        # Stopping the run alone hands the thread over, and a message still untaken (its own,
        # if it had not started, or a later one) starts the next turn at once: stopped in turn,
        # it spun until the hard limit. Closing the Runner stops its runs and hand-overs, and
        # starts no more; the process makes a new one for its next task (`retired`).
        _RETIRED.add(runner)
        await runner.aclose()
        return True


_RETIRED: Final[weakref.WeakSet["artifactr.agent.Runner[Any]"]] = weakref.WeakSet()
"""The Runners `take_turn` closed to leave nothing running (`stop_at_deadline`)."""


def retired(runner: "artifactr.agent.Runner[Any]") -> bool:
    """Whether `take_turn` closed `runner` to leave nothing running in a loop that stops between
    tasks (`stop_at_deadline`): it starts no more turns, and its process needs a new one."""
    return runner in _RETIRED


async def _refund_if_untaken(
    workspace: artifactr.Workspace,
    requests: TurnRequests,
    request: TurnRequest,
    *,
    spent: int,
    at: datetime,
) -> None:
    """Take back the `spent`-th ask, made `at`, if the request's message is still untaken: its
    turn, stopped, never started, so no model was called. Any error is logged, not raised: the
    caller is on its way out with a cancellation, which must come out as it is."""
    try:
        if await _state(workspace, request) == "untaken":
            await requests.refund_ask(*request.key, spent=spent, at=at)
    except Exception as error:
        logger.warning(
            "turn cancelled: its ask could not be taken back message_id=%s (%s)",
            request.message_id,
            type(error).__name__,
        )


async def _state(
    workspace: artifactr.Workspace, request: TurnRequest
) -> Literal["taken", "untaken", "missing"]:
    """Whether the Runner took the request's message, has yet to, or it is not committed.

    The taken cursor is read before the log, so a message found after it was untaken when the
    cursor was read, and one not found after it was taken, or is not committed at all.

    Raises:
        ValueError: If the message is a notice.
    """
    thread = request.thread_id
    taken = await _taken_seq(workspace, thread)
    after = await workspace.read(after_seq=taken, threads={thread})
    if _posted(after, request.message_id) is not None:
        return "untaken"
    return "taken" if await _posted_up_to(workspace, request, taken) else "missing"


async def _posted_up_to(workspace: artifactr.Workspace, request: TurnRequest, seq: int) -> bool:
    """Whether the request's message lies at or before `seq`, read back from there a page at a
    time, no further than entries older than the request by `_CLOCK_SLACK`.

    A thread's reads carry every artifact and proposal event of the workspace: reading all of
    it up to the taken cursor cost a turn the workspace's whole history. A message is committed
    after its request is recorded, in the same process, so it is never older than the request,
    and a taken one is usually among the last entries taken.

    Raises:
        ValueError: If the message is a notice.
    """
    oldest = request.requested_at - _CLOCK_SLACK
    before = seq + 1
    while before > 1:
        page = await workspace.read(
            before_seq=before, threads={request.thread_id}, last=_TAKEN_PAGE
        )
        if _posted(page, request.message_id) is not None:
            return True
        if len(page) < _TAKEN_PAGE or _in_utc(page[0].ts) < oldest:
            return False
        before = page[0].seq
    return False


def _in_utc(moment: datetime) -> datetime:
    """`moment` as an aware time: one without a zone is taken as UTC."""
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


def _posted(log: list[a.Envelope], message_id: a.MessageId) -> a.MessagePosted | None:
    """The message with `message_id` in `log`, if it is there.

    Raises:
        ValueError: If it is a notice.
    """
    for envelope in log:
        event = envelope.event
        if isinstance(event, a.MessagePosted) and event.message_id == message_id:
            if event.kind != "message":
                raise ValueError(f"{message_id} is a {event.kind}: it starts no turn")
            return event
    return None


async def _taken_seq(workspace: artifactr.Workspace, thread_id: a.ThreadId) -> int:
    """How far the Runner has taken a thread's messages, read as its `_taken_seq` reads it."""
    taken = await workspace.cursor(f"{_RUNNER_CURSOR}/{thread_id}/taken")
    upgraded = await workspace.cursor(_UPGRADED)
    if taken:
        return max(taken, upgraded)
    return max(upgraded, await artifactr.agent.last_seen(workspace, thread_id))


def _purge_cutoff(older_than: datetime, max_asks: int) -> datetime:
    """`older_than` in UTC, once it and `max_asks` are checked for `purge_settled`.

    Raises:
        ValueError: If `older_than` is naive, or `max_asks` is below 1.
    """
    if max_asks < 1:
        raise ValueError(
            f"max_asks is the turns' budget of asks (ACTONCE_TURN_MAX_ASKS), 1 or more, "
            f"not {max_asks}"
        )
    return aware_utc(older_than, "older_than")


def _is(tenant_id: str, workspace_id: str, message_id: str) -> sa.ColumnElement[bool]:
    """The SQL condition that selects one request by its key."""
    return sa.and_(
        TURN_REQUESTS.c.tenant_id == tenant_id,
        TURN_REQUESTS.c.workspace_id == workspace_id,
        TURN_REQUESTS.c.message_id == message_id,
    )


_DIALECTS: Final = frozenset({"sqlite", "postgresql"})
"""The SQL dialects `SqlTurnRequests` runs on: each has an insert that skips a used key."""

_TAKEN_PAGE: Final = 100
"""How many of a thread's entries `_posted_up_to` reads at a time, newest first."""

_CLOCK_SLACK: Final = timedelta(minutes=5)
"""How much older than its request a message is looked for: the clock may step back between
recording the request and committing the message, milliseconds apart."""

_RUNNER_CURSOR: Final = "artifactr.runner"
"""The prefix of the Runner's per-thread cursors, `asked` and `taken`."""

_UPGRADED: Final = "artifactr.runner/upgraded"
"""Where a workspace's log stood as it was upgraded to artifactr's log-driven turns (ADR-0055):
no message before it is taken again."""
