"""Property: however attempt 1 stopped, attempt 2 in any order leaves each write in artifactr once.

For random lists of writes (creates direct and by proposal, keyed edits direct and by proposal,
notices, threads, and repeats of identical writes), attempt 1 stops after any number k of them,
and attempt 2 makes all of them again in any permutation. artifactr's log then holds every write
exactly once, under the same ids as a run whose attempt 1 made them all and never failed. Counted
from artifactr's own log, over its in-memory store.
"""

import asyncio
from collections import Counter
from typing import Any

import artifactr
from hypothesis import given, settings
from hypothesis import strategies as st
from worlds import BOARD, PLAN, Board, Plan, World, Writes, make_world

from actonce.tasks import RunActions

WRITES = (
    *[("create_board", n) for n in range(2)],
    *[("create_plan", n) for n in range(2)],
    *[("edit_board", n) for n in range(3)],
    *[("edit_plan", n) for n in range(3)],
    *[("notice", n) for n in range(3)],
    *[("thread", n) for n in range(2)],
)
"""The writes a run may make. An edit's path always gets one value: a run sets each key once."""

type Write = tuple[str, int]


async def _make(acting: RunActions, write: Write) -> str | None:
    """Make one write; return the id it returns, if any."""
    match write:
        case ("create_board", n):
            return await acting.create(Board(entries={"n": str(n)}))
        case ("create_plan", n):
            return await acting.create(Plan(steps={"n": str(n)}))
        case ("edit_board", n):
            await acting.edit(BOARD, f"/entries/key-{n}", f"value-{n}")
        case ("edit_plan", n):
            await acting.edit(PLAN, f"/steps/key-{n}", f"value-{n}")
        case ("notice", n):
            return await acting.notice(f"Notice {n}.")
        case ("thread", n):
            return await acting.create_thread(f"Thread {n}")
    return None


async def _world() -> World:
    return await make_world(artifactr.Workspaces(artifactr.InMemoryStorage(), types=[Board, Plan]))


async def _attempt(world: World, epoch: int, writes: list[Write]) -> Counter[str | None]:
    """Make `writes` in one attempt with a fresh handle; return the ids they returned."""
    acting = world.outbound().acting(world.reaction(epoch))
    return Counter([await _make(acting, write) for write in writes])


async def _crash_free(writes: list[Write]) -> tuple[Writes, Counter[str | None]]:
    world = await _world()
    returned = await _attempt(world, 1, writes)
    return await world.writes(), returned


async def _crashed_then_retried(
    writes: list[Write], crash_after: int, order: list[int]
) -> tuple[Writes, Counter[str | None]]:
    world = await _world()
    await _attempt(world, 1, writes[:crash_after])
    returned = await _attempt(world, 2, [writes[i] for i in order])
    return await world.writes(), returned


@st.composite
def _scenarios(draw: Any) -> tuple[list[Write], int, list[int]]:
    writes = draw(st.lists(st.sampled_from(WRITES), min_size=1, max_size=12))
    crash_after = draw(st.integers(min_value=0, max_value=len(writes)))
    order = draw(st.permutations(range(len(writes))))
    return writes, crash_after, order


@settings(max_examples=50, deadline=None)
@given(_scenarios())
def test_a_crashed_attempt_retried_in_any_order_makes_each_write_once_with_the_same_ids(
    scenario: tuple[list[Write], int, list[int]],
) -> None:
    writes, crash_after, order = scenario

    expected, expected_ids = asyncio.run(_crash_free(writes))
    landed, returned_ids = asyncio.run(_crashed_then_retried(writes, crash_after, order))

    assert not expected.duplicated()
    assert not landed.duplicated(), f"written twice: {landed.duplicated()}"
    assert landed.all() == expected.all(), "the retried run wrote other writes than a clean run"
    assert returned_ids == expected_ids, "the retry returned other ids than a clean run"


@settings(max_examples=20, deadline=None)
@given(st.lists(st.sampled_from(WRITES), min_size=1, max_size=8), st.randoms())
def test_a_third_attempt_after_two_complete_ones_writes_nothing(
    writes: list[Write], random: Any
) -> None:
    async def three_attempts() -> tuple[int, int]:
        world = await _world()
        await _attempt(world, 1, writes)
        await _attempt(world, 2, random.sample(writes, len(writes)))
        head = await world.people.head_seq()
        await _attempt(world, 3, random.sample(writes, len(writes)))
        return head, await world.people.head_seq()

    before, after = asyncio.run(three_attempts())

    assert after == before, "a repeated attempt wrote again"
