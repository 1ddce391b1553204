"""Every write of `RunActions`, made by attempt 1 and again by attempt 2, lands in artifactr once.

Each test runs over artifactr's in-memory store and over its SQLite store, and counts what landed
from artifactr's own log: create (direct and by proposal), edit (direct and by proposal), archive,
notice, create_thread, read, and send (through a `Runner`, for a rule whose allowlist starts turns;
`NotAllowed` otherwise). And the limits the README's Guarantees state: a rephrased notice is
another notice, a direct edit retried after someone changed the value sets it again, and an edit
at an array index inserts there (once).
"""

import asyncio
from collections.abc import AsyncIterator

import artifactr
import artifactr.agent
import artifactr.core as a
import pytest
from pydantic_ai import Agent, ModelMessage, ModelResponse, TextPart
from pydantic_ai.models.function import AgentInfo
from worlds import ALLOWLIST, BOARD, PLAN, RULE, RUN_ID, THREAD, Board, Plan, World

from actonce.tasks import Allowlist, NotAllowed, Outbound, ids, rule_actor

pytestmark = pytest.mark.anyio


async def test_a_retried_direct_create_makes_one_artifact_with_the_same_id(world: World) -> None:
    outbound = world.outbound()

    first = await outbound.acting(world.reaction(1)).create(Board(entries={"a": "1"}))
    second = await outbound.acting(world.reaction(2)).create(Board(entries={"a": "1"}))

    assert first == second and first.startswith("art_")
    writes = await world.writes()
    assert writes.artifacts == {first: 1}, "the retry made a second artifact"
    assert not writes.proposals
    assert (await world.people.get(Board, first)).data.entries == {"a": "1"}


async def test_a_retried_create_by_proposal_makes_one_proposal(world: World) -> None:
    outbound = world.outbound()

    first = await outbound.acting(world.reaction(1)).create(Plan(steps={"s": "1"}), rationale="r")
    second = await outbound.acting(world.reaction(2)).create(Plan(steps={"s": "1"}), rationale="r")

    assert first == second
    proposal_id = "prp_" + first.removeprefix("art_")
    writes = await world.writes()
    assert writes.proposals == {proposal_id: 1}
    assert not writes.artifacts, "a create by proposal reserves no artifact until accepted"
    assert (await world.people.proposal(proposal_id)).status == "pending"


async def test_a_retried_direct_edit_changes_the_artifact_once(world: World) -> None:
    outbound = world.outbound()

    await outbound.acting(world.reaction(1)).edit(BOARD, "/entries/deploy-42", "failed")
    await outbound.acting(world.reaction(2)).edit(BOARD, "/entries/deploy-42", "failed")

    board = await world.people.get(Board, BOARD)
    assert board.data.entries == {"deploy-42": "failed"}
    assert board.version == 2, "the retry committed the same edit again"
    assert sum((await world.writes()).changes.values()) == 1


async def test_a_retried_edit_by_proposal_proposes_once(world: World) -> None:
    outbound = world.outbound()

    await outbound.acting(world.reaction(1)).edit(PLAN, "/steps/rollback", "now", rationale="r")
    await outbound.acting(world.reaction(2)).edit(PLAN, "/steps/rollback", "now", rationale="r")

    writes = await world.writes()
    assert len(writes.proposals) == 1 and not writes.duplicated()
    assert (await world.people.get(Plan, PLAN)).version == 1, "a proposal changes nothing yet"


async def test_a_retried_direct_archive_archives_once(world: World) -> None:
    outbound = world.outbound()

    await outbound.acting(world.reaction(1)).archive(BOARD)
    await outbound.acting(world.reaction(2)).archive(BOARD)

    assert (await world.people.artifact(BOARD)).archived
    assert (await world.writes()).changes == {(BOARD, "archived"): 1}


async def test_a_retried_archive_by_proposal_proposes_once(world: World) -> None:
    outbound = world.outbound()

    await outbound.acting(world.reaction(1)).archive(PLAN, rationale="done")
    await outbound.acting(world.reaction(2)).archive(PLAN, rationale="done")

    writes = await world.writes()
    assert len(writes.proposals) == 1 and not writes.duplicated()
    assert not (await world.people.artifact(PLAN)).archived


async def test_a_retried_attempt_posts_its_notice_once(world: World) -> None:
    outbound = world.outbound()

    first = await outbound.acting(world.reaction(1)).notice("Logged deploy 42.")
    second = await outbound.acting(world.reaction(2)).notice("Logged deploy 42.")

    assert first == second
    assert (await world.writes()).messages == {first: 1}
    [posted] = [
        e.event for e in await world.people.read() if getattr(e.event, "kind", "") == "notice"
    ]
    assert posted.thread_id == THREAD, "a notice goes to the thread whose message fired the rule"


async def test_a_retried_attempt_creates_its_thread_once(world: World) -> None:
    outbound = world.outbound()

    first = await outbound.acting(world.reaction(1)).create_thread("Postmortem")
    second = await outbound.acting(world.reaction(2)).create_thread("Postmortem")

    assert first == second and first.startswith("thr_")
    assert (await world.writes()).threads == {first: 1}
    assert (await world.people.thread(first)).title == "Postmortem"


async def test_a_created_thread_joins_the_chain_so_the_run_may_post_there(world: World) -> None:
    acting = world.outbound().acting(world.reaction(1))

    thread = await acting.create_thread("Postmortem")
    notice = await acting.notice("Opened.", thread_id=thread)

    assert (await world.writes()).messages == {notice: 1}


async def test_a_rule_may_not_create_threads_by_default(world: World) -> None:
    with pytest.raises(NotAllowed) as refused:
        await world.outbound(None).acting(world.reaction(1)).create_thread("t")

    assert refused.value.reason == "not_allowed" and refused.value.permanent
    assert not (await world.writes()).all()


async def test_read_returns_the_current_version_as_the_rule_reads_it(world: World) -> None:
    acting = world.outbound().acting(world.reaction(1))
    await acting.edit(BOARD, "/entries/k", "v")

    current = await acting.read(BOARD)

    assert current.version == 2 and current.data.to_json()["entries"] == {"k": "v"}
    assert current.updated_by.participant == f"external_agent:reflexr:{RULE}"


def _reply(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    return ModelResponse(parts=[TextPart("on it")])


async def _turns_taking(world: World, runner: artifactr.agent.Runner[None], message_id: str) -> int:
    """Wait until a turn took `message_id` and no turn is running; return how many took it."""
    for _ in range(300):
        await runner.drain()
        turns = [e.event for e in await world.people.read() if isinstance(e.event, a.RunStarted)]
        taking = [turn for turn in turns if message_id in turn.message_ids]
        runs = await world.people.runs(thread_id=THREAD)
        if taking and all(run.status != "running" for run in runs):
            return len(taking)
        await asyncio.sleep(0.01)
    raise TimeoutError(f"no turn took {message_id}")


@pytest.fixture
async def runner() -> AsyncIterator[artifactr.agent.Runner[None]]:
    """artifactr's runner of the chat's assistant, with a scripted model."""
    agent = Agent(
        artifactr.agent.function_model(_reply),
        deps_type=artifactr.Session[None],
        capabilities=[artifactr.ArtifactWorkspace(types=[Board, Plan])],
    )
    runner = artifactr.agent.Runner(agent, app=None)
    yield runner
    await runner.aclose()


async def test_a_retried_send_posts_its_message_once_and_starts_one_turn(
    world: World, runner: artifactr.agent.Runner[None]
) -> None:
    outbound = world.outbound(ALLOWLIST.model_copy(update={"turns": True}), runner=runner)

    first = await outbound.acting(world.reaction(1)).send("Summarise deploy 42.")
    assert await _turns_taking(world, runner, first) == 1
    second = await outbound.acting(world.reaction(2)).send("Summarise deploy 42.")
    await asyncio.sleep(0.05)

    assert first == second
    assert (await world.writes()).messages == {first: 1}
    assert await _turns_taking(world, runner, first) == 1, "the retry's ask started another turn"
    notice_id = await outbound.acting(world.reaction(2)).notice("Summarise deploy 42.")
    assert notice_id != first, "a notice of the same text gets another id than a message"


@pytest.mark.parametrize("turns", [False, True])
async def test_send_is_not_allowed_without_turns_or_without_a_runner(
    world: World, runner: artifactr.agent.Runner[None], turns: bool
) -> None:
    # turns=False with a runner; turns=True but no runner
    outbound = Outbound(
        world.artifactr,
        world.ledger,
        allowlists={RULE: Allowlist(turns=turns)},
        runner=None if turns else runner,
    )

    with pytest.raises(NotAllowed) as refused:
        await outbound.acting(world.reaction(1)).send("hello")

    assert refused.value.reason == "not_allowed" and refused.value.permanent
    assert "post a notice" in str(refused.value)
    assert not (await world.writes()).all()


async def test_a_send_whose_attempt_stopped_before_asking_gets_its_turn_on_the_retry(
    world: World, runner: artifactr.agent.Runner[None]
) -> None:
    # Given attempt 1 committed its message and stopped before asking for the turn
    content = "Summarise deploy 42."
    digest = ids.write_digest(RUN_ID, 0, "send", (THREAD, ids.content_digest(content)), 0)
    rule = world.people.as_actor(rule_actor(RULE))
    await rule.commit(a.PostMessage(thread_id=THREAD, content=content, message_id=f"msg_{digest}"))
    outbound = world.outbound(ALLOWLIST.model_copy(update={"turns": True}), runner=runner)

    # When attempt 2 sends it again
    sent = await outbound.acting(world.reaction(2)).send(content)

    # Then the message is not posted again, and its turn runs
    assert sent == f"msg_{digest}"
    assert (await world.writes()).messages == {sent: 1}
    assert await _turns_taking(world, runner, sent) == 1


# The limits the README's Guarantees state: what is written once is the same write, only.


async def test_a_notice_rephrased_on_the_retry_is_posted_again(world: World) -> None:
    outbound = world.outbound()

    first = await outbound.acting(world.reaction(1)).notice("Logged deploy 42.")
    second = await outbound.acting(world.reaction(2)).notice("Deploy 42 logged.")

    assert first != second, "content is part of a write's id"
    assert (await world.writes()).messages == {first: 1, second: 1}


async def test_a_direct_edit_retried_after_someone_changed_the_value_sets_it_again(
    world: World,
) -> None:
    outbound = world.outbound()
    await outbound.acting(world.reaction(1)).edit(BOARD, "/entries/deploy-42", "failed")
    await _people_set(world, "/entries/deploy-42", "fixed", base_version=2)

    await outbound.acting(world.reaction(2)).edit(BOARD, "/entries/deploy-42", "failed")

    board = await world.people.get(Board, BOARD)
    assert board.data.entries == {"deploy-42": "failed"}, "a direct change carries no id"
    assert board.version == 4


async def test_an_edit_at_an_array_index_inserts_there_and_once(world: World) -> None:
    outbound = world.outbound()
    await _people_set(world, "/items", ["older"], base_version=1)

    await outbound.acting(world.reaction(1)).edit(BOARD, "/items/0", "deploy 42")
    await outbound.acting(world.reaction(2)).edit(BOARD, "/items/0", "deploy 42")

    board = await world.people.get(Board, BOARD)
    assert board.data.items == ["deploy 42", "older"], "inserted before, not in place of"
    assert board.version == 3, "the retry inserted it again"


async def _people_set(world: World, path: str, value: object, *, base_version: int) -> None:
    """Alice sets `path` of the board to `value`: a change of someone else's."""
    await world.people.commit(
        a.EditArtifact(
            artifact_id=BOARD,
            base_version=base_version,
            patch=a.JsonPatch(ops=({"op": "add", "path": path, "value": value},)),
        )
    )
