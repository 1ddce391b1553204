"""The one-run view of reflexr's storage, on SQLite and PostgreSQL.

An attempt's run is leased in the transaction that reads it. The run an attempt settles on without
a read-back is the run as the store holds it; a transaction that did not commit leaves nothing
kept. The claim of an unordered rule's run sees that run alone, an ordered rule's the whole scope.
"""

import dataclasses
from datetime import timedelta

import pytest
import reflexr.sql
import sqlalchemy
from pools import statements_on
from reflexr.core import Rule, SourceActor, on, run
from reflexr.workspace import RunPolicy, WorkspaceRef, run_lease

from actonce.worker.definition import load_definition
from actonce.worker.process.runtime import Runtime
from actonce.worker.settings import Settings
from actonce.worker.storage.one_run import attempting
from bench.definition import RULES, BenchRequested, prepare
from bench.definition import app as bench_app

REF = WorkspaceRef("t", "w")
FEED = SourceActor(name="test-feed")


def test_an_attempt_settles_on_the_run_as_the_store_holds_it(settings_of: Settings) -> None:
    # Given three pending runs of bench:act
    runtime = Runtime(settings_of, load_definition(settings_of.app), one_run=True).open()
    try:

        async def scenario() -> None:
            await prepare(runtime.artifactr, REF.tenant_id, REF.workspace_id)
            opened = await runtime.reflexr.open(REF.tenant_id, REF.workspace_id, actor=FEED)
            await opened.publish_many([BenchRequested(key=f"k{i}", writes=2) for i in range(3)])
            await runtime.reactor().evaluate()  # evaluation is all reflexr's, view or not
            storage = runtime.reflexr.storage
            runs = await reflexr.sql.SqlStorage.runs(storage, REF)  # type: ignore[arg-type]
            assert len(runs) == 3
            for run in runs:
                # When each is attempted through the one-run view
                finished, settled = await runtime.attempt(REF, run.id)
                # Then it finished, and the run it settles on is the store's, read afresh
                assert finished
                assert settled is not None and settled.status == "succeeded"
                assert settled == await storage.run(REF, run.id)
            # A run attempted twice is not claimed again, and reads back as it is
            again, settled = await runtime.attempt(REF, runs[0].id)
            assert not again and settled == await storage.run(REF, runs[0].id)
            # An unknown run is offered to no one and reads back as None
            assert await runtime.attempt(REF, "fir_nope") == (False, None)

        runtime.run(scenario())
    finally:
        runtime.close()


def test_a_transaction_that_fails_keeps_no_run(settings_of: Settings) -> None:
    runtime = Runtime(settings_of, load_definition(settings_of.app), one_run=True).open()
    try:

        async def scenario() -> None:
            opened = await runtime.reflexr.open(REF.tenant_id, REF.workspace_id, actor=FEED)
            await opened.publish(BenchRequested(key="k", writes=1))
            await runtime.reactor().evaluate()  # evaluation is all reflexr's, view or not
            storage = runtime.reflexr.storage
            (run,) = await reflexr.sql.SqlStorage.runs(storage, REF)  # type: ignore[arg-type]
            with attempting(REF, run.id) as target:
                with pytest.raises(RuntimeError):
                    async with storage.transaction(REF) as transaction:
                        await transaction.save_runs([run.model_copy(update={"status": "dead"})])
                        raise RuntimeError("rolled back")
                assert target.saved is None
                async with storage.transaction(REF) as transaction:
                    await transaction.save_runs([run])
                assert target.saved == run
            # Outside an attempt nothing is due and nothing is kept
            policy = RunPolicy.of(runtime.reflexr.rules.values())
            assert await storage.due_runs(now=run.created_at, limit=10, policy=policy) == []

        runtime.run(scenario())
    finally:
        runtime.close()


def test_the_runs_lease_is_taken_with_its_read_and_the_executors_first_ask_answered_from_it(
    settings_of: Settings,
) -> None:
    runtime = Runtime(settings_of, load_definition(settings_of.app), one_run=True).open()
    engine = runtime.engine("reflexr")
    begun: list[object] = []
    sqlalchemy.event.listen(engine.sync_engine, "begin", begun.append)
    try:

        async def scenario() -> None:
            await prepare(runtime.artifactr, REF.tenant_id, REF.workspace_id)
            opened = await runtime.reflexr.open(REF.tenant_id, REF.workspace_id, actor=FEED)
            await opened.publish_many([BenchRequested(key="a"), BenchRequested(key="b")])
            await runtime.reactor().evaluate()
            storage = runtime.reflexr.storage
            mine, theirs = await reflexr.sql.SqlStorage.runs(storage, REF)  # type: ignore[arg-type]
            policy = RunPolicy.of(runtime.reflexr.rules.values())
            ttl = timedelta(seconds=30)
            # Given an attempt that names its executor's holder
            with attempting(REF, mine.id, holder="me", ttl=ttl) as target:
                # When the executor asks what is due: one transaction reads the run, leases it
                begun.clear()
                statements = statements_on(engine)
                due = await storage.due_runs(now=mine.created_at, limit=1, policy=policy)
                assert [run.id for _, run in due] == [mine.id]
                assert (len(begun), target.leased) == (1, True)
                # on PostgreSQL in one statement, in autocommit (no BEGIN and COMMIT round trips;
                # SQLite's connection runs its own BEGIN, not counted)
                alone = begun[0].get_execution_options().get("isolation_level")  # type: ignore[attr-defined]
                postgres = engine.dialect.name == "postgresql"
                claim = [statement for statement in statements if "reflexr_" in statement]
                assert (len(claim), alone) == ((1, "AUTOCOMMIT") if postgres else (2, None))
                # Then its first ask for the lease is answered without the store
                assert await storage.acquire_lease(REF, run_lease(mine.id), "me", ttl)
                assert (len(begun), target.leased) == (1, None)
                # and the lease is the store's: another holder cannot take it
                assert not await storage.acquire_lease(REF, run_lease(mine.id), "other", ttl)
                # and a renewal goes to the store
                assert await storage.acquire_lease(REF, run_lease(mine.id), "me", ttl)
                assert len(begun) == 3
                begun.clear()
                await storage.release_lease(REF, run_lease(mine.id), "me")
                released = begun[0].get_execution_options().get("isolation_level")  # type: ignore[attr-defined]
                assert released == ("AUTOCOMMIT" if postgres else None)
            # A run whose lease another holder has is offered, not leased, and not attempted
            assert await storage.acquire_lease(REF, run_lease(theirs.id), "other", ttl)
            with attempting(REF, theirs.id, holder="me", ttl=ttl) as target:
                await storage.due_runs(now=mine.created_at, limit=1, policy=policy)
                assert target.leased is False
                assert not await storage.acquire_lease(REF, run_lease(theirs.id), "me", ttl)
            assert await runtime.attempt(REF, theirs.id) == (False, theirs)
            # An unknown run takes no lease
            with attempting(REF, "fir_nope", holder="me", ttl=ttl) as target:
                assert await storage.due_runs(now=mine.created_at, limit=1, policy=policy) == []
                assert target.leased is None
            assert await storage.acquire_lease(REF, run_lease("fir_nope"), "other", ttl)
            # And an attempt releases its lease when it is done
            finished, settled = await runtime.attempt(REF, mine.id)
            assert finished and settled is not None and settled.status == "succeeded"
            assert await storage.acquire_lease(REF, run_lease(mine.id), "other", ttl)

        runtime.run(scenario())
    finally:
        runtime.close()


class _RolledBack(Exception):
    """Raised to end a transaction without committing it."""


ORDERED = Rule(
    name="bench:ordered",
    when=on(BenchRequested),
    then=run("bench-act"),
    timeout=RULES[0].timeout,
    ordering="scope",
)


def test_an_unordered_claim_sees_its_own_run_and_an_ordered_one_the_whole_scope(
    settings_of: Settings,
) -> None:
    # Given five events heard by an unordered rule and by a rule ordered by scope
    definition = dataclasses.replace(bench_app, rules=[RULES[0], ORDERED])
    runtime = Runtime(settings_of, definition, one_run=True).open()
    statements = statements_on(runtime.engine("reflexr"))

    def reads() -> list[str]:
        return [s for s in statements if s.startswith("SELECT") and "FROM reflexr_runs" in s]

    try:

        async def scenario() -> None:
            await prepare(runtime.artifactr, REF.tenant_id, REF.workspace_id)
            opened = await runtime.reflexr.open(REF.tenant_id, REF.workspace_id, actor=FEED)
            await opened.publish_many([BenchRequested(key=f"k{i}") for i in range(5)])
            await runtime.reactor().evaluate()
            storage = runtime.reflexr.storage
            runs = await reflexr.sql.SqlStorage.runs(storage, REF)  # type: ignore[arg-type]
            unordered = [r for r in runs if r.rule == RULES[0].name]
            ordered = [r for r in runs if r.rule == ORDERED.name]
            assert len(unordered) == len(ordered) == 5
            # In firing order, as reflexr's storage answers outside an attempt
            async with storage.transaction(REF) as transaction:
                ordered = await transaction.scope_runs(ORDERED.name, ordered[0].scope_key)
            mine, theirs = unordered[2], ordered[2]

            async def scopes(run_id: str) -> tuple[list[str], list[str]]:
                async with storage.transaction(REF) as transaction:
                    await transaction.run(run_id)  # as the claim reads it first
                    seen = []
                    for of in (mine, theirs):
                        got = await transaction.scope_runs(of.rule, of.scope_key)
                        seen.append(sorted(r.id for r in got))
                    return seen[0], seen[1]

            # When the claims of an attempt of each ask for their scope's unfinished runs
            statements.clear()
            with attempting(REF, mine.id):
                own, ordered_seen = await scopes(mine.id)
            # Then the unordered one sees its run alone, as the claim read it (no read again);
            # any other rule, the whole scope
            assert own == [mine.id]
            assert ordered_seen == sorted(r.id for r in ordered)
            assert len(reads()) == 2, reads()  # the claim's read of the run, the ordered scope's
            # A save after the read drops the kept run: the scope is answered as saved
            with attempting(REF, mine.id), pytest.raises(_RolledBack):
                async with storage.transaction(REF) as transaction:
                    read = await transaction.run(mine.id)
                    assert read is not None
                    done = read.model_copy(update={"status": "succeeded"})
                    await transaction.save_runs([done])
                    assert await transaction.scope_runs(mine.rule, mine.scope_key) == []
                    raise _RolledBack
            with attempting(REF, theirs.id):
                _, whole = await scopes(theirs.id)
            assert whole == sorted(r.id for r in ordered)
            # Outside an attempt, every unfinished run of the scope, as reflexr answers
            assert (await scopes(mine.id))[0] == sorted(r.id for r in unordered)

            # And attempts keep each rule's order: an ordered scope's third run waits for the
            # first two, an unordered one's runs go in any order
            assert (await runtime.attempt(REF, theirs.id))[0] is False
            for first_come in (mine, *ordered[:2], theirs):
                finished, settled = await runtime.attempt(REF, first_come.id)
                assert finished and settled is not None and settled.status == "succeeded"

        runtime.run(scenario())
    finally:
        runtime.close()
