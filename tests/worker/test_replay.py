"""Replay as a newcomer does it, through the commands the demo prints.

A demo run dies for want of an artifact (`missing_prerequisite`). `actonce dead list` shows its
letter with the tenant and workspace. A replay while the broker does not answer, or refuses the
connection, fails at once in one line that says which, and leaves the letter and the run as they
were. `python -m demo --fix WORKSPACE` creates the artifact; `actonce dead replay` then settles the
run, each write once. Replaying the same letter again says so and sends nothing.
"""

import asyncio
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime

import pytest
import redis
from pools import wait_for, wait_until
from reflexr.core import Run

from actonce.worker.definition import load_definition
from actonce.worker.process.runtime import Runtime
from actonce.worker.settings import ATTEMPTS_QUEUE, Settings
from actonce.worker.storage.migrate import migrate
from demo.definition import PREREQUISITE_ID, WorkRequested
from demo.feed import FEED, PEOPLE, prepare, request_work
from demo.run import TENANT
from lab.census import Census, artifactr_census
from lab.pool import LocalPool
from lab.processes import environment
from lab.redis import RedisHandle
from lab.settle import wait_settled

pytestmark = pytest.mark.slow

REDIS_DB = 7
"""The private Redis's database this module's pool uses."""

IDLE_DB = 8
"""A database of the same Redis no worker serves: a message sent there stays to be counted."""


@dataclass
class Demo:
    env: dict[str, str]
    runtime: Runtime
    workspace_id: str

    def command(self, *argv: str, **env: str) -> "subprocess.CompletedProcess[str]":
        return subprocess.run(
            [sys.executable, *argv],
            env=environment({**self.env, **env}),
            capture_output=True,
            text=True,
            timeout=120,
        )

    def actonce(self, *args: str, **env: str) -> "subprocess.CompletedProcess[str]":
        return self.command("-m", "actonce.worker.cli", *args, **env)

    def runs(self, timeout_s: float = 45.0) -> list[Run]:
        async def read() -> list[Run]:
            workspace = await self.runtime.reflexr.open(TENANT, self.workspace_id, actor=FEED)
            return await wait_settled(workspace.runs, timeout_s=timeout_s)

        return self.runtime.run(read())

    def census(self) -> Census:
        async def read() -> Census:
            workspace = await self.runtime.artifactr.open(TENANT, self.workspace_id, actor=PEOPLE)
            return await artifactr_census(workspace)

        return self.runtime.run(read())


@pytest.fixture(scope="module")
def demo(redis_server: RedisHandle, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Demo]:
    base = tmp_path_factory.mktemp("replay")
    env = {
        "ACTONCE_BROKER_URL": redis_server.url.rsplit("/", 1)[0] + f"/{REDIS_DB}",
        "ACTONCE_VAR_DIR": str(base / "var"),
        "ACTONCE_LEASE_TTL_S": "3",
    }
    settings = Settings.from_env(env)
    asyncio.run(migrate(settings))
    runtime = Runtime(settings, load_definition(settings.app), one_run=False).open()
    try:
        with LocalPool(env, workers=1, concurrency=1, log_dir=base / "logs") as pool:
            pool.wait_ready(timeout_s=60)
            workspace_id = f"run-{datetime.now(UTC):%Y%m%d-%H%M%S}"
            runtime.run(prepare(runtime.artifactr, TENANT, workspace_id))
            yield Demo(env, runtime, workspace_id)
    finally:
        runtime.close()


def test_a_dead_letter_is_fixed_and_replayed_once_through_the_commands(demo: Demo) -> None:
    # Given the demo's run that dies for want of its prerequisite, after its notice
    event = WorkRequested(key="needy", needs=PREREQUISITE_ID)
    demo.runtime.run(request_work(demo.runtime.reflexr, TENANT, demo.workspace_id, event))
    (dead,) = demo.runs()
    assert (dead.status, dead.reason) == ("dead", "missing_prerequisite"), dead
    listed = _wait_for_letter(demo, dead.id)
    letter_id = listed.split()[0]
    assert f"{TENANT}/{demo.workspace_id}" in listed, listed

    # When it is replayed while the broker does not answer
    started = time.monotonic()
    down = demo.actonce("dead", "replay", letter_id, ACTONCE_BROKER_URL="redis://127.0.0.1:1/0")
    # Then it fails at once, in one line, and leaves the letter and the run as they were
    assert down.returncode == 1, down.stdout
    assert time.monotonic() - started < 20
    (line,) = down.stderr.strip().splitlines()
    assert "the broker at redis://127.0.0.1:1/0 does not answer" in line, line
    assert "nothing was replayed" in line, line
    assert "replayed×" not in _wait_for_letter(demo, dead.id)
    assert [run.status for run in demo.runs(timeout_s=0)] == ["dead"]
    # And when the broker answers but refuses the connection (a database it does not have),
    # it says that, and what to fix, with the password masked
    broker = demo.env["ACTONCE_BROKER_URL"].rsplit("/", 1)[0] + "/99"
    wrong = broker.replace("redis://", "redis://:a-password@", 1)
    refused = demo.actonce("dead", "replay", letter_id, ACTONCE_BROKER_URL=wrong)
    assert refused.returncode == 1, refused.stdout
    (line,) = refused.stderr.strip().splitlines()
    assert "refused the connection" in line and "ACTONCE_BROKER_URL" in line, line
    assert "does not answer" not in line and "a-password" not in line, line
    assert "nothing was replayed" in line, line
    assert "replayed×" not in _wait_for_letter(demo, dead.id)

    # When the artifact is created as the demo says, and the letter replayed
    fixed = demo.command("-m", "demo", "--fix", demo.workspace_id)
    assert fixed.returncode == 0, fixed.stderr
    assert f"{PREREQUISITE_ID} created in {TENANT}/{demo.workspace_id}" in fixed.stdout
    replayed = demo.actonce("dead", "replay", letter_id)
    assert replayed.returncode == 0, replayed.stderr
    assert f"replayed {letter_id}: run {dead.id} (dead → pending), sent" in replayed.stdout

    # Then the run succeeds, and every write is there once, the dying attempt's notice too
    wait_until(
        lambda: demo.runs(timeout_s=0)[0].status == "succeeded", "the replayed run's success", 45.0
    )
    census = demo.census()
    assert census.duplicates() == {}, census.duplicates()
    assert len(census.messages) == 1, census.messages

    # When the same letter is replayed again, with a broker no worker serves
    idle_url = demo.env["ACTONCE_BROKER_URL"].rsplit("/", 1)[0] + f"/{IDLE_DB}"
    again = demo.actonce("dead", "replay", letter_id, ACTONCE_BROKER_URL=idle_url)

    # Then it says so, and sent nothing
    assert again.returncode == 0, again.stderr
    assert f"{letter_id} was replayed already (1×): run {dead.id} is succeeded; nothing sent" in (
        again.stdout
    )
    client = redis.Redis.from_url(idle_url)
    try:
        assert client.llen(ATTEMPTS_QUEUE) == 0
    finally:
        client.close()


def _wait_for_letter(demo: Demo, run_id: str) -> str:
    """The `actonce dead list --all` line of the run's letter, once it is there."""

    def letter() -> str | None:
        done = demo.actonce("dead", "list", "--all")
        assert done.returncode == 0, done.stderr
        return next((line for line in done.stdout.splitlines() if run_id in line), None)

    return wait_for(letter, f"the letter of run {run_id} in `actonce dead list --all`")
