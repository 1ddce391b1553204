"""The dispatcher on its own: what one poll sends, when it looks for due runs, how fast it polls.

A real private Redis holds the attempts queue and the sent marks; the stores are SQLite files.
No worker runs, so what a poll sent is exactly what waits in the queue.
"""

import asyncio
import base64
import contextlib
import functools
import json
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path

import pytest
import redis
import reflexr.workspace as rw
import sqlalchemy as sa
from pools import statements_on, wait_until
from reflexr import Rule, on, run
from reflexr.core import Forbidden, RunDeadLettered, RunSucceeded, SourceActor, StoredRules
from reflexr.sql import SqlStorage
from reflexr.sql.tables import LeaseRow, RunRow
from reflexr.workspace import EVALUATION_LEASE, WorkspaceRef
from sqlalchemy import func, select

from actonce.worker.app import make_celery
from actonce.worker.definition import load_definition
from actonce.worker.dispatching.dispatcher import (
    EVALUATION_BATCH,
    KEEP_LEASE_S,
    CpuBudget,
    Dispatcher,
    Polled,
)
from actonce.worker.dispatching.nudge import Appended, Grown
from actonce.worker.dispatching.rule_listeners import OWN_FACTS, Listeners
from actonce.worker.process.health import HEARTBEAT_PREFIX
from actonce.worker.process.runtime import Runtime
from actonce.worker.settings import ATTEMPTS_QUEUE, Settings
from actonce.worker.storage.migrate import migrate
from bench.definition import RULES, BenchRequested, ChaosRequested
from lab.processes import environment
from lab.redis import RedisHandle

FEED = SourceActor(name="test-feed")


@pytest.fixture
def dispatcher_env(redis_server: RedisHandle, tmp_path: Path) -> Iterator[dict[str, str]]:
    url = redis_server.url.rsplit("/", 1)[0] + "/7"
    client = redis.Redis.from_url(url)
    client.flushdb()
    yield {
        "ACTONCE_APP": "bench.definition:app",
        "ACTONCE_BROKER_URL": url,
        "ACTONCE_VAR_DIR": str(tmp_path / "var"),
        "ACTONCE_SWEEP_INTERVAL_S": "2",
    }
    client.flushdb()
    client.close()


@pytest.fixture
def served(dispatcher_env: dict[str, str]) -> Iterator[tuple[Runtime, Dispatcher]]:
    """Migrated SQLite stores, a runtime over them, and a dispatcher on the private Redis."""
    with _serving(dispatcher_env) as both:
        yield both


@pytest.fixture
def served_first_in_first_out(
    dispatcher_env: dict[str, str],
) -> Iterator[tuple[Runtime, Dispatcher]]:
    """`served`, with fair share off: what a poll fires is sent as it fires, however many (fair
    share holds all but a few back while no worker serves, `test_fair_share_pool`)."""
    with _serving({**dispatcher_env, "ACTONCE_FAIR_SHARE": "0"}) as both:
        yield both


@pytest.fixture
def served_on_postgres(
    dispatcher_env: dict[str, str], postgres_url: str
) -> Iterator[tuple[Runtime, Dispatcher]]:
    """`served`, on a fresh migrated PostgreSQL database: appends notify
    (`worker.dispatching.nudge`)."""
    with _serving({**dispatcher_env, "ACTONCE_DATABASE_URL": postgres_url}) as both:
        yield both


@contextlib.contextmanager
def _serving(env: dict[str, str]) -> Iterator[tuple[Runtime, Dispatcher]]:
    """Migrate the stores `env` names; yield a runtime over them and a dispatcher, both closed
    after."""
    settings = Settings.from_env(env)
    asyncio.run(migrate(settings))
    runtime = Runtime(settings, load_definition(settings.app), one_run=False).open()
    dispatcher = Dispatcher(runtime, make_celery(settings))
    try:
        yield runtime, dispatcher
    finally:
        runtime.run(dispatcher.close())
        runtime.close()


def _queued(url: str) -> list[str]:
    """The run ids of the attempt messages waiting in the queue."""
    client = redis.Redis.from_url(url)
    try:
        bodies = [json.loads(raw) for raw in client.lrange(ATTEMPTS_QUEUE, 0, -1)]
    finally:
        client.close()
    return sorted(json.loads(_decoded(body))[1]["run_id"] for body in bodies)


def _decoded(message: dict[str, object]) -> str:
    """The Celery message's body: base64 of `[args, kwargs, embed]` as JSON."""
    body = message["body"]
    assert isinstance(body, str)
    return base64.b64decode(body).decode()


def test_a_poll_sends_what_it_fires_once_and_looks_again_only_on_the_sweep(
    dispatcher_env: dict[str, str], served: tuple[Runtime, Dispatcher]
) -> None:
    runtime, dispatcher = served

    async def scenario() -> None:
        opened = await runtime.reflexr.open("t", "w", actor=FEED)
        # Given three events the dispatcher's evaluation will fire
        await opened.publish_many([BenchRequested(key=f"k{i}") for i in range(3)])
        # When it polls, it sends the three runs it fired (and its first look finds them sent)
        first = await dispatcher.poll()
        assert (first.fired, first.due, first.sent) == (3, 3, 3)
        # Then, with nothing new and before the sweep interval, it does not look again
        second = await dispatcher.poll()
        assert (second.fired, second.due, second.sent) == (0, 0, 0)
        # Nor one sweep interval (2 s) later: a look that found only runs sent already
        # waits twice as long before the next
        await asyncio.sleep(2.05)
        assert (await dispatcher.poll()).due == 0
        # And on that sweep it sees them due again, but their marks keep it from resending
        await asyncio.sleep(2.0)
        swept = await dispatcher.poll()
        assert (swept.due, swept.sent) == (3, 0)
        # A fourth event fires and goes out at once, sweep or not
        await opened.publish(BenchRequested(key="k3"))
        fourth = await dispatcher.poll()
        assert (fourth.fired, fourth.sent) == (1, 1)

    runtime.run(scenario())
    queued = _queued(dispatcher_env["ACTONCE_BROKER_URL"])
    assert len(queued) == 4 and len(set(queued)) == 4
    stats = dispatcher.stats
    assert (stats.polls, stats.fired, stats.sent) == (5, 4, 4)
    assert stats.firing_cpu_s > 0 and stats.sending_cpu_s > 0


def test_actonce_dispatch_sends_what_it_fires_and_no_more_due_runs_a_look_than_its_batch(
    dispatcher_env: dict[str, str], served_first_in_first_out: tuple[Runtime, Dispatcher]
) -> None:
    runtime, _ = served_first_in_first_out
    url = dispatcher_env["ACTONCE_BROKER_URL"]

    async def five_events() -> None:
        opened = await runtime.reflexr.open("t", "w", actor=FEED)
        await opened.publish_many([BenchRequested(key=f"k{i}") for i in range(5)])

    def dispatch_once() -> dict[str, int]:
        done = subprocess.run(
            [sys.executable, "-m", "actonce.worker.cli", "dispatch", "--once"],
            env=environment(
                {**dispatcher_env, "ACTONCE_DISPATCH_BATCH": "2", "ACTONCE_FAIR_SHARE": "0"}
            ),
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
        polled: dict[str, int] = json.loads(done.stdout.splitlines()[-1])
        return polled

    async def leases() -> list[str]:
        async with runtime.engine("reflexr").connect() as connection:
            return list((await connection.execute(select(LeaseRow.holder))).scalars())

    # Given five events a rule hears, when `actonce dispatch --once` polls with a batch of two
    runtime.run(five_events())
    # Then the five runs it fired go at once: the batch bounds a look for due runs, not firing
    assert dispatch_once() == {"fired": 5, "due": 2, "sent": 5}
    assert len(_queued(url)) == 5
    # and the evaluation lease it kept went with it
    assert runtime.run(leases()) == []

    # When Redis loses its messages and marks (it restarted, keeping nothing on disk)
    client = redis.Redis.from_url(url)
    client.flushdb()
    client.close()
    # Then the next poll's look finds the five due and sends two of them: its batch
    assert dispatch_once() == {"fired": 0, "due": 2, "sent": 2}
    assert len(_queued(url)) == 2


def test_actonce_dispatch_polls_less_often_to_keep_under_its_cpu_share(
    dispatcher_env: dict[str, str], served: tuple[Runtime, Dispatcher], tmp_path: Path
) -> None:
    # Given two dispatchers polling every 50 ms: one with the default share of a core, one
    # with a thousandth of one, which a poll's few milliseconds of CPU put in debt at once
    quick = {**dispatcher_env, "ACTONCE_POLL_INTERVAL_S": "0.05"}
    shares = {"default": quick, "thousandth": {**quick, "ACTONCE_DISPATCHER_MAX_CPU": "0.001"}}
    started = {name: _dispatcher(env, tmp_path / f"{name}.log") for name, env in shares.items()}
    try:
        for log in (tmp_path / f"{name}.log" for name in started):
            wait_until(lambda log=log: "dispatching to" in log.read_text(), f"{log.name} ready", 60)
        # When both poll, idle, until the default's heartbeat counts 60 polls (3 s at 20 a second)
        url = dispatcher_env["ACTONCE_BROKER_URL"]
        wait_until(lambda: _beaten_polls(url, started["default"].pid) >= 60, "60 polls", 60)
    finally:
        for process in started.values():
            process.send_signal(signal.SIGTERM)
        outputs = {name: process.communicate(timeout=30)[0] for name, process in started.items()}
    # Then the thousandth's polls waited out their debt, at most a burst (2 s) each: a tenth of
    # the default's polls, and more than one
    polls = {name: int(re.findall(r"polls=(\d+)", out)[-1]) for name, out in outputs.items()}
    assert 1 <= polls["thousandth"] <= polls["default"] / 10, polls


def _dispatcher(env: dict[str, str], log: Path) -> "subprocess.Popen[str]":
    """Start `actonce dispatch` with `env`, its log to `log` and its last line to a pipe."""
    with open(log, "w") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "actonce.worker.cli", "dispatch"],
            env=environment(env),
            stdout=subprocess.PIPE,
            stderr=out,
            text=True,
        )


def _beaten_polls(url: str, pid: int) -> int:
    """The polls a dispatcher's last heartbeat counted, 0 before its first."""
    with redis.Redis.from_url(url) as client:
        beat = client.get(f"{HEARTBEAT_PREFIX}{socket.gethostname()}:{pid}")
    return int(json.loads(beat)["polls"]) if beat else 0


def test_runs_waiting_in_a_backed_up_queue_are_not_sent_again_and_lost_ones_are(
    dispatcher_env: dict[str, str],
) -> None:
    # Given a dispatcher whose marks live 1 s, sweeping every poll, and no worker at all
    env = {**dispatcher_env, "ACTONCE_DEDUPE_TTL_S": "1", "ACTONCE_SWEEP_INTERVAL_S": "0.05"}
    settings = Settings.from_env(env)
    asyncio.run(migrate(settings))
    runtime = Runtime(settings, load_definition(settings.app), one_run=False).open()
    dispatcher = Dispatcher(runtime, make_celery(settings))
    url = env["ACTONCE_BROKER_URL"]

    async def poll_for(seconds: float) -> None:
        until = time.monotonic() + seconds
        while time.monotonic() < until:
            await dispatcher.poll()
            await asyncio.sleep(0.05)

    async def poll_until(done: Callable[[], bool], seconds: float) -> None:
        until = time.monotonic() + seconds
        while not done():
            assert time.monotonic() < until, f"not done after {seconds}s: {_queued(url)}"
            await dispatcher.poll()
            await asyncio.sleep(0.05)

    async def scenario() -> None:
        opened = await runtime.reflexr.open("t", "w", actor=FEED)
        await opened.publish_many([BenchRequested(key=f"k{i}") for i in range(3)])
        # When it sends three runs, and their messages wait in the queue three marks' lives
        await dispatcher.poll()
        await poll_for(3.0)
        # Then each was sent once: the marks were renewed while the queue held messages
        assert len(_queued(url)) == 3, _queued(url)
        # And when those messages are lost, the runs are sent again once their marks lapse
        _drop_queue(url)
        await poll_until(lambda: len(_queued(url)) == 3, 10.0)

    try:
        runtime.run(scenario())
    finally:
        runtime.close()
    assert len(set(_queued(url))) == 3


def _drop_queue(url: str) -> None:
    client = redis.Redis.from_url(url)
    try:
        client.delete(ATTEMPTS_QUEUE)
    finally:
        client.close()


def test_a_poll_evaluates_only_the_workspaces_where_something_a_rule_hears_was_appended(
    served: tuple[Runtime, Dispatcher],
) -> None:
    runtime, dispatcher = served

    async def evaluations_of_a_poll() -> int:
        before = dispatcher.stats.evaluations
        await dispatcher.poll()
        return dispatcher.stats.evaluations - before

    async def scenario() -> list[int]:
        one = await runtime.reflexr.open("t", "one", actor=FEED)
        two = await runtime.reflexr.open("t", "two", actor=FEED)
        await one.publish(BenchRequested(key="a"))
        await two.publish(BenchRequested(key="b"))
        counts = [
            await evaluations_of_a_poll(),  # the first poll evaluates every workspace
            await evaluations_of_a_poll(),  # both logs grew by the firings' own facts alone
            await evaluations_of_a_poll(),  # nothing new anywhere
        ]
        await one.publish(BenchRequested(key="c"))
        counts.append(await evaluations_of_a_poll())  # only "one" grew
        return counts

    assert runtime.run(scenario()) == [2, 0, 0, 1]
    assert dispatcher.stats.fired == 3
    assert dispatcher.stats.skipped == 2, dispatcher.stats.line()


def test_a_long_quiet_stretch_is_evaluated_once_the_log_stands_still(
    served: tuple[Runtime, Dispatcher],
) -> None:
    runtime, dispatcher = served
    dispatcher.catch_up_entries = 5

    async def scenario() -> list[tuple[int, int]]:
        one = await runtime.reflexr.open("t", "one", actor=FEED)
        await one.publish_many([BenchRequested(key=f"q{i}") for i in range(3)])
        await dispatcher.poll()  # evaluates and fires three runs (3 rule_fired: quiet, < 5)
        await dispatcher.poll()
        # Their attempts append six more quiet facts (run_started, run_succeeded each)
        await runtime.reactor().execute(limit=10)
        seen = []
        for _ in range(3):
            before = (dispatcher.stats.evaluations, dispatcher.stats.skipped)
            await dispatcher.poll()
            seen.append(
                (dispatcher.stats.evaluations - before[0], dispatcher.stats.skipped - before[1])
            )
        return seen

    # The nine quiet entries past the last evaluation reach the threshold, but the log just
    # grew: skipped, as every poll of a burst would skip them. The next poll finds it still and
    # evaluates it; the one after that has nothing left to pay.
    assert runtime.run(scenario()) == [(0, 1), (1, 0), (0, 0)], dispatcher.stats.line()


def test_a_listening_dispatcher_reads_no_head_while_idle_and_still_catches_up_quiet_entries(
    served_on_postgres: tuple[Runtime, Dispatcher],
) -> None:
    runtime, dispatcher = served_on_postgres
    dispatcher.catch_up_entries = 5
    statements = statements_on(runtime.engine("reflexr"))
    nudges = dispatcher._nudges
    ref = WorkspaceRef("t", "one")

    polled: list[str] = []  # the statements of the polls
    told = [0]  # the last entry of `ref` a notification told of, before polls drained them

    async def heard_to_the_head() -> None:
        """Wait until the notifications told of every entry in `ref`'s log."""
        head = await runtime.reflexr.storage.head_seq(ref)
        for _ in range(1000):
            told[0] = max([told[0], *(each.last for each in nudges._grown.get(ref, ()))])
            if told[0] >= head:
                return
            await asyncio.sleep(0.01)
        raise AssertionError(f"no notification told of entry {head}")

    async def poll() -> tuple[int, int]:
        """Poll once the notifications told all; return the evaluations and the skips."""
        await heard_to_the_head()
        before = (dispatcher.stats.evaluations, dispatcher.stats.skipped)
        statements.clear()
        await dispatcher.poll()
        polled.extend(statements)
        return dispatcher.stats.evaluations - before[0], dispatcher.stats.skipped - before[1]

    async def scenario() -> list[tuple[int, int]]:
        await nudges.listen()
        assert await nudges.wait(0)
        await dispatcher.poll()  # the first after listening began reads the store
        one = await runtime.reflexr.open(ref.tenant_id, ref.workspace_id, actor=FEED)
        await one.publish_many([BenchRequested(key=f"q{i}") for i in range(3)])
        assert await poll() == (1, 0)  # fires three runs (3 rule_fired: quiet, < 5)
        assert await poll() == (0, 1)
        # Given their attempts' six quiet facts, nine past the last evaluation of every rule
        await runtime.reactor().execute(limit=10)
        polled.clear()
        # When the dispatcher polls, told of them, then of nothing, twice
        seen = [await poll() for _ in range(3)]
        # Then no poll read a head, and the quiet stretch was caught up once the log stood still
        assert [s for s in polled if "reflexr_workspaces.head_seq FROM" in s] == []
        return seen

    assert runtime.run(scenario()) == [(0, 1), (1, 0), (0, 0)], dispatcher.stats.line()


def test_a_poll_evaluates_only_the_rules_that_hear_what_was_appended(
    served: tuple[Runtime, Dispatcher],
) -> None:
    runtime, dispatcher = served
    storage = runtime.reflexr.storage
    ref = WorkspaceRef("t", "w")

    async def cursors() -> dict[str, int]:
        return {rule: known.cursor for rule, known in (await storage.progress(ref)).items()}

    async def scenario() -> None:
        opened = await runtime.reflexr.open("t", "w", actor=FEED)
        await opened.publish(BenchRequested(key="k0"))
        await dispatcher.poll()  # the first poll evaluates every rule
        # Given an event only `bench:act` hears
        await opened.publish(BenchRequested(key="k1"))
        head = await storage.head_seq(ref)
        # When the dispatcher polls, it fires its run and evaluates `bench:act` alone
        assert (await dispatcher.poll()).fired == 1
        after_bench = await cursors()
        assert after_bench["bench:act"] >= head > after_bench["chaos:act"], after_bench
        # And an event only `chaos:act` hears is evaluated by it, from where it stood up to the
        # head the poll read: the firing's own fact, appended past it, is left to the next
        await opened.publish(ChaosRequested(key="c0"))
        head = await storage.head_seq(ref)
        assert (await dispatcher.poll()).fired == 1
        assert (await cursors())["chaos:act"] == head < await storage.head_seq(ref)
        assert dispatcher.stats.partial == 2, dispatcher.stats.line()
        # Then, once the rules' lag reaches the catch-up and the log stands still, a poll
        # evaluates every rule up to the head, and nothing fires twice
        dispatcher.catch_up_entries = 1
        for _ in range(5):
            if len(set((await cursors()).values())) == 1:
                break
            assert (await dispatcher.poll()).fired == 0
        assert len(set((await cursors()).values())) == 1, await cursors()
        assert dispatcher.stats.partial == 2

    runtime.run(scenario())
    assert dispatcher.stats.fired == 3


def test_a_polls_evaluation_reads_the_log_once_up_to_the_head_it_polled(
    served: tuple[Runtime, Dispatcher],
) -> None:
    runtime, dispatcher = served
    storage = runtime.reflexr.storage
    ref = WorkspaceRef("t", "w")
    statements = statements_on(runtime.engine("reflexr"))

    async def scenario() -> None:
        opened = await runtime.reflexr.open("t", "w", actor=FEED)
        await opened.publish(BenchRequested(key="k0"))
        await dispatcher.poll()  # the first poll evaluates every rule
        # Given one event only `bench:act` hears
        await opened.publish(BenchRequested(key="k1"))
        head = await storage.head_seq(ref)
        # When a poll fires its run
        statements.clear()
        assert (await dispatcher.poll()).fired == 1
        # Then its evaluation read the log once, and saved the rule's progress once, at that
        # head: reading on would have read the firing's own `rule_fired` fact in a second
        # batch, and found nothing in a third
        log_reads = [s for s in statements if s.startswith("SELECT") and "ORDER BY" in s]
        assert len([s for s in log_reads if "FROM reflexr_events" in s]) == 1, log_reads
        saves = [s for s in statements if s.startswith("UPDATE reflexr_rule_progress")]
        assert len(saves) == 1, saves
        progress = await storage.progress(ref)
        assert progress["bench:act"].cursor == head < await storage.head_seq(ref)

    runtime.run(scenario())


def test_a_workspace_whose_lease_another_dispatcher_holds_is_evaluated_once_it_is_free(
    served: tuple[Runtime, Dispatcher],
) -> None:
    runtime, dispatcher = served
    # The other dispatcher's leases: reflexr's own, taken and released as they are asked for
    storage = SqlStorage(runtime.engine("reflexr"))
    ref = WorkspaceRef("t", "w")

    async def scenario() -> None:
        opened = await runtime.reflexr.open("t", "w", actor=FEED)
        await opened.publish(BenchRequested(key="k0"))
        await dispatcher.poll()
        await dispatcher.close()  # the lease it kept after evaluating, released
        # Given another dispatcher evaluating the workspace, its lease held
        held = await storage.acquire_lease(ref, EVALUATION_LEASE, "other", timedelta(minutes=1))
        assert held
        # When an event comes, the dispatcher's polls fire nothing while the lease is held
        await opened.publish(ChaosRequested(key="c0"))
        assert (await dispatcher.poll()).fired == 0
        assert (await dispatcher.poll()).fired == 0
        # Then the first poll after it is released evaluates the event: the other dispatcher
        # may have been evaluating other rules, so the held polls did not count it as seen
        await storage.release_lease(ref, EVALUATION_LEASE, "other")
        assert (await dispatcher.poll()).fired == 1

    runtime.run(scenario())


def test_a_dispatcher_keeps_a_workspaces_lease_a_moment_after_evaluating_it(
    served: tuple[Runtime, Dispatcher],
) -> None:
    runtime, dispatcher = served
    storage = runtime.reflexr.storage
    ref = WorkspaceRef("t", "w")
    statements = statements_on(runtime.engine("reflexr"))
    other = functools.partial(
        storage.acquire_lease, ref, EVALUATION_LEASE, "other", timedelta(minutes=1)
    )

    async def scenario() -> None:
        opened = await runtime.reflexr.open("t", "w", actor=FEED)
        await opened.publish(BenchRequested(key="k0"))
        # Given a dispatcher that has just evaluated a workspace
        assert (await dispatcher.poll()).fired == 1
        evaluated = time.monotonic()
        # When another dispatcher asks for the workspace's evaluation lease, it is refused
        assert not await other()
        # and the dispatcher's next evaluation of it costs no lease statement
        await opened.publish(BenchRequested(key="k1"))
        statements.clear()
        assert (await dispatcher.poll()).fired == 1
        evaluated = time.monotonic()
        assert [s for s in statements if "reflexr_leases" in s] == []
        # Then a poll once it has not evaluated the workspace for `KEEP_LEASE_S` releases it
        while not await other():
            assert time.monotonic() - evaluated < KEEP_LEASE_S + 5, "the lease was kept on"
            await asyncio.sleep(0.05)
            await dispatcher.poll()
        assert time.monotonic() - evaluated >= KEEP_LEASE_S

    runtime.run(scenario())


def test_a_dispatcher_that_cannot_release_its_kept_lease_says_so_and_stops(
    served: tuple[Runtime, Dispatcher], caplog: pytest.LogCaptureFixture
) -> None:
    runtime, dispatcher = served

    async def scenario() -> None:
        opened = await runtime.reflexr.open("t", "w", actor=FEED)
        await opened.publish(BenchRequested(key="k0"))
        # Given a dispatcher that keeps the lease of a workspace it has just evaluated
        assert (await dispatcher.poll()).fired == 1
        # When its store loses its tables before it closes
        async with runtime.engine("reflexr").begin() as connection:
            await connection.execute(sa.text("DROP TABLE reflexr_leases"))
        # Then closing logs one line naming what happens to the lease, and raises nothing
        await dispatcher.close()

    runtime.run(scenario())
    lines = [r.getMessage() for r in caplog.records if r.name == "actonce.dispatcher"]
    assert any("lapse after ACTONCE_LEASE_TTL_S" in line for line in lines), lines


def test_a_poll_told_of_every_append_reads_no_head_and_no_types(
    served_on_postgres: tuple[Runtime, Dispatcher],
) -> None:
    runtime, dispatcher = served_on_postgres
    statements = statements_on(runtime.engine("reflexr"))
    nudges = dispatcher._nudges

    def reads() -> list[str]:
        heads = [s for s in statements if "reflexr_workspaces.head_seq FROM" in s]
        return heads + [s for s in statements if "DISTINCT reflexr_events.event_type" in s]

    async def poll_after(opened: rw.Workspace, *events: BenchRequested | ChaosRequested) -> int:
        """Publish `events`, wait for the notification, poll; return the runs fired."""
        await opened.publish_many(list(events))
        assert await nudges.wait(10), "no notification came"
        statements.clear()
        return (await dispatcher.poll()).fired

    async def scenario() -> None:
        opened = await runtime.reflexr.open("t", "w", actor=FEED)
        await opened.publish(BenchRequested(key="k0"))
        await dispatcher.poll()
        # Given a dispatcher listening for appends, past the first poll after listening began
        # (what was appended before it is unheard: that poll reads the store)
        await nudges.listen()
        assert await nudges.wait(0)
        statements.clear()
        await dispatcher.poll()
        assert reads(), "the first poll after listening began read no head"
        # When events are appended, each rule's, and the run facts no rule hears
        # Then each poll fires them, with no read of a head or of the types appended
        assert await poll_after(opened, BenchRequested(key="k1")) == 1
        assert reads() == []
        assert await poll_after(opened, ChaosRequested(key="c1"), BenchRequested(key="k2")) == 2
        assert reads() == []
        # And when listening broke and began again, the next poll reads the store
        await nudges.close()
        await opened.publish(BenchRequested(key="k3"))  # unheard
        await nudges.listen()
        assert await poll_after(opened, BenchRequested(key="k4")) == 2
        assert reads()

    runtime.run(scenario())


def test_a_poll_after_one_that_failed_evaluates_what_the_failed_one_was_told(
    served_on_postgres: tuple[Runtime, Dispatcher],
) -> None:
    runtime, dispatcher = served_on_postgres
    nudges = dispatcher._nudges

    async def scenario() -> None:
        first = await runtime.reflexr.open("t", "w", actor=FEED)
        other = await runtime.reflexr.open("t", "other", actor=FEED)
        await first.publish(BenchRequested(key="k0"))
        await other.publish(BenchRequested(key="o0"))
        await dispatcher.poll()
        await nudges.listen()
        assert await nudges.wait(0)
        await dispatcher.poll()  # the first poll after listening began reads the store
        # Given a poll told of an event that fails while it evaluates (its store refusing)
        await first.publish(BenchRequested(key="k1"))
        assert await nudges.wait(10)
        rename = "ALTER TABLE {} RENAME TO {}"
        async with runtime.engine("reflexr").begin() as connection:
            await connection.execute(sa.text(rename.format("reflexr_rule_progress", "hidden")))
        with pytest.raises(sa.exc.DBAPIError):
            await dispatcher.poll()
        async with runtime.engine("reflexr").begin() as connection:
            await connection.execute(sa.text(rename.format("hidden", "reflexr_rule_progress")))
        # When the next poll is told only of an event in another workspace
        await other.publish(BenchRequested(key="o1"))
        assert await nudges.wait(10)
        # Then it fires both: what the failed poll was told is not lost with it
        assert (await dispatcher.poll()).fired == 2

    runtime.run(scenario())


def test_a_statement_appending_too_much_to_say_makes_the_next_poll_read_the_store(
    served_on_postgres: tuple[Runtime, Dispatcher],
) -> None:
    runtime, dispatcher = served_on_postgres
    nudges = dispatcher._nudges
    ref = WorkspaceRef("t", "w")

    async def scenario() -> None:
        await nudges.listen()
        assert await nudges.wait(0)
        assert nudges.drain() is None  # listening just began
        # Given an append a notification can say: it tells the workspace, its seq and type
        opened = await runtime.reflexr.open("t", "w", actor=FEED)
        await opened.publish(BenchRequested(key="k0"))
        assert await nudges.wait(10)
        appended = nudges.drain()
        assert appended is not None
        head = await runtime.reflexr.storage.head_seq(ref)
        assert appended.heads() == {ref: head}
        assert appended.types(ref, 0, head) == {BenchRequested.event_type}
        # When one statement appends to more workspaces than a notification can name
        async with runtime.engine("reflexr").begin() as connection:
            await connection.execute(
                sa.text(
                    "INSERT INTO reflexr_events"
                    " (tenant_id, workspace_id, seq, event_id, event_type, envelope)"
                    " SELECT 'other', 'workspace-' || n, 1, 'evt-' || n, 'x', '{}'"
                    " FROM generate_series(1, 400) AS n"
                )
            )
        # Then it wakes the dispatcher, and the next poll reads the store
        assert await nudges.wait(10)
        assert nudges.drain() is None

    runtime.run(scenario())


def test_notifications_tell_the_types_appended_only_where_they_cover_every_entry() -> None:
    ref = WorkspaceRef("t", "w")
    appended = Appended(
        {
            ref: [
                Grown(6, 7, frozenset({"b"})),
                Grown(3, 5, frozenset({"a"})),
                Grown(1, 2, frozenset({"z"})),
            ]
        }
    )
    assert appended.heads() == {ref: 7}
    assert appended.types(ref, 2, 7) == {"a", "b"}  # what lies before `after` is left out
    assert appended.types(ref, 4, 7) == {"a", "b"}
    assert appended.types(ref, 5, 6) == {"b"}
    gap = Appended({ref: [Grown(1, 2, frozenset({"a"})), Grown(4, 5, frozenset({"b"}))]})
    assert gap.types(ref, 0, 5) is None  # entry 3 was never heard of
    assert gap.types(ref, 3, 5) == {"b"}
    assert gap.types(ref, 3, 6) is None  # past what was heard
    assert gap.types(WorkspaceRef("t", "other"), 0, 1) is None


def test_listeners_know_which_rules_an_entry_concerns() -> None:
    silence = Rule(
        name="bench:silence",
        when=on(BenchRequested).absent(within=timedelta(minutes=1)),
        then=run("bench-act"),
    )
    off = Rule(name="bench:off", when=on(ChaosRequested), then=run("bench-act"), enabled=False)
    listeners = Listeners.of([*RULES, silence, off])
    assert listeners.every == {"bench:act", "chaos:act", "bench:silence"}
    assert listeners.always == {"bench:silence"}
    assert listeners.hearing([BenchRequested.event_type]) == {"bench:act", "bench:silence"}
    assert listeners.hearing([ChaosRequested.event_type]) == {"chaos:act", "bench:silence"}
    assert listeners.hearing([RunSucceeded.event_type]) == {"bench:silence"}


def test_the_pools_own_facts_are_quiet_unless_a_rule_listens_to_them() -> None:
    hears_failures = Rule(
        name="bench:failures",
        when=on(RunDeadLettered),
        then=run("bench-act"),
    )
    assert Listeners.of(RULES).quiet == OWN_FACTS
    assert Listeners.of([*RULES, hears_failures]).quiet == OWN_FACTS - {RunDeadLettered.event_type}
    waits = Rule(
        name="bench:silence",
        when=on(BenchRequested).absent(within=timedelta(minutes=1)),
        then=run("bench-act"),
    )
    assert Listeners.of([*RULES, waits]).quiet == frozenset()


def test_costly_polls_go_at_once_within_the_burst_and_sustained_ones_keep_to_the_share() -> None:
    # Given a quarter of a core, of which two seconds' worth (0.5 s of CPU) may go at once
    budget = CpuBudget(0.25, burst_s=2.0)
    # When a few costly polls (80 ms of CPU each) come 0.25 s apart, as low-load events do
    for i in range(4):
        budget.spend(0.08, now=i * 0.25)
        # Then none waits: the refill (62.5 ms per 0.25 s) and the burst cover them
        assert budget.wait_s() == 0.0
    # And when such polls come back to back, the budget runs into debt and each waits until
    # the share repaid it: 0.08 s of CPU per 0.32 s of wall time, a quarter of a core
    now = 1.0
    for _ in range(20):
        budget.spend(0.08, now=now)
        now += budget.wait_s()
    assert budget.wait_s() == pytest.approx(0.32)
    assert 20 * 0.08 / (now - 1.0) < 0.25 + 0.5 / (now - 1.0)


def test_after_a_burst_the_default_share_lets_low_load_events_go_at_once() -> None:
    # Given the default share, and a burst's evaluation of three seconds of CPU
    share = Settings.model_fields["dispatcher_max_cpu"].default
    budget = CpuBudget(share)
    budget.spend(3.0, now=0.0)
    now = budget.wait_s()
    # When events then come four a second, in ten workspaces, each evaluation costing 60 ms
    # (what the bench's spread workload measured: a lease and two transactions per rule)
    waits = []
    for i in range(40):
        budget.spend(0.06, now=now + i * 0.25)
        waits.append(budget.wait_s())
    # Then only the first waits, for what the burst left: at a quarter of a core every one
    # waited about 0.23 s, and that wait was most of an event's latency
    assert waits[0] > 0 and waits[1:] == [0.0] * 39


def test_one_poll_costlier_than_the_burst_is_followed_by_a_burst_of_rest_at_most() -> None:
    # Given a quarter of a core with a two-second burst
    budget = CpuBudget(0.25, burst_s=2.0)
    # When one evaluation of a burst of events takes four seconds of CPU
    budget.spend(4.0, now=0.0)
    # Then the next poll waits two seconds, not the sixteen that would repay it all: a
    # dispatcher that long asleep hears no nudge, sweeps nothing and beats no heartbeat
    assert budget.wait_s() == pytest.approx(2.0)


def test_a_long_poll_that_mostly_waited_on_the_database_leaves_no_debt() -> None:
    # Given the default share, full
    budget = CpuBudget(Settings.model_fields["dispatcher_max_cpu"].default)
    # When a burst's evaluation waits on PostgreSQL's row locks for 13 s and uses 1.7 s of
    # CPU (what a `threads` worker's burst over ten workspaces measured)
    budget.spend(1.7, now=113.0, started=100.0)
    # Then the next poll goes at once: the poll kept to 13% of a core. Charged as if it had
    # been spent in an instant, it made the first low-load events wait 1.5 s
    assert budget.wait_s() == 0.0


def test_a_long_poll_that_was_all_cpu_is_still_held_to_the_share() -> None:
    # Given half a core with a two-second burst
    budget = CpuBudget(0.5, burst_s=2.0)
    # When one poll spends all of its 4 s of wall time on the CPU
    budget.spend(4.0, now=4.0, started=0.0)
    # Then it ran past the share: 1 s of burst and 2 s of refill covered 3 of its 4 s, and
    # the next poll waits 2 s to repay the rest
    assert budget.wait_s() == pytest.approx(2.0)


def test_a_long_evaluation_sends_the_runs_of_its_first_batches_before_it_ends(
    dispatcher_env: dict[str, str], served_first_in_first_out: tuple[Runtime, Dispatcher]
) -> None:
    runtime, dispatcher = served_first_in_first_out
    client = redis.Redis.from_url(dispatcher_env["ACTONCE_BROKER_URL"])
    count_runs = select(func.count()).select_from(RunRow)

    async def scenario() -> tuple[int, int, Polled]:
        opened = await runtime.reflexr.open("t", "w", actor=FEED)
        # Given a burst of events, several of the dispatcher's evaluation batches (and fewer
        # than one poll sends)
        total = 4 * EVALUATION_BATCH
        await opened.publish_many([BenchRequested(key=f"k{i}") for i in range(total)])
        # When one poll evaluates them all
        polling = asyncio.ensure_future(dispatcher.poll())
        runs_when_first_sent = None
        while not polling.done():
            if runs_when_first_sent is None and client.llen(ATTEMPTS_QUEUE):
                async with runtime.engine("reflexr").connect() as connection:
                    runs_when_first_sent = (await connection.execute(count_runs)).scalar_one()
            await asyncio.sleep(0.02)
        assert runs_when_first_sent is not None, "nothing was queued before the poll ended"
        return total, runs_when_first_sent, polling.result()

    try:
        total, runs_when_first_sent, polled = runtime.run(scenario())
    finally:
        client.close()
    # Then it sends each once, and the first went out while most were not fired yet
    assert (polled.fired, polled.sent) == (total, total)
    assert runs_when_first_sent < total, runs_when_first_sent
    assert len(_queued(dispatcher_env["ACTONCE_BROKER_URL"])) == total


def test_the_pool_runs_code_rules_only_and_a_stored_rule_never_fires(
    served: tuple[Runtime, Dispatcher],
) -> None:
    runtime, dispatcher = served

    async def scenario() -> None:
        # Given another process whose reflexr allows stored rules, on the pool's own stores,
        # and a stored rule it installed on the same event as the pool's code rule
        other = rw.Workspaces(
            SqlStorage(runtime.engine("reflexr")),
            events=[BenchRequested, ChaosRequested],
            rules=RULES,
            stored_rules=StoredRules(actions={"bench-act": None}, namespaces={"user"}),
        )
        stored = Rule(
            name="user:act",
            when=on(BenchRequested).at_most(10, per=timedelta(hours=1)),
            then=run("bench-act"),
            timeout=timedelta(seconds=10),
            ordering="none",
        )
        await (await other.open("t", "w", actor=FEED)).install_rule(stored)

        # When an event is published and the dispatcher polls
        opened = await runtime.reflexr.open("t", "w", actor=FEED)
        await opened.publish(BenchRequested(key="k0"))
        polled = await dispatcher.poll()

        # Then only the code rule fired, and the pool refuses to install one itself
        assert (polled.fired, polled.sent) == (1, 1)
        with pytest.raises(Forbidden):
            await opened.install_rule(Rule(name="user:b", when=on(BenchRequested), then=run("x")))

    runtime.run(scenario())
