"""Leases taken in one statement (`worker.storage.leases`), on SQLite and PostgreSQL.

The upsert answers as reflexr's update-then-insert does for every sequence of takes, renewals and
expiries; of holders racing for a free lease one gets it; a renewal soon after a take is answered
from memory; and the dispatcher's evaluations lease their workspace through it, one statement to
take and one to release.
"""

import asyncio
import uuid
from datetime import UTC, datetime, timedelta

import pytest
import reflexr.sql
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pools import statements_on
from reflexr.core import SourceActor
from reflexr.workspace import WorkspaceRef

from actonce.worker.commands.opening import open_runtime
from actonce.worker.process.runtime import make_engine
from actonce.worker.settings import Settings
from actonce.worker.storage.leases import RENEW_FROM_MEMORY, UpsertLeaseStorage
from bench.definition import BenchRequested, prepare

REF = WorkspaceRef("t", "w")
FEED = SourceActor(name="test-feed")


def asked(statements: list[str]) -> int:
    """How many of `statements` were about leases (SQLite's connections run pragmas too)."""
    return sum("reflexr_leases" in statement for statement in statements)


class Clock:
    def __init__(self) -> None:
        self.now = datetime(2026, 1, 1, tzinfo=UTC)

    def __call__(self) -> datetime:
        return self.now


# A step: (holder 0-2, ttl in s, seconds the clock moves before it); both storages see the same.
STEPS = st.lists(
    st.tuples(st.integers(0, 2), st.integers(1, 5), st.integers(0, 6)), min_size=1, max_size=12
)


# Each example works in workspaces of its own, so sharing the test's store is harmless.
@settings(
    max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(steps=STEPS, key=st.sampled_from(["run:a", "run:b"]))
def test_the_lease_answers_as_reflexrs_own(
    settings_of: Settings, steps: list[tuple[int, int, int]], key: str
) -> None:
    # Given reflexr's storage and the one-run view, each on its own workspace of one store
    async def scenario() -> None:
        engine = make_engine(settings_of.store_url("reflexr"))
        clock = Clock()
        theirs = reflexr.sql.SqlStorage(engine, clock=clock)
        ours = UpsertLeaseStorage(engine, clock=clock)
        suffix = uuid.uuid4().hex[:12]
        their_ref, our_ref = WorkspaceRef("t", f"r{suffix}"), WorkspaceRef("t", f"o{suffix}")
        try:
            # When both see the same takes and renewals as the clock moves
            for holder, ttl_s, later_s in steps:
                clock.now += timedelta(seconds=later_s)
                ttl = timedelta(seconds=ttl_s)
                expected = await theirs.acquire_lease(their_ref, key, f"h{holder}", ttl)
                got = await ours.acquire_lease(our_ref, key, f"h{holder}", ttl)
                # Then each answer is the same
                assert got == expected, (holder, ttl_s, later_s)
            await theirs.release_lease(their_ref, key, "h0")
            await ours.release_lease(our_ref, key, "h0")
            assert await ours.acquire_lease(our_ref, key, "h0", timedelta(seconds=1)) == (
                await theirs.acquire_lease(their_ref, key, "h0", timedelta(seconds=1))
            )
        finally:
            await engine.dispose()

    asyncio.run(scenario())


def test_a_lease_is_exclusive_until_it_expires_or_its_holder_releases_it(
    settings_of: Settings,
) -> None:
    async def scenario() -> None:
        engine = make_engine(settings_of.store_url("reflexr"))
        clock = Clock()
        storage = UpsertLeaseStorage(engine, clock=clock)
        try:
            ttl = timedelta(seconds=10)
            assert await storage.acquire_lease(REF, "run:x", "a", ttl)
            assert not await storage.acquire_lease(REF, "run:x", "b", ttl)
            clock.now += timedelta(seconds=9)
            assert await storage.acquire_lease(REF, "run:x", "a", ttl)  # renewed to +19
            clock.now += timedelta(seconds=9)
            assert not await storage.acquire_lease(REF, "run:x", "b", ttl)
            clock.now += timedelta(seconds=1)
            assert await storage.acquire_lease(REF, "run:x", "b", ttl)  # expired: taken over
            assert not await storage.acquire_lease(REF, "run:x", "a", ttl)
            # Only its holder releases a lease
            await storage.release_lease(REF, "run:x", "a")
            assert not await storage.acquire_lease(REF, "run:x", "a", ttl)
            await storage.release_lease(REF, "run:x", "b")
            assert await storage.acquire_lease(REF, "run:x", "a", ttl)
        finally:
            await engine.dispose()

    asyncio.run(scenario())


def test_a_renewal_soon_after_the_last_asks_the_store_nothing_and_a_later_one_renews(
    settings_of: Settings,
) -> None:
    async def scenario() -> None:
        engine = make_engine(settings_of.store_url("reflexr"))
        statements = statements_on(engine)
        clock = Clock()
        storage = UpsertLeaseStorage(engine, clock=clock)
        ttl = timedelta(seconds=10)
        memory = ttl * RENEW_FROM_MEMORY
        tick = timedelta(milliseconds=1)
        taken_at = clock.now
        try:
            # Given a lease taken in one statement
            assert await storage.acquire_lease(REF, "run:m", "a", ttl)
            assert asked(statements) == 1
            # When its holder renews it just within a tenth of its ttl
            clock.now = taken_at + memory - tick
            assert await storage.acquire_lease(REF, "run:m", "a", ttl)
            # Then the store was not asked, and the lease is still exclusive
            assert asked(statements) == 1
            assert not await storage.acquire_lease(REF, "run:m", "b", ttl)
            assert asked(statements) == 2
            # When it renews at a tenth of its ttl, it asks the store, which renews it
            clock.now = taken_at + memory
            assert await storage.acquire_lease(REF, "run:m", "a", ttl)
            assert asked(statements) == 3
            clock.now = taken_at + ttl + tick  # past the take's expiry, not the renewal's
            assert not await storage.acquire_lease(REF, "run:m", "b", ttl)
            # And a renewal for another ttl, or one after a clock went back, asks the store
            clock.now = taken_at + ttl + 2 * tick
            assert await storage.acquire_lease(REF, "run:m", "a", ttl)
            assert asked(statements) == 5
            assert await storage.acquire_lease(REF, "run:m", "a", 2 * ttl)
            assert asked(statements) == 6
            clock.now -= tick
            assert await storage.acquire_lease(REF, "run:m", "a", 2 * ttl)
            assert asked(statements) == 7
            # And after its release, a take by its holder asks the store again, and so would
            # another holder's: the lease is free
            await storage.release_lease(REF, "run:m", "a")
            assert await storage.acquire_lease(REF, "run:m", "a", 2 * ttl)
            assert asked(statements) == 9
            await storage.release_lease(REF, "run:m", "a")
            assert await storage.acquire_lease(REF, "run:m", "b", ttl)
        finally:
            await engine.dispose()

    asyncio.run(scenario())


def test_of_holders_racing_for_a_free_lease_exactly_one_gets_it(settings_of: Settings) -> None:
    async def scenario() -> list[bool]:
        engine = make_engine(settings_of.store_url("reflexr"))
        storage = UpsertLeaseStorage(engine)
        try:
            ttl = timedelta(seconds=30)
            return list(
                await asyncio.gather(
                    *(storage.acquire_lease(REF, "run:race", f"h{i}", ttl) for i in range(8))
                )
            )
        finally:
            await engine.dispose()

    assert sorted(asyncio.run(scenario())) == [False] * 7 + [True]


def test_row_level_security_is_refused(settings_of: Settings) -> None:
    engine = make_engine(settings_of.store_url("reflexr"))
    try:
        with pytest.raises(ValueError, match="row-level security"):
            UpsertLeaseStorage(engine, row_level_security=True, across_tenants=engine)
    finally:
        asyncio.run(engine.dispose())


def test_the_dispatchers_evaluation_takes_its_lease_in_one_statement_and_renews_from_memory(
    settings_of: Settings,
) -> None:
    # Given the runtime the dispatcher opens, and an event its rule hears
    runtime = open_runtime(settings_of)
    statements = statements_on(runtime.engine("reflexr"))
    try:

        async def scenario() -> None:
            await prepare(runtime.artifactr, REF.tenant_id, REF.workspace_id)
            opened = await runtime.reflexr.open(REF.tenant_id, REF.workspace_id, actor=FEED)
            await opened.publish_many([BenchRequested(key="a")])
            # When it evaluates the workspace
            statements.clear()
            fired = await runtime.reactor().evaluate(REF)
            assert fired == 1
            runs = await reflexr.sql.SqlStorage.runs(runtime.reflexr.storage, REF)  # type: ignore[arg-type]
            assert len(runs) == 1

        runtime.run(scenario())
    finally:
        runtime.close()
    # Then the lease was taken by one upsert and released by a delete, and its renewals after
    # each batch, milliseconds later, were answered from memory: reflexr's own storage runs an
    # UPDATE, then an INSERT, for the take, and an UPDATE for each renewal
    leases = [" ".join(s.split()[:2]) for s in statements if "reflexr_leases" in s]
    assert leases == ["INSERT INTO", "DELETE FROM"]
