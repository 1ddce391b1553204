"""Evaluation bounded to a head (`worker.storage.bounded_reads`), on SQLite and PostgreSQL.

Within `reading_up_to` an evaluation fires for the entries up to the head alone and leaves each
rule's cursor there; the next evaluation reads on from it and fires the rest, each once. The
storage's head there is the bound, read from no store.
"""

from collections.abc import Iterator

import pytest
import reflexr.sql
from pools import statements_on
from reflexr.core import SourceActor
from reflexr.workspace import WorkspaceRef

from actonce.worker.definition import load_definition
from actonce.worker.dispatching.rule_listeners import Listeners
from actonce.worker.process.runtime import Runtime
from actonce.worker.settings import Settings
from actonce.worker.storage.bounded_reads import reading_up_to
from bench.definition import BenchRequested, prepare

REF = WorkspaceRef("t", "w")
OTHER = WorkspaceRef("t", "other")
FEED = SourceActor(name="test-feed")


def _progress_reads(statements: list[str], *, of_every_rule: bool) -> int:
    """reflexr's reads of rules' progress among `statements`: of every rule at once (its
    evaluation's, before the batches: `storage.progress`), or of one rule (a batch's)."""
    return len(
        [
            s
            for s in statements
            if s.startswith("SELECT")
            and "FROM reflexr_rule_progress" in s
            and ("ORDER BY" in s) == of_every_rule
        ]
    )


@pytest.fixture
def runtime(settings_of: Settings) -> Iterator[Runtime]:
    """A runtime over the migrated stores of `settings_of`, as the dispatcher's; closed after."""
    opened = Runtime(settings_of, load_definition(settings_of.app), one_run=False).open()
    try:
        yield opened
    finally:
        opened.close()


def test_an_evaluation_bounded_to_a_head_fires_up_to_it_and_the_next_reads_on(
    runtime: Runtime,
) -> None:
    storage = runtime.reflexr.storage
    statements = statements_on(runtime.engine("reflexr"))

    async def cursors(ref: WorkspaceRef) -> set[int]:
        return {known.cursor for known in (await storage.progress(ref)).values()}

    async def fired(ref: WorkspaceRef) -> list[int]:
        runs = await reflexr.sql.SqlStorage.runs(storage, ref)  # type: ignore[arg-type]
        return sorted(run.fired_seq for run in runs)

    async def scenario() -> None:
        await prepare(runtime.artifactr, REF.tenant_id, REF.workspace_id)
        opened = await runtime.reflexr.open(REF.tenant_id, REF.workspace_id, actor=FEED)
        other = await runtime.reflexr.open(OTHER.tenant_id, OTHER.workspace_id, actor=FEED)
        # Given two events a rule hears, the bound at the first
        await opened.publish(BenchRequested(key="a"))
        bound = await storage.head_seq(REF)
        await opened.publish(BenchRequested(key="b"))
        await other.publish(BenchRequested(key="c"))
        # When the workspace is evaluated within the bound, it fires for the first alone, and
        # every rule's cursor stops at the bound
        with reading_up_to(REF, bound):
            assert await runtime.reactor().evaluate(REF) == 1
            # (a bound on one workspace leaves another's reads whole)
            assert await runtime.reactor().evaluate(OTHER) == 1
        assert await cursors(REF) == {bound}
        assert await fired(REF) == [bound]
        assert await cursors(OTHER) == {await storage.head_seq(OTHER)}
        # A second evaluation within the same bound asks the log for nothing, nor the head
        statements.clear()
        with reading_up_to(REF, bound):
            assert await storage.head_seq(REF) == bound
            assert await runtime.reactor().evaluate(REF) == 0
        assert [
            s for s in statements if s.startswith("SELECT") and "FROM reflexr_events" in s
        ] == []
        assert [s for s in statements if "reflexr_workspaces.head_seq FROM" in s] == []
        assert await storage.head_seq(REF) > bound  # outside the bound, the store's
        # Then the next evaluation reads on from the cursor and fires the second, once
        assert await runtime.reactor().evaluate(REF) == 1
        assert await fired(REF) == [bound, bound + 1]
        assert await cursors(REF) == {await storage.head_seq(REF)}

    runtime.run(scenario())


def test_an_evaluation_bounded_with_its_rules_ends_without_a_last_pass_in_the_store(
    runtime: Runtime,
) -> None:
    storage = runtime.reflexr.storage
    statements = statements_on(runtime.engine("reflexr"))
    rules = Listeners.of(runtime.definition.rules).every

    def progress_reads() -> int:
        return _progress_reads(statements, of_every_rule=False)

    async def evaluate(ref: WorkspaceRef, *, with_rules: bool, batch_size: int = 500) -> int:
        """Publish two events a rule hears, evaluate up to them; return the runs fired."""
        opened = await runtime.reflexr.open(ref.tenant_id, ref.workspace_id, actor=FEED)
        await opened.publish_many([BenchRequested(key="a"), BenchRequested(key="b")])
        head = await storage.head_seq(ref)
        statements.clear()
        with reading_up_to(ref, head, rules=rules if with_rules else None):
            fired = await runtime.reactor(batch_size=batch_size).evaluate(ref)
        assert {known.cursor for known in (await storage.progress(ref)).values()} == {head}
        return fired

    async def scenario() -> None:
        for ref in (REF, OTHER):
            await prepare(runtime.artifactr, ref.tenant_id, ref.workspace_id)
            await evaluate(ref, with_rules=False)  # every rule begins
        # Given two workspaces with the same log, evaluated up to the same bound
        # When one is evaluated with its rules named, the other without
        assert await evaluate(REF, with_rules=False) == 2
        without = progress_reads()
        assert await evaluate(OTHER, with_rules=True) == 2
        # Then the named one's last pass, once every rule reached the bound, read no rule's
        # progress: one read fewer per rule
        assert progress_reads() == without - len(rules)
        # And a rule whose batch stopped short of the bound is evaluated on to it: two batches
        # of one entry each fire both runs
        assert await evaluate(OTHER, with_rules=True, batch_size=1) == 2

    runtime.run(scenario())


def test_a_bounded_evaluation_asks_the_store_for_progress_only_when_memory_says_no_work(
    runtime: Runtime,
) -> None:
    storage = runtime.reflexr.storage
    statements = statements_on(runtime.engine("reflexr"))
    rules = Listeners.of(runtime.definition.rules).every

    def whole_progress_reads() -> int:
        return _progress_reads(statements, of_every_rule=True)

    async def evaluate_up_to(head: int) -> int:
        statements.clear()
        with reading_up_to(REF, head, rules=rules):
            return await runtime.reactor().evaluate(REF)

    async def scenario() -> None:
        await prepare(runtime.artifactr, REF.tenant_id, REF.workspace_id)
        opened = await runtime.reflexr.open(REF.tenant_id, REF.workspace_id, actor=FEED)
        await opened.publish_many([BenchRequested(key="a"), BenchRequested(key="b")])
        assert await evaluate_up_to(await storage.head_seq(REF)) == 2
        # Given every rule's progress seen committed, and an event past it
        await opened.publish(BenchRequested(key="c"))
        bound = await storage.head_seq(REF)
        # When it is evaluated, the progress the batches need is read under the lock alone
        assert await evaluate_up_to(bound) == 1
        assert whole_progress_reads() == 0
        # And when a rule was moved back behind a bound that memory says every rule reached
        # (a replay, committed after that bound was read), the store is asked, and says work
        await opened.replay_rule("bench:act", from_seq=0, mode="refire")
        assert await evaluate_up_to(bound) == 3
        assert whole_progress_reads() == 1

    runtime.run(scenario())
