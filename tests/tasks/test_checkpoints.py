"""A checkpoint starts a new segment of ids, and the ids are byte-identical to relayr 0.1.1's.

These run a real reflexr run in a reactor, since only a real run saves checkpoints. The same writes
made through `relayr.outbound.Outbound` and `tasks.Outbound` in one attempt, each over its own
artifactr store, get the same ids before and after a checkpoint: a run whose first attempt ran in
process under relayr finishes in the pool without writing twice.
"""

from typing import Any

import artifactr
import artifactr.core as a
import pytest
import relayr.outbound
from reflexr.workspace import Reaction, Reactor
from worlds import (
    ALLOWLIST,
    BOARD,
    PLAN,
    RULE,
    Board,
    Plan,
    World,
    make_world,
    retried_rule,
    rule_writes,
    set_up_people,
    settled,
)

from actonce.tasks import Outbound

pytestmark = pytest.mark.anyio


async def _memory_world(rule: Any) -> World:
    return await make_world(
        artifactr.Workspaces(artifactr.InMemoryStorage(), types=[Board, Plan]), rule=rule
    )


async def make_the_writes(acting: Any, round: int) -> list[str]:
    """Make one of each write through a handle, relayr's or ours, and return what they return."""
    thread = await acting.create_thread("Postmortem")
    made = [
        await acting.create(Board(entries={"round": str(round)})),
        await acting.create(Plan(steps={"round": str(round)})),
        await acting.notice("Deploy 42 failed."),
        await acting.notice("Deploy 42 failed."),
        await acting.notice("Opened the postmortem.", thread_id=thread),
        thread,
    ]
    await acting.edit(BOARD, f"/entries/round-{round}", "done")
    await acting.edit(PLAN, f"/steps/round-{round}", "check")
    await acting.archive(made[0])
    return made


async def test_a_write_after_a_checkpoint_gets_another_id_and_a_retry_resumes_with_it() -> None:
    world = await _memory_world(retried_rule())
    outbound = world.outbound()
    notices: dict[int, list[str]] = {}

    async def log(reaction: Reaction[None]) -> list[str]:
        acting = outbound.acting(reaction)
        made = notices.setdefault(reaction.attempt, [])
        if reaction.run.step != "noticed":
            made.append(await acting.notice("Deploy 42 failed."))
            await reaction.checkpoint("noticed", None)
        made.append(await acting.notice("Deploy 42 failed."))
        if reaction.attempt == 1:
            raise RuntimeError("the worker died after its writes")
        return made

    run = await settled(Reactor(world.reflexr, actions={"log": log}), world)

    assert (run.status, run.attempts, run.checkpoints) == ("succeeded", 2, 1)
    before, after = notices[1]
    assert before != after, "the checkpoint did not start a new segment"
    assert notices[2] == [after], "the retry after the checkpoint derived another id"
    assert (await world.writes()).messages == {before: 1, after: 1}


async def test_ids_are_byte_identical_to_relayrs_across_a_checkpoint() -> None:
    world = await _memory_world(retried_rule(max_attempts=1))
    ours = world.outbound()
    relayr_store = artifactr.Workspaces(artifactr.InMemoryStorage(), types=[Board, Plan])
    relayr_people = await set_up_people(relayr_store, world.workspace_id)
    theirs = relayr.outbound.Outbound(
        relayr_store,
        world.ledger,
        allowlists={RULE: relayr.outbound.Allowlist(**ALLOWLIST.model_dump())},
    )
    made: dict[str, list[str]] = {"ours": [], "relayr": []}

    async def log(reaction: Reaction[None]) -> None:
        handles = {"ours": ours.acting(reaction), "relayr": theirs.acting(reaction)}
        for name, acting in handles.items():
            made[name] += await make_the_writes(acting, 1)
        await reaction.checkpoint("half", None)
        for name, acting in handles.items():
            made[name] += await make_the_writes(acting, 1)  # the same writes, a new segment

    run = await settled(Reactor(world.reflexr, actions={"log": log}), world)

    assert (run.status, run.checkpoints) == ("succeeded", 1), run.error
    assert made["ours"] == made["relayr"]
    assert len(set(made["ours"])) == len(made["ours"]), "a write after the checkpoint reused an id"
    assert await rule_writes(world.people) == await rule_writes(relayr_people)
    assert await _log(world.people) == await _log(relayr_people)


async def _log(workspace: artifactr.Workspace) -> list[tuple[str, str]]:
    """The rule's writes in order, by type and by what they are, without times or seqs."""
    return [
        (e.event.type, e.event.model_dump_json(exclude={"at"}))
        for e in await workspace.read()
        if isinstance(e.actor, a.ExternalAgentActor)
    ]


async def test_an_attempt_begun_under_relayr_finishes_under_tasks_without_writing_twice() -> None:
    world = await _memory_world(retried_rule())
    theirs = relayr.outbound.Outbound(
        world.artifactr,
        world.ledger,
        allowlists={RULE: relayr.outbound.Allowlist(**ALLOWLIST.model_dump())},
    )
    ours: Outbound = world.outbound()

    async def log(reaction: Reaction[None]) -> None:
        if reaction.attempt == 1:
            await make_the_writes(theirs.acting(reaction), 1)
            raise RuntimeError("the in-process reactor stopped")
        await make_the_writes(ours.acting(reaction), 1)

    run = await settled(Reactor(world.reflexr, actions={"log": log}), world)

    assert (run.status, run.attempts) == ("succeeded", 2)
    writes = await world.writes()
    assert not writes.duplicated()
    assert len(writes.messages) == 3 and len(writes.threads) == 1
