"""One handle per attempt, whatever `Outbound` or `Reaction` asks for it, and only while it lives.

relayr 0.1.1 keeps a handle per `Outbound` and per `Reaction`, so identical writes made through two
of them in one attempt get one id and the second is silently lost; here the attempt (tenant,
workspace, run id, epoch) is the key. The next attempt gets a fresh handle that derives the same
ids again, and a finished attempt's handle goes with its reactions.
"""

import gc

import pytest
import relayr.outbound
from worlds import ALLOWLIST, RULE, World

from tasks import Allowlist, Outbound
from tasks.handles import HANDLES

pytestmark = pytest.mark.anyio


async def test_identical_notices_through_two_outbounds_in_one_attempt_both_land(
    world: World,
) -> None:
    reaction = world.reaction(1)

    first = await world.outbound().acting(reaction).notice("Deploy 42 failed.")
    second = await world.outbound().acting(reaction).notice("Deploy 42 failed.")

    assert first != second
    assert (await world.writes()).messages == {first: 1, second: 1}


async def test_relayr_collapses_identical_notices_through_two_outbounds(world: World) -> None:
    # what the handles keyed by attempt fix: relayr 0.1.1 counts per Outbound
    reaction = world.reaction(1)

    def relayr_outbound() -> relayr.outbound.Outbound:
        return relayr.outbound.Outbound(world.artifactr, world.ledger)

    first = await relayr_outbound().acting(reaction).notice("Deploy 42 failed.")
    second = await relayr_outbound().acting(reaction).notice("Deploy 42 failed.")

    assert first == second
    assert (await world.writes()).messages == {first: 1}


async def test_two_reactions_of_one_attempt_share_one_handle(world: World) -> None:
    outbound = world.outbound()
    one, other = world.reaction(1), world.reaction(1)

    assert outbound.acting(one) is outbound.acting(other)
    assert world.outbound().acting(other) is outbound.acting(one)
    first = await outbound.acting(one).notice("again")
    second = await outbound.acting(other).notice("again")
    assert first != second


async def test_the_next_attempt_gets_a_fresh_handle_that_derives_the_same_ids(
    world: World,
) -> None:
    outbound = world.outbound()
    attempt_1, attempt_2 = world.reaction(1), world.reaction(2)

    made_1 = [await outbound.acting(attempt_1).notice("again") for _ in range(2)]
    assert outbound.acting(attempt_2) is not outbound.acting(attempt_1)
    made_2 = [await outbound.acting(attempt_2).notice("again") for _ in range(2)]

    assert made_1 == made_2 and made_1[0] != made_1[1]
    assert (await world.writes()).messages == {made_1[0]: 1, made_1[1]: 1}


async def test_a_finished_attempts_handle_is_collected(world: World) -> None:
    gc.collect()
    live = len(HANDLES)
    outbound = world.outbound()
    reactions = [world.reaction(1), world.reaction(1), world.reaction(2)]
    for reaction in reactions:
        await outbound.acting(reaction).notice("hello")
    assert len(HANDLES) == live + 2

    del reactions, reaction
    gc.collect()

    assert len(HANDLES) == live == 0, "a finished attempt's handle outlived its reactions"


async def test_two_outbounds_with_different_allowlists_for_the_rule_are_refused(
    world: World,
) -> None:
    reaction = world.reaction(1)
    world.outbound().acting(reaction)
    other = Outbound(world.artifactr, world.ledger, allowlists={RULE: Allowlist()})

    with pytest.raises(ValueError, match="different allowlists"):
        other.acting(reaction)


async def test_two_outbounds_with_equal_allowlists_by_other_keys_share_the_handle(
    world: World,
) -> None:
    reaction = world.reaction(1)
    by_namespace = Outbound(world.artifactr, world.ledger, allowlists={"ops:*": ALLOWLIST})

    assert by_namespace.acting(reaction) is world.outbound().acting(reaction)
