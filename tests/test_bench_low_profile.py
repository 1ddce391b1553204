"""`python -m bench.low_profile`: each process of the pool is profiled over the low load alone,
its CPU per event is read, and its Redis's commands are counted by name."""

import json
from pathlib import Path

import pytest
from bench_runs import run_bench


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_the_low_load_profile_names_each_process_its_cpu_and_the_redis_commands(
    tmp_path: Path,
) -> None:
    out = tmp_path / "low"
    argv = ["--events", "6", "--warmup", "3", "--rate", "200", "--out", str(out)]
    # Through the door its docstring gives: the module run as a program.
    done = run_bench("bench.low_profile", argv, timeout_s=180)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    found = json.loads((out / "summary.json").read_text())
    assert found["contender"] == "pool2" and found["events"] == 6
    parts = found["cpu_ms_per_event_by_process"]
    assert {"celery", "celery:children", "dispatcher", "redis"} <= set(parts), parts
    assert parts["celery:children"] > 0 and parts["dispatcher"] > 0, parts
    assert sum(parts.values()) == pytest.approx(found["cpu_ms_per_event"], abs=0.1)
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
