"""A run left dead by a delivery that never settled gets its dead letter from the dispatcher.

Before the pool starts, the test does what a worker child does up to the moment it is killed:
reflexr's evaluation fires a demo run that dies for want of its prerequisite, and the child's own
attempt (`Runtime.attempt`) leaves it dead; no letter is written and no message is queued, as
after a SIGKILL and a Redis restart. Then a real pool starts, on PostgreSQL as in production, and
`actonce dead list` must show that run's letter. A dispatcher in the test process shows, on SQLite
and on PostgreSQL, the sweep's grace and that it reads a letter it found once.
"""

import asyncio
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from pathlib import Path

import pytest
from pools import POOL_ENV, broker_url, database, flush, statements_on, wait_for
from reflexr.core import Run
from reflexr.workspace import WorkspaceRef

from actonce.worker.app import make_celery
from actonce.worker.dead_letters import unsettled_deaths
from actonce.worker.dead_letters.store import run_letter_id
from actonce.worker.definition import load_definition
from actonce.worker.dispatching.dispatcher import Dispatcher
from actonce.worker.process.runtime import Runtime
from actonce.worker.settings import Settings
from actonce.worker.storage.migrate import migrate
from demo.definition import PREREQUISITE_ID, WorkRequested
from demo.feed import prepare, request_work
from lab.pool import LocalPool
from lab.processes import environment
from lab.redis import RedisHandle

pytestmark = pytest.mark.slow

REDIS_DB = 11
"""The private Redis's database this module's pools use."""

TENANT = "t_unsettled"
WORKSPACE = "w_unsettled"


@pytest.fixture(params=["sqlite", "postgres"])
def stores(
    request: pytest.FixtureRequest,
    redis_server: RedisHandle,
    tmp_path: Path,
    postgres_database: Callable[[], AbstractContextManager[str]],
) -> Iterator[dict[str, str]]:
    """Migrated stores on the backend and a Redis database emptied for this test's pool."""
    made = {
        **POOL_ENV,
        "ACTONCE_BROKER_URL": broker_url(redis_server, REDIS_DB),
        "ACTONCE_VAR_DIR": str(tmp_path / "var"),
    }
    with database(request.param, postgres_database) as url:
        if url is not None:
            made["ACTONCE_DATABASE_URL"] = url
        asyncio.run(migrate(Settings.from_env(made)))
        flush(made["ACTONCE_BROKER_URL"])
        yield made
        flush(made["ACTONCE_BROKER_URL"])


@pytest.mark.parametrize("stores", ["postgres"], indirect=True)
def test_a_run_left_dead_without_its_letter_is_lettered_by_the_pool(
    stores: dict[str, str], tmp_path: Path
) -> None:
    env = stores
    # Given a run that a worker's attempt left dead, the worker gone before it wrote the letter
    dead = _left_dead_unsettled(env)
    assert (dead.status, dead.reason) == ("dead", "missing_prerequisite"), dead
    assert _listed(env) == [], "no letter before the pool runs"

    # When a pool starts
    with LocalPool(env, workers=1, concurrency=1, log_dir=tmp_path / "logs") as pool:
        pool.wait_ready(timeout_s=60)
        # Then `actonce dead list` shows the run's letter, with its reason and workspace
        (line,) = wait_for(
            lambda: _naming(_listed(env), dead.id) or None, f"a letter for {dead.id}", 45.0
        )
        assert "missing_prerequisite" in line, line
        assert f"{TENANT}/{WORKSPACE}" in line, line
        # And the dispatcher's log says why it wrote it
        (said,) = wait_for(lambda: _sweep_said(pool, dead.id) or None, "the sweep's log line", 10.0)
        assert "missing_prerequisite" in said, said


def test_the_sweep_leaves_a_death_to_its_delivery_for_the_grace_and_reads_a_letter_once(
    stores: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    env = stores
    # Given a run a worker's attempt left dead, and a dispatcher that sweeps on every poll
    dead = _left_dead_unsettled(env)
    monkeypatch.setattr(unsettled_deaths, "SWEEP_EVERY_S", 0.0)
    settings = Settings.from_env(env)
    runtime = Runtime(settings, load_definition(settings.app), one_run=False).open()
    try:
        dispatcher = Dispatcher(runtime, make_celery(settings))
        letter_id = run_letter_id(TENANT, WORKSPACE, dead.id, dead.epoch)
        letters = runtime.dead_letters

        # When it polls within the grace, its delivery may still be settling it: no letter
        monkeypatch.setattr(unsettled_deaths, "DEATH_GRACE_S", 3600.0)
        runtime.run(dispatcher.poll())
        assert runtime.run(letters.get(letter_id)) is None
        assert dispatcher.stats.lettered == 0

        # When it polls after the grace, it writes the letter, as a delivery would have
        monkeypatch.setattr(unsettled_deaths, "DEATH_GRACE_S", 0.0)
        runtime.run(dispatcher.poll())
        letter = runtime.run(letters.get(letter_id))
        assert letter is not None and dispatcher.stats.lettered == 1
        assert (letter.run_id, letter.reason, letter.task_id) == (
            dead.id,
            "missing_prerequisite",
            None,
        )

        # When it polls again, it neither writes nor reads that letter again
        read = statements_on(runtime.engine("actonce"))
        runtime.run(dispatcher.poll())
        assert dispatcher.stats.lettered == 1
        assert not [sql for sql in read if "actonce_dead_letters" in sql], read
    finally:
        runtime.close()


def _left_dead_unsettled(env: dict[str, str]) -> Run:
    """Fire one demo run that dies, and attempt it as a worker child does; write no letter."""
    settings = Settings.from_env(env)
    definition = load_definition(settings.app)
    ref = WorkspaceRef(TENANT, WORKSPACE)
    dispatching = Runtime(settings, definition, one_run=False).open()
    try:

        async def fire() -> str:
            await prepare(dispatching.artifactr, TENANT, WORKSPACE)
            event = WorkRequested(key="unsettled", needs=PREREQUISITE_ID)
            await request_work(dispatching.reflexr, TENANT, WORKSPACE, event)
            assert await dispatching.reactor().evaluate(ref) == 1
            (fired,) = await dispatching.reflexr.storage.runs(ref)
            return fired.id

        run_id = dispatching.run(fire())
    finally:
        dispatching.close()
    attempting = Runtime(settings, definition, one_run=True).open()
    try:
        finished, run = attempting.run(attempting.attempt(ref, run_id))
    finally:
        attempting.close()
    assert finished and run is not None
    return run


def _listed(env: dict[str, str]) -> list[str]:
    """The lines of `actonce dead list --all`."""
    listed = subprocess.run(
        [sys.executable, "-m", "actonce.worker.cli", "dead", "list", "--all"],
        env=environment(env),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert listed.returncode == 0, listed.stderr
    return [line for line in listed.stdout.splitlines() if line.startswith("dl_")]


def _naming(lines: list[str], run_id: str) -> list[str]:
    """The lines that name `run_id`."""
    return [line for line in lines if run_id in line]


def _sweep_said(pool: LocalPool, run_id: str) -> list[str]:
    """The dispatcher's log lines saying the sweep wrote `run_id`'s letter."""
    return [
        line
        for line in _naming(pool.log("dispatcher").splitlines(), run_id)
        if "no delivery settled it" in line
    ]
