"""Each artifactr refusal maps to the failure ADR-0019 gives it; keyed edits commit at most once.

not_found, validation_failed and patch_failed are `Refused` (retryable, reason = code); forbidden
and an `InvalidState` that is not a used id are permanent; a used id is done. An edit that appends
or names no pointer is refused before anything is committed, one whose value is there commits
nothing, and a `VersionConflict` is re-read and made again, three times, then fails the attempt
to be retried. Everything runs over both artifactr stores unless it needs to wrap the store.
"""

from collections import Counter
from typing import Any

import artifactr
import artifactr.core as a
import pytest
from reflexr.workspace import Reaction, Reactor, RunFailure
from relayr.ledger import InMemoryLedger
from worlds import (
    ALICE,
    ALLOWLIST,
    BOARD,
    PLAN,
    RULE,
    Board,
    Plan,
    World,
    make_world,
    retried_rule,
    settled,
)

from actonce.tasks import Outbound, Refused
from actonce.tasks.outbound import WRITES

pytestmark = pytest.mark.anyio


async def test_an_edit_of_a_missing_artifact_is_refused_as_not_found(world: World) -> None:
    with pytest.raises(Refused) as refused:
        await world.outbound().acting(world.reaction(1)).edit("art_missing", "/entries/k", "v")

    assert (refused.value.reason, refused.value.permanent) == ("not_found", False)
    assert "art_missing" in str(refused.value)


async def test_a_read_of_a_missing_artifact_is_refused_as_not_found(world: World) -> None:
    with pytest.raises(Refused) as refused:
        await world.outbound().acting(world.reaction(1)).read("art_missing")

    assert (refused.value.reason, refused.value.permanent) == ("not_found", False)


async def test_an_edit_that_leaves_the_data_invalid_is_refused_as_validation_failed(
    world: World,
) -> None:
    with pytest.raises(Refused) as refused:
        await world.outbound().acting(world.reaction(1)).edit(BOARD, "/entries/k", 42)

    assert (refused.value.reason, refused.value.permanent) == ("validation_failed", False)
    assert (await world.people.artifact(BOARD)).version == 1


@pytest.mark.filterwarnings("ignore:Pydantic serializer warnings")
async def test_a_create_of_invalid_data_is_refused_as_validation_failed(world: World) -> None:
    invalid = Board.model_construct(items="not a list")

    with pytest.raises(Refused) as refused:
        await world.outbound().acting(world.reaction(1)).create(invalid)

    assert (refused.value.reason, refused.value.permanent) == ("validation_failed", False)
    assert not (await world.writes()).all()


async def test_an_edit_whose_parent_is_missing_is_refused_as_patch_failed(world: World) -> None:
    with pytest.raises(Refused) as refused:
        await world.outbound().acting(world.reaction(1)).edit(BOARD, "/nowhere/k", "v")

    assert (refused.value.reason, refused.value.permanent) == ("patch_failed", False)


async def test_an_append_is_refused_before_anything_is_committed(world: World) -> None:
    with pytest.raises(Refused) as refused:
        await world.outbound().acting(world.reaction(1)).edit(BOARD, "/items/-", "x")

    assert (refused.value.reason, refused.value.permanent) == ("patch_failed", False)
    assert "name the entry" in str(refused.value)
    board = await world.people.get(Board, BOARD)
    assert (board.version, board.data.items) == (1, []), "the append was committed"
    assert not (await world.writes()).all()


@pytest.mark.parametrize("path", ["entries/k", "", "~1entries"])
async def test_an_edit_whose_path_is_no_pointer_is_refused_as_patch_failed(
    world: World, path: str
) -> None:
    with pytest.raises(Refused) as refused:
        await world.outbound().acting(world.reaction(1)).edit(BOARD, path, "v")

    assert (refused.value.reason, refused.value.permanent) == ("patch_failed", False)
    assert "JSON Pointer" in str(refused.value)
    assert (await world.people.artifact(BOARD)).version == 1


async def test_a_keyed_edit_whose_value_is_there_commits_nothing(world: World) -> None:
    await world.people.commit(
        a.EditArtifact(
            artifact_id=BOARD,
            base_version=1,
            patch=a.JsonPatch(ops=({"op": "add", "path": "/entries/k", "value": "v"},)),
        )
    )

    await world.outbound().acting(world.reaction(1)).edit(BOARD, "/entries/k", "v")

    assert (await world.people.artifact(BOARD)).version == 2
    assert not (await world.writes()).all()


async def test_a_write_whose_derived_id_is_used_is_done_with_the_same_id(world: World) -> None:
    first = world.outbound().acting(world.reaction(1))
    made = [
        await first.create(Board(entries={"x": "1"})),
        await first.create(Plan(steps={"x": "1"})),
        await first.notice("hello"),
        await first.create_thread("side"),
    ]
    await first.edit(PLAN, "/steps/x", "1")
    before = await world.people.head_seq()

    again = world.outbound().acting(world.reaction(2))
    remade = [
        await again.create(Board(entries={"x": "1"})),
        await again.create(Plan(steps={"x": "1"})),
        await again.notice("hello"),
        await again.create_thread("side"),
    ]
    await again.edit(PLAN, "/steps/x", "1")

    assert remade == made
    assert await world.people.head_seq() == before, "a used id was written again"


async def test_an_edit_of_an_artifact_archived_meanwhile_fails_the_run_for_good(
    world: World,
) -> None:
    # Given attempt 1 proposed an edit, and someone archived the artifact before attempt 2
    await world.outbound().acting(world.reaction(1)).edit(PLAN, "/steps/k", "v")
    await world.people.commit(a.ArchiveArtifact(artifact_id=PLAN, base_version=1))
    before = await world.people.head_seq()

    with pytest.raises(RunFailure) as failed:
        await world.outbound().acting(world.reaction(2)).edit(PLAN, "/steps/k", "v")

    assert (failed.value.reason, failed.value.permanent) == ("invalid_state", True)
    assert not isinstance(failed.value, Refused)
    assert await world.people.head_seq() == before, "the edit was tried"


class _Workspaces:
    """artifactr's workspaces, whose handles call `meddle` around the rule's reads and commits."""

    def __init__(self, inner: artifactr.Workspaces, meddle: "_Meddler") -> None:
        self._inner = inner
        self._meddle = meddle

    async def open(self, *args: Any, **kwargs: Any) -> "_Workspace":
        return _Workspace(await self._inner.open(*args, **kwargs), self._meddle)


class _Workspace:
    def __init__(self, inner: artifactr.Workspace, meddle: "_Meddler") -> None:
        self._inner = inner
        self._meddle = meddle

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def artifact(self, artifact_id: str) -> a.Versioned[a.Artifact]:
        read = await self._inner.artifact(artifact_id)
        await self._meddle.after_read(artifact_id)
        return read

    async def commit(self, command: a.Command) -> a.Outcome:
        self._meddle.commits += 1
        await self._meddle.before_commit(command)
        return await self._inner.commit(command)


class _Meddler:
    """Someone else writing between the rule's read and its commit."""

    def __init__(self, people: artifactr.Workspace, *, changes: int = 0) -> None:
        self.people = people
        self.changes = changes
        self.reads = self.commits = 0
        self.archive_before_commit = False

    async def after_read(self, artifact_id: str) -> None:
        self.reads += 1
        if self.reads <= self.changes:
            current = await self.people.artifact(artifact_id)
            await self.people.commit(
                current.edit(lambda data: data.entries.update({f"other-{self.reads}": "x"}))
            )

    async def before_commit(self, command: a.Command) -> None:
        if self.archive_before_commit:
            self.archive_before_commit = False
            current = await self.people.artifact(PLAN)
            await self.people.commit(current.archive())


def _meddled(world: World, meddler: _Meddler) -> Outbound:
    workspaces: Any = _Workspaces(world.artifactr, meddler)
    return Outbound(workspaces, world.ledger, allowlists={RULE: ALLOWLIST})


async def test_an_edit_of_an_artifact_that_keeps_changing_fails_after_three_tries(
    world: World,
) -> None:
    meddler = _Meddler(world.people, changes=100)
    outbound = _meddled(world, meddler)

    with pytest.raises(RunFailure) as failed:
        await outbound.acting(world.reaction(1)).edit(BOARD, "/entries/k", "v")

    assert (failed.value.reason, failed.value.permanent) == ("version_conflict", False)
    assert (meddler.reads, meddler.commits) == (3, 3)
    assert "k" not in (await world.people.get(Board, BOARD)).data.entries


async def test_an_edit_of_an_artifact_that_changed_once_succeeds_on_the_re_read(
    world: World,
) -> None:
    meddler = _Meddler(world.people, changes=1)
    outbound = _meddled(world, meddler)
    tally: Counter[str] = Counter()
    WRITES.set(tally)

    await outbound.acting(world.reaction(1)).edit(BOARD, "/entries/k", "v")

    assert (meddler.reads, meddler.commits) == (2, 2)
    assert (tally["conflicts"], tally["made"]) == (1, 1)  # the attempt's log line counts both
    board = await world.people.get(Board, BOARD)
    assert board.data.entries == {"other-1": "x", "k": "v"}
    assert board.version == 3


async def test_an_edit_whose_artifact_is_archived_before_its_commit_fails_for_good(
    world: World,
) -> None:
    meddler = _Meddler(world.people)
    meddler.archive_before_commit = True
    outbound = _meddled(world, meddler)

    with pytest.raises(RunFailure) as failed:
        await outbound.acting(world.reaction(1)).edit(PLAN, "/steps/k", "v")

    assert (failed.value.reason, failed.value.permanent) == ("invalid_state", True)
    assert "archived" in str(failed.value)
    assert not (await world.writes()).proposals


async def _refuse_rules(tenant: str, workspace: str | None, actor: a.Actor, access: Any) -> bool:
    """Let people do anything, and rules only open and read."""
    rule = getattr(actor, "client_id", "").startswith("reflexr:")
    return (
        not rule or access.action == "artifactr:open" or access.action.startswith("artifactr:read")
    )


async def test_a_write_the_authorize_hook_refuses_fails_the_run_for_good_as_forbidden() -> None:
    guarded = artifactr.Workspaces(
        artifactr.InMemoryStorage(), types=[Board, Plan], authorize=_refuse_rules
    )
    world = await make_world(guarded, ledger=InMemoryLedger())
    acting = world.outbound().acting(world.reaction(1))

    writes = {
        "notice": lambda: acting.notice("hello"),
        "edit": lambda: acting.edit(BOARD, "/entries/k", "v"),
        "create": lambda: acting.create(Board()),
        "create_thread": lambda: acting.create_thread("t"),
    }
    for name, write in writes.items():
        with pytest.raises(RunFailure) as failed:
            await write()
        assert (failed.value.reason, failed.value.permanent) == ("forbidden", True), name
        assert not isinstance(failed.value, Refused), name
    assert not (await world.writes()).all()
    assert (await world.people.artifact(BOARD)).updated_by == ALICE


async def test_a_function_actions_refusal_is_retried_and_a_permanent_one_ends_the_run() -> None:
    world = await make_world(
        artifactr.Workspaces(artifactr.InMemoryStorage(), types=[Board, Plan]),
        rule=retried_rule(max_attempts=3),
    )
    outbound = world.outbound()
    reasons: list[str | None] = []

    async def log(reaction: Reaction[None]) -> None:
        acting = outbound.acting(reaction)
        if reaction.attempt == 1:
            await acting.edit("art_missing", "/entries/k", "v")  # Refused: retried
        reasons.append((await world.automation.run(reaction.run_id)).reason)
        await acting.notice("hello", thread_id="thr_elsewhere")  # NotAllowed: dead

    run = await settled(Reactor(world.reflexr, actions={"log": log}), world)

    assert reasons == ["not_found"], "the refused attempt was not retried with its reason"
    assert (run.status, run.reason, run.attempts) == ("dead", "not_allowed", 2)
