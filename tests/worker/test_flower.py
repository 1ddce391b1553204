"""Flower watches the pool: started against the test broker, its HTTP API shows the demo's
attempts with SUCCESS, RETRY and FAILURE, and the dead-lettered one's failure names its reason.
Started as compose starts it, its API asks for `FLOWER_BASIC_AUTH`.

Flower sees task events live only, so it is started before the attempts run.
"""

import base64
import json
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pools import Pool, Scene

from lab.flower import flower, flower_answers, flower_port
from lab.processes import STOP_GRACE_S, end, environment, free_port
from lab.redis import RedisHandle

pytestmark = pytest.mark.slow


def _get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=5) as response:
        return json.loads(response.read())


@pytest.fixture
def flower_api(pool: Pool, tmp_path: Path) -> Iterator[str]:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with flower(pool.env, port=port, log_file=tmp_path / "flower.log"):
        deadline = time.monotonic() + 30
        while True:
            try:
                if _get(f"{url}/api/workers?refresh=true"):
                    break
            except OSError:
                pass
            assert time.monotonic() < deadline, "flower did not answer in 30s"
            time.sleep(0.5)
        yield url


def _tasks_of(url: str, run_ids: set[str]) -> dict[str, list[dict[str, Any]]]:
    tasks = _get(f"{url}/api/tasks?limit=1000")
    found: dict[str, list[dict[str, Any]]] = {}
    for info in tasks.values():
        kwargs = str(info.get("kwargs") or "")
        for run_id in run_ids:
            if run_id in kwargs:
                found.setdefault(run_id, []).append(info)
    return found


def test_flower_shows_success_retry_and_a_failure_naming_its_reason(
    pool: Pool, scene: Scene, flower_api: str
) -> None:
    # Given a plain run, a run refused once and retried, and a run designed to die
    scene.request("plain")
    scene.request("refused-once", refuse_first=True)
    scene.request("dies", die=True)
    runs = {run.id: run for run in scene.settled(runs=3)}
    by_status = {run.status: run for run in runs.values() if run.attempts == 1}
    retried = next(run for run in runs.values() if run.attempts == 2)
    dead = by_status["dead"]
    # Then Flower's API names every attempt task by what it does, with their states
    # A run settles in reflexr before its task's last event reaches Flower, so wait until
    # each run's own final state is there, not merely some SUCCESS and some FAILURE.
    final = {run_id: "FAILURE" if run_id == dead.id else "SUCCESS" for run_id in runs}
    seen: dict[str, list[dict[str, Any]]] = {}
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        seen = _tasks_of(flower_api, set(runs))
        if all(
            any(info["state"] == state for info in seen.get(run_id, []))
            for run_id, state in final.items()
        ):
            break
        time.sleep(0.5)
    names = {info["name"] for infos in seen.values() for info in infos}
    assert names == {"actonce.attempt_run"}, names
    assert {info["state"] for info in seen[dead.id]} == {"FAILURE"}, seen[dead.id]
    assert "not_allowed" in seen[dead.id][0]["exception"], seen[dead.id]
    retried_infos = seen[retried.id]
    assert any(info["state"] == "SUCCESS" for info in retried_infos), retried_infos
    # A retried attempt is one Celery task that went through RETRY: Flower counts it.
    assert any(
        info["state"] == "RETRY" or (info.get("retries") or 0) >= 1 for info in retried_infos
    ), retried_infos


def test_make_flower_joins_a_flower_that_already_answers_on_its_port(
    redis_server: RedisHandle, tmp_path: Path
) -> None:
    # Given a Flower (the demo's) already serving on the port `make flower` wants
    port = free_port()
    env = {"ACTONCE_BROKER_URL": redis_server.url}
    with flower(env, port=port, log_file=tmp_path / "flower.log"):
        deadline = time.monotonic() + 30
        while not flower_answers(port):
            assert time.monotonic() < deadline, "flower did not answer in 30s"
            time.sleep(0.5)
        # When `make flower` (python -m lab.flower) runs
        done = subprocess.run(
            [sys.executable, "-m", "lab.flower", f"--port={port}"],
            env=environment(env),
            capture_output=True,
            text=True,
            timeout=60,
        )
    # Then it points at that Flower and exits, rather than failing on the taken port
    assert done.returncode == 0, done.stderr
    assert f"already running at http://127.0.0.1:{port}/" in done.stdout, done.stdout
    assert "Traceback" not in done.stderr, done.stderr


def test_the_demo_takes_another_port_when_flowers_is_taken() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = taken.getsockname()[1]

        assert flower_port(busy) != busy
    assert flower_port(busy) == busy


def test_flower_as_compose_runs_it_asks_for_its_basic_auth(
    redis_server: RedisHandle, tmp_path: Path
) -> None:
    # Given Flower started as compose starts it, with FLOWER_BASIC_AUTH from the environment
    port = free_port()
    env = {"ACTONCE_BROKER_URL": redis_server.url, "FLOWER_BASIC_AUTH": "ops:flower-pw"}
    command = ["celery", "-A", "actonce.worker.app", "flower", f"--port={port}"]
    with open(tmp_path / "flower.log", "wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", *command, "--address=127.0.0.1"],
            env=environment(env),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        url = f"http://127.0.0.1:{port}/api/workers"
        deadline = time.monotonic() + 30
        while (status := _status(url)) is None:
            assert time.monotonic() < deadline, (tmp_path / "flower.log").read_text()
            time.sleep(0.5)
        # Then its HTTP API answers 401 without the credentials, and 200 with them
        assert status == 401
        assert _status(url, auth="ops:flower-pw") == 200
        assert _status(url, auth="ops:wrong") == 401
    finally:
        end(process, grace_s=STOP_GRACE_S)


def _status(url: str, auth: str | None = None) -> int | None:
    """The HTTP status `url` answers with, with basic `auth` if given; None if nothing answers."""
    request = urllib.request.Request(url)
    if auth is not None:
        request.add_header("Authorization", f"Basic {base64.b64encode(auth.encode()).decode()}")
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return int(response.status)
    except urllib.error.HTTPError as refused:
        return refused.code
    except OSError:
        return None
