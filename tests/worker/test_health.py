"""The pool tells the truth about its health, through the commands an operator types.

A worker and a dispatcher each log one ready line, with their queues, the broker and the stores
(passwords masked), once their broker and stores answer; `actonce status` then reports the
workers, the dispatcher's last poll (its heartbeat in Redis), the queues and the dead letters,
and exits 0, and 1 when a part it requires is missing. A dispatcher whose broker does not answer
never says it is ready; one whose broker goes away logs one line per back-off step (1 s, 2 s,
4 s …), no traceback, and after `ACTONCE_DISPATCHER_MAX_FAILED_POLLS` failed polls exits 1.
"""

import asyncio
import contextlib
import json
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from actonce.worker.process.health import HEARTBEAT_PREFIX, HEARTBEAT_TTL_S, beat
from actonce.worker.settings import Settings
from actonce.worker.storage.migrate import migrate
from lab.pool import LocalPool
from lab.processes import STOP_GRACE_S, children, end, environment
from lab.redis import RedisHandle, find_or_start_redis

pytestmark = pytest.mark.slow

REDIS_DB = 6
OWN_DB = 4
"""The database of the tests that start their own worker or write heartbeats themselves: the
module pool's dispatcher beats in `REDIS_DB`."""
"""The private Redis's database this module's pool uses."""


def _actonce(env: dict[str, str], *args: str) -> "subprocess.CompletedProcess[str]":
    return subprocess.run(
        [sys.executable, "-m", "actonce.worker.cli", *args],
        env=environment(env),
        capture_output=True,
        text=True,
        timeout=120,
    )


def _migrated(tmp_path: Path, broker_url: str) -> dict[str, str]:
    env = {"ACTONCE_BROKER_URL": broker_url, "ACTONCE_VAR_DIR": str(tmp_path / "var")}
    asyncio.run(migrate(Settings.from_env(env)))
    return env


@pytest.fixture(scope="module")
def running(
    redis_server: RedisHandle, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[dict[str, str], LocalPool]]:
    base = tmp_path_factory.mktemp("health")
    env = _migrated(base, redis_server.url.rsplit("/", 1)[0] + f"/{REDIS_DB}")
    with LocalPool(env, workers=1, concurrency=1, log_dir=base / "logs") as pool:
        pool.wait_ready(timeout_s=60)
        yield env, pool


def test_worker_and_dispatcher_each_log_one_ready_line(
    running: tuple[dict[str, str], LocalPool],
) -> None:
    env, pool = running
    worker_log, dispatcher_log = pool.log("worker0"), pool.log("dispatcher")

    worker_ready = [line for line in worker_log.splitlines() if "worker ready:" in line]
    dispatcher_ready = [line for line in dispatcher_log.splitlines() if "dispatcher ready:" in line]

    assert len(worker_ready) == 1, worker_log
    assert "queues=actonce.attempts,actonce.turns concurrency=1" in worker_ready[0]
    assert len(dispatcher_ready) == 1, dispatcher_log
    for line in (worker_ready[0], dispatcher_ready[0]):
        assert f"broker={env['ACTONCE_BROKER_URL']}" in line, line
        assert "reflexr=sqlite+aiosqlite:///" in line and "actonce=sqlite" in line, line
        assert " loop=uvloop " in line, line


def test_the_worker_child_and_the_dispatcher_keep_their_startup_heap_from_the_collector(
    running: tuple[dict[str, str], LocalPool],
) -> None:
    _, pool = running
    kept = re.compile(r"collector: (\d+) objects built at start kept out of its reach")

    # The worker's main process, its one prefork child (concurrency=1), and the dispatcher.
    for name, processes in (("worker0", 2), ("dispatcher", 1)):
        found = [int(m.group(1)) for m in kept.finditer(pool.log(name))]
        assert len(found) == processes, pool.log(name)
        assert all(objects > 10_000 for objects in found), found


def test_status_reports_workers_dispatcher_queues_and_dead_letters(
    running: tuple[dict[str, str], LocalPool],
) -> None:
    env, pool = running

    done = _actonce(env, "status")

    assert done.returncode == 0, done.stdout + done.stderr
    assert f"workers: 1 answering ({pool.hostnames[0]})" in done.stdout, done.stdout
    assert re.search(r"dispatcher \S+:\d+: last poll \d+\.\d+s ago", done.stdout), done.stdout
    assert "queues: actonce.attempts 0 waiting, actonce.turns 0 waiting; unacked: 0" in (
        done.stdout
    )
    assert "dead letters: 0 (actonce dead list)" in done.stdout
    assert done.stdout.strip().endswith("status: ok")


def test_status_fails_when_the_node_it_requires_does_not_answer(
    running: tuple[dict[str, str], LocalPool],
) -> None:
    env, pool = running

    this_one = _actonce(env, "status", "--require", "worker", "--node", pool.hostnames[0])
    missing = _actonce(env, "status", "--require", "worker", "--node", "celery@nowhere")

    assert this_one.returncode == 0, this_one.stdout
    assert missing.returncode == 1, missing.stdout
    assert "status: unhealthy: no worker answers a ping" in missing.stdout


@pytest.mark.parametrize("broker", ["closed port", "wrong password"])
def test_status_with_no_broker_says_why_and_fails(redis_server: RedisHandle, broker: str) -> None:
    if broker == "closed port":
        url = shown = "redis://127.0.0.1:1/0"
        why = "ConnectionError: Error 111 connecting to 127.0.0.1:1. Connection refused."
    else:
        url = redis_server.url.replace("redis://", "redis://nobody:s3cret-pw@")
        shown = redis_server.url.replace("redis://", "redis://nobody:***@")
        why = "AuthenticationError: invalid username-password pair or user is disabled."

    done = _actonce({"ACTONCE_BROKER_URL": url}, "status")

    assert done.returncode == 1
    assert done.stdout.splitlines() == [
        f"broker: {shown} does not answer ({why})",
        "status: unhealthy",
    ]


def test_a_dispatcher_without_a_broker_never_says_ready_and_gives_up(tmp_path: Path) -> None:
    env = _migrated(tmp_path, "redis://127.0.0.1:1/0")

    started = time.monotonic()
    done = _actonce({**env, "ACTONCE_DISPATCHER_MAX_FAILED_POLLS": "3"}, "dispatch")

    assert done.returncode == 1
    assert time.monotonic() - started < 60
    output = done.stdout + done.stderr
    assert "ready" not in output and "dispatching to" not in output, output
    assert "Traceback" not in output, output
    steps = [line for line in output.splitlines() if "poll failed" in line]
    waits = [re.search(r"retrying in (\d+)s", line)[1] for line in steps]  # type: ignore[index]
    assert waits == ["1", "2"], output
    assert "127.0.0.1:1" in steps[0] and "(1 of 3 failed polls in a row)" in steps[0], output
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("actonce dispatch stopped with status 1: 3 polls in a row failed"), last


def test_a_dispatcher_that_loses_its_broker_backs_off_in_lines_then_exits(
    tmp_path: Path,
) -> None:
    # Given a dispatcher serving on a broker of its own
    redis_handle = find_or_start_redis(None, directory=tmp_path / "redis")
    env = {
        **_migrated(tmp_path, redis_handle.url),
        "ACTONCE_DISPATCHER_MAX_FAILED_POLLS": "4",
        # On asyncio's own loop: the back-off must not depend on uvloop's.
        "ACTONCE_EVENT_LOOP": "asyncio",
    }
    log_path = tmp_path / "dispatcher.log"
    try:
        with _serving(env, log_path, "dispatch", ready="dispatcher ready:") as dispatcher:
            # When its broker goes away
            redis_handle.stop()
            # Then it exits 1 after backing off 1, 2 and 4 s, one line a step, and no traceback
            code = dispatcher.wait(timeout=90)
    finally:
        redis_handle.stop()
    output = log_path.read_text()
    assert code == 1, output
    assert "Traceback" not in output, output
    assert " loop=asyncio " in output, output
    steps = [line for line in output.splitlines() if "poll failed" in line]
    waits = [re.search(r"retrying in (\d+)s", line)[1] for line in steps]  # type: ignore[index]
    assert waits == ["1", "2", "4"], output
    assert "actonce dispatch stopped with status 1: 4 polls in a row failed" in output, output


def test_status_requires_a_dispatcher_that_polled_within_a_minute(
    redis_server: RedisHandle, tmp_path: Path
) -> None:
    # Given a broker where a dispatcher that stopped 61 s ago left its heartbeat
    env = _migrated(tmp_path, redis_server.url.rsplit("/", 1)[0] + f"/{OWN_DB}")
    client = redis.Redis.from_url(env["ACTONCE_BROKER_URL"])
    client.flushdb()
    try:
        stale = json.dumps({"at": time.time() - 61, "polls": 7})
        client.set(f"{HEARTBEAT_PREFIX}gone:1", stale, ex=HEARTBEAT_TTL_S)
        # Then `--require dispatcher` fails, saying so, with the poll's age on its line
        done = _actonce(env, "status", "--require", "dispatcher")
        assert done.returncode == 1, done.stdout + done.stderr
        assert re.search(r"dispatcher gone:1: last poll 6\d\.\ds ago", done.stdout), done.stdout
        assert "status: unhealthy: no dispatcher polled in the last 60s" in done.stdout
        # When the dispatcher polls again, it passes
        beat(client, polls=8)
        again = _actonce(env, "status", "--require", "dispatcher")
        assert again.returncode == 0 and again.stdout.strip().endswith("status: ok"), again.stdout
    finally:
        client.flushdb()
        client.close()


def test_a_worker_takes_its_children_from_actonce_concurrency(
    redis_server: RedisHandle, tmp_path: Path
) -> None:
    # Given a worker started with ACTONCE_CONCURRENCY=3 and no `-c`
    env = {
        **_migrated(tmp_path, redis_server.url.rsplit("/", 1)[0] + f"/{OWN_DB}"),
        "ACTONCE_CONCURRENCY": "3",
    }
    log = tmp_path / "worker.log"
    arguments = ("worker", "-Q", "actonce.attempts")
    with _serving(env, log, *arguments, ready="worker ready:") as worker:
        # Then it says so in its ready line, and runs three children
        [ready] = [line for line in log.read_text().splitlines() if "worker ready:" in line]
        assert "queues=actonce.attempts concurrency=3 " in ready, ready
        assert "is not below ACTONCE_SOFT_TIME_LIMIT_S" not in log.read_text()  # the defaults
        assert len(children(worker.pid)) == 3
        # When it is stopped warm (SIGTERM), it exits 0
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(timeout=STOP_GRACE_S) == 0, log.read_text()


def test_a_dispatcher_stopped_warm_exits_0_printing_its_figures(
    redis_server: RedisHandle, tmp_path: Path
) -> None:
    # Given a running dispatcher
    env = _migrated(tmp_path, redis_server.url.rsplit("/", 1)[0] + f"/{OWN_DB}")
    log = tmp_path / "dispatcher.log"
    with _serving(env, log, "dispatch", ready="dispatcher ready:") as dispatcher:
        # When it is stopped (SIGTERM)
        dispatcher.send_signal(signal.SIGTERM)
        # Then it exits 0, its last line its figures
        assert dispatcher.wait(timeout=STOP_GRACE_S) == 0, log.read_text()
        last = log.read_text().strip().splitlines()[-1]
        assert re.match(r"dispatcher stopped: polls=[1-9]\d* evaluations=\d+ ", last), last


def test_a_worker_warns_of_rule_timeouts_and_a_turn_wait_the_soft_limit_would_cut_short(
    redis_server: RedisHandle, tmp_path: Path
) -> None:
    # Given the demo (its rules time out after 60 s, a turn waits 300 s) and a 30 s soft limit
    env = {
        **_migrated(tmp_path, redis_server.url.rsplit("/", 1)[0] + f"/{OWN_DB}"),
        "ACTONCE_SOFT_TIME_LIMIT_S": "30",
        "ACTONCE_TIME_LIMIT_S": "40",
    }
    # When a worker starts, it starts, and says which limits the soft limit comes before
    log = tmp_path / "worker.log"
    with _serving(env, log, "worker", "-c", "1", ready="worker ready:"):
        said = log.read_text()
    for rule in ("demo:work", "demo:chat"):
        assert (
            f"rule {rule}'s timeout (60s) is not below ACTONCE_SOFT_TIME_LIMIT_S (30s)" in said
        ), said
    assert "ACTONCE_TURN_WAIT_S (300s) is not below ACTONCE_SOFT_TIME_LIMIT_S (30s)" in said


@contextlib.contextmanager
def _serving(
    env: dict[str, str], log: Path, *arguments: str, ready: str
) -> Iterator["subprocess.Popen[bytes]"]:
    """Start `actonce <arguments>` logging to `log`, wait for its `ready` line, and end it
    afterwards (SIGTERM, then SIGKILL) if it is still running."""
    with open(log, "wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "actonce.worker.cli", *arguments],
            env=environment(env),
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + 60
        while ready not in log.read_text():
            assert process.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.2)
        yield process
    finally:
        end(process, grace_s=STOP_GRACE_S)
