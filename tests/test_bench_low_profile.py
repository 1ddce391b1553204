"""`python -m bench.low_profile`: each process of the pool is profiled over the low load alone,
its CPU per event is read, and its Redis's commands are counted by name."""

import json
import os
from collections import Counter
from pathlib import Path

import pytest
from bench_runs import run_bench

from bench.low_profile import Recording, queue_share, window_figures
from lab.postgres import PostgresHandle

_TRACE = (
    "Worker.workloop (billiard/pool.py:369);fast_trace_task (celery/app/trace.py:798);"
    "attempt (actonce/tasks/attempt.py:60);"
    "run_to_soft_limit (actonce/worker/process/soft_limit.py:37)"
)
_LOOP = (
    "run_to_soft_limit (actonce/worker/process/soft_limit.py:37);"
    "Runner.run (asyncio/runners.py:118)"
)


def test_carrying_a_message_is_told_from_the_work_it_carries_by_the_innermost_package() -> None:
    lines = [
        # a child's attempt, under Celery's tracer: the loop's and SQLAlchemy's are the work
        f"{_TRACE};Runner.run (asyncio/runners.py:118) 4",
        "greenlet_spawn (sqlalchemy/util/concurrency.py:200);execute (asyncpg/x.py:1) 3",
        # a child returning its result, and reading its next task: carried
        "Worker.workloop (billiard/pool.py:417);Connection._send (billiard/connection.py:409) 2",
        "fast_trace_task (celery/app/trace.py:798);loads (json/decoder.py:353) 1",
        # the dispatcher's send, inside actonce's loop: carried
        f"{_LOOP};Dispatcher._send (actonce/worker/dispatching/dispatcher.py:1);"
        "publish (kombu/messaging.py:170);send_packed_command (redis/connection.py:1) 3",
        # the standard library alone decides nothing; a loop waiting is not busy
        "Thread.run (threading.py:1010);_flush (sitecustomize.py:29) 2",
        f"{_LOOP};EpollSelector.select (selectors.py:468) 50",
    ]
    assert queue_share(lines) == pytest.approx(6 / 15)
    assert queue_share([]) == 0.0


def test_a_threads_worker_is_not_counted_whole_as_carrying_a_prefork_one_is(
    tmp_path: Path,
) -> None:
    # Given a worker process whose samples are half carrying, half attempting, over 10 events
    raw = tmp_path / "worker.txt"
    raw.write_text(
        f"{_TRACE};Runner.run (asyncio/runners.py:118) 5\n"
        "Worker.workloop (billiard/pool.py:417);Connection._send (billiard/connection.py:409) 5\n"
    )
    before = {("celery", 1): 0.0, ("redis", 3): 0.0}
    after = {("celery", 1): 0.2, ("redis", 3): 0.01}
    # When it has no prefork children (a threads worker), its profile decides
    alone = window_figures("threads1", 10, before, after, Counter(), {("celery", 1): raw})
    assert alone["queue_cpu_ms_per_event_by_process"] == {"celery": 10.0, "redis": 1.0}
    # And when it has (a prefork worker), it only carries messages: all of it counts
    child = tmp_path / "child.txt"
    child.write_text(f"{_TRACE};Runner.run (asyncio/runners.py:118) 9\n")
    files = {("celery", 1): raw, ("celery:children", 2): child}
    after[("celery:children", 2)] = 0.3
    forked = window_figures("pool1", 10, before, after, Counter(), files)
    carried = forked["queue_cpu_ms_per_event_by_process"]
    assert carried == {"celery": 20.0, "celery:children": 0.0, "redis": 1.0}, carried
    assert forked["cpu_ms_per_event"] == 51.0


def test_a_process_py_spy_cannot_record_fails_the_recording_and_stops_the_others(
    tmp_path: Path,
) -> None:
    # Given a recording of this test's own process and of a pid that names no process
    gone = 2**22 + 1  # above Linux's largest pid
    recording = Recording([("celery", os.getpid()), ("dispatcher", gone)], tmp_path, 100)
    # When it starts, then it fails with py-spy's reason
    with pytest.raises(RuntimeError, match="py-spy could not record"):
        recording.__enter__()
    # And the spy that could record was stopped, not left sampling
    assert recording.still_recording() == 0


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_the_low_load_profile_names_each_process_its_cpu_and_the_redis_commands(
    tmp_path: Path, postgres_server: PostgresHandle
) -> None:
    out = tmp_path / "low"
    argv = ["--events", "6", "--warmup", "3", "--rate", "200", "--out", str(out)]
    # Through the door its docstring gives: the module run as a program.
    done = run_bench("bench.low_profile", argv, postgres_server, timeout_s=180)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    found = json.loads((out / "summary.json").read_text())
    assert found["contender"] == "pool2" and found["events"] == 6
    parts = found["cpu_ms_per_event_by_process"]
    assert {"celery", "celery:children", "dispatcher", "redis"} <= set(parts), parts
    assert parts["celery:children"] > 0 and parts["dispatcher"] > 0, parts
    assert sum(parts.values()) == pytest.approx(found["cpu_ms_per_event"], abs=0.1)
    # What carrying the messages cost: all of Celery's main process and Redis, part of a child
    carried = found["queue_cpu_ms_per_event_by_process"]
    assert carried["celery"] == parts["celery"] and carried["redis"] == parts["redis"], carried
    assert carried["celery:children"] <= parts["celery:children"], (carried, parts)
    assert found["queue_cpu_ms_per_event"] == pytest.approx(sum(carried.values()), abs=0.1)
    # Each event is one attempt message: pushed once by the dispatcher, popped once by the worker
    # (a few more pops: the worker's blocking pop also returns when its timeout passes).
    commands = found["redis_commands_per_event"]
    assert commands["LPUSH"] == 1.0, commands
    assert commands["BRPOP"] >= 1.0, commands
    # By name only: no key, no argument.
    assert all(name.isalpha() and name.isupper() for name in commands), commands
    # A profile per Python process of the pool, each recorded (the idle child's may be empty)
    profiled = {name.split()[0] for name in found["profiles"]}
    assert profiled == {"celery", "celery:children", "dispatcher"}, found["profiles"]
    for name, path in found["profiles"].items():
        assert Path(path).exists(), name
    dispatcher = next(p for n, p in found["profiles"].items() if n.startswith("dispatcher"))
    assert Path(dispatcher).read_text().strip(), "the dispatcher's profile is empty"
    # The window's own: the worker forked its children long before it opened.
    main = next(p for n, p in found["profiles"].items() if n.startswith("celery "))
    assert "_create_worker_process" not in Path(main).read_text()
    assert "ms of CPU per low-load event" in done.stdout, done.stdout
    assert "Redis commands per event" in done.stdout, done.stdout
