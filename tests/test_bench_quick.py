"""`python -m bench.bench --quick`, smaller still: every contender starts, run every run, and every
figure the benchmarks page's table prints is measured (CPU, PostgreSQL CPU, SQL, low-load
latency)."""

import json
from pathlib import Path

import pytest
from bench_runs import run_bench

from lab.postgres import PostgresHandle


@pytest.mark.slow
@pytest.mark.timeout(420)
def test_the_quick_bench_measures_every_figure_of_every_contender(
    tmp_path: Path, postgres_server: PostgresHandle
) -> None:
    out = tmp_path / "bench.json"
    argv = ["--quick", "--runs", "12", "--warmup", "2", "--low-load", "3", "--out", str(out)]
    # Through the door `make bench` uses: the module run as a program.
    done = run_bench("bench.bench", argv, postgres_server, timeout_s=400)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    # Each measure's line names the share of its backends that waited for a row's lock.
    assert done.stdout.count(" pg_locked=") >= 3, done.stdout
    assert done.stdout.count(" machine=") >= 3, done.stdout
    figures = json.loads(out.read_text())
    own = figures["summary"]["own"]
    assert set(own) == {"reactor1", "loop1", "pool2", "threads2"}
    for contender in own.values():
        assert contender["failed"] == 0, contender
        for name in ("attempts_per_s", "cpu_ms", "postgres_cpu_ms", "statements", "low_p50_ms"):
            assert contender[name]["median"] > 0, (name, contender)
        # PostgreSQL's own count is read from its statistics, which it flushes on its own
        # schedule: it must have seen transactions, not a share of what the processes counted.
        assert contender["pg_transactions"]["median"] > 0, contender
    assert own["reactor1"]["x_reactor"] == 1.0
    # And each ratio to the reactor round by round, which the targets are judged on
    assert own["reactor1"]["paired"]["x_reactor"]["median"] == 1.0
    for contender in ("loop1", "pool2", "threads2"):
        paired = own[contender]["paired"]
        assert set(paired) == {"x_reactor", "cpu_x_reactor", "low_cpu_x_reactor"}, paired
        assert all(ratio["median"] > 0 for ratio in paired.values()), paired
    # The headline's peer is the faster of the in-process contenders, the same for every row,
    # and each row's ratios to it are taken round by round.
    peer = max(("reactor1", "loop1"), key=lambda key: own[key]["attempts_per_s"]["median"])
    for contender in own.values():
        assert contender["peer"] == peer, contender
        assert set(contender["paired_peer"]) == {"x_peer", "cpu_x_peer"}, contender
    assert own[peer]["paired_peer"]["x_peer"]["median"] == 1.0
    assert "against the strongest peer" in done.stdout, done.stdout
    assert "| × strongest peer by round (min–max) |" in done.stdout, done.stdout
    # Each low-load event's latency is kept, in publish order, so a p95 can be traced to events.
    for measured in figures["rounds_measured"]:
        for contender in measured["own"].values():
            # What the backends running a statement waited for: shares of one whole at most
            waits = contender["postgres_active_by_wait"]
            assert all(0 < share <= 1 for share in waits.values()), waits
            # Each share is rounded to three decimals: the sum may pass 1 by half a thousandth each.
            assert sum(waits.values()) <= 1 + 0.0005 * len(waits), waits
            # How busy the whole machine was: a share of all its cores, and at least what the
            # contender and its backends spent on them
            assert 0 < contender["machine_busy"] <= 1, contender
            theirs = contender["cpu_ms"] + contender["postgres_cpu_ms"]
            # The server's own processes (WAL writer, checkpointer...) are read apart
            assert contender["postgres_server_cpu_ms"] >= 0, contender
            assert contender["machine_cpu_ms"] >= 0.9 * theirs, contender
            each = contender["low_load"]["each"]
            assert len(each) == 3, each
            for event in each:
                assert 0 < event["fired_ms"] <= event["succeeded_ms"], event
            # And its CPU per event, process by process, adds up to the whole
            parts = contender["low_load"]["cpu_ms_per_event_by_process"]
            assert sum(parts.values()) == pytest.approx(
                contender["low_load"]["cpu_ms_per_event"], abs=0.1
            )
            # And what it spent idle afterwards, per second, likewise
            idle = contender["low_load"]["idle_cpu_ms_per_s_by_process"]
            assert contender["low_load"]["idle_cpu_ms_per_s"] > 0, contender["low_load"]
            assert sum(idle.values()) == pytest.approx(
                contender["low_load"]["idle_cpu_ms_per_s"], abs=0.1
            )
    for paths in figures["statements_by_writes"].values():
        assert paths["pool"]["statements"] <= paths["reactor"]["statements"], paths
