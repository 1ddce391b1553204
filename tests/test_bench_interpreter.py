"""`python -m bench.interpreter`, small: each combination of event loop and collector runs the
attempt path on the loop `ACTONCE_EVENT_LOOP` names and with the collector it asks for."""

import json
from pathlib import Path

import pytest
from bench_runs import run_bench

from lab.postgres import PostgresHandle


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_each_combination_runs_on_its_loop_with_its_collector(
    tmp_path: Path, postgres_server: PostgresHandle
) -> None:
    out = tmp_path / "interpreter.json"
    argv = ["--rounds", "1", "--runs", "12", "--warmup", "4", "--out", str(out)]
    done = run_bench("bench.interpreter", argv, postgres_server)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    figures = json.loads(out.read_text())
    (measured,) = figures["rounds"]
    assert set(measured) == {"asyncio+default", "uvloop+default", "asyncio+kept", "uvloop+kept"}
    for name, each in measured.items():
        loop, collector = name.split("+")
        assert each["attempts"] == 8, each
        assert each["cpu_ms"] > 0, each
        # The loop the environment variable asked for is the one the attempts ran on.
        assert each["loop"] == loop, each
        # Only `keep_startup_heap` hands the collector the heap built at start.
        assert (each["frozen"] > 10_000) == (collector == "kept"), each
    assert measured["asyncio+default"]["cpu_ratio"] == 1.0
    assert set(figures["summary"]) == set(measured)
