"""`python -m bench.capacity`: what one PostgreSQL carries is derived from a bench run's medians,
the server's own processes counted when the run read them, and one workspace's ceiling is the
fastest any contender went on one workspace."""

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from bench.capacity import on_paper

ROOT = Path(__file__).resolve().parents[1]


def _median(value: float) -> dict[str, float]:
    return {"median": value, "min": value, "max": value}


def _figures(server_ms: float | None) -> dict[str, Any]:
    pool: dict[str, Any] = {
        "name": "actonce pool, prefork, 2 processes",
        "attempts_per_s": _median(50.0),
        "postgres_cpu_ms": _median(4.0),
        "statements": _median(40.0),
        "pg_transactions": _median(11.0),
    }
    if server_ms is not None:
        pool["postgres_server_cpu_ms"] = _median(server_ms)
    loop = {
        **pool,
        "name": "relayr Reactor, tight loop, 1 process",
        "attempts_per_s": _median(60.0),
    }
    return {"when": "then", "summary": {"own": {"pool2": pool, "loop1": loop}}}


def test_one_core_carries_the_inverse_of_postgres_cpu_per_attempt() -> None:
    paper = on_paper(_figures(server_ms=1.0), "own", "pool2")
    assert paper.server_counted
    assert paper.per_core == pytest.approx(200.0)  # 1000 ms / (4 + 1) ms
    # 4 cores at 70% carry 560 attempts/s: 11.2 machines running 50 each
    assert paper.machines(4, 0.7) == pytest.approx(11.2)
    # The fastest on one workspace, whoever it was
    assert paper.one_workspace_per_s == 60.0


def test_a_run_without_the_server_processes_counts_the_backends_alone() -> None:
    paper = on_paper(_figures(server_ms=None), "own", "pool2")
    assert not paper.server_counted
    assert paper.per_core == pytest.approx(250.0)


def test_the_command_prints_the_table_from_a_runs_file(tmp_path: Path) -> None:
    path = tmp_path / "bench.json"
    path.write_text(json.dumps(_figures(server_ms=1.0)))
    done = subprocess.run(
        [sys.executable, "-m", "bench.capacity", str(path), "--workload", "own"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert "one PostgreSQL core carries 200 attempts/s, 8000 statements/s" in done.stdout
    assert "| 4 | 560 | 6160 | 11.2 |" in done.stdout, done.stdout
    missing = subprocess.run(
        [sys.executable, "-m", "bench.capacity", str(path), "--workload", "spread"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert missing.returncode == 2 and "has no 'spread'" in missing.stderr, missing.stderr
