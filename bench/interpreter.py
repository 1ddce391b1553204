"""CPU per attempt on the attempt path, by event loop and collector: what
`worker.process.interpreter` saves a prefork child.

Each measure is a process of its own on a fresh PostgreSQL database: it publishes `runs` events
of the bench's headline workload (one workspace, each run a notice and a keyed edit of its own
ledger), fires them, warms up on the first `warmup`, then attempts the rest one at a time through
the Celery task's body (`tasks.attempt._attempt` over a `Runtime`, as a prefork child does) and
reads the process's CPU time around them. Its loop is `ACTONCE_EVENT_LOOP`'s; its collector is
Python's default, or `keep_startup_heap()`'s (called, as a child calls it, once its runtime is
built). The four combinations run in rotated order each round; the medians and each round's
figures are printed, and written to `--out`::

    python -m bench.interpreter --rounds 5 --runs 400

Processes on two cores drift in speed from one minute to the next (the reactor's CPU per attempt
in one `make bench` run ranged 22.7–35.6 ms), so compare the combinations within a round: the
ratios to `asyncio+default` of the same round are what the summary gives.
"""

import argparse
import asyncio
import gc
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Final

from reflexr.workspace import WorkspaceRef

from actonce.worker.process.interpreter import keep_startup_heap
from actonce.worker.process.runtime import Runtime
from actonce.worker.settings import Settings
from actonce.worker.storage.migrate import migrate
from bench.sql_grid import attempt_each
from bench.stores import fresh_stores
from bench.workloads import TENANT, WORKSPACE, keys, prepare_workspace, publish_burst

COMBINATIONS: Final = (
    ("asyncio", "default"),
    ("uvloop", "default"),
    ("asyncio", "kept"),
    ("uvloop", "kept"),
)
"""Every event loop with every collector; the first is Python's own, the baseline."""


async def _loop_module() -> str:
    return type(asyncio.get_running_loop()).__module__.split(".")[0]


async def _fire(runtime: Runtime, runs: int) -> list[str]:
    """Publish `runs` events on fresh stores, fire them; return the runs' ids."""
    import reflexr.sql

    run_keys = keys("interp", runs)
    await prepare_workspace(runtime, run_keys, "own")
    await publish_burst(runtime, run_keys, "own")
    await runtime.reactor().evaluate()
    storage: Any = runtime.reflexr.storage
    made = await reflexr.sql.SqlStorage.runs(storage, WorkspaceRef(TENANT, WORKSPACE))
    return [run.id for run in made]


def measure(collector: str, runs: int, warmup: int) -> dict[str, Any]:
    """In this process, on the stores and loop the environment names: CPU ms per attempt, and
    which loop ran them and how many objects the collector was told to keep."""
    from bench.definition import app

    settings = Settings.from_env(None, app="bench.definition:app")
    runtime = Runtime(settings, app, one_run=True).open()
    try:
        run_ids = runtime.run(_fire(runtime, runs))
        runtime.run(attempt_each(runtime, WORKSPACE, run_ids[:warmup]))
        if collector == "kept":
            keep_startup_heap()
        measured = run_ids[warmup:]
        cpu, wall = time.process_time(), time.perf_counter()
        runtime.run(attempt_each(runtime, WORKSPACE, measured))
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
        loop = runtime.run(_loop_module())
    finally:
        runtime.close()
    return {
        "cpu_ms": round(1000 * cpu / len(measured), 2),
        "wall_ms": round(1000 * wall / len(measured), 2),
        "attempts": len(measured),
        "loop": loop,
        "frozen": gc.get_freeze_count(),
    }


def _one(loop: str, collector: str, runs: int, warmup: int) -> dict[str, Any]:
    """`measure` in a process of its own, on a fresh database."""
    with fresh_stores("postgres", "actonce_interp") as stores:
        env = {**os.environ, **stores, "ACTONCE_EVENT_LOOP": loop}
        asyncio.run(migrate(Settings.from_env(env, app="bench.definition:app")))
        argv = ["--measure", collector, "--runs", str(runs), "--warmup", str(warmup)]
        done = subprocess.run(
            [sys.executable, "-m", "bench.interpreter", *argv],
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )
    if done.returncode != 0:
        raise RuntimeError(f"the {loop}+{collector} measure failed:\n{done.stderr[-4000:]}")
    figures: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return figures


def compare(rounds: int, runs: int, warmup: int) -> dict[str, Any]:
    """Every combination, `rounds` times in rotated order; the medians and per-round ratios."""
    each: list[dict[str, dict[str, Any]]] = []
    for index in range(rounds):
        order = COMBINATIONS[index % 4 :] + COMBINATIONS[: index % 4]
        this_round: dict[str, dict[str, Any]] = {}
        for loop, collector in order:
            name = f"{loop}+{collector}"
            this_round[name] = _one(loop, collector, runs, warmup)
            print(f"round {index + 1}/{rounds}: {name} {this_round[name]}", flush=True)
        base = this_round["asyncio+default"]["cpu_ms"]
        for figures in this_round.values():
            figures["cpu_ratio"] = round(figures["cpu_ms"] / base, 3)
        each.append(this_round)
    summary = {
        name: {
            figure: statistics.median(r[name][figure] for r in each)
            for figure in ("cpu_ms", "wall_ms", "cpu_ratio")
        }
        for name in (f"{loop}+{collector}" for loop, collector in COMBINATIONS)
    }
    return {"runs": runs, "warmup": warmup, "rounds": each, "summary": summary}


def main(argv: list[str] | None = None) -> int:
    """Run the comparison, or (`--measure`) one measure in this process."""
    parser = argparse.ArgumentParser(prog="python -m bench.interpreter", description=__doc__)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--runs", type=int, default=400, help="runs fired per measure")
    parser.add_argument("--warmup", type=int, default=40, help="attempts not measured")
    parser.add_argument("--out", type=Path, default=Path("var/interpreter.json"))
    parser.add_argument("--measure", choices=("default", "kept"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.warmup >= args.runs:
        parser.error("--warmup must be below --runs")
    if args.measure:
        print(json.dumps(measure(args.measure, args.runs, args.warmup)))
        return 0
    result = compare(args.rounds, args.runs, args.warmup)
    print("\nmedian of the rounds: CPU ms per attempt, and its ratio to asyncio+default")
    for name, figures in result["summary"].items():
        print(f"  {name:18} {figures['cpu_ms']:6.2f} ms  ×{figures['cpu_ratio']:.3f}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
