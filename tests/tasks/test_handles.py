"""One handle per attempt, whatever `Outbound` or `Reaction` asks for it, and only while it lives.

relayr 0.1.1 keeps a handle per `Outbound` and per `Reaction`, so identical writes made through two
of them in one attempt get one id and the second is silently lost; here the attempt (tenant,
workspace, run id, epoch) is the key. The next attempt gets a fresh handle that derives the same
ids again, and a finished attempt's handle goes with its reactions.
"""

import gc

import artifactr
import pytest
import relayr.outbound
from reflexr.workspace import Reaction, Reactor
from relayr.ledger import InMemoryLedger
from worlds import ALLOWLIST, RULE, Board, Plan, World, make_world, retried_rule, settled

from actonce.tasks import Allowlist, Outbound
from actonce.tasks.handles import HANDLES

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


async def test_two_outbounds_over_other_stores_are_refused_not_silently_merged(
    world: World,
) -> None:
    reaction = world.reaction(1)
    world.outbound().acting(reaction)
    other_store = artifactr.Workspaces(artifactr.InMemoryStorage(), types=[Board, Plan])
    over_other_store = Outbound(other_store, world.ledger, allowlists={RULE: ALLOWLIST})
    over_other_ledger = Outbound(world.artifactr, InMemoryLedger(), allowlists={RULE: ALLOWLIST})

    for other in (over_other_store, over_other_ledger):
        with pytest.raises(ValueError, match="different artifactr workspaces or ledgers"):
            other.acting(reaction)


async def test_two_outbounds_with_equal_allowlists_by_other_keys_share_the_handle(
    world: World,
) -> None:
    reaction = world.reaction(1)
    by_namespace = Outbound(world.artifactr, world.ledger, allowlists={"ops:*": ALLOWLIST})

    assert by_namespace.acting(reaction) is world.outbound().acting(reaction)


async def test_the_handles_of_a_reactors_finished_attempts_are_collected() -> None:
    world = await make_world(
        artifactr.Workspaces(artifactr.InMemoryStorage(), types=[Board, Plan]), rule=retried_rule()
    )
    outbound = world.outbound()
    gc.collect()
    live = len(HANDLES)
    during: list[int] = []

    async def log(reaction: Reaction[None]) -> None:
        await outbound.acting(reaction).notice("hello")
        during.append(len(HANDLES))
        if reaction.attempt == 1:
            raise RuntimeError("attempt 1 fails after its notice")

    run = await settled(Reactor(world.reflexr, actions={"log": log}), world)
    gc.collect()

    assert (run.status, run.attempts) == ("succeeded", 2)
    assert during == [live + 1, live + 1], "an attempt's handle outlived it into the next"
    assert len(HANDLES) == live, "a finished attempt's handle outlived the reactor's run"
    assert len((await world.writes()).messages) == 1


async def test_relayrs_allowlists_configure_the_drop_in_alike(world: World) -> None:
    reaction = world.reaction(1)
    relayr_style = Outbound(
        world.artifactr,
        world.ledger,
        allowlists={RULE: relayr.outbound.Allowlist(**ALLOWLIST.model_dump())},
    )

    assert relayr_style.acting(reaction) is world.outbound().acting(reaction)
