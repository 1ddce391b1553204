"""Dead letters keep every job the pool gave up on, once, until an operator purges it.

One behaviour suite runs over the three stores (in memory, SQLite, PostgreSQL), so the fast
tests and the real ones prove the same things: a letter is kept once by its derived id and never
overwritten, listed newest first, marked replayed, counted, and purged only by a filter or by an
explicit `everything`. A malformed message is kept too, its raw body bounded and marked when cut.
"""

import asyncio
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

import pytest
from artifactr.sql import create_sqlite_engine
from pydantic import ValidationError
from sqlalchemy.ext.asyncio import create_async_engine

from actonce.tasks.lifecycle import Reason
from actonce.worker.dead_letters.store import (
    RAW_LIMIT_BYTES,
    DeadLetter,
    DeadLetters,
    InMemoryDeadLetters,
    SqlDeadLetters,
    intake_letter_id,
    raw_letter_id,
    raw_text,
    run_letter_id,
)
from actonce.worker.storage.migrate import migrate_own_tables

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


class Stores:
    """Runs scenarios against one kind of store; each run opens it afresh, as a new process."""

    def __init__(self, kind: str, url: str | None) -> None:
        self.kind = kind
        self.url = url
        self._memory = InMemoryDeadLetters()

    def run[T](self, scenario: Callable[[DeadLetters], Awaitable[T]]) -> T:
        """Run a scenario on its own event loop, with the store opened on it and closed after."""
        return asyncio.run(self._run(scenario))

    async def _run[T](self, scenario: Callable[[DeadLetters], Awaitable[T]]) -> T:
        if self.url is None:
            return await scenario(self._memory)
        engine = (
            create_sqlite_engine(self.url)
            if self.url.startswith("sqlite")
            else create_async_engine(self.url)
        )
        try:
            await migrate_own_tables(engine)
            return await scenario(SqlDeadLetters(engine))
        finally:
            await engine.dispose()


@pytest.fixture(params=["memory", "sqlite", "postgres"])
def stores(request: pytest.FixtureRequest, tmp_path: Path) -> Stores:
    if request.param == "memory":
        return Stores("memory", None)
    if request.param == "sqlite":
        return Stores("sqlite", f"sqlite+aiosqlite:///{tmp_path / 'dead_letters.db'}")
    return Stores("postgres", request.getfixturevalue("postgres_url"))


def letter(
    run: str = "fir_1",
    *,
    epoch: int = 1,
    tenant_id: str = "acme",
    reason: str = "forbidden",
    dead_at: datetime = T0,
    error: str = "the rule may not edit this artifact",
) -> DeadLetter:
    return DeadLetter(
        id=run_letter_id(tenant_id, "ws_1", run, epoch),
        tenant_id=tenant_id,
        workspace_id="ws_1",
        run_id=run,
        rule="notes.tidy",
        reason=reason,
        error=error,
        attempts=epoch,
        task_id=f"task-{run}-{epoch}",
        queue="attempts",
        dead_at=dead_at,
    )


# ─── keeping a letter ─────────────────────────────────────────────────────────


def test_a_letter_added_is_read_back_as_it_was(stores: Stores) -> None:
    dead = letter()

    async def scenario(store: DeadLetters) -> DeadLetter | None:
        assert await store.add(dead), "a new letter should be reported as new"
        return await store.get(dead.id)

    got = stores.run(scenario)
    assert got == dead, f"the letter read back differs: {got!r}"
    assert got.dead_at.tzinfo is UTC, f"dead_at should read back as aware UTC: {got.dead_at!r}"


def test_a_letter_added_twice_is_kept_once(stores: Stores) -> None:
    first = letter(error="first delivery")
    duplicate = letter(error="a duplicate delivery, with another message")

    async def scenario(store: DeadLetters) -> tuple[bool, bool, DeadLetter | None, int]:
        return (
            await store.add(first),
            await store.add(duplicate),
            await store.get(first.id),
            await store.count(),
        )

    added, added_again, kept, count = stores.run(scenario)
    assert (added, added_again) == (True, False), "the second add of an id should say False"
    assert kept == first, "the first letter of an id should be kept, never overwritten"
    assert count == 1


def test_duplicate_deliveries_dead_lettering_at_once_make_one_letter(stores: Stores) -> None:
    async def scenario(store: DeadLetters) -> list[bool]:
        return list(await asyncio.gather(*(store.add(letter()) for _ in range(8))))

    added = stores.run(scenario)
    assert sorted(added) == [False] * 7 + [True], f"exactly one add should win: {added}"


def test_an_unknown_id_reads_as_nothing(stores: Stores) -> None:
    assert stores.run(lambda store: store.get("dl_0000000000000000")) is None


def test_letters_outlive_the_store_that_kept_them(stores: Stores) -> None:
    dead = letter()
    stores.run(lambda store: store.add(dead))
    assert stores.run(lambda store: store.get(dead.id)) == dead


def test_a_time_in_another_zone_is_kept_in_utc(stores: Stores) -> None:
    paris = timezone(timedelta(hours=1))
    dead = letter(dead_at=datetime(2026, 3, 1, 13, 0, tzinfo=paris))

    async def scenario(store: DeadLetters) -> DeadLetter | None:
        await store.add(dead)
        return await store.get(dead.id)

    got = stores.run(scenario)
    assert got is not None
    assert got.dead_at == T0 and got.dead_at.tzinfo is UTC, f"not UTC: {got.dead_at!r}"


# ─── listing and counting ─────────────────────────────────────────────────────


def test_letters_are_listed_newest_first(stores: Stores) -> None:
    letters = [letter(f"fir_{n}", dead_at=T0 + timedelta(minutes=n)) for n in (2, 0, 3, 1)]

    async def scenario(store: DeadLetters) -> list[DeadLetter]:
        for each in letters:
            await store.add(each)
        return await store.list()

    listed = [each.run_id for each in stores.run(scenario)]
    assert listed == ["fir_3", "fir_2", "fir_1", "fir_0"], f"not newest first: {listed}"


def test_letters_dead_at_the_same_moment_list_in_a_stable_order(stores: Stores) -> None:
    letters = [letter(f"fir_{n}") for n in range(5)]

    async def scenario(store: DeadLetters) -> list[DeadLetter]:
        for each in letters:
            await store.add(each)
        return await store.list()

    listed = [each.id for each in stores.run(scenario)]
    assert listed == sorted(listed, reverse=True), f"ties should list by id, descending: {listed}"


def test_the_list_stops_at_its_limit(stores: Stores) -> None:
    letters = [letter(f"fir_{n}", dead_at=T0 + timedelta(minutes=n)) for n in range(5)]

    async def scenario(store: DeadLetters) -> list[DeadLetter]:
        for each in letters:
            await store.add(each)
        return await store.list(limit=2)

    assert [each.run_id for each in stores.run(scenario)] == ["fir_4", "fir_3"]


def test_a_list_without_room_for_a_letter_is_refused(stores: Stores) -> None:
    with pytest.raises(ValueError, match="limit"):
        stores.run(lambda store: store.list(limit=0))


def test_the_list_narrows_to_a_workspace(stores: Stores) -> None:
    elsewhere = letter("fir_2").model_copy(
        update={"workspace_id": "ws_2", "id": run_letter_id("acme", "ws_2", "fir_2", 1)}
    )

    async def scenario(store: DeadLetters) -> tuple[list[DeadLetter], ...]:
        await store.add(letter("fir_1"))
        await store.add(elsewhere)
        return (
            await store.list(workspace_id="ws_2"),
            await store.list(tenant_id="acme", workspace_id="ws_1"),
            await store.list(tenant_id="globex", workspace_id="ws_2"),
        )

    in_two, in_one, none = stores.run(scenario)
    assert [each.run_id for each in in_two] == ["fir_2"]
    assert [each.run_id for each in in_one] == ["fir_1"]
    assert none == []


def test_the_list_narrows_to_a_reason_and_to_a_tenant(stores: Stores) -> None:
    letters = [
        letter("fir_1", tenant_id="acme", reason="forbidden"),
        letter("fir_2", tenant_id="acme", reason="attempts_exhausted"),
        letter("fir_3", tenant_id="globex", reason="forbidden"),
    ]

    async def scenario(store: DeadLetters) -> tuple[list[DeadLetter], ...]:
        for each in letters:
            await store.add(each)
        return (
            await store.list(reason="forbidden"),
            await store.list(tenant_id="acme"),
            await store.list(reason="forbidden", tenant_id="acme"),
        )

    by_reason, by_tenant, by_both = stores.run(scenario)
    assert {each.run_id for each in by_reason} == {"fir_1", "fir_3"}
    assert {each.run_id for each in by_tenant} == {"fir_1", "fir_2"}
    assert [each.run_id for each in by_both] == ["fir_1"]


def test_replayed_letters_are_left_out_of_lists_and_counts_unless_asked_for(
    stores: Stores,
) -> None:
    replayed, waiting = letter("fir_1"), letter("fir_2")

    async def scenario(store: DeadLetters) -> tuple[list[DeadLetter], list[DeadLetter], int, int]:
        await store.add(replayed)
        await store.add(waiting)
        await store.mark_replayed(replayed.id, T0 + timedelta(hours=1))
        return (
            await store.list(),
            await store.list(include_replayed=True),
            await store.count(),
            await store.count(include_replayed=True),
        )

    listed, listed_all, count, count_all = stores.run(scenario)
    assert [each.run_id for each in listed] == ["fir_2"]
    assert {each.run_id for each in listed_all} == {"fir_1", "fir_2"}
    assert (count, count_all) == (1, 2)


# ─── replaying ────────────────────────────────────────────────────────────────


def test_each_replay_is_stamped_and_counted(stores: Stores) -> None:
    dead = letter()
    first, second = T0 + timedelta(hours=1), T0 + timedelta(hours=2)

    async def scenario(store: DeadLetters) -> tuple[DeadLetter, DeadLetter, DeadLetter | None]:
        await store.add(dead)
        once = await store.mark_replayed(dead.id, first)
        twice = await store.mark_replayed(dead.id, second)
        return once, twice, await store.get(dead.id)

    once, twice, kept = stores.run(scenario)
    assert (once.replays, once.replayed_at) == (1, first)
    assert (twice.replays, twice.replayed_at) == (2, second)
    assert kept == twice, "the store should keep what mark_replayed returned"
    assert kept.error == dead.error and kept.dead_at == dead.dead_at, "only the replay changes"


def test_replaying_a_missing_letter_raises_key_error_naming_it(stores: Stores) -> None:
    with pytest.raises(KeyError, match="dl_missing"):
        stores.run(lambda store: store.mark_replayed("dl_missing", T0))


def test_a_naive_replay_time_is_refused(stores: Stores) -> None:
    dead = letter()

    async def scenario(store: DeadLetters) -> DeadLetter:
        await store.add(dead)
        return await store.mark_replayed(dead.id, datetime(2026, 3, 1, 13, 0))

    with pytest.raises(ValueError, match="timezone-aware"):
        stores.run(scenario)


# ─── purging ──────────────────────────────────────────────────────────────────


def test_purge_without_a_filter_refuses_to_empty_the_store(stores: Stores) -> None:
    async def scenario(store: DeadLetters) -> int:
        await store.add(letter())
        with pytest.raises(ValueError, match="everything=True"):
            await store.purge()
        return await store.count()

    assert stores.run(scenario) == 1, "a refused purge should remove nothing"


def test_purge_everything_empties_the_store_only_when_said(stores: Stores) -> None:
    async def scenario(store: DeadLetters) -> tuple[int, int]:
        for n in range(3):
            await store.add(letter(f"fir_{n}"))
        return await store.purge(everything=True), await store.count(include_replayed=True)

    assert stores.run(scenario) == (3, 0)


def test_purge_everything_with_a_filter_is_refused_as_ambiguous(stores: Stores) -> None:
    with pytest.raises(ValueError, match="either"):
        stores.run(lambda store: store.purge(everything=True, replayed_only=True))


def test_purge_by_ids_removes_those_only_and_counts_what_it_removed(stores: Stores) -> None:
    letters = [letter(f"fir_{n}") for n in range(3)]

    async def scenario(store: DeadLetters) -> tuple[int, int, list[DeadLetter]]:
        for each in letters:
            await store.add(each)
        removed = await store.purge(ids=[letters[0].id, letters[1].id, "dl_missing"])
        nothing = await store.purge(ids=[])
        return removed, nothing, await store.list()

    removed, nothing, left = stores.run(scenario)
    assert (removed, nothing) == (2, 0), "a missing id and an empty list should remove nothing"
    assert [each.run_id for each in left] == ["fir_2"]


def test_purge_by_many_ids_removes_them_all(stores: Stores) -> None:
    letters = [letter(f"fir_{n}") for n in range(520)]

    async def scenario(store: DeadLetters) -> tuple[int, int]:
        for each in letters:
            await store.add(each)
        removed = await store.purge(ids=[each.id for each in letters[:510]])
        return removed, await store.count()

    assert stores.run(scenario) == (510, 10)


def test_purge_refuses_one_string_for_ids(stores: Stores) -> None:
    with pytest.raises(ValueError, match="sequence"):
        stores.run(lambda store: store.purge(ids="dl_0000000000000000"))


def test_purge_older_than_removes_only_letters_dead_before_it(stores: Stores) -> None:
    letters = [letter(f"fir_{n}", dead_at=T0 + timedelta(days=n)) for n in range(4)]

    async def scenario(store: DeadLetters) -> tuple[int, list[DeadLetter]]:
        for each in letters:
            await store.add(each)
        removed = await store.purge(older_than=T0 + timedelta(days=2))
        return removed, await store.list()

    removed, left = stores.run(scenario)
    assert removed == 2
    assert [each.run_id for each in left] == ["fir_3", "fir_2"], "the cutoff itself is kept"


def test_purge_replayed_only_keeps_letters_still_waiting(stores: Stores) -> None:
    old_replayed = letter("fir_1", dead_at=T0)
    new_replayed = letter("fir_2", dead_at=T0 + timedelta(days=10))
    old_waiting = letter("fir_3", dead_at=T0)

    async def scenario(store: DeadLetters) -> tuple[int, int, list[DeadLetter]]:
        for each in (old_replayed, new_replayed, old_waiting):
            await store.add(each)
        for each in (old_replayed, new_replayed):
            await store.mark_replayed(each.id, T0 + timedelta(days=11))
        old = await store.purge(replayed_only=True, older_than=T0 + timedelta(days=1))
        rest = await store.purge(replayed_only=True)
        return old, rest, await store.list(include_replayed=True)

    old, rest, left = stores.run(scenario)
    assert (old, rest) == (1, 1), "filters should combine: old AND replayed, then replayed"
    assert [each.run_id for each in left] == ["fir_3"]


# ─── malformed messages ───────────────────────────────────────────────────────


def test_a_malformed_message_is_kept_with_its_raw_body_and_reason(stores: Stores) -> None:
    body = b'{"tenant_id": "acme", "run_id": \xff\x00}'
    dead = DeadLetter.malformed(
        body, error="run_id: not a string", dead_at=T0, task_id="task-9", queue="attempts"
    )

    async def scenario(store: DeadLetters) -> tuple[DeadLetter | None, list[DeadLetter]]:
        await store.add(dead)
        return await store.get(dead.id), await store.list(reason=Reason.MALFORMED_MESSAGE)

    got, listed = stores.run(scenario)
    assert got == dead and listed == [dead]
    assert got.raw == '{"tenant_id": "acme", "run_id": \\xff\\x00}', f"raw: {got.raw!r}"
    assert (got.run_id, got.tenant_id, got.attempts) == (None, None, 0)
    assert got.id == raw_letter_id("task-9", body)


def test_a_huge_raw_body_is_kept_cut_to_its_bound_and_marked(stores: Stores) -> None:
    body = ("é" * RAW_LIMIT_BYTES).encode()
    dead = DeadLetter.malformed(body, error="not JSON", dead_at=T0)

    async def scenario(store: DeadLetters) -> DeadLetter | None:
        await store.add(dead)
        return await store.get(dead.id)

    got = stores.run(scenario)
    assert got is not None and got.raw is not None
    assert len(got.raw.encode()) <= RAW_LIMIT_BYTES, "the raw body should fit its bound"
    assert got.raw.startswith("éé") and got.raw.endswith(f"had {len(body)} bytes]"), got.raw[-80:]


@pytest.mark.parametrize(
    ("item", "encoding"),
    [
        pytest.param(b'{"headers": {"task": "celery.accumulate"}}', "text", id="utf8"),
        pytest.param(b'{"id": "a\x00b"}', "base64", id="nul"),
        pytest.param(b"\xff\xfe\x80 not utf-8", "base64", id="binary"),
    ],
)
def test_a_refused_message_is_kept_with_its_exact_bytes(
    stores: Stores, item: bytes, encoding: str
) -> None:
    dead = DeadLetter.refused(
        item, reason="unknown_task", error="no", dead_at=T0, task_id=None, queue="q"
    )

    async def scenario(store: DeadLetters) -> DeadLetter | None:
        await store.add(dead)
        return await store.get(dead.id)

    got = stores.run(scenario)
    assert got == dead
    assert (got.raw_encoding, got.raw_bytes, got.raw_message()) == (encoding, len(item), item)


def test_two_undecodable_messages_never_share_a_letter(stores: Stores) -> None:
    # The letters of messages that could not be decoded once all read "None" and shared an id.
    first, second = b"\xff\x00 one", b"\xff\x00 two"
    letters = [
        DeadLetter.refused(item, reason="malformed_message", error="not JSON", dead_at=T0)
        for item in (first, second, first)
    ]

    async def scenario(store: DeadLetters) -> list[bool]:
        return [await store.add(one) for one in letters]

    assert stores.run(scenario) == [True, True, False], "a redelivery is the same letter"
    assert letters[0].id != letters[1].id
    assert letters[0].id == intake_letter_id(first) and len(letters[0].id) == len("dl_") + 32


def test_a_huge_refused_binary_message_is_cut_to_its_bound_and_tells_its_size() -> None:
    item = b"\xff" * (RAW_LIMIT_BYTES * 3)
    dead = DeadLetter.refused(item, reason="oversized", error="big", dead_at=T0)
    assert dead.raw is not None and len(dead.raw) <= RAW_LIMIT_BYTES
    kept = dead.raw_message()
    assert kept is not None and item.startswith(kept) and dead.raw_bytes == len(item)


# ─── ids and values, without a store ──────────────────────────────────────────


def test_the_same_attempt_dead_lettered_twice_gets_one_id() -> None:
    once = run_letter_id("acme", "ws_1", "fir_1", 3)
    assert once == run_letter_id("acme", "ws_1", "fir_1", 3)
    assert once.startswith("dl_") and len(once) == len("dl_") + 16
    assert once != run_letter_id("acme", "ws_1", "fir_1", 4), "a later attempt is another letter"
    assert once != run_letter_id("acme", "ws_2", "fir_1", 3), "another workspace, another letter"


def test_the_parts_of_a_letter_id_cannot_run_into_each_other() -> None:
    assert run_letter_id("a", "bc", "r", 1) != run_letter_id("ab", "c", "r", 1)


def test_a_redelivered_malformed_message_gets_one_id() -> None:
    assert raw_letter_id("task-1", b"{oops") == raw_letter_id("task-1", "{oops")
    assert raw_letter_id("task-1", b"{oops") != raw_letter_id("task-2", b"{oops")
    assert raw_letter_id(None, b"{oops") == raw_letter_id("", b"{oops")
    assert raw_letter_id(None, b"{oops") != raw_letter_id(None, b"{oops!")


def test_a_body_within_its_bound_is_kept_whole() -> None:
    body = "x" * RAW_LIMIT_BYTES
    assert raw_text(body) == body


def test_a_cut_body_keeps_its_bound_when_validated_again() -> None:
    dead = DeadLetter.malformed(b"x" * (RAW_LIMIT_BYTES * 2), error="too big", dead_at=T0)
    again = DeadLetter.model_validate(dead.model_dump())
    assert again == dead, "a letter read back should not be cut a second time"


def test_a_raw_body_set_directly_is_bounded_too() -> None:
    dead = DeadLetter(id="dl_x", reason="malformed_message", error="e", raw="y" * 10**6, dead_at=T0)
    assert dead.raw is not None and len(dead.raw.encode()) <= RAW_LIMIT_BYTES
    assert dead.raw.endswith("had 1000000 bytes]")


def test_a_letter_with_a_naive_time_is_refused() -> None:
    with pytest.raises(ValidationError, match="timezone"):
        DeadLetter(id="dl_x", reason="forbidden", error="e", dead_at=datetime(2026, 3, 1))


def test_a_letter_is_frozen() -> None:
    dead = letter()
    with pytest.raises(ValidationError):
        dead.__setattr__("replays", 5)


def test_a_letters_repr_leaves_its_raw_body_out() -> None:
    dead = DeadLetter.malformed(b"secret body", error="not JSON", dead_at=T0)
    assert "secret body" not in repr(dead)


# ─── the table ────────────────────────────────────────────────────────────────


def test_migrating_the_table_twice_is_harmless(tmp_path: Path) -> None:
    async def scenario() -> int:
        engine = create_sqlite_engine(f"sqlite+aiosqlite:///{tmp_path / 'twice.db'}")
        try:
            await migrate_own_tables(engine)
            store = SqlDeadLetters(engine)
            await store.add(letter())
            await migrate_own_tables(engine)
            return await store.count()
        finally:
            await engine.dispose()

    assert asyncio.run(scenario()) == 1, "migrating again should keep its letters"
