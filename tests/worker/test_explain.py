"""`explain` lists a real run's writes with the ids the run derived, and whether each exists.

A reflexr `Reactor` runs the demo's `work` action with `tasks.Outbound` over artifactr's and
reflexr's in-memory stores and relayr's SQL ledger on a SQLite file. `worker.commands.explain` then
finds, from artifactr's log and the ledger alone, the notice, the receipt, the timeline's direct
edit and the runbook's proposal, each with its derived id recomputed by `tasks.ids` and each
existing; it leaves out another run's writes, places a write after a checkpoint in its own segment,
and lists a write the ledger recorded but artifactr never took as missing.
"""

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import artifactr
import artifactr.core as a
import pytest
import reflexr.workspace as rw
import relayr.sql
from reflexr import SystemActor
from reflexr.core import Run
from reflexr.workspace import Reaction, WorkspaceRef
from relayr.events import BRIDGED
from relayr.inbound import SOURCE

from actonce.tasks import Outbound, ids
from actonce.worker.commands.explain import Explanation, candidate_of, explain_run, locate, unmade
from actonce.worker.definition import Deps
from demo.definition import (
    RUNBOOK_ID,
    THREAD_ID,
    TIMELINE_ID,
    Receipt,
    Runbook,
    Timeline,
    WorkRequested,
    app,
    work,
)

TENANT = "acme"
WORKSPACE = "ws_explain"


class Scene:
    """The demo's stores with its thread, timeline and runbook, a reactor, and the ledger."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine
        self.ledger = relayr.sql.SqlLedger(engine)
        self.artifactr = artifactr.Workspaces(
            artifactr.InMemoryStorage(), types=list(app.artifact_types)
        )
        self.reflexr = rw.Workspaces(
            rw.InMemoryStorage(),
            events=[*BRIDGED, *app.events],
            publishers={"artifactr": [SOURCE]},
            rules=app.rules,
        )
        self.outbound = Outbound(self.artifactr, self.ledger, allowlists=app.allowlists)
        self.ref = WorkspaceRef(TENANT, WORKSPACE)

    async def set_up(self) -> None:
        people = await self.artifactr.open(TENANT, WORKSPACE, actor=a.UserActor(id="al", name="Al"))
        await people.commit(a.CreateThread(thread_id=THREAD_ID, title="demo"))
        await people.create(Timeline(), artifact_id=TIMELINE_ID)
        await people.create(Runbook(), artifact_id=RUNBOOK_ID)

    async def run(
        self,
        key: str,
        work: Callable[[Reaction[Deps]], Awaitable[Any]],
        *,
        until: tuple[str, ...] = ("succeeded", "dead"),
    ) -> Run:
        """Publish a `WorkRequested`; have a reactor run its run until its status is in `until`."""
        system = await self.reflexr.open(TENANT, WORKSPACE, actor=SystemActor(name="tests"))
        before = {r.id for r in await system.runs()}
        await system.publish(WorkRequested(key=key))
        reactor = rw.Reactor(
            self.reflexr,
            actions={**app.actions(self.outbound), "demo-work": work},
            deps=Deps(outbound=self.outbound),
        )
        for _ in range(100):
            await reactor.settle()
            [run] = [r for r in await system.runs() if r.id not in before]
            if run.status in until:
                return run
            await asyncio.sleep(0.01)
        raise TimeoutError(f"the run did not finish: {run}")

    async def explain(self, run: Run) -> Explanation:
        return await explain_run(
            self.reflexr, self.artifactr, self.ledger, self.ref, run.id, relayr_engine=self.engine
        )


@pytest.fixture
async def scene(tmp_path: Path) -> AsyncIterator[Scene]:
    """A fresh scene whose ledger is a migrated SQLite file."""
    engine = relayr.sql.create_sqlite_engine(f"sqlite+aiosqlite:///{tmp_path / 'relayr.db'}")
    await relayr.sql.migrate(engine)
    made = Scene(engine)
    await made.set_up()
    yield made
    await engine.dispose()


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


pytestmark = pytest.mark.anyio


async def test_explain_lists_the_demo_runs_four_writes_with_their_derived_ids(
    scene: Scene,
) -> None:
    run = await scene.run("k1", work)
    assert run.status == "succeeded", run.error

    explanation = await scene.explain(run)

    def expected(op: str, *key: str) -> str:
        return ids.write_digest(run.id, 0, op, key, 0)

    notice = f"msg_{expected('notice', THREAD_ID, ids.content_digest('Working on k1.'))}"
    receipt = Receipt(key="k1", done_by="demo:work")
    receipt_id = f"art_{expected('create', 'demo_receipt', ids.content_digest(receipt.to_json()))}"
    timeline = f"prp_{expected('edit', TIMELINE_ID, '/entries/k1')}"
    runbook = f"prp_{expected('edit', RUNBOOK_ID, '/steps/k1')}"
    assert [(w.op, w.id, w.exists, w.segment, w.occurrence) for w in explanation.writes] == [
        ("notice", notice, True, 0, 0),
        ("create", receipt_id, True, 0, 0),
        ("edit", timeline, True, 0, 0),
        ("edit", runbook, True, 0, 0),
    ]
    assert run.output == {"notice": notice, "receipt": receipt_id}


async def test_explain_prints_a_line_per_write_and_a_summary_without_content(
    scene: Scene,
) -> None:
    run = await scene.run("k1", work)

    lines = (await scene.explain(run)).lines()

    assert lines[0].split() == ["op", "id", "exists", "about"]
    assert [line.split()[0] for line in lines[1:5]] == ["notice", "create", "edit", "edit"]
    assert all(line.split()[2] == "yes" for line in lines[1:5])
    assert f"{TIMELINE_ID} /entries/k1 (direct)" in lines[3]
    assert f"{RUNBOOK_ID} /steps/k1 (proposed)" in lines[4]
    assert lines[5].startswith("4 write(s): 4 exist, 0 missing; run fir_")
    assert "succeeded after 1 attempt(s)" in lines[5]
    assert not any("Working on" in line for line in lines), "message content was printed"


async def test_explain_leaves_out_the_writes_of_another_run_of_the_same_rule(
    scene: Scene,
) -> None:
    first = await scene.run("k1", work)
    second = await scene.run("k2", work)

    mine = (await scene.explain(first)).writes
    theirs = (await scene.explain(second)).writes

    assert len(mine) == len(theirs) == 4
    assert not {w.id for w in mine} & {w.id for w in theirs}


async def test_a_write_after_a_checkpoint_is_placed_in_the_next_segment(scene: Scene) -> None:
    async def twice(reaction: Reaction[Deps]) -> None:
        acting = reaction.deps.outbound.acting(reaction)
        await acting.notice("Halfway.", thread_id=THREAD_ID)
        await reaction.checkpoint("half", None)
        await acting.notice("Halfway.", thread_id=THREAD_ID)

    run = await scene.run("k1", twice)

    writes = (await scene.explain(run)).writes

    assert [(w.op, w.segment, w.occurrence, w.exists) for w in writes] == [
        ("notice", 0, 0, True),
        ("notice", 1, 0, True),
    ]


async def test_a_write_the_ledger_recorded_but_artifactr_refused_is_listed_missing(
    scene: Scene,
) -> None:
    async def into_nowhere(reaction: Reaction[Deps]) -> None:
        acting = reaction.deps.outbound.acting(reaction)
        await acting.notice("Posted.", thread_id=THREAD_ID)
        await acting.notice("Lost.", thread_id="thr_missing")  # cause recorded, then refused

    run = await scene.run("k1", into_nowhere, until=("retrying",))

    explanation = await scene.explain(run)

    missing = [w for w in explanation.writes if not w.exists]
    assert [(w.op, w.id[:4], w.segment) for w in missing] == [("message", "msg_", None)]
    assert len(explanation.writes) == 2
    assert "1 missing" in explanation.lines()[-1]
    assert "is retrying after 1 attempt(s)" in explanation.lines()[-1]


async def test_an_unknown_run_is_a_lookup_error(scene: Scene) -> None:
    with pytest.raises(LookupError, match="no run fir_nope"):
        await explain_run(scene.reflexr, scene.artifactr, scene.ledger, scene.ref, "fir_nope")


def test_locate_finds_the_segment_and_occurrence_an_id_was_derived_at() -> None:
    digest = ids.write_digest("fir_1", 2, "notice", ("thr_a", "d"), 1)

    assert locate("fir_1", 3, "notice", ("thr_a", "d"), 2, digest) == (2, 1)
    assert locate("fir_1", 2, "notice", ("thr_a", "d"), 2, digest) is None
    assert locate("fir_2", 3, "notice", ("thr_a", "d"), 2, digest) is None


def test_a_create_and_an_edit_recorded_in_the_ledger_are_one_write_each() -> None:
    recorded = [
        ("proposal", "prp_aaa"),
        ("artifact", "art_aaa"),
        ("proposal", "prp_bbb"),
        ("edit", "reflexr:r/art_x@2"),
        ("message", "msg_ccc"),
    ]

    assert unmade(recorded, set()) == [
        ("artifact", "art_aaa"),
        ("proposal", "prp_bbb"),
        ("message", "msg_ccc"),
    ]
    assert unmade(recorded, {"art_aaa", "prp_bbb", "msg_ccc"}) == []


def test_a_patch_that_is_not_one_keyed_add_is_not_a_runs_edit() -> None:
    patch = a.JsonPatch(ops=({"op": "remove", "path": "/entries/k"},))
    changed = a.ArtifactChanged(
        artifact_id="art_x", kind="demo_timeline", version=2, patch=patch, summary="remove"
    )

    assert candidate_of(changed) is None
