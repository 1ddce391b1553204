"""The pool, for real: every write of a run lands once, whatever Celery and the workers do.

Each test runs on a real Redis (a private server), a real `actonce worker` (prefork, two
children) and the real dispatcher, over SQLite files and over PostgreSQL. Events are published in
the test process; the counts come from artifactr's own log, so "exactly once" is read from the
store, not from what the worker says it did. It proves that a clean run writes each thing once;
that a refused attempt is retried by Celery (RETRY, then SUCCESS) at reflexr's time; that a
permanent failure and spent attempts are dead-lettered with their reason; that a duplicate
message attempts nothing more; that a worker child killed mid-attempt is taken over once its
lease lapses; that a replayed dead letter succeeds without writing twice; and that a malformed
message of any kind is dead-lettered with its reason while the worker serves on.
"""

import pickle
import time
import uuid

import artifactr.core as a
import kombu
import pytest
import relayr.sql
from pools import TENANT, Pool, Scene, wait_until
from reflexr.core import Run
from relayr.ledger import WorkspaceKey

from actonce.tasks.attempt import ATTEMPT_TASK
from actonce.worker.dead_letters.commands import replay
from actonce.worker.settings import ATTEMPTS_QUEUE
from demo.definition import RUNBOOK_ID, TIMELINE_ID, Receipt
from demo.feed import PEOPLE
from lab.census import Census

pytestmark = pytest.mark.slow

PREPARED = frozenset({TIMELINE_ID, RUNBOOK_ID})
"""The artifacts `demo.feed.prepare` creates in every scene, before any run."""


def assert_each_write_once(census: Census, keys: list[str]) -> None:
    """Assert that the runs of `keys` made each of their writes exactly once, and nothing else."""
    assert census.duplicates() == {}, f"writes made more than once: {census.duplicates()}"
    assert len(census.messages) == len(keys), f"one notice per run expected: {census.messages}"
    receipts = set(census.artifacts) - PREPARED
    assert len(receipts) == len(keys), f"one receipt per run expected: {census.artifacts}"
    assert len(census.proposals) == len(keys), f"one runbook proposal per run: {census.proposals}"
    for key in keys:
        applied = census.edits[(TIMELINE_ID, f"/entries/{key}")]
        assert applied == 1, f"the timeline entry of {key} was set by {applied} edits"


def test_runs_on_the_pool_make_every_write_once(scene: Scene) -> None:
    # Given three pieces of work
    keys = ["alpha", "beta", "gamma"]
    for key in keys:
        scene.request(key)

    # When the pool has run them
    runs = scene.settled(runs=3)

    # Then each succeeded in one attempt, and artifactr holds each write once
    assert [(run.status, run.attempts) for run in runs] == [("succeeded", 1)] * 3, runs
    census = scene.census()
    assert_each_write_once(census, keys)
    # and relayr's own ledger, as its bridge reads it, traces each notice to the run that posted it
    ledger = relayr.sql.SqlLedger(scene.pool.runtime.engine("relayr"))
    where = WorkspaceKey(TENANT, scene.workspace_id)
    causes = [scene.pool.run(ledger.cause(where, "message", posted)) for posted in census.messages]
    assert sorted(cause.run_id for cause in causes if cause) == sorted(run.id for run in runs)


def test_a_refused_attempt_is_retried_by_celery_then_succeeds(scene: Scene, pool: Pool) -> None:
    # Given work whose first attempt edits an artifact that does not exist (Refused)
    scene.request("refused", refuse_first=True)

    # When the pool has run it
    (run,) = scene.settled()

    # Then two attempts made it, the task went RETRY then SUCCESS, and each write is there once
    assert (run.status, run.attempts) == ("succeeded", 2), run
    task_id = scene.task_of(run.id)
    assert pool.task_states(task_id) == ["RETRY", "SUCCESS"]
    assert pool.final_state(task_id) == "SUCCESS"
    assert_each_write_once(scene.census(), ["refused"])


def test_a_permanent_failure_is_dead_lettered_with_reason_not_allowed(
    scene: Scene, pool: Pool
) -> None:
    # Given work whose every attempt tries what its allowlist forbids
    scene.request("forbidden", die=True)

    # When the pool has run it
    (run,) = scene.settled()

    # Then the run is dead after one attempt, its letter says not_allowed, the task failed
    assert (run.status, run.attempts, run.reason) == ("dead", 1, "not_allowed"), run
    letter = scene.letter_of(run.id)
    assert (letter.reason, letter.attempts, letter.rule) == ("not_allowed", 1, "demo:work")
    assert letter.task_id is not None
    # The letter is written inside the task, before Celery logs its end: poll. The dispatcher
    # sends attempts with results ignored, so the worker's log holds the task's final state.
    task_id = letter.task_id
    wait_until(lambda: pool.final_state(task_id) == "FAILURE", "the task to fail")
    assert pool.task_states(task_id) == ["FAILURE"]
    assert scene.census().messages == {}, "the forbidden attempt wrote nothing"


def test_a_run_whose_attempts_run_out_is_dead_lettered_as_attempts_exhausted(
    scene: Scene, pool: Pool
) -> None:
    # Given work whose every attempt fails after making all its writes
    scene.request("flaky", flaky=True)

    # When the pool has run it
    (run,) = scene.settled()

    # Then its three attempts ran out, it is dead-lettered so, and its writes were made once
    assert (run.status, run.attempts) == ("dead", 3), run
    letter = scene.letter_of(run.id)
    assert (letter.reason, letter.attempts) == ("attempts_exhausted", 3), letter
    assert letter.task_id is not None
    task_id = letter.task_id
    wait_until(lambda: pool.final_state(task_id) == "FAILURE", "the task to fail")
    assert pool.task_states(task_id) == ["RETRY", "RETRY", "FAILURE"]
    assert_each_write_once(scene.census(), ["flaky"])


def test_a_duplicate_delivery_attempts_nothing_more(scene: Scene, pool: Pool) -> None:
    # Given a run in the middle of its attempt
    scene.request("twice", slow_s=2.0)
    run = wait_for_running(scene)

    # When the same message is delivered twice more while it runs, and again after it ended
    during = [scene.send(run.id), scene.send(run.id)]
    (done,) = scene.settled()
    after = scene.send(run.id)

    # Then each copy ended quietly, one attempt was made, and each write is there once
    for copy in [*during, after]:
        summary = pool.summary(copy.id, timeout_s=30)
        assert summary["outcome"] == "not_claimed", summary
    assert (done.status, done.attempts) == ("succeeded", 1), done
    assert scene.runs()[0].attempts == 1
    assert_each_write_once(scene.census(), ["twice"])


def test_a_worker_child_killed_mid_attempt_is_taken_over_and_writes_once(
    scene: Scene, pool: Pool
) -> None:
    # Given a run whose first attempt made its first write (the notice) and then lingers
    scene.request("killed", slow_s=30.0)
    run = wait_for_running(scene)
    wait_until(lambda: len(scene.census().messages) == 1, "the first write of the attempt")

    # When the prefork child attempting it is killed
    scene.kill_attempt(run.id)

    # Then, once its lease lapsed, a second attempt finished it, and each write is there once
    (done,) = scene.settled(timeout_s=60)
    assert (done.status, done.attempts) == ("succeeded", 2), done
    assert_each_write_once(scene.census(), ["killed"])
    pool.assert_alive()


def test_a_replayed_dead_letter_succeeds_without_writing_twice(scene: Scene, pool: Pool) -> None:
    # Given a run dead-lettered, after its notice, for an artifact that did not exist
    needed = f"art_needed_{scene.workspace_id}"
    scene.request("replayed", needs=needed)
    (dead,) = scene.settled()
    assert (dead.status, dead.reason) == ("dead", "missing_prerequisite"), dead
    letter = scene.letter_of(dead.id)
    assert letter.reason == "missing_prerequisite"
    assert len(scene.census().messages) == 1, "the dying attempt posted its notice"

    # When an operator creates the artifact and replays the letter
    pool.run(create_receipt(pool, scene, needed))
    said = pool.run(replay(pool.runtime, pool.local.celery, letter.id))
    assert "replayed" in said

    # Then the run succeeds, and its notice and every other write are there once
    wait_until(lambda: scene.runs()[0].status != "dead", "the replayed run to be taken up")
    (done,) = scene.settled()
    assert done.status == "succeeded", done
    census = scene.census()
    assert census.duplicates() == {}, census.duplicates()
    assert len(census.messages) == 1, f"the notice was posted again: {census.messages}"
    assert census.edits[(TIMELINE_ID, "/entries/replayed")] == 1
    assert len(census.proposals) == 1
    replayed = [found for found in pool.letters() if found.id == letter.id]
    assert replayed[0].replays == 1


@pytest.mark.parametrize(
    ("kwargs", "reason", "says"),
    [
        pytest.param(
            {"tenant_id": "t_pool", "workspace_id": "ws_x", "run_id": 123},
            "malformed_message",
            "run_id",
            id="wrong-types",
        ),
        pytest.param({"tenant_id": "t_pool"}, "malformed_message", "workspace_id", id="missing"),
        pytest.param(
            {"tenant_id": "t_pool", "workspace_id": "ws_nowhere", "run_id": "fir_nothing"},
            "unknown_run",
            "fir_nothing",
            id="unknown-run",
        ),
    ],
)
def test_a_malformed_task_message_is_dead_lettered_and_the_worker_serves_on(
    pool: Pool, scene: Scene, kwargs: dict[str, object], reason: str, says: str
) -> None:
    # When a message that is no attempt of a known run is sent
    sent = pool.local.celery.send_task(ATTEMPT_TASK, kwargs=kwargs, queue=ATTEMPTS_QUEUE)

    # Then it is dead-lettered with its reason, the task failed, and a good run still succeeds
    letter = pool.letter(lambda found: found.task_id == sent.id)
    assert letter.reason == reason, letter
    assert says in letter.error, letter.error
    assert letter.run_id is None and letter.raw is not None
    wait_until(lambda: pool.result(sent.id).state == "FAILURE", "the task to fail")
    assert_serves_on(pool, scene)


@pytest.mark.parametrize(
    ("body", "content_type", "reason", "says"),
    [
        pytest.param(
            b'{"not json', "application/json", "malformed_message", "not json", id="not-json"
        ),
        pytest.param(
            pickle.dumps(((), {"run_id": "fir_x"}, {})),
            "application/x-python-serialize",
            "unsupported_content",
            "x-python-serialize",
            id="pickle",
        ),
    ],
)
def test_a_raw_message_celery_cannot_decode_is_dead_lettered_and_the_worker_serves_on(
    pool: Pool, scene: Scene, body: bytes, content_type: str, reason: str, says: str
) -> None:
    # When a body Celery must not decode is published to the attempts queue
    task_id = str(uuid.uuid4())
    with kombu.Connection(pool.env["ACTONCE_BROKER_URL"]) as connection:
        connection.Producer().publish(
            body,
            exchange=ATTEMPTS_QUEUE,
            routing_key=ATTEMPTS_QUEUE,
            content_type=content_type,
            content_encoding="binary" if "pickle" in content_type else "utf-8",
            headers={"id": task_id, "task": ATTEMPT_TASK, "lang": "py"},
            declare=[kombu.Queue(ATTEMPTS_QUEUE, kombu.Exchange(ATTEMPTS_QUEUE, "direct"))],
        )

    # Then the intake dead-letters it with its reason and raw bytes, and the worker serves on
    # (tests/worker/test_intake.py pushes many more shapes, oversized ones among them)
    letter = pool.letter(lambda found: found.task_id == task_id)
    assert letter.reason == reason, letter
    assert says in letter.error.lower(), letter.error
    assert letter.raw
    assert_serves_on(pool, scene)


# ─── how ──────────────────────────────────────────────────────────────────────


def assert_serves_on(pool: Pool, scene: Scene) -> None:
    """Assert the pool's processes live, and a clean run in `scene` still succeeds once."""
    pool.assert_alive()
    key = f"after_{uuid.uuid4().hex[:8]}"
    scene.request(key)
    (run,) = scene.settled()
    assert run.status == "succeeded", run
    assert_each_write_once(scene.census(), [key])


def wait_for_running(scene: Scene, timeout_s: float = 20.0) -> Run:
    """Wait until the scene's one run is `running`, and return it."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        runs = scene.runs()
        if runs and runs[0].status == "running":
            return runs[0]
        time.sleep(0.05)
    raise AssertionError(f"no run started in {timeout_s}s: {scene.runs()}")


async def create_receipt(pool: Pool, scene: Scene, artifact_id: str) -> None:
    """Create the artifact a run needs, as the operator fixing its cause."""
    workspace = await pool.runtime.artifactr.open("t_pool", scene.workspace_id, actor=PEOPLE)
    await workspace.commit(
        a.create_artifact(Receipt(key="fix", done_by="operator"), artifact_id=artifact_id)
    )
