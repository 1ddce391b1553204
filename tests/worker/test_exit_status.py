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
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from actonce.worker.definition import load_definition
from actonce.worker.process.runtime import Runtime
from actonce.worker.settings import Settings
from actonce.worker.storage.migrate import migrate
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


def test_a_worker_whose_consumer_cannot_be_rebuilt_exits_1_saying_why(
    broker_users: "BrokerUsers", tmp_path: Path
) -> None:
    # Given a worker serving on a private Redis, as a user of its own
    env = broker_users.settings("pool", "+@all", var_dir=tmp_path / "var")
    log_path = tmp_path / "worker.log"
    worker = start_worker(env, log_path)
    try:
        deadline = time.monotonic() + 60
        while "worker ready:" not in log_path.read_text() and worker.poll() is None:
            assert time.monotonic() < deadline, log_path.read_text()[-3000:]
            time.sleep(0.1)
        # When its broker drops each of its connections, as often as it makes them
        deadline = time.monotonic() + 90
        while worker.poll() is None:
            assert time.monotonic() < deadline, log_path.read_text()[-3000:]
            broker_users.admin.execute_command("CLIENT", "KILL", "USER", "pool")
            time.sleep(0.02)
    finally:
        end(worker, grace_s=10)
    # Then it stops with status 1 past 30 rebuilds in a minute, its last line saying why
    said = log_path.read_text()
    assert worker.returncode == 1, said[-3000:]
    assert "the consumer cannot be rebuilt: 31 rebuilds in a minute" in said, said[-3000:]
    last = said.strip().splitlines()[-1]
    assert last.startswith("actonce worker stopped with status 1: the consumer cannot"), last


def test_a_worker_whose_broker_user_may_not_consume_exits_1_naming_the_command(
    broker_users: "BrokerUsers", tmp_path: Path
) -> None:
    # Given a broker user that may do everything but pop from a list
    env = broker_users.settings("nopop", "+@all", "-brpop", var_dir=tmp_path / "var")
    log_path = tmp_path / "worker.log"
    # When a worker starts as that user
    worker = start_worker(env, log_path)
    try:
        worker.wait(timeout=90)
    finally:
        end(worker, grace_s=10)
    # Then it exits 1, its last line naming the refused command, its password masked
    said = log_path.read_text()
    assert worker.returncode == 1, said[-3000:]
    last = said.strip().splitlines()[-1]
    assert last.startswith("actonce worker stopped with status 1: "), last
    assert "NoPermissionError" in last and "brpop" in last, last
    assert BROKER_PASSWORD not in said, said[-3000:]


@pytest.mark.parametrize(
    ("wrong", "why"),
    [
        ("password", "AuthenticationError: invalid username-password pair"),
        ("database", "ResponseError: DB index is out of range"),
    ],
)
def test_a_worker_and_a_dispatcher_whose_broker_refuses_their_connection_refuse_to_start(
    broker_users: "BrokerUsers", tmp_path: Path, wrong: str, why: str
) -> None:
    # Given settings naming a password, or a database number, the broker does not know
    env = broker_users.settings("pool", "+@all", var_dir=tmp_path / "var")
    url = env["ACTONCE_BROKER_URL"]
    unknown = "not-the-pw-0417"
    if wrong == "password":
        env["ACTONCE_BROKER_URL"] = url.replace(BROKER_PASSWORD, unknown)
    else:
        env["ACTONCE_BROKER_URL"] = url.rsplit("/", 1)[0] + "/99"
    # When a worker and a dispatcher start with them (no retry mends either: before, the
    # worker retried its default 100 times, 2 to 30 s apart, past this test's timeout)
    worker = run(env, "worker", "-c", "1")
    dispatcher = run(env, "dispatch")
    # Then each ends at once, its last line naming the refusal and the variable, password masked
    for ended, status, starts in (
        (worker, 3, "actonce refuses to start: "),
        (dispatcher, 1, "Error: "),
    ):
        said = ended.stdout + ended.stderr
        assert ended.returncode == status, said[-3000:]
        last = ended.stderr.strip().splitlines()[-1]
        assert last.startswith(f"{starts}the Redis at redis://pool:***@127.0.0.1:"), last
        assert f"refused actonce's connection ({why}" in last, last
        assert last.endswith("ACTONCE_BROKER_URL (or REDIS_URL)"), last
        assert unknown not in said and BROKER_PASSWORD not in said, said[-3000:]
        assert "Traceback" not in said, said[-3000:]


def test_a_worker_and_a_dispatcher_whose_result_backend_refuses_them_refuse_to_start(
    broker_users: "BrokerUsers", tmp_path: Path
) -> None:
    # Given a broker that lets the pool in, and a result backend on it with a wrong password
    env = broker_users.settings("pool", "+@all", var_dir=tmp_path / "var")
    unknown = "not-the-pw-0417"
    backend = env["ACTONCE_BROKER_URL"].replace(BROKER_PASSWORD, unknown).rsplit("/", 1)[0]
    env["ACTONCE_RESULT_BACKEND_URL"] = f"{backend}/1"
    # When a worker and a dispatcher start
    for ended, status in ((run(env, "worker", "-c", "1"), 3), (run(env, "dispatch"), 1)):
        # Then each ends at once, naming the result backend's variable, its password masked
        said = ended.stdout + ended.stderr
        assert ended.returncode == status, said[-3000:]
        last = ended.stderr.strip().splitlines()[-1]
        assert "the Redis at redis://pool:***@127.0.0.1:" in last and "/1 refused" in last, last
        assert last.endswith("in ACTONCE_RESULT_BACKEND_URL"), last
        assert unknown not in said and "Traceback" not in said, said[-3000:]


BROKER_PASSWORD = "broker-pw-0417"
"""Every test user's password on the private broker: found in no line a worker writes."""


class BrokerUsers:
    """A private Redis whose users a test makes with ACL rules, and settings that connect as one.

    Args:
        url: The private server's URL, as its default user.
    """

    def __init__(self, url: str) -> None:
        self.admin = redis.Redis.from_url(url)
        self._port = url.rsplit(":", 1)[1].split("/")[0]

    def settings(self, user: str, *rules: str, var_dir: Path) -> dict[str, str]:
        """Make `user` with `rules` (and every key and channel); return settings over migrated
        SQLite stores in `var_dir` whose broker is this server, as that user."""
        self.admin.execute_command(
            "ACL", "SETUSER", user, "on", f">{BROKER_PASSWORD}", "~*", "&*", *rules
        )
        env = {
            "ACTONCE_VAR_DIR": str(var_dir),
            "ACTONCE_BROKER_URL": f"redis://{user}:{BROKER_PASSWORD}@127.0.0.1:{self._port}/0",
        }
        asyncio.run(migrate(Settings.from_env(env)))
        return env


@pytest.fixture
def broker_users(tmp_path: Path) -> Iterator[BrokerUsers]:
    """A private `redis-server` for one test, which sets its users' rights."""
    server = find_or_start_redis(None, directory=tmp_path / "redis")
    users = BrokerUsers(server.url)
    try:
        yield users
    finally:
        users.admin.close()
        server.stop()


def start_worker(env: dict[str, str], log_path: Path) -> "subprocess.Popen[bytes]":
    """Start `actonce worker -c 1` in a session of its own, its output into `log_path`."""
    with log_path.open("wb") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "actonce.worker.cli", "worker", "-c", "1"],
            env=environment(env),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
