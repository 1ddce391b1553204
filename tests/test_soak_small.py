"""`make soak`, small: `python -m bench.soak` run as a program feeds its runs to a pool of 2
prefork children, samples every process's memory and descriptors, Redis and actonce's tables
every K runs, judges the targets against the warm-up sample, exits 1 exactly when one is missed,
shows its progress on stderr, and draws its curves."""

import json
from pathlib import Path

import pytest
from bench_runs import run_bench

from lab.postgres import PostgresHandle

RUNS = 600
EVERY = 200


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_small_soak_samples_every_process_and_judges_its_targets(
    tmp_path: Path, postgres_server: PostgresHandle
) -> None:
    out, picture = tmp_path / "soak.json", tmp_path / "soak.png"
    argv = ["--runs", str(RUNS), "--every", str(EVERY), "--out", str(out), "--plot", str(picture)]
    done = run_bench("bench.soak", argv, postgres_server, timeout_s=280)
    assert out.exists(), done.stdout[-2000:] + done.stderr[-4000:]
    figures = json.loads(out.read_text())

    samples = figures["samples"]
    assert len(samples) == RUNS // EVERY, samples
    assert all(s["settled"] >= EVERY * (i + 1) for i, s in enumerate(samples)), samples
    assert samples[-1]["settled"] == samples[-1]["succeeded"] == RUNS, samples[-1]
    for sample in samples:
        # the worker's main process, both prefork children, the dispatcher, the private Redis
        assert set(sample["processes"]) == {"worker", "child0", "child1", "dispatcher", "redis"}
        for name, process in sample["processes"].items():
            assert process["rss_kb"] > 0 and process["fds"] > 0, (name, process)
        assert sample["redis"]["used_memory"] > 0 and sample["redis"]["keys"] > 0, sample
        assert 0 < sample["redis"]["lasting"] <= sample["redis"]["keys"], sample
        assert {"actonce_dead_letters", "actonce_turn_requests"} <= set(sample["tables"]), sample
        assert sample["attempts_per_s"] > 0, sample

    # Every target is judged, against the warm-up sample, and the exit status follows them
    targets = {t["target"]: t for t in figures["targets"]}
    for name in ("worker", "child0", "child1", "dispatcher", "redis"):
        assert any(t.startswith(f"{name}: resident memory") for t in targets), targets
        assert any(t.startswith(f"{name}: no more file descriptors") for t in targets), targets
    assert any(t.startswith("Redis: no more keys that never expire") for t in targets), targets
    assert any(t.startswith("steady:") for t in targets), targets
    assert targets["every run succeeded"]["kept"], targets
    missed = [t for t in figures["targets"] if not t["kept"]]
    assert done.returncode == (1 if missed else 0), (missed, done.stderr[-3000:])
    assert all(("MISSED " if not t["kept"] else "ok ") in done.stdout for t in figures["targets"])

    # Its progress went to stderr as lines (no terminal): the last says all runs settled
    assert f"soak: {RUNS}/{RUNS} runs" in done.stderr, done.stderr[-2000:]
    assert "elapsed" in done.stderr and "left" in done.stderr
    assert picture.read_bytes().startswith(b"\x89PNG"), "no PNG drawn"
