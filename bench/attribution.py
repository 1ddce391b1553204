"""Where each contender's CPU per attempt goes, process by process: `python -m bench.attribution`.

    python -m bench.attribution [--contenders pool2,loop1] [--runs 500] [--rounds 3]
        [--workload own] [--profile] [--out var/attribution]

Each round visits the contenders in rotated order; each gets a fresh PostgreSQL database, starts,
is warmed up, and is given a burst of `--runs` runs, as `bench.bench` gives it (the window closes
once every rule's cursor is within reach of the log's head). In that window the bench's sampler
(`bench.measure.Sampler`) reads the CPU of every process of the contender and of PostgreSQL, and
the contender's processes count their statements. The table gives, per attempt, the median of
the rounds and their spread, by process:

- `dispatcher`, `worker main` (Celery's main process), `worker children` (its prefork
  children, or its threads), `redis`: the pool's; `reactor`: relayr's process(es), `serve` or
  the tight loop;
- `postgres backends`: the backends serving the contender's database; `postgres server`: the
  postmaster and its processes bound to no database (WAL writer, checkpointer, ...), which
  serve the whole server, so on a server other databases use their CPU is partly others'.

With `--profile`, py-spy (`bench.low_profile.Recording`) records each Python process of the
contender through the burst, and each process's row gains the part of its CPU spent carrying
messages (`bench.low_profile.queue_share`: the hop from the dispatcher to a child and back,
which a reactor does not make); `python -m bench.profile FILE` summarizes any of the raw
profiles left under `--out`. py-spy's own sampling costs its targets a little: state the CPU
from a run without `--profile`, and use a profiled one for where it goes.

It writes every round's figures to `OUT/attribution.json`. Figures from a machine busy with
anything else are noise: run it on a quiet one, with `--rounds 3` at least.
"""

import argparse
import contextlib
import json
import statistics
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

from sqlalchemy.engine import make_url

from actonce.worker.dispatching.dispatcher import CATCH_UP_ENTRIES
from bench import workloads as w
from bench.bench import OwnTransactions, Window, bench_runtime, contender_env
from bench.contenders import KNOWN, Contender, running
from bench.low_profile import UNPROFILED, Recording, queue_share
from bench.measure import SERVER, Sampler, SqlFiles

ROWS: Final = {
    "dispatcher": "dispatcher",
    "celery": "worker main",
    "celery:children": "worker children",
    "redis": "redis",
    "reactor": "reactor",
}
"""The contenders' process labels (`bench.measure.label_of_command`), as the table names them."""

POSTGRES_ROWS: Final = {"postgres_cpu_ms": "postgres backends", SERVER: "postgres server"}
"""PostgreSQL's rows: the figure each comes from."""


def attribute(
    contender: Contender,
    workload: w.Workload,
    *,
    runs: int,
    warmup: int,
    log_dir: Path,
    profile_dir: Path | None,
    rate: int,
) -> dict[str, Any]:
    """Run `contender` on a fresh database through warm-up and a burst of `runs`; return the
    burst's figures per attempt, by process, with the share carrying messages if profiled."""
    warm, burst = w.keys("w", warmup), w.keys("b", runs)
    with bench_runtime(one_run=False) as (stores, runtime, admin_dsn):
        database = make_url(stores["ACTONCE_DATABASE_URL"]).database or ""
        count_dir = Path(tempfile.mkdtemp(prefix="attribution-sql-", dir=log_dir))
        runtime.run(w.prepare_workspace(runtime, warm + burst, workload))
        own = OwnTransactions(runtime)
        env = contender_env(stores, count_dir)
        with Sampler(database, admin_dsn) as sampler, running(contender, env, log_dir):
            runtime.run(w.publish_burst(runtime, warm, workload))
            runtime.run(w.settled(runtime, workload, warmup, 120, every_s=0.5))
            runtime.run(w.caught_up(runtime, workload, CATCH_UP_ENTRIES, 60))
            spied = [
                key
                for key in sampler.mark()
                if key[0] not in UNPROFILED and not key[0].startswith("postgres")
            ]
            recording = (
                Recording(spied, profile_dir, rate)
                if profile_dir is not None
                else contextlib.nullcontext()
            )
            with recording as recorded:
                spent = Window(sampler, database, admin_dsn, SqlFiles(count_dir), own)
                before = sampler.mark()
                spent.open()
                started = runtime.run(w.publish_burst(runtime, burst, workload))
                found = runtime.run(w.settled(runtime, workload, warmup + runs, 120 + runs))
                runtime.run(w.caught_up(runtime, workload, CATCH_UP_ENTRIES, 60))
                figures = spent.close(runs)
                after = sampler.mark()
            seqs = runtime.run(w.seqs_of(runtime, workload, {f"evt_{k}" for k in burst}))
    done = w.burst_of(found, set(seqs), started)
    # py-spy and the bench's own helpers are `other`: never the contender's.
    by_process = {k: v for k, v in figures["cpu_ms_by_process"].items() if k in ROWS}
    result: dict[str, Any] = {
        "attempts_per_s": round(done.per_s, 2),
        "failed": done.failed,
        "cpu_ms_by_process": by_process,
        "cpu_ms": round(sum(by_process.values()), 2),
        "postgres_cpu_ms": figures["postgres_cpu_ms"],
        SERVER: figures["postgres_server_cpu_ms"],
        "statements": figures["statements"],
        "statements_by_process": figures["statements_by_process"],
    }
    if isinstance(recorded, Recording):
        carried: dict[str, float] = {}
        prefork = any(label == "celery:children" for label, _ in recorded.files)
        for (label, pid), path in recorded.files.items():
            lines = path.read_text(errors="replace").splitlines() if path.exists() else []
            cpu_s = max(0.0, after.get((label, pid), 0.0) - before.get((label, pid), 0.0))
            # As `bench.low_profile` counts it: a prefork worker's main process only carries.
            share = 1.0 if label == "celery" and prefork else queue_share(lines)
            carried[label] = carried.get(label, 0.0) + cpu_s * share * 1000 / runs
        if "redis" in by_process:
            carried["redis"] = by_process["redis"]
        result["carrying_ms_by_process"] = {k: round(v, 2) for k, v in sorted(carried.items())}
        result["profiles"] = {
            f"{label} {pid}": str(p) for (label, pid), p in recorded.files.items()
        }
    return result


def summarise(rounds: list[dict[str, dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    """Each contender's figures over the rounds: by row, the median, min and max."""
    summary: dict[str, dict[str, Any]] = {}
    keys = {key for measured in rounds for key in measured}
    for key in sorted(keys):
        measured = [r[key] for r in rounds if key in r]
        rows: dict[str, list[float]] = {}
        for m in measured:
            for label, ms in m["cpu_ms_by_process"].items():
                rows.setdefault(label, []).append(ms)
            for label, ms in m.get("carrying_ms_by_process", {}).items():
                rows.setdefault(f"{label} carrying", []).append(ms)
            for figure in ("cpu_ms", "postgres_cpu_ms", SERVER, "attempts_per_s", "statements"):
                rows.setdefault(figure, []).append(m[figure])
            rows.setdefault("all", []).append(m["cpu_ms"] + m["postgres_cpu_ms"] + m[SERVER])
        summary[key] = {
            row: {
                "median": round(statistics.median(v), 2),
                "min": round(min(v), 2),
                "max": round(max(v), 2),
            }
            for row, v in rows.items()
        }
    return summary


def table(summary: dict[str, dict[str, Any]], names: dict[str, str]) -> str:
    """The summary as a markdown table: a row per process, a column per contender."""
    keys = list(summary)
    lines = [
        "| CPU ms per attempt | " + " | ".join(names[k] for k in keys) + " |",
        "|---|" + "---:|" * len(keys),
    ]
    rows = [
        *((label, name) for label, name in ROWS.items()),
        ("cpu_ms", "**contender, all processes**"),
        *POSTGRES_ROWS.items(),
        ("all", "**all, PostgreSQL included**"),
        ("attempts_per_s", "attempts/s"),
        ("statements", "statements per attempt"),
    ]
    for row, name in rows:
        cells = [_cell(summary[k].get(row)) for k in keys]
        if all(c == "-" for c in cells):
            continue
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
        carrying = [_cell(summary[k].get(f"{row} carrying")) for k in keys]
        if any(c != "-" for c in carrying):
            lines.append("| of which carrying messages | " + " | ".join(carrying) + " |")
    return "\n".join(lines)


def _cell(figure: dict[str, float] | None) -> str:
    if not figure:
        return "-"
    if figure["min"] == figure["max"]:
        return f"{figure['median']:.2f}"
    return f"{figure['median']:.2f} ({figure['min']:.2f}–{figure['max']:.2f})"


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m bench.attribution`: measure, print the table, write `OUT/attribution.json`."""
    parser = argparse.ArgumentParser(prog="python -m bench.attribution", description=__doc__)
    parser.add_argument("--contenders", default="pool2,loop1", help="keys (pool2,loop1)")
    parser.add_argument("--workload", default="own", choices=("own", "spread", "shared"))
    parser.add_argument("--runs", type=int, default=500, help="runs per burst (500)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds (3)")
    parser.add_argument("--warmup", type=int, default=30, help="warm-up runs (30)")
    parser.add_argument("--profile", action="store_true", help="record each process with py-spy")
    parser.add_argument("--rate", type=int, default=100, help="py-spy samples per second (100)")
    parser.add_argument("--out", type=Path, default=Path("var/attribution"))
    options = parser.parse_args(argv)
    wanted = options.contenders.split(",")
    contenders = [c for c in KNOWN if c.key in wanted]
    if len(contenders) != len(wanted):
        known = ", ".join(c.key for c in KNOWN)
        print(f"unknown contender in {options.contenders!r}: of {known}", file=sys.stderr)
        return 2
    options.out.mkdir(parents=True, exist_ok=True)
    log_dir = Path(tempfile.mkdtemp(prefix="actonce-attribution-"))
    measured: list[dict[str, dict[str, Any]]] = []
    for r in range(options.rounds):
        order = contenders[r % len(contenders) :] + contenders[: r % len(contenders)]
        this: dict[str, dict[str, Any]] = {}
        for contender in order:
            print(f"round {r + 1}/{options.rounds}: {contender.name}…", flush=True)
            profile_dir = options.out / f"round{r + 1}-{contender.key}" if options.profile else None
            if profile_dir is not None:
                profile_dir.mkdir(parents=True, exist_ok=True)
            this[contender.key] = attribute(
                contender,
                options.workload,
                runs=options.runs,
                warmup=options.warmup,
                log_dir=log_dir,
                profile_dir=profile_dir,
                rate=options.rate,
            )
            print(f"  {json.dumps(this[contender.key]['cpu_ms_by_process'])}", flush=True)
        measured.append(this)
    summary = summarise(measured)
    names = {c.key: c.name for c in contenders}
    print(
        f"\n{options.workload} workload, {options.runs} runs, {options.rounds} round(s);"
        " median (min–max) of the rounds"
    )
    print(table(summary, names))
    out = options.out / "attribution.json"
    document = {
        "command": " ".join(["python -m bench.attribution", *(argv or sys.argv[1:])]),
        "workload": options.workload,
        "runs": options.runs,
        "summary": summary,
        "rounds_measured": measured,
    }
    out.write_text(json.dumps(document, indent=2) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
