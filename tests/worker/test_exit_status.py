"""A worker or dispatcher that cannot go on exits non-zero, with one last line saying why.

`restart: on-failure` and systemd restart a process only when it fails: a real `actonce worker`
and a real `actonce dispatch`, whose broker is a port nothing listens on, must end with status 1
once their retries are spent, and the last line they write must say why. So must a worker whose
consumer is torn down as soon as it is rebuilt: its broker answers every connection and drops it.
"""

import asyncio
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis

from actonce.worker.definition import load_definition
from actonce.worker.migrate import migrate
from actonce.worker.runtime import Runtime
from actonce.worker.settings import Settings
from demo.definition import WorkRequested
from demo.feed import prepare, request_work
from lab.processes import end, environment, free_port
from lab.redis import find_or_start_redis

pytestmark = pytest.mark.slow


@pytest.fixture
def gone_broker_env(tmp_path: Path) -> dict[str, str]:
    """Settings over migrated SQLite stores, whose broker is a port nobody listens on."""
    env = {
        "ACTONCE_VAR_DIR": str(tmp_path / "var"),
        "ACTONCE_BROKER_URL": f"redis://127.0.0.1:{free_port()}/0",
        "ACTONCE_BROKER_MAX_RETRIES": "1",
        "ACTONCE_DISPATCHER_MAX_FAILED_POLLS": "2",
        "ACTONCE_POLL_INTERVAL_S": "0.1",
    }
    asyncio.run(migrate(Settings.from_env(env)))
    return env


def run(env: dict[str, str], *arguments: str) -> subprocess.CompletedProcess[str]:
    """Run `actonce` with `arguments` to its end, as its supervisor would."""
    return subprocess.run(
        [sys.executable, "-m", "actonce.worker.cli", *arguments],
        env=environment(env),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_a_worker_whose_broker_is_gone_beyond_its_retries_exits_1_saying_why(
    gone_broker_env: dict[str, str],
) -> None:
    ended = run(gone_broker_env, "worker", "-c", "1")

    assert ended.returncode == 1, ended.stderr[-3000:]
    last = ended.stderr.strip().splitlines()[-1]
    assert last.startswith("actonce worker stopped with status 1: "), last
    assert "connecting to 127.0.0.1" in last, last


def test_a_dispatcher_that_cannot_send_exits_1_saying_why(
    gone_broker_env: dict[str, str],
) -> None:
    # Given a run due to be sent
    settings = Settings.from_env(gone_broker_env)
    runtime = Runtime(settings, load_definition(settings.app), one_run=False).open()
    try:
        runtime.run(prepare(runtime.artifactr, "acme", "ws_exit"))
        runtime.run(request_work(runtime.reflexr, "acme", "ws_exit", WorkRequested(key="exit")))
    finally:
        runtime.close()

    # When the dispatcher runs, with its broker gone
    ended = run(gone_broker_env, "dispatch")

    # Then its polls fail, and after two in a row it exits 1 with one line saying why
    assert ended.returncode == 1, ended.stderr[-3000:]
    last = ended.stderr.strip().splitlines()[-1]
    assert last.startswith("actonce dispatch stopped with status 1: 2 polls in a row failed"), last


def test_a_worker_whose_consumer_cannot_be_rebuilt_exits_1_saying_why(tmp_path: Path) -> None:
    # Given a worker serving on a private Redis, as a user of its own
    server = find_or_start_redis(None, directory=tmp_path / "redis")
    admin = redis.Redis.from_url(server.url)
    try:
        admin.execute_command("ACL", "SETUSER", "pool", "on", ">pool-pw", "~*", "&*", "+@all")
        port = server.url.rsplit(":", 1)[1].split("/")[0]
        env = {
            "ACTONCE_VAR_DIR": str(tmp_path / "var"),
            "ACTONCE_BROKER_URL": f"redis://pool:pool-pw@127.0.0.1:{port}/0",
        }
        asyncio.run(migrate(Settings.from_env(env)))
        log_path = tmp_path / "worker.log"
        with log_path.open("wb") as log:
            worker = subprocess.Popen(
                [sys.executable, "-m", "actonce.worker.cli", "worker", "-c", "1"],
                env=environment(env),
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        try:
            deadline = time.monotonic() + 60
            while "worker ready:" not in log_path.read_text() and worker.poll() is None:
                assert time.monotonic() < deadline, log_path.read_text()[-3000:]
                time.sleep(0.1)
            # When its broker drops each of its connections, as often as it makes them
            deadline = time.monotonic() + 90
            while worker.poll() is None:
                assert time.monotonic() < deadline, log_path.read_text()[-3000:]
                admin.execute_command("CLIENT", "KILL", "USER", "pool")
                time.sleep(0.02)
        finally:
            end(worker, grace_s=10)
        # Then it stops with status 1 past 30 rebuilds in a minute, its last line saying why
        said = log_path.read_text()
        assert worker.returncode == 1, said[-3000:]
        assert "the consumer cannot be rebuilt: 31 rebuilds in a minute" in said, said[-3000:]
        last = said.strip().splitlines()[-1]
        assert last.startswith("actonce worker stopped with status 1: the consumer cannot"), last
    finally:
        admin.close()
        server.stop()
