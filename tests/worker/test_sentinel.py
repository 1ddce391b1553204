"""The pool on Redis Sentinel: it finds the master through the sentinels and outlives its loss.

Through the doors a user uses: `ACTONCE_BROKER_URL=sentinel://…`, `ACTONCE_BROKER_MASTER_NAME`
and `ACTONCE_BROKER_SENTINEL_PASSWORD` in the environment of real `actonce` processes, on a real
master, replica and three sentinels (`lab.sentinel`). A sentinel URL without a master name, or a
URL of no scheme actonce reads, is refused at start in one line. Celery gets the master's name
and the sentinels' password, and publishes neither password. `actonce status` names the master
the sentinels name. A master SIGKILLed in the middle of a burst is replaced by its
replica, and the same worker and dispatcher processes carry on: every run succeeds, each write
lands once, and the intake still screens what the workers pop.
"""

import asyncio
import re
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import kombu
import pytest
from celery.app.utils import filter_hidden_settings
from pools import POOL_ENV, Pool, wait_until
from test_pool import assert_each_write_once

from actonce.tasks.attempt import ATTEMPT_TASK
from actonce.worker.app import celery_config
from actonce.worker.definition import load_definition
from actonce.worker.process.runtime import Runtime
from actonce.worker.settings import ATTEMPTS_QUEUE, Settings
from actonce.worker.storage.migrate import migrate
from lab.pool import LocalPool
from lab.processes import environment
from lab.sentinel import SentinelGroup, start_sentinel_group

MASTER_PASSWORD = "master-s3cret"
SENTINEL_PASSWORD = "sentinel-s3cret"

BURST = 16
"""How many runs the failover test publishes at once."""


def _actonce(env: dict[str, str], *args: str) -> "subprocess.CompletedProcess[str]":
    return subprocess.run(
        [sys.executable, "-m", "actonce.worker.cli", *args],
        env=environment(env),
        capture_output=True,
        text=True,
        timeout=120,
    )


def _sentinel_env(group: SentinelGroup, var: Path, sentinel_password: str) -> dict[str, str]:
    return {
        "ACTONCE_BROKER_URL": group.url,
        "ACTONCE_BROKER_MASTER_NAME": group.master_name,
        "ACTONCE_BROKER_SENTINEL_PASSWORD": sentinel_password,
        "ACTONCE_VAR_DIR": str(var),
    }


@pytest.mark.parametrize(
    ("env", "says"),
    [
        pytest.param(
            {"ACTONCE_BROKER_URL": "sentinel://127.0.0.1:26379;sentinel://127.0.0.1:26380/0"},
            "ACTONCE_SETTINGS: Value error, a sentinel:// URL needs ACTONCE_BROKER_MASTER_NAME",
            id="no-master-name",
        ),
        pytest.param(
            {"ACTONCE_BROKER_URL": "amqp://guest@127.0.0.1//"},
            "ACTONCE_BROKER_URL: Value error, not a Redis URL, redis://[USER:PASSWORD@]HOST:PORT"
            "/DB or sentinel://[USER:PASSWORD@]HOST:PORT;sentinel://HOST:PORT;.../DB",
            id="unknown-scheme",
        ),
        pytest.param(
            {
                "ACTONCE_BROKER_URL": "sentinel://sentinel-a:26379;redis://broker:6379/0",
                "ACTONCE_BROKER_MASTER_NAME": "actonce",
            },
            "ACTONCE_BROKER_URL: Value error, part 2 is not sentinel://HOST:PORT",
            id="a-part-not-a-sentinel",
        ),
        pytest.param(
            {"ACTONCE_BROKER_MASTER_NAME": "actonce"},
            "ACTONCE_BROKER_MASTER_NAME is set but no URL is sentinel://",
            id="a-master-name-without-sentinels",
        ),
    ],
)
def test_a_sentinel_setting_that_cannot_work_is_refused_at_start_in_one_line(
    tmp_path: Path, env: dict[str, str], says: str
) -> None:
    done = _actonce(
        {**env, "ACTONCE_VAR_DIR": str(tmp_path / "var"), "ACTONCE_BROKER_SENTINEL_PASSWORD": "x"},
        "dispatch",
        "--once",
    )

    assert done.returncode != 0, done.stdout + done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("Error: invalid settings: "), lines[0]
    assert says in lines[0], lines[0]


def test_celery_reads_the_master_name_and_never_shows_the_sentinels_password() -> None:
    settings = Settings.from_env(
        {
            "ACTONCE_BROKER_URL": f"sentinel://h1:26379;sentinel://:{MASTER_PASSWORD}@h2:26380/3",
            "ACTONCE_BROKER_MASTER_NAME": "actonce",
            "ACTONCE_BROKER_SENTINEL_PASSWORD": SENTINEL_PASSWORD,
        }
    )

    config = celery_config(settings)

    # kombu and Celery read the database and password off the first part: each part has them
    for url in (config["broker_url"], config["result_backend"]):
        assert url == (
            f"sentinel://:{MASTER_PASSWORD}@h1:26379/3;sentinel://:{MASTER_PASSWORD}@h2:26380/3"
        )
    for options in ("broker_transport_options", "result_backend_transport_options"):
        assert config[options]["master_name"] == "actonce"
        assert config[options]["sentinel_kwargs"] == {"password": SENTINEL_PASSWORD}
    # and what `celery inspect conf` (Flower's worker page) publishes masks both passwords
    published = repr(filter_hidden_settings(config))
    assert MASTER_PASSWORD not in published and SENTINEL_PASSWORD not in published, published
    assert SENTINEL_PASSWORD not in repr(settings)


@pytest.mark.slow  # starts a master, a replica and a sentinel
def test_status_names_the_master_the_sentinels_name(tmp_path: Path) -> None:
    # Given a master and its replica, watched by a sentinel that requires a password
    with start_sentinel_group(
        tmp_path / "redis",
        sentinels=1,
        password=MASTER_PASSWORD,
        sentinel_password=SENTINEL_PASSWORD,
    ) as group:
        env = _sentinel_env(group, tmp_path / "var", SENTINEL_PASSWORD)
        asyncio.run(migrate(Settings.from_env(env)))
        host, port = group.master()

        # When an operator asks how the pool is
        done = _actonce(env, "status", "--timeout", "0.5")

    # Then the broker answers through the sentinel, which names the master; no password shows
    assert re.search(
        r"^broker: sentinel://:\*\*\*@127\.0\.0\.1:\d+/0 answers$", done.stdout, re.M
    ), done.stdout + done.stderr
    assert f"master: {host}:{port} (named by the sentinels)" in done.stdout, done.stdout
    assert MASTER_PASSWORD not in done.stdout + done.stderr
    assert SENTINEL_PASSWORD not in done.stdout + done.stderr


@pytest.fixture
def sentinel_pool(tmp_path: Path) -> Iterator[tuple[SentinelGroup, Pool]]:
    """A master, its replica and three sentinels (all requiring passwords), and a pool on them:
    one worker (prefork, `-c 2`) and the dispatcher, over SQLite files."""
    with start_sentinel_group(
        tmp_path / "redis", password=MASTER_PASSWORD, sentinel_password=SENTINEL_PASSWORD
    ) as group:
        env = {**POOL_ENV, **_sentinel_env(group, tmp_path / "var", SENTINEL_PASSWORD)}
        settings = Settings.from_env(env)
        asyncio.run(migrate(settings))
        runtime = Runtime(settings, load_definition(settings.app), one_run=False).open()
        try:
            with LocalPool(env, workers=1, concurrency=2, log_dir=tmp_path / "logs") as processes:
                processes.wait_ready(timeout_s=60)
                yield group, Pool("sqlite", env, processes, runtime)
        finally:
            runtime.close()


@pytest.mark.slow  # a pool, five Redis processes and a failover
def test_a_master_killed_mid_burst_fails_over_and_every_write_lands_once(
    sentinel_pool: tuple[SentinelGroup, Pool],
) -> None:
    group, pool = sentinel_pool
    scene = pool.scene("failover")
    processes = {name: pool.local.pid(name) for name in ("worker0", "dispatcher")}
    worker_children = pool.local.worker_children()

    # Given a burst of runs that take a moment each
    keys = [f"k{index:02d}" for index in range(BURST)]
    for key in keys:
        scene.request(key, slow_s=0.3)
    wait_until(
        lambda: sum(run.status == "succeeded" for run in scene.runs()) >= 3,
        "the first runs of the burst to succeed",
        timeout_s=60,
    )

    # When the master is SIGKILLed in the middle of it, and the sentinels promote the replica
    old_port = group.kill_master()
    unfinished = [run for run in scene.runs() if run.status != "succeeded"]
    assert unfinished, "the burst was over before the master was killed"
    _, new_port = group.wait_promoted(old_port)

    # Then every run succeeds, and artifactr holds each write once
    runs = scene.settled(runs=BURST, timeout_s=180)
    assert [run.status for run in runs] == ["succeeded"] * BURST, runs
    assert_each_write_once(scene.census(), keys)
    # carried by the same worker, prefork children and dispatcher, never restarted
    assert {name: pool.local.pid(name) for name in processes} == processes
    assert pool.local.worker_children() == worker_children
    # whose intake still screens what they pop from the new master
    task_id = str(uuid.uuid4())
    with pool.local.celery.connection_for_write() as connection:
        connection.Producer().publish(
            b'{"not json',
            exchange=ATTEMPTS_QUEUE,
            routing_key=ATTEMPTS_QUEUE,
            content_type="application/json",
            content_encoding="utf-8",
            headers={"id": task_id, "task": ATTEMPT_TASK, "lang": "py"},
            declare=[kombu.Queue(ATTEMPTS_QUEUE, kombu.Exchange(ATTEMPTS_QUEUE, "direct"))],
        )
    letter = pool.letter(lambda found: found.task_id == task_id, timeout_s=30)
    assert letter.reason == "malformed_message" and "is not JSON" in letter.error, letter
    # and `actonce status` names the new master
    done = _actonce(pool.env, "status", "--timeout", "2")
    assert f"master: 127.0.0.1:{new_port} (named by the sentinels)" in done.stdout, done.stdout
    assert done.returncode == 0, done.stdout + done.stderr
    # and no process logged a password
    for name in processes:
        said = pool.local.log(name)
        assert MASTER_PASSWORD not in said and SENTINEL_PASSWORD not in said, name
