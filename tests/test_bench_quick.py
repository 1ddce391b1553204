"""`python -m bench.bench --quick`, smaller still: both contenders start, run every run, and every
figure the README's table prints is measured (CPU, PostgreSQL CPU, SQL, low-load latency)."""

import json
import os
from pathlib import Path

import pytest

from bench.bench import main
from bench.stores import PostgresUnreachable


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_quick_bench_measures_every_figure_of_both_contenders(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    argv = ["--quick", "--runs", "12", "--warmup", "2", "--low-load", "3", "--out", str(out)]
    try:
        assert main(argv) == 0
    except PostgresUnreachable as unreachable:
        if os.environ.get("CI"):
            pytest.fail(f"{unreachable}; CI is set, so the bench test must run, not skip")
        pytest.skip(f"{unreachable}; start PostgreSQL (or set CI to make this a failure)")
    figures = json.loads(out.read_text())
    own = figures["summary"]["own"]
    assert set(own) == {"reactor1", "pool2"}
    for contender in own.values():
        assert contender["failed"] == 0, contender
        for name in ("attempts_per_s", "cpu_ms", "postgres_cpu_ms", "statements", "low_p50_ms"):
            assert contender[name]["median"] > 0, (name, contender)
        assert contender["pg_transactions"]["median"] >= contender["transactions"]["median"] * 0.5
    assert own["reactor1"]["x_reactor"] == 1.0
    for paths in figures["statements_by_writes"].values():
        assert paths["pool"]["statements"] <= paths["reactor"]["statements"], paths
