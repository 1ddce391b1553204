"""Turns from the pool: a rule's message is committed once and answered by one turn, whatever stops.

Each test plays processes over files in `tmp_path`: artifactr's SQLite store, and the turn-request
store, SQL on SQLite or in memory (one instance standing in for a durable store). A "process" has
its own engines and, as a turn worker, its own `Runner` over a scripted model; a process that
dies mid-turn is an event loop frozen where it stood, never run again, as a killed process would
leave it. Turns are counted from artifactr's own log (the thread's runs and the agent's replies)
and from the model's calls. The turn-request stores prove one behaviour suite, and PostgreSQL
runs on PostgreSQL too: a fresh database, or the one `ACTONCE_TEST_POSTGRES_URL` names.

Runs in plain pytest: each test drives its coroutines with `asyncio.run`.
"""

import asyncio
import contextlib
import os
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import artifactr
import artifactr.agent
import artifactr.core as a
import artifactr.sql
import pytest
from pydantic import ValidationError
from pydantic_ai import Agent, ModelMessage, ModelRequest, ModelResponse, TextPart, UserPromptPart
from pydantic_ai.models.function import AgentInfo
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine
from worlds import Board

from actonce.tasks.outbound import rule_actor
from actonce.tasks.turns import (
    AskBudget,
    InMemoryTurnRequests,
    SqlTurnRequests,
    TurnOutcome,
    TurnRequest,
    TurnRequests,
    send_once,
    sweep,
    take_turn,
)
from actonce.worker.storage.migrate import migrate_own_tables

TENANT = "acme"
THREAD = "thr_incident"
RULE = "ops:summarise"
ALICE = a.UserActor(id="alice", name="Alice")
CLAIM_TTL = timedelta(seconds=1)
"""The turn workers' claim_ttl: a dead worker's claim lapses this long after its last renewal."""
WAIT_S = 10.0
"""How long a turn worker waits for a turn in these tests: far more than a scripted turn takes."""
BUDGET = AskBudget(max_asks=5, backoff_s=0.5)
"""The turn workers' budget of asks: a back-off shorter than `CLAIM_TTL`, so retries stay quick."""


# ─── the scripted agent ───────────────────────────────────────────────────────


@dataclass
class Model:
    """A scripted model: answers each prompt with a numbered reply, or hangs while `hang` is set."""

    prompts: list[str] = field(default_factory=list)
    """The user prompt of each call, in order."""
    hang: bool = False
    """Whether calls block until cancelled, as a model call does when its process dies."""
    called: asyncio.Event = field(default_factory=asyncio.Event)
    """Set by each call (waited for only on the loop of the worker that dies)."""

    async def respond(self, messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        last = messages[-1]
        assert isinstance(last, ModelRequest)
        prompt = " | ".join(str(p.content) for p in last.parts if isinstance(p, UserPromptPart))
        self.prompts.append(prompt)
        self.called.set()
        if self.hang:
            await asyncio.Event().wait()
        return ModelResponse(parts=[TextPart(f"reply #{len(self.prompts)}")])


@dataclass
class HangBeforeStart:
    """A turn context that blocks: the worker holds the claim but never records `run_started`."""

    entered: asyncio.Event = field(default_factory=asyncio.Event)

    @contextlib.asynccontextmanager
    async def __call__(self, session: artifactr.Session[None]) -> AsyncIterator[None]:
        self.entered.set()
        await asyncio.Event().wait()
        yield


# ─── processes ────────────────────────────────────────────────────────────────


@dataclass
class Process:
    """One process of the pool: its engines, its handles, and a Runner if it is a turn worker."""

    engines: list[AsyncEngine]
    people: artifactr.Workspace
    """Alice's handle on the workspace."""
    rule: artifactr.Workspace
    """The rule's actor's handle, as `RunActions` opens it."""
    requests: TurnRequests
    runner: artifactr.agent.Runner[None]

    async def take(
        self,
        request: TurnRequest,
        *,
        wait_s: float = WAIT_S,
        budget: AskBudget | None = BUDGET,
        stop_at_deadline: bool = False,
    ) -> TurnOutcome:
        """Take `request`'s turn in this process, as the turn task does."""
        return await take_turn(
            runner=self.runner,
            workspace=self.rule,
            requests=self.requests,
            request=request,
            wait_s=wait_s,
            budget=budget,
            stop_at_deadline=stop_at_deadline,
        )

    async def close(self) -> None:
        """Stop as a process stops cleanly: runs stopped, connections closed."""
        await self.runner.aclose()
        for engine in self.engines:
            await engine.dispose()


@dataclass
class Pool:
    """Where a test's processes meet: the files in `tmp_path` and the turn-request store's kind."""

    tmp_path: Path
    store: str
    """`memory` (one instance, standing in for a durable store), `sqlite` or `postgresql`."""
    model: Model = field(default_factory=Model)
    workspace_id: str = field(default_factory=lambda: _fresh())
    """The pool's workspace: its own, so pools sharing a PostgreSQL database never meet."""
    _memory: InMemoryTurnRequests = field(default_factory=InMemoryTurnRequests)

    async def process(self, **runner: Any) -> Process:
        """Start a process: fresh engines, handles and a fresh Runner with `CLAIM_TTL`."""
        engine = artifactr.sql.create_sqlite_engine(
            f"sqlite+aiosqlite:///{self.tmp_path / 'artifactr.db'}"
        )
        await artifactr.sql.migrate(engine)
        collab = artifactr.Workspaces(artifactr.sql.SqlStorage(engine))
        people = await collab.open(TENANT, self.workspace_id, actor=ALICE)
        engines = [engine]
        requests: TurnRequests = self._memory
        if self.store != "memory":
            engines.append(await _requests_engine(self.store, self.tmp_path))
            requests = SqlTurnRequests(engines[-1])
        agent = Agent(
            artifactr.agent.function_model(self.model.respond),
            deps_type=artifactr.Session[None],
            capabilities=[artifactr.ArtifactWorkspace(types=[])],
        )
        return Process(
            engines=engines,
            people=people,
            rule=people.as_actor(rule_actor(RULE)),
            requests=requests,
            runner=artifactr.agent.Runner(agent, app=None, claim_ttl=CLAIM_TTL, **runner),
        )

    def request(self, message_id: str = "msg_summary") -> TurnRequest:
        """A request for the rule's message in `THREAD`, as the pool derives it."""
        return a_request(message_id, workspace_id=self.workspace_id)

    async def swept(self, process: Process) -> list[str]:
        """The ids of the pool's messages a sweep finds to announce again."""
        found = await sweep(process.requests, requested_before=_later(), limit=1000)
        return [r.message_id for r in found if r.workspace_id == self.workspace_id]

    async def thread(self) -> None:
        """Create the thread Alice and the rule talk in."""
        started = await self.process()
        await started.people.commit(a.CreateThread(thread_id=THREAD, title="Incident 42"))
        await started.close()


@pytest.fixture(params=["memory", "sqlite", "postgresql"])
def pool(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Pool:
    """A pool whose turn requests are kept in memory, in SQLite, and in PostgreSQL: the one
    `ACTONCE_TEST_POSTGRES_URL` names, or else a fresh database of the machine's server (which
    fails the test in CI when it is unreachable, never skips it)."""
    if request.param == "postgresql" and not os.environ.get(POSTGRES_URL):
        monkeypatch.setenv(POSTGRES_URL, request.getfixturevalue("postgres_url"))
    made = Pool(tmp_path, request.param)
    asyncio.run(made.thread())
    return made


POSTGRES_URL = "ACTONCE_TEST_POSTGRES_URL"
"""The environment variable naming a PostgreSQL database for the SQL store, as asyncpg's URL."""


async def _requests_engine(store: str, tmp_path: Path) -> AsyncEngine:
    """An engine on the turn-request store, migrated (idempotently, every process)."""
    if store == "sqlite":
        engine = create_async_engine(f"sqlite+aiosqlite:///{tmp_path / 'actonce.db'}")
    else:
        engine = create_async_engine(os.environ[POSTGRES_URL])
    await migrate_own_tables(engine)
    return engine


def a_request(message_id: str = "msg_summary", **fields: Any) -> TurnRequest:
    """A request for a message in `THREAD`, in the workspace named, or one of its own."""
    return TurnRequest(
        tenant_id=TENANT,
        workspace_id=fields.pop("workspace_id", None) or _fresh(),
        thread_id=THREAD,
        message_id=message_id,
        rule=RULE,
        requested_at=fields.pop("requested_at", datetime.now(UTC)),
        **fields,
    )


class Announced(list[TurnRequest]):
    """The announcements a process made: what it would have enqueued as turn tasks."""

    async def __call__(self, request: TurnRequest) -> None:
        self.append(request)


async def sent(
    pool: Pool, attempt: Process, announce: Callable[[TurnRequest], Awaitable[None]] | None = None
) -> list[TurnRequest]:
    """Send the pool's message as an attempt does; return what it announced, unless `announce`
    stands in for the announcing."""
    announced = Announced()
    await send_once(
        workspace=attempt.rule,
        requests=attempt.requests,
        request=pool.request(),
        content="summarise the incident",
        announce=announce or announced,
    )
    return announced


async def _killed(request: TurnRequest) -> None:
    """An announcement that never leaves: the process stops before it enqueues the turn."""
    raise ConnectionError("the broker went away")


async def take_until_done(process: Process, request: TurnRequest, tries: int = 6) -> list[str]:
    """Take a request's turn as the turn task does, retried a `CLAIM_TTL` on while it is busy."""
    outcomes: list[str] = []
    for tried in range(1, tries + 1):
        outcome = await process.take(request)
        outcomes.append(outcome)
        if outcome == "taken":
            if (running := process.runner.running(THREAD)) is not None:
                await asyncio.wait({running.task})  # a turn that took it on its own look
            await process.runner.drain()
            return outcomes
        if tried < tries:
            await asyncio.sleep(CLAIM_TTL.total_seconds() * 1.2)
    return outcomes


@dataclass(frozen=True)
class Thread:
    """What happened in `THREAD`, read from artifactr's log."""

    runs: list[tuple[str, str | None]]
    """Each run's status and, for a failed one, its reason."""
    rule_messages: list[str]
    """The ids of the messages the rule posted."""
    replies: list[str]
    """What the agent replied."""


async def thread_of(process: Process) -> Thread:
    """Read what happened in `THREAD`."""
    log = await process.people.read(threads={THREAD})
    ended = {e.event.run_id: e.event.reason for e in log if isinstance(e.event, a.RunEnded)}
    runs = [(run.status, ended.get(run.id)) for run in await process.people.runs(thread_id=THREAD)]
    messages = [e for e in log if isinstance(e.event, a.MessagePosted)]
    return Thread(
        runs=runs,
        rule_messages=[
            e.event.message_id
            for e in messages
            if e.actor.participant == process.rule.actor.participant
        ],
        replies=[e.event.content for e in messages if e.actor.participant.startswith("agent:")],
    )


# ─── sending and taking ───────────────────────────────────────────────────────


def test_a_sent_message_is_answered_by_exactly_one_turn(pool: Pool) -> None:
    async def main() -> None:
        # Given an attempt that sends, and a turn worker that takes what it announced
        attempt, worker = await pool.process(), await pool.process()
        announced = Announced()
        request = pool.request()
        await send_once(
            workspace=attempt.rule,
            requests=attempt.requests,
            request=request,
            content="summarise the incident",
            announce=announced,
        )
        # Then no turn ran in the attempt
        assert (await thread_of(attempt)).runs == [], "a turn ran inside the attempt"
        # When the worker takes each announced request
        outcomes = [await take_until_done(worker, r) for r in announced]
        # Then one turn answered the message, and the request is taken
        assert outcomes == [["taken"]]
        seen = await thread_of(worker)
        assert seen.runs == [("completed", None)]
        assert seen.rule_messages == [request.message_id]
        assert seen.replies == ["reply #1"]
        assert pool.model.prompts == ["summarise the incident"]
        stored = await worker.requests.get(*request.key)
        assert stored is not None and stored.taken_at is not None and stored.asks == 1
        assert await pool.swept(worker) == []
        await attempt.close()
        await worker.close()

    asyncio.run(main())


def test_a_process_killed_between_commit_and_ask_still_gets_its_turn_once(pool: Pool) -> None:
    async def main() -> None:
        # Given an attempt that commits its message and stops before it announces the turn
        attempt = await pool.process()
        request = pool.request()
        await send_once(
            workspace=attempt.rule,
            requests=attempt.requests,
            request=request,
            content="summarise the incident",
            announce=_killed,
        )
        await attempt.close()
        # When a new process sweeps, and a new turn worker takes what it found
        sweeper, worker = await pool.process(), await pool.process()
        assert await pool.swept(sweeper) == [request.message_id]
        assert await take_until_done(worker, request) == ["taken"]
        # Then the message was answered once, and nothing is left to sweep
        seen = await thread_of(worker)
        assert seen.runs == [("completed", None)]
        assert seen.rule_messages == [request.message_id]
        assert pool.model.prompts == ["summarise the incident"]
        assert await pool.swept(sweeper) == []
        for process in (sweeper, worker):
            await process.close()

    asyncio.run(main())


def test_a_failed_announcement_is_logged_not_raised(
    pool: Pool, caplog: pytest.LogCaptureFixture
) -> None:
    async def main() -> None:
        attempt = await pool.process()
        await sent(pool, attempt, announce=_killed)
        await attempt.close()

    asyncio.run(main())
    assert "the sweep announces it again" in caplog.text


def test_a_duplicate_delivery_sends_one_message_and_runs_one_turn(pool: Pool) -> None:
    async def main() -> None:
        # Given the same send delivered twice, to two attempts, each announcing the turn
        first, second = await pool.process(), await pool.process()
        announced = Announced()
        for attempt in (first, second):
            await send_once(
                workspace=attempt.rule,
                requests=attempt.requests,
                request=pool.request(),
                content="summarise the incident",
                announce=announced,
            )
        assert len(announced) == 2
        # When two turn workers take the two announcements at once
        workers = [await pool.process(), await pool.process()]
        outcomes = await asyncio.gather(
            *(take_until_done(w, r) for w, r in zip(workers, announced, strict=True))
        )
        # Then each ends taken, and one message had one turn
        assert all(o[-1] == "taken" for o in outcomes), outcomes
        seen = await thread_of(workers[0])
        assert seen.rule_messages == ["msg_summary"]
        assert seen.runs == [("completed", None)]
        assert pool.model.prompts == ["summarise the incident"]
        for process in (first, second, *workers):
            await process.close()

    asyncio.run(main())


def test_a_send_retried_after_its_turn_ran_starts_no_second_turn(pool: Pool) -> None:
    async def main() -> None:
        # Given a message sent and answered
        process = await pool.process()
        announced = Announced()
        send = {
            "workspace": process.rule,
            "requests": process.requests,
            "request": pool.request(),
            "content": "summarise the incident",
            "announce": announced,
        }
        await send_once(**send)
        assert await take_until_done(process, announced[0]) == ["taken"]
        # When the attempt is retried, and a stale announcement is taken again
        await send_once(**send)
        again = await take_until_done(process, announced[0])
        # Then the retry announced nothing, and no second turn ran
        assert len(announced) == 1, "a retry announced a turn that was taken"
        assert again == ["taken"]
        assert (await thread_of(process)).runs == [("completed", None)]
        assert pool.model.prompts == ["summarise the incident"]
        await process.close()

    asyncio.run(main())


def test_a_worker_that_stopped_before_marking_finds_the_message_taken_in_artifactr(
    pool: Pool,
) -> None:
    async def main() -> None:
        # Given a turn that ran for a request its worker never marked taken
        process = await pool.process()
        request = await _sent_and_answered(process, pool.request())
        # When the sweep finds it and a worker takes it
        assert await pool.swept(process) == [request.message_id]
        # Then artifactr's cursor says it is taken, and no second turn runs
        assert await take_until_done(process, request) == ["taken"]
        assert (await thread_of(process)).runs == [("completed", None)]
        assert await pool.swept(process) == []
        await process.close()

    asyncio.run(main())


def test_a_taken_message_is_found_without_reading_the_whole_log_before_it(pool: Pool) -> None:
    async def main() -> None:
        # Given a workspace whose log holds 300 artifact events, which every thread's reads
        # carry, then a message whose turn ran but whose worker never marked it taken
        process = await pool.process()
        await _boards(process, 300)
        first = await _sent_and_answered(process, pool.request())
        # and 150 artifact events more, and a second message answered, so that the thread's
        # taken cursor lies two pages past the first
        await _boards(process, 150)
        await _sent_and_answered(process, pool.request("msg_second"))
        # When a worker takes the first request, counting the entries its reads return
        read = process.rule.read
        returned: list[int] = []

        async def counted(**window: Any) -> list[a.Envelope]:
            got = await read(**window)
            returned.append(len(got))
            return got

        process.rule.read = counted  # type: ignore[method-assign]
        assert await take_until_done(process, first) == ["taken"]
        # Then it found the message taken, reading back page by page from the cursor, and not
        # the 300 entries before it
        assert 150 < sum(returned) <= 3 * 100 + 10, returned
        assert (await thread_of(process)).runs == [("completed", None)] * 2
        await process.close()

    asyncio.run(main())


async def _boards(process: Process, count: int) -> None:
    """Create `count` boards as Alice: workspace-scoped events, in every thread's reads."""
    for i in range(count):
        await process.people.create(Board(entries={"i": str(i)}))


async def _sent_and_answered(process: Process, request: TurnRequest) -> TurnRequest:
    """Send `request`'s message and run the turn that takes it, marking nothing taken."""
    await send_once(
        workspace=process.rule,
        requests=process.requests,
        request=request,
        content="summarise the incident",
        announce=Announced(),
    )
    handle = await process.runner.ask(process.rule, THREAD)
    assert handle is not None
    await handle.wait()
    return request


def test_a_request_whose_message_is_not_committed_yet_is_pending(pool: Pool) -> None:
    async def main() -> None:
        process = await pool.process()
        request = pool.request()
        assert await process.requests.request(request)
        assert await take_until_done(process, request, tries=1) == ["pending"]
        assert (await thread_of(process)).runs == []
        await process.close()

    asyncio.run(main())


def test_a_turn_that_ends_without_taking_its_message_is_not_asked_for_again_at_once(
    pool: Pool,
) -> None:
    class Inert(artifactr.ArtifactWorkspace):
        # The capability's run hook gone: the turn runs the model and records nothing.
        async def wrap_run(self, ctx: Any, *, handler: Any) -> Any:
            return await handler()

    async def main() -> None:
        # Given a turn worker whose agent never takes its message
        process = await pool.process()
        agent = Agent(
            artifactr.agent.function_model(pool.model.respond),
            deps_type=artifactr.Session[None],
            capabilities=[Inert(types=[])],
        )
        process.runner = artifactr.agent.Runner(agent, app=None, claim_ttl=CLAIM_TTL)
        announced = Announced()
        request = pool.request()
        await send_once(
            workspace=process.rule,
            requests=process.requests,
            request=request,
            content="summarise the incident",
            announce=announced,
        )
        # When it takes the request until its budget of 3 asks is spent, at once each time
        budget = AskBudget(max_asks=3, backoff_s=0.2)
        outcomes: list[str] = []
        while not outcomes or outcomes[-1] != "spent":
            outcomes.append(await process.take(request, budget=budget))
            assert len(outcomes) < 1000, outcomes
        # Then each counted ask ran one turn, one model call, and said so; the takes in a
        # back-off asked nothing; and after 3 asks the budget is spent
        asked = [o for o in outcomes if o != "not_due"]
        assert asked == ["not_taken"] * 3 + ["spent"], outcomes
        assert pool.model.prompts == ["summarise the incident"] * 3
        stored = await process.requests.get(*request.key)
        assert stored is not None and stored.asks == 3 and stored.taken_at is None
        assert stored.asked_at is not None and stored.due_at is not None
        # and a sweep with a budget of 3 leaves it out, until its asks are reset
        found = await sweep(process.requests, requested_before=_later(), limit=1000, max_asks=3)
        assert request.key not in [r.key for r in found]
        await process.requests.reset_asks(*request.key)
        found = await sweep(process.requests, requested_before=_later(), limit=1000, max_asks=3)
        assert request.key in [r.key for r in found]
        await process.close()

    asyncio.run(main())


# ─── turn workers that die ────────────────────────────────────────────────────


def test_a_turn_worker_that_dies_before_its_turn_starts_leaves_the_message_to_the_next(
    pool: Pool,
) -> None:
    # Given a turn worker that claimed the thread and died before recording the run's start
    hang = HangBeforeStart()
    with dead_process(pool, turn_context=hang) as died:
        request = died.run(_send_and_take_until(pool, died, hang.entered))
        assert died.runs == [], "the dead worker recorded a run"

        async def main() -> None:
            # When a fresh turn worker takes the request, retried while the dead claim holds
            worker = await pool.process()
            outcomes = await take_until_done(worker, request)
            # Then it is busy until the claim lapses, and the message is answered once
            # (the dead worker's ask was counted: the first retries may find its back-off on)
            assert outcomes[-1] == "taken", outcomes
            assert set(outcomes) <= {"busy", "not_due", "taken"}, outcomes
            seen = await thread_of(worker)
            assert seen.runs == [("completed", None)]
            assert seen.replies == ["reply #1"]
            assert pool.model.prompts == ["summarise the incident"]
            await worker.close()

        asyncio.run(main())


def test_a_turn_worker_that_dies_mid_turn_leaves_an_abandoned_run_and_no_second_turn(
    pool: Pool,
) -> None:
    # Given a turn worker that died while the model answered: the run started, taking the message
    pool.model.hang = True
    with dead_process(pool) as died:
        request = died.run(_send_and_take_until(pool, died, pool.model.called))
        assert died.runs == [("running", None)]
        pool.model.hang = False

        async def main() -> None:
            # When a fresh turn worker takes the request, once the dead claim could have lapsed
            worker = await pool.process()
            await asyncio.sleep(CLAIM_TTL.total_seconds() * 1.2)
            outcomes = await take_until_done(worker, request)
            # Then the request is taken, as artifactr took the message when the run started;
            # the thread's next claim records the dead run abandoned, and nothing runs again
            assert outcomes == ["taken"]
            assert await worker.runner.ask(worker.rule, THREAD) is None  # the next claim
            seen = await thread_of(worker)
            assert seen.runs == [("failed", "abandoned")]
            assert seen.replies == []
            assert await worker.runner.recover(worker.rule) == []
            assert pool.model.prompts == ["summarise the incident"]
            await worker.close()

        asyncio.run(main())


def test_a_turn_past_the_wait_is_stopped_when_the_loop_stops_between_tasks(pool: Pool) -> None:
    async def main() -> None:
        # Given a sent message, and a model that hangs
        attempt, worker = await pool.process(), await pool.process()
        [request] = await sent(pool, attempt)
        pool.model.hang = True
        # When a worker whose loop stops between tasks waits less than the turn takes
        outcome = await worker.take(request, wait_s=0.5, stop_at_deadline=True)
        # Then the turn was stopped before the call returned, its end recorded, nothing left
        # running to freeze; the message counts as taken, as artifactr took it at the start
        assert outcome == "taken"
        assert worker.runner.running(THREAD) is None
        seen = await thread_of(worker)
        assert seen.runs == [("stopped", None)], seen.runs
        assert seen.replies == []
        stored = await worker.requests.get(*request.key)
        assert stored is not None and stored.taken_at is not None and stored.asks == 1
        await attempt.close()
        await worker.close()

    asyncio.run(main())


def test_a_take_cancelled_while_its_turn_runs_stops_the_turn_when_the_loop_stops_between_tasks(
    pool: Pool,
) -> None:
    async def main() -> None:
        # Given a sent message, and a model that hangs
        attempt, worker = await pool.process(), await pool.process()
        [request] = await sent(pool, attempt)
        pool.model.hang = True
        # When a worker whose loop stops between tasks is cancelled while its turn is in the
        # model call, long before its wait is over (a prefork child's soft time limit)
        taking = asyncio.create_task(worker.take(request, stop_at_deadline=True))
        await asyncio.wait_for(pool.model.called.wait(), timeout=WAIT_S)
        taking.cancel()
        with pytest.raises(asyncio.CancelledError):
            await taking
        # Then the turn was stopped before the cancellation came out, its end recorded, and
        # nothing is left running to freeze; its message counts as taken
        assert worker.runner.running(THREAD) is None
        seen = await thread_of(worker)
        assert seen.runs == [("stopped", None)], seen.runs
        assert seen.replies == []
        # and the next delivery finds it taken, asking nothing more
        pool.model.hang = False
        again = await worker.requests.get(*request.key)
        assert again is not None
        assert await worker.take(again, stop_at_deadline=True) == "taken"
        stored = await worker.requests.get(*request.key)
        assert stored is not None and stored.taken_at is not None and stored.asks == 1
        assert len(pool.model.prompts) == 1
        await attempt.close()
        await worker.close()

    asyncio.run(main())


def test_a_take_cancelled_before_its_turn_started_takes_its_ask_back(pool: Pool) -> None:
    async def main() -> None:
        # Given a sent message, and a turn worker whose turns hang before they start
        hang = HangBeforeStart()
        attempt, hanging = await pool.process(), await pool.process(turn_context=hang)
        [request] = await sent(pool, attempt)
        # When its take is cancelled there (a prefork child's soft time limit), ask counted
        taking = asyncio.create_task(hanging.take(request, stop_at_deadline=True))
        await asyncio.wait_for(hang.entered.wait(), timeout=WAIT_S)
        counted = await hanging.requests.get(*request.key)
        assert counted is not None and counted.asks == 1
        taking.cancel()
        with pytest.raises(asyncio.CancelledError):
            await taking
        # Then nothing is left running, no model was called, and the ask is taken back: the
        # budget counts turns that could bill a model, and this one never started
        assert hanging.runner.running(THREAD) is None
        assert pool.model.prompts == []
        stored = await hanging.requests.get(*request.key)
        assert stored is not None and stored.asks == 0 and stored.taken_at is None, stored
        await hanging.close()
        # and the next delivery asks once and the message is answered
        worker = await pool.process()
        again = await worker.requests.get(*request.key)
        assert again is not None
        assert await worker.take(again, stop_at_deadline=True) == "taken"
        stored = await worker.requests.get(*request.key)
        assert stored is not None and stored.asks == 1
        assert pool.model.prompts == ["summarise the incident"]
        await attempt.close()
        await worker.close()

    asyncio.run(main())


# ─── notices ──────────────────────────────────────────────────────────────────


def test_a_notice_never_starts_a_turn(pool: Pool) -> None:
    async def main() -> None:
        # Given a notice the rule posted
        process = await pool.process()
        notice = a.PostMessage(
            thread_id=THREAD, message_id="msg_notice", content="import done", kind="notice"
        )
        await process.rule.commit(notice)
        # When a turn worker asks for the thread's turn, or is handed the notice by mistake
        assert await process.runner.ask(process.rule, THREAD) is None
        with pytest.raises(ValueError, match="notice"):
            await process.take(pool.request("msg_notice"), budget=None)
        # Then no turn ran; and a message sent after it gets the only turn
        assert (await thread_of(process)).runs == []
        announced = await sent(pool, process)
        assert await take_until_done(process, announced[0]) == ["taken"]
        assert (await thread_of(process)).runs == [("completed", None)]
        assert pool.model.prompts == ["summarise the incident"]
        await process.close()

    asyncio.run(main())


# ─── the turn-request stores ──────────────────────────────────────────────────


def test_a_request_is_recorded_once_by_its_key(pool: Pool) -> None:
    async def check(requests: TurnRequests) -> None:
        first = a_request(workspace_id=_fresh())
        assert await requests.request(first)
        assert not await requests.request(first.model_copy(update={"rule": "ops:other"}))
        assert await requests.get(*first.key) == first
        assert await requests.get(TENANT, first.workspace_id, "msg_other") is None

    run_on_store(pool, check)


def test_pending_lists_untaken_requests_oldest_first_up_to_the_limit(pool: Pool) -> None:
    async def check(requests: TurnRequests) -> None:
        ws = _fresh()
        now = datetime.now(UTC)
        for minutes, message_id in [(3, "msg_b"), (5, "msg_a"), (1, "msg_c"), (0, "msg_new")]:
            made = a_request(
                message_id, workspace_id=ws, requested_at=now - timedelta(minutes=minutes)
            )
            await requests.request(made)
        await requests.mark_taken(TENANT, ws, "msg_b", now)
        before = now - timedelta(seconds=30)
        ours = [
            r
            for r in await requests.pending(requested_before=before, limit=100)
            if r.workspace_id == ws
        ]
        assert [r.message_id for r in ours] == ["msg_a", "msg_c"]
        assert len(await requests.pending(requested_before=_later(), limit=1)) == 1

    run_on_store(pool, check)


def test_asks_are_counted_and_the_first_mark_taken_stands(pool: Pool) -> None:
    async def check(requests: TurnRequests) -> None:
        request = a_request(workspace_id=_fresh())
        await requests.request(request)
        budget = AskBudget(max_asks=5, backoff_s=0)
        now = datetime.now(UTC)
        assert await requests.spend_ask(*request.key, seen=0, now=now, budget=budget)
        assert await requests.spend_ask(*request.key, seen=1, now=now, budget=budget)
        first = datetime(2026, 1, 2, 3, 4, 5, tzinfo=timezone(timedelta(hours=2)))
        await requests.mark_taken(*request.key, first)
        await requests.mark_taken(*request.key, first + timedelta(hours=1))
        assert not await requests.spend_ask(*request.key, seen=2, now=now, budget=budget)
        missing = (TENANT, request.workspace_id, "msg_missing")
        assert not await requests.spend_ask(*missing, seen=0, now=now, budget=budget)
        await requests.mark_taken(*missing, first)
        stored = await requests.get(*request.key)
        assert stored is not None
        assert stored.asks == 2
        assert stored.taken_at == first and stored.taken_at.tzinfo == UTC
        assert stored.requested_at == request.requested_at

    run_on_store(pool, check)


def test_an_ask_is_spent_only_after_its_back_off_and_within_the_budget(pool: Pool) -> None:
    async def check(requests: TurnRequests) -> None:
        request = a_request(workspace_id=_fresh())
        await requests.request(request)
        budget = AskBudget(max_asks=2, backoff_s=10)
        t0 = datetime.now(UTC)
        # The first ask is due at once; it sets the back-off: asked at t0, due 10 s on
        assert await requests.spend_ask(*request.key, seen=0, now=t0, budget=budget)
        stored = await requests.get(*request.key)
        assert stored is not None
        assert (stored.asks, stored.asked_at, stored.due_at) == (1, t0, t0 + timedelta(seconds=10))
        # A second within the back-off, or with a stale count, is not spent
        soon = t0 + timedelta(seconds=9)
        assert not await requests.spend_ask(*request.key, seen=1, now=soon, budget=budget)
        later = t0 + timedelta(seconds=10)
        assert not await requests.spend_ask(*request.key, seen=0, now=later, budget=budget)
        # Once it is due, it is; then the budget of 2 is spent, however long one waits
        assert await requests.spend_ask(*request.key, seen=1, now=later, budget=budget)
        much_later = t0 + timedelta(days=1)
        assert not await requests.spend_ask(*request.key, seen=2, now=much_later, budget=budget)
        # An ask that started no turn is taken back, once, and only by the one who spent it
        assert not await requests.refund_ask(*request.key, spent=2, at=t0)
        assert await requests.refund_ask(*request.key, spent=2, at=later)
        assert not await requests.refund_ask(*request.key, spent=2, at=later)
        stored = await requests.get(*request.key)
        assert stored is not None and stored.asks == 1 and stored.asked_at == later
        # A replay's reset gives a fresh budget with no back-off
        await requests.reset_asks(*request.key)
        stored = await requests.get(*request.key)
        assert stored is not None
        assert (stored.asks, stored.asked_at, stored.due_at) == (0, None, None)
        assert await requests.spend_ask(*request.key, seen=0, now=later, budget=budget)

    run_on_store(pool, check)


def test_concurrent_deliveries_never_overshoot_the_budget(pool: Pool) -> None:
    async def main() -> None:
        # Given a request, and two processes each with its own store (engines, connections)
        first, second = await pool.process(), await pool.process()
        request = pool.request()
        assert await first.requests.request(request)
        budget = AskBudget(max_asks=3, backoff_s=0)

        async def deliver(process: Process) -> int:
            # What each delivery of the turn task does: read the count, then spend on it.
            spent = 0
            while True:
                stored = await process.requests.get(*request.key)
                assert stored is not None
                if stored.asks >= budget.max_asks:
                    return spent
                now = datetime.now(UTC)
                if await process.requests.spend_ask(
                    *request.key, seen=stored.asks, now=now, budget=budget
                ):
                    spent += 1

        # When eight deliveries race to spend it, with no back-off to hold them apart
        spent = await asyncio.gather(*(deliver(p) for p in [first, second] * 4))
        # Then exactly the budget was spent, by whichever won each race
        assert sum(spent) == 3, spent
        stored = await first.requests.get(*request.key)
        assert stored is not None and stored.asks == 3
        # And two deliveries that read the same count spend one ask between them
        await first.requests.reset_asks(*request.key)
        now = datetime.now(UTC)
        won = await asyncio.gather(
            *(
                p.requests.spend_ask(*request.key, seen=0, now=now, budget=budget)
                for p in (first, second)
            )
        )
        assert sorted(won) == [False, True]
        for process in (first, second):
            await process.close()

    asyncio.run(main())


def test_a_request_in_its_back_off_is_not_swept_until_a_grace_after_it_is_due(
    pool: Pool,
) -> None:
    async def check(requests: TurnRequests) -> None:
        ws = _fresh()
        t0 = datetime.now(UTC)
        request = a_request("msg_backoff", workspace_id=ws, requested_at=t0 - timedelta(hours=1))
        await requests.request(request)
        budget = AskBudget(max_asks=5, backoff_s=60)
        assert await requests.spend_ask(*request.key, seen=0, now=t0, budget=budget)
        grace = timedelta(seconds=30)

        async def swept(at: datetime) -> list[str]:
            found = await sweep(
                requests, requested_before=at - grace, limit=1000, due_before=at - grace
            )
            return [r.message_id for r in found if r.workspace_id == ws]

        # Due 60 s after its ask: not swept within the back-off nor its grace, swept after
        assert await swept(t0 + timedelta(seconds=89)) == []
        assert await swept(t0 + timedelta(seconds=91)) == ["msg_backoff"]
        # A turn task's own later try defers it; an earlier time does not bring it forward
        await requests.defer(*request.key, t0 + timedelta(seconds=200))
        await requests.defer(*request.key, t0 + timedelta(seconds=100))
        assert await swept(t0 + timedelta(seconds=229)) == []
        assert await swept(t0 + timedelta(seconds=231)) == ["msg_backoff"]

    run_on_store(pool, check)


def test_purge_removes_requests_settled_before_the_cutoff_and_never_one_still_waiting(
    pool: Pool,
) -> None:
    async def check(requests: TurnRequests) -> None:
        ws = _fresh()
        now = datetime.now(UTC)
        long_ago, lately = now - timedelta(days=10), now - timedelta(days=1)
        budget = AskBudget(max_asks=2, backoff_s=0)

        async def made(message_id: str, *, asks: int = 0, asked_at: datetime = long_ago) -> None:
            request = a_request(message_id, workspace_id=ws, requested_at=long_ago)
            assert await requests.request(request)
            for seen in range(asks):
                assert await requests.spend_ask(
                    *request.key, seen=seen, now=asked_at, budget=budget
                )

        # Given requests taken and given up on, long ago and lately, and two still waiting
        await made("msg_taken_long_ago", asks=1)
        await requests.mark_taken(TENANT, ws, "msg_taken_long_ago", long_ago)
        await made("msg_taken_lately", asks=1)
        await requests.mark_taken(TENANT, ws, "msg_taken_lately", lately)
        await made("msg_given_up_long_ago", asks=2)
        await made("msg_given_up_lately", asks=2, asked_at=lately)
        await made("msg_asked_once_long_ago", asks=1)
        await made("msg_never_asked")

        # When the settled ones older than a week are purged
        removed = await requests.purge_settled(
            older_than=now - timedelta(days=7), max_asks=budget.max_asks
        )

        # Then those two are gone; the recent ones and every waiting one, however old, are kept
        left = {
            message_id
            for message_id in (
                "msg_taken_long_ago",
                "msg_taken_lately",
                "msg_given_up_long_ago",
                "msg_given_up_lately",
                "msg_asked_once_long_ago",
                "msg_never_asked",
            )
            if await requests.get(TENANT, ws, message_id) is not None
        }
        assert left == {
            "msg_taken_lately",
            "msg_given_up_lately",
            "msg_asked_once_long_ago",
            "msg_never_asked",
        }
        # (a PostgreSQL database named by ACTONCE_TEST_POSTGRES_URL may hold other tests' rows)
        assert removed == 2 if pool.store != "postgresql" else removed >= 2, removed
        # And a request given up on, once replayed (a fresh budget), waits again: it is kept
        await requests.reset_asks(TENANT, ws, "msg_given_up_lately")
        await requests.purge_settled(older_than=now, max_asks=budget.max_asks)
        assert await requests.get(TENANT, ws, "msg_given_up_lately") is not None
        assert await requests.get(TENANT, ws, "msg_taken_lately") is None

    run_on_store(pool, check)


def test_purge_needs_an_aware_cutoff_and_a_budget_of_one_ask_or_more() -> None:
    async def check() -> None:
        requests = InMemoryTurnRequests()
        with pytest.raises(ValueError, match="older_than must be timezone-aware"):
            await requests.purge_settled(older_than=datetime(2026, 1, 2), max_asks=5)
        with pytest.raises(ValueError, match="ACTONCE_TURN_MAX_ASKS"):
            await requests.purge_settled(older_than=datetime.now(UTC), max_asks=0)

    asyncio.run(check())


def test_a_request_needs_an_aware_time_and_keeps_it_in_utc() -> None:
    with pytest.raises(ValidationError):
        a_request(requested_at=datetime(2026, 1, 2, 3, 4, 5))
    local = datetime(2026, 1, 2, 3, 4, 5, tzinfo=timezone(timedelta(hours=-5)))
    assert a_request(requested_at=local).requested_at == local
    assert a_request(requested_at=local).requested_at.tzinfo == UTC


def test_migrating_the_table_twice_is_harmless(tmp_path: Path) -> None:
    async def main() -> None:
        engine = create_async_engine(f"sqlite+aiosqlite:///{tmp_path / 'actonce.db'}")
        await migrate_own_tables(engine)
        request = a_request()
        assert await SqlTurnRequests(engine).request(request)
        await migrate_own_tables(engine)
        assert await SqlTurnRequests(engine).get(*request.key) == request
        await engine.dispose()

    asyncio.run(main())


# ─── how ──────────────────────────────────────────────────────────────────────


@dataclass
class DeadProcess:
    """A turn worker on an event loop of its own, which stops running where it stood."""

    loop: asyncio.AbstractEventLoop
    process: Process | None = None
    runs: list[tuple[str, str | None]] = field(default_factory=list)

    def run[T](self, step: Awaitable[T]) -> T:
        """Run a step of the worker's life on its loop, while it lives."""
        return self.loop.run_until_complete(step)


@contextlib.contextmanager
def dead_process(pool: Pool, **runner: Any) -> Iterator[DeadProcess]:
    """A turn worker that dies where its last step left it; its loop is cleaned up afterwards.

    After the body, the frozen loop's tasks are cancelled and its engines closed, so no thread
    or connection outlives the test; what that writes comes after every assertion.
    """
    loop = asyncio.new_event_loop()
    died = DeadProcess(loop)
    died.run(_start(died, pool, runner))
    try:
        yield died
    finally:
        assert died.process is not None
        died.run(died.process.runner.aclose())
        tasks = asyncio.all_tasks(loop)
        for task in tasks:
            task.cancel()
        died.run(asyncio.gather(*tasks, return_exceptions=True))
        for engine in died.process.engines:
            died.run(engine.dispose())
        loop.close()


async def _start(died: DeadProcess, pool: Pool, runner: dict[str, Any]) -> None:
    died.process = await pool.process(**runner)


async def _send_and_take_until(
    pool: Pool, died: DeadProcess, reached: asyncio.Event
) -> TurnRequest:
    """Send as an attempt would, then take the turn in the worker until `reached`; then it dies."""
    process = died.process
    assert process is not None
    announced = await sent(pool, process)
    taking = asyncio.create_task(process.take(announced[0], budget=None))
    await asyncio.wait_for(reached.wait(), timeout=WAIT_S)
    assert not taking.done()
    died.runs = (await thread_of(process)).runs
    return announced[0]


def run_on_store(pool: Pool, check: Callable[[TurnRequests], Awaitable[None]]) -> None:
    """Run `check` on the pool's turn-request store, in a process closed afterwards."""

    async def main() -> None:
        process = await pool.process()
        try:
            await check(process.requests)
        finally:
            await process.close()

    asyncio.run(main())


def _later() -> datetime:
    """A time after every request a test made."""
    return datetime.now(UTC) + timedelta(seconds=5)


def _fresh() -> str:
    """A workspace id of its own, so tests sharing a PostgreSQL database never meet."""
    return f"ws_{uuid.uuid4().hex[:12]}"
