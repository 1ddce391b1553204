"""The noisy-neighbour bench: does one tenant's burst hold every other tenant's runs back?

A pool of 2 prefork children (one `actonce worker -c 2`) and its dispatcher, on a fresh PostgreSQL
database and a private Redis, runs the bench's rule (`bench.definition`, one notice a run, so no
two runs conflict), once with fair share off (`ACTONCE_FAIR_SHARE=false`: every due run into the
queue, first in, first out) and once with the defaults (fair share on). Each mode measures:

- `alone`: a quiet tenant publishes an event every `--gap` seconds, `--quiet` of them; each
  run's settle latency is its event's append time to its run's `updated_at`;
- `burst`: another tenant publishes `--burst` events at once while the quiet tenant keeps
  publishing every `--gap` seconds; the quiet runs whose events came before the burst settled
  give the latency during it, and the burst its attempts per second (its runs over the time from
  its first commit to its last run's `updated_at`);
- `tenants`: `--tenants` tenants publish `--each` events each at once; each tenant's finishing
  time is its last run's `updated_at` from the first commit, and the spread is the last
  tenant's over the first's.

The figures go to `bench/results/<date>-noisy.json` and a picture to
`docs/images/noisy-neighbour.png`::

    python -m bench.noisy                  # make bench-noisy: the whole of it, several minutes
    python -m bench.noisy --small          # a quick look: a burst of 100, 4 tenants of 30
"""

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Any, Final

from reflexr.core import Run, SourceActor
from reflexr.sql import SqlStorage
from reflexr.workspace import WorkspaceRef

from actonce.worker.definition import load_definition
from actonce.worker.process.runtime import Runtime
from actonce.worker.settings import Settings
from actonce.worker.storage.migrate import migrate
from bench.definition import BenchRequested, prepare
from bench.measure import machine
from bench.stores import fresh_stores
from bench.workloads import percentile
from lab.pool import LocalPool
from lab.redis import find_or_start_redis
from lab.settle import TERMINAL

HERE: Final = Path(__file__).resolve().parent
RESULTS: Final = HERE / "results"
PICTURE: Final = HERE.parent / "docs" / "images" / "noisy-neighbour.png"
FEED: Final = SourceActor(name="bench-noisy")
MODES: Final = {"fifo": "false", "fair": "true"}
"""Each mode's `ACTONCE_FAIR_SHARE`."""

WORKSPACE: Final = "w"
CHUNK: Final = 250
"""Events a publish commits at once."""


def main(argv: list[str] | None = None) -> int:
    """Run the bench; print and keep its figures, and draw its picture."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--burst", type=int, default=1000, help="the noisy tenant's events")
    parser.add_argument("--quiet", type=int, default=20, help="the quiet tenant's events alone")
    parser.add_argument("--gap", type=float, default=0.5, help="seconds between quiet events")
    parser.add_argument("--tenants", type=int, default=10, help="tenants bursting at once")
    parser.add_argument("--each", type=int, default=200, help="events of each of those")
    parser.add_argument("--modes", default=",".join(MODES), help="fifo, fair, or both")
    parser.add_argument("--small", action="store_true", help="a quick look, not the figures")
    parser.add_argument("--out", type=Path, default=None, help="the JSON (bench/results/…)")
    parser.add_argument("--picture", type=Path, default=PICTURE)
    args = parser.parse_args(argv)
    if args.small:
        args.burst, args.quiet, args.tenants, args.each = 100, 6, 4, 30
    began = machine()
    figures: dict[str, Any] = {"pool": "1 worker x 2 prefork children, PostgreSQL", "modes": {}}
    with tempfile.TemporaryDirectory(prefix="actonce-noisy-") as scratch:
        server = find_or_start_redis(None, directory=Path(scratch))
        try:
            chosen = [mode for mode in MODES if mode in args.modes.split(",")]
            for db, (mode, fair) in enumerate(((m, MODES[m]) for m in chosen), start=1):
                # A database of each mode's own: the second mode does not run on the first's rows.
                with fresh_stores("postgres", f"actonce_noisy_{mode}") as stores:
                    env = {
                        **stores,
                        "ACTONCE_APP": "bench.definition:app",
                        "ACTONCE_BROKER_URL": server.url.rsplit("/", 1)[0] + f"/{db}",
                        "ACTONCE_FAIR_SHARE": fair,
                    }
                    print(f"{mode}: ACTONCE_FAIR_SHARE={fair}", flush=True)
                    figures["modes"][mode] = _mode(env, mode, args, Path(scratch) / mode)
        finally:
            server.stop()
    figures["machine_busy_share"] = round(machine().busy_share(began), 3)
    figures["settings"] = {
        k: getattr(args, k) for k in ("burst", "quiet", "gap", "tenants", "each")
    }
    out = (
        args.out
        or RESULTS / f"{date.today().isoformat()}-noisy{'-small' if args.small else ''}.json"
    )
    out.write_text(json.dumps(figures, indent=2) + "\n")
    for line in report(figures):
        print(line)
    print(f"figures: {out}")
    if not args.small or args.picture != PICTURE:
        draw(figures, args.picture)
        print(f"picture: {args.picture}")
    return 0


def report(figures: dict[str, Any]) -> list[str]:
    """The figures, a line each."""
    lines = []
    for mode, got in figures["modes"].items():
        alone, during = got["alone"], got["burst"]["quiet"]
        lines.append(
            f"{mode}: quiet p50/p95 alone {alone['p50_ms']}/{alone['p95_ms']} ms, during the "
            f"burst {during['p50_ms']}/{during['p95_ms']} ms; burst "
            f"{got['burst']['attempts_per_s']} attempts/s; {got['tenants']['count']} tenants "
            f"finish {got['tenants']['first_s']}-{got['tenants']['last_s']} s "
            f"(spread {got['tenants']['spread']}x)"
        )
    modes = figures["modes"]
    if {"fifo", "fair"} <= set(modes):
        kept = modes["fair"]["burst"]["attempts_per_s"] / modes["fifo"]["burst"]["attempts_per_s"]
        target = 2 * modes["fair"]["alone"]["p95_ms"] + 500
        lines.append(
            f"targets: burst throughput kept {kept:.0%} (>= 95%); quiet p95 during the burst "
            f"{modes['fair']['burst']['quiet']['p95_ms']} ms (<= {target:.0f} ms); tenants' "
            f"spread {modes['fair']['tenants']['spread']}x (<= 1.5x)"
        )
    lines.append(f"machine busy: {figures['machine_busy_share']:.0%} of its cores")
    return lines


def draw(figures: dict[str, Any], picture: Path) -> None:
    """Plot the quiet tenant's latencies and the tenants' finishing times, by mode."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    modes = figures["modes"]
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    groups = [("alone", "p50"), ("alone", "p95"), ("burst", "p50"), ("burst", "p95")]
    width = 0.8 / max(1, len(modes))
    for i, (mode, got) in enumerate(modes.items()):
        values = [
            (got["alone"] if phase == "alone" else got["burst"]["quiet"])[f"{q}_ms"] or 0
            for phase, q in groups
        ]
        left.bar([g + i * width for g in range(len(groups))], values, width, label=mode)
    left.set_xticks([g + width * (len(modes) - 1) / 2 for g in range(len(groups))])
    left.set_xticklabels([f"{q}\n{'alone' if p == 'alone' else 'during burst'}" for p, q in groups])
    left.set_yscale("log")
    left.set_ylabel("quiet tenant's settle latency (ms)")
    left.set_title(f"A quiet tenant, alone and during a burst of {figures['settings']['burst']}")
    left.legend()
    for mode, got in modes.items():
        finished = sorted(got["tenants"]["finished_s"].values())
        right.plot(range(1, len(finished) + 1), finished, marker="o", label=mode)
    right.set_xlabel("tenants, by finishing order")
    right.set_ylabel("finished after (s)")
    right.set_ylim(bottom=0)
    settings = figures["settings"]
    right.set_title(f"{settings['tenants']} tenants bursting {settings['each']} runs at once")
    right.legend()
    fig.tight_layout()
    picture.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(picture, dpi=110)
    plt.close(fig)


# ─── how ──────────────────────────────────────────────────────────────────────


def _mode(env: dict[str, str], mode: str, args: Any, logs: Path) -> dict[str, Any]:
    """Start a pool with `env` and measure the three phases on tenants of `mode`'s own."""
    settings = Settings.from_env(env)
    asyncio.run(migrate(settings))
    runtime = Runtime(settings, load_definition(settings.app), one_run=False).open()
    try:
        with LocalPool(env, workers=1, concurrency=2, loglevel="WARNING", log_dir=logs) as pool:
            pool.wait_ready(120.0)
            alone = runtime.run(_alone(runtime, f"{mode}-quiet-alone", args))
            print(f"  alone: {alone}", flush=True)
            burst = runtime.run(_burst(runtime, mode, args))
            shown = {
                **burst,
                "quiet": {k: v for k, v in burst["quiet"].items() if k != "by_offset_s"},
            }
            print(f"  burst: {shown}", flush=True)
            tenants = runtime.run(_tenants(runtime, mode, args))
            print(f"  tenants: {tenants}", flush=True)
    finally:
        runtime.close()
    return {"alone": alone, "burst": burst, "tenants": tenants}


async def _alone(runtime: Runtime, tenant: str, args: Any) -> dict[str, Any]:
    await prepare(runtime.artifactr, tenant, WORKSPACE)
    await _trickle(runtime, tenant, args.quiet, args.gap)
    await _settled(runtime, [tenant], args.quiet)
    return _latencies([ms for _, ms in await _quiet_latencies(runtime, tenant)])


async def _burst(runtime: Runtime, mode: str, args: Any) -> dict[str, Any]:
    noisy, quiet = f"{mode}-noisy", f"{mode}-quiet"
    await prepare(runtime.artifactr, noisy, WORKSPACE)
    await prepare(runtime.artifactr, quiet, WORKSPACE)
    started = await _publish(runtime, noisy, args.burst)
    # The quiet tenant publishes every `gap` until the burst has settled.
    trickling = asyncio.ensure_future(_trickle(runtime, quiet, None, args.gap))
    try:
        await _settled(runtime, [noisy], args.burst)
    finally:
        trickling.cancel()
        await asyncio.gather(trickling, return_exceptions=True)
    runs = await _runs(runtime, noisy)
    ended = max(run.updated_at for run in runs)
    await _settled(runtime, [quiet], len(await _runs(runtime, quiet)))
    quiet_runs = await _quiet_latencies(runtime, quiet, before=ended)
    seconds = (ended - started).total_seconds()
    # Each quiet run's latency by when its event came in the burst: a slow one says why.
    by_offset = sorted(
        (round((at - started).total_seconds(), 2), round(ms, 1)) for at, ms in quiet_runs
    )
    return {
        "runs": len(runs),
        "seconds": round(seconds, 2),
        "attempts_per_s": round(len(runs) / seconds, 2),
        "failed": sum(run.status != "succeeded" for run in runs),
        "quiet": {**_latencies([ms for _, ms in quiet_runs]), "by_offset_s": by_offset},
    }


async def _tenants(runtime: Runtime, mode: str, args: Any) -> dict[str, Any]:
    names = [f"{mode}-t{i}" for i in range(args.tenants)]
    for name in names:
        await prepare(runtime.artifactr, name, WORKSPACE)
    started: datetime | None = None
    for name in names:
        at = await _publish(runtime, name, args.each)
        started = started or at
    assert started is not None
    await _settled(runtime, names, args.each)
    finished = {
        name: round(
            (max(r.updated_at for r in await _runs(runtime, name)) - started).total_seconds(), 2
        )
        for name in names
    }
    first, last = min(finished.values()), max(finished.values())
    return {
        "count": len(names),
        "each": args.each,
        "finished_s": finished,
        "first_s": first,
        "last_s": last,
        "spread": round(last / first, 2) if first > 0 else None,
    }


async def _publish(runtime: Runtime, tenant: str, count: int) -> datetime:
    """Publish `count` events at once, `CHUNK` a transaction; return when the first committed."""
    opened = await runtime.reflexr.open(tenant, WORKSPACE, actor=FEED)
    started: datetime | None = None
    for first in range(0, count, CHUNK):
        keys = [f"{tenant}-{i}" for i in range(first, min(count, first + CHUNK))]
        events = [BenchRequested(key=key, writes=1) for key in keys]
        await opened.publish_many(events, ids=[f"evt_{key}" for key in keys])
        started = started or datetime.now(UTC)
    return started or datetime.now(UTC)


async def _trickle(runtime: Runtime, tenant: str, count: int | None, gap_s: float) -> None:
    """Publish one event every `gap_s`, `count` of them (None: until cancelled)."""
    opened = await runtime.reflexr.open(tenant, WORKSPACE, actor=FEED)
    next_at, i = time.monotonic(), 0
    while count is None or i < count:
        await asyncio.sleep(max(0.0, next_at - time.monotonic()))
        next_at += gap_s
        await opened.publish(BenchRequested(key=f"{tenant}-{i}", writes=1), id=f"evt_{tenant}-{i}")
        i += 1


async def _runs(runtime: Runtime, tenant: str) -> list[Run]:
    storage: Any = runtime.reflexr.storage
    return await SqlStorage.runs(storage, WorkspaceRef(tenant, WORKSPACE))


async def _settled(
    runtime: Runtime, tenants: list[str], each: int, timeout_s: float = 1800
) -> None:
    """Wait until each of `tenants` has `each` runs, all settled, reading every second."""
    deadline = time.monotonic() + timeout_s
    while True:
        done = True
        for tenant in tenants:
            runs = await _runs(runtime, tenant)
            if len(runs) < each or any(run.status not in TERMINAL for run in runs):
                done = False
                break
        if done:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"{tenants} not settled after {timeout_s}s")
        await asyncio.sleep(1.0)


async def _quiet_latencies(
    runtime: Runtime, tenant: str, *, before: datetime | None = None
) -> list[tuple[datetime, float]]:
    """Each succeeded run's event's append time and settle latency in ms from it; only events
    appended before `before`, if given."""
    opened = await runtime.reflexr.open(tenant, WORKSPACE, actor=FEED)
    appended = {e.seq: e.ts for e in await opened.read(types=[BenchRequested.event_type])}
    latencies = []
    for run in await _runs(runtime, tenant):
        at = appended.get(run.matched[0]) if run.matched else None
        if at is None or run.status != "succeeded" or (before is not None and at >= before):
            continue
        latencies.append((at, (run.updated_at - at).total_seconds() * 1000))
    return latencies


def _latencies(values: list[float]) -> dict[str, Any]:
    def rounded(value: float | None) -> float | None:
        return None if value is None else round(value, 1)

    return {
        "runs": len(values),
        "p50_ms": rounded(statistics.median(values)) if values else None,
        "p95_ms": rounded(percentile(values, 0.95)),
    }


if __name__ == "__main__":
    raise SystemExit(main())
