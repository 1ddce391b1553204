"""`python -m bench.attribution`: the pool and the tight loop each run a burst on a fresh
database, and their CPU per attempt is given process by process, PostgreSQL's included."""

import json
from pathlib import Path

import pytest
from bench_runs import run_bench

from lab.postgres import PostgresHandle


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_pool_and_the_loop_are_attributed_process_by_process(
    tmp_path: Path, postgres_server: PostgresHandle
) -> None:
    argv = ["--runs", "10", "--rounds", "1", "--warmup", "2", "--out", str(tmp_path)]
    # Through the door a user takes: the module run as a program.
    done = run_bench("bench.attribution", argv, postgres_server)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    summary = json.loads((tmp_path / "attribution.json").read_text())["summary"]
    assert set(summary) == {"pool2", "loop1"}, summary
    pool, loop = summary["pool2"], summary["loop1"]
    for row in ("dispatcher", "celery", "celery:children", "redis"):
        assert pool[row]["median"] >= 0, (row, pool)
    assert pool["celery:children"]["median"] > 0, pool
    assert loop["reactor"]["median"] > 0, loop
    assert "dispatcher" not in loop, loop
    for figures in (pool, loop):
        assert figures["postgres_cpu_ms"]["median"] > 0, figures
        assert figures["postgres:server"]["median"] >= 0, figures
        assert figures["all"]["median"] == pytest.approx(
            figures["cpu_ms"]["median"]
            + figures["postgres_cpu_ms"]["median"]
            + figures["postgres:server"]["median"],
            abs=0.05,
        )
    # The table a reader gets: a row per process, a column per contender
    assert "| CPU ms per attempt | relayr Reactor, tight loop, 1 process |" in done.stdout or (
        "| CPU ms per attempt | actonce pool, prefork, 2 processes |" in done.stdout
    ), done.stdout
    assert "| worker children |" in done.stdout and "| postgres backends |" in done.stdout
