"""A long, steady run of the pool: `python -m bench.soak [--runs N] [--every K] [--plot]`.

N runs of `bench:act` (a notice and one keyed edit of a ledger of the run's own, so no run
re-reads what earlier runs wrote) are fed steadily to a local pool, the one `make chaos` uses
without its faults: a dispatcher and one `actonce worker` with 2 prefork children, on a fresh
PostgreSQL database (`bench.stores.postgres_stores`: the server `ACTONCE_TEST_POSTGRES_SERVER`
names, else 127.0.0.1:5432, else an embedded one) and a private Redis. The harness keeps
`2 * --batch` runs in flight at most. Every K settled runs it takes a sample:

- each process's resident memory and open file descriptors: the worker's main process, each
  prefork child, the dispatcher, and the private Redis;
- Redis's `used_memory` and key count (`DBSIZE`);
- the row count of each of actonce's own tables (`actonce_*`);
- the attempts per second since the sample before.

The first sample is the warm-up. Against it, the targets: every process's resident memory grows
less than `RSS_GROWTH` by the last sample, no process holds more file descriptors (`FD_SLACK`),
Redis holds no more keys that never expire (and no more in all than `STEADY` allows), each
window after warm-up keeps `STEADY` of their median attempts per second and the last keeps
`STEADY` of the first, and every run succeeded. Exit 1 when one is missed. The
figures go to `bench/results/<date>-soak-<N>.json`; `--plot` draws them (`bench.soak_plot`).
"""

import argparse
import asyncio
import contextlib
import json
import logging
import os
import re
import statistics
import sys
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

import artifactr.core as a
import redis
from reflexr.core import SourceActor

from actonce.worker.process.runtime import Runtime
from actonce.worker.settings import Settings
from actonce.worker.storage.migrate import migrate
from bench.definition import BenchRequested, Ledger, app, own_ledger, prepare
from bench.stores import postgres_stores
from lab.footprint import footprint
from lab.pool import LocalPool
from lab.processes import children, run_stoppable
from lab.progress import Progress
from lab.redis import RedisHandle, find_or_start_redis
from lab.tables import actonce_rows, settled_runs

TENANT: Final = "soak"
WORKSPACE: Final = "steady"
FEED: Final = SourceActor(name="soak-feed")
LEDGERS: Final = a.UserActor(id="soak", name="Soak")

RSS_GROWTH: Final = 0.05
"""How much any process's resident memory may grow from the warm-up sample to the last."""

STEADY: Final = 0.8
"""The share of the median window's attempts per second every window after warm-up keeps;
Redis's keys in all, which include marks that expire (`ACTONCE_DEDUPE_TTL_S`) and so follow the
rate, may be the warm-up's over it."""

FD_SLACK: Final = 2
"""How many more descriptors than at warm-up a process may hold at the last sample: a
connection that happens to be open as the sample is read is not a leak, which grows with runs."""

POLL_S: Final = 0.25
"""How often the harness counts settled runs while it feeds."""

SETTLE_TIMEOUT_S: Final = 300.0
"""How long the harness waits without one more run settling before it gives up."""

ID_PART: Final = re.compile(r"[0-9]|^[a-z]+_")
"""A part of a Redis key that is an id (a digit in it, or a prefix such as `fir_`)."""

RESULTS: Final = Path(__file__).resolve().parent / "results"


@dataclass(frozen=True)
class Soaked:
    """What a soak measured and whether it kept its targets."""

    figures: dict[str, Any]
    """Every sample, the targets judged on them, and the run's settings, as written to JSON."""

    @property
    def missed(self) -> list[str]:
        """The targets missed, in words; empty when all were kept."""
        return [t["target"] for t in self.figures["targets"] if not t["kept"]]


def run_soak(
    runs: int, every: int, *, batch: int = 50, log_dir: Path | None = None, show: bool = True
) -> Soaked:
    """Feed `runs` runs to a local pool, sample every `every` settled runs, judge the targets.

    Raises:
        PostgresUnreachable: If no database can be made.
        RedisUnavailable: If no private `redis-server` can be started.
        Stopped: On SIGTERM or SIGINT under `lab.processes.stopping_on_signals` (as
            `asyncio.CancelledError` when it came while runs were fed), once every process it
            started has stopped.
    """
    if runs < 1 or every < 1 or batch < 1:
        raise ValueError(f"runs, every and batch must be 1 or more, not {runs}, {every}, {batch}")
    started = time.monotonic()
    # The machine's other work sets the rate too: the result says how busy it was.
    load_before = [round(x, 2) for x in os.getloadavg()]
    with contextlib.ExitStack() as stack:
        stores, _ = stack.enter_context(postgres_stores("actonce_soak"))
        redis_handle = stack.enter_context(find_or_start_redis(None))
        env = {
            "ACTONCE_APP": "bench.definition:app",
            "ACTONCE_BROKER_URL": redis_handle.url,
            **stores,
        }
        settings = Settings.from_env(env)
        asyncio.run(migrate(settings))
        runtime = Runtime(settings, app, one_run=False).open()
        stack.callback(runtime.close)
        runtime.run(prepare(runtime.artifactr, TENANT, WORKSPACE))
        pool = stack.enter_context(LocalPool(env, workers=1, concurrency=2, log_dir=log_dir))
        pool.wait_ready(90.0)
        progress = stack.enter_context(Progress("soak", runs, bar=None if show else False))
        samples = runtime.run(_feed(runtime, pool, redis_handle, runs, every, batch, progress))
        logs = str(pool.log_dir)
    figures: dict[str, Any] = {
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "runs": runs,
        "every": every,
        "batch": batch,
        "seconds": round(time.monotonic() - started, 1),
        "load_average_before": load_before,
        "load_average_after": [round(x, 2) for x in os.getloadavg()],
        "samples": samples,
        "targets": judge(samples, runs),
        "logs": logs,
    }
    return Soaked(figures)


def judge(samples: list[dict[str, Any]], runs: int) -> list[dict[str, Any]]:
    """Return each target (`target`, `kept`, `detail`), judged on `samples` after the first."""
    targets: list[dict[str, Any]] = []

    def check(target: str, kept: bool, detail: str) -> None:
        targets.append({"target": target, "kept": kept, "detail": detail})

    last = samples[-1]
    check(
        "every run succeeded",
        last["succeeded"] == runs,
        f"{last['succeeded']} of {runs} succeeded, {last['settled'] - last['succeeded']} not",
    )
    if len(samples) < 2:
        check("a sample after warm-up", False, "one sample only: lower --every")
        return targets
    first = samples[0]
    for name, was in first["processes"].items():
        now = last["processes"].get(name)
        if now is None:
            check(f"{name} still runs", False, f"{name} was not found at the last sample")
            continue
        growth = now["rss_kb"] / was["rss_kb"] - 1
        check(
            f"{name}: resident memory grows less than {RSS_GROWTH:.0%}",
            growth < RSS_GROWTH,
            f"{was['rss_kb']} KiB -> {now['rss_kb']} KiB ({growth:+.1%})",
        )
        check(
            f"{name}: no more file descriptors (give or take {FD_SLACK})",
            now["fds"] <= was["fds"] + FD_SLACK,
            f"{was['fds']} -> {now['fds']}",
        )
    check(
        "Redis: no more keys that never expire",
        last["redis"]["lasting"] <= first["redis"]["lasting"],
        f"{first['redis']['lasting']} -> {last['redis']['lasting']}",
    )
    check(
        f"Redis: no more keys in all than the warm-up's over {STEADY:.0%} (expiring keys follow "
        "the rate)",
        last["redis"]["keys"] <= first["redis"]["keys"] / STEADY,
        f"{first['redis']['keys']} -> {last['redis']['keys']}",
    )
    rates = [s["attempts_per_s"] for s in samples[1:]]
    median = statistics.median(rates)
    check(
        f"steady: every window after warm-up keeps {STEADY:.0%} of their median attempts/s",
        min(rates) >= STEADY * median,
        f"median {median:.1f}/s, lowest {min(rates):.1f}/s",
    )
    check(
        f"steady: the last window keeps {STEADY:.0%} of the first after warm-up",
        rates[-1] >= STEADY * rates[0],
        f"{rates[0]:.1f}/s -> {rates[-1]:.1f}/s",
    )
    return targets


def report(soaked: Soaked) -> Iterator[str]:
    """The lines `python -m bench.soak` prints: one per sample, then each target."""
    for s in soaked.figures["samples"]:
        memory = " ".join(
            f"{n}={p['rss_kb'] // 1024}MiB/{p['fds']}fd" for n, p in s["processes"].items()
        )
        rows = " ".join(f"{name}={count}" for name, count in s["tables"].items())
        yield (
            f"{s['settled']:>7} runs  {s['attempts_per_s']:6.1f} attempts/s  {memory}  "
            f"redis={s['redis']['used_memory'] // 1024}KiB/{s['redis']['keys']}keys  {rows}"
        )
    for target in soaked.figures["targets"]:
        yield f"{'ok    ' if target['kept'] else 'MISSED'} {target['target']}: {target['detail']}"


def main(argv: list[str] | None = None) -> int:
    """`python -m bench.soak`: soak, print and save the samples, exit 1 when a target is missed."""
    parser = argparse.ArgumentParser(prog="python -m bench.soak", description=__doc__)
    parser.add_argument("--runs", type=int, default=100_000)
    parser.add_argument("--every", type=int, default=10_000, help="sample every K settled runs")
    parser.add_argument("--batch", type=int, default=50, help="runs published at a time")
    parser.add_argument("--out", type=Path, default=None, help="the JSON (bench/results/…)")
    parser.add_argument("--plot", type=Path, nargs="?", const=Path("docs/images/soak.png"))
    options = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    soaked = run_soak(options.runs, options.every, batch=options.batch)
    for line in report(soaked):
        print(line)
    day = datetime.now(UTC).date().isoformat()
    out: Path = options.out or RESULTS / f"{day}-soak-{options.runs}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(soaked.figures, indent=2) + "\n")
    print(f"wrote {out}")
    if options.plot is not None:
        from bench.soak_plot import plot

        plot(soaked.figures, options.plot)
        print(f"drew {options.plot}")
    return 1 if soaked.missed else 0


# ─── how ──────────────────────────────────────────────────────────────────────


async def _feed(
    runtime: Runtime,
    pool: LocalPool,
    redis_handle: RedisHandle,
    runs: int,
    every: int,
    batch: int,
    progress: Progress,
) -> list[dict[str, Any]]:
    """Publish `runs` runs, `2 * batch` in flight at most, and sample every `every` settled."""
    reflexr_ws = await runtime.reflexr.open(TENANT, WORKSPACE, actor=FEED)
    artifactr_ws = await runtime.artifactr.open(TENANT, WORKSPACE, actor=LEDGERS)
    engine = runtime.engine("reflexr")
    client = redis.Redis.from_url(redis_handle.url)
    samples: list[dict[str, Any]] = []
    began = time.monotonic()
    published = 0
    window = (began, 0)  # when the window began, and the attempts by then
    next_sample = min(every, runs)
    moved = began
    try:
        while True:
            settled = await settled_runs(engine)
            now = time.monotonic()
            if settled.runs > progress.done:
                moved = now
            elif now - moved > SETTLE_TIMEOUT_S:
                raise TimeoutError(f"no run settled for {SETTLE_TIMEOUT_S}s; see {pool.log_dir}")
            # This window's rate so far: the last sample's would lag a window behind.
            rate = (settled.attempts - window[1]) / max(now - window[0], 1e-3)
            in_flight = published - settled.runs
            progress.update(settled.runs, f"{in_flight} in flight, {rate:.1f} attempts/s")
            if settled.runs >= next_sample:
                seconds = now - window[0]
                rate = (settled.attempts - window[1]) / seconds if seconds > 0 else 0.0
                sample = await _sample(runtime, pool, redis_handle, client)
                samples.append(
                    {
                        "settled": settled.runs,
                        "succeeded": settled.succeeded,
                        "attempts": settled.attempts,
                        "elapsed_s": round(now - began, 1),
                        "attempts_per_s": round(rate, 2),
                        **sample,
                    }
                )
                window = (now, settled.attempts)
                if settled.runs >= runs:
                    return samples
                next_sample = min(next_sample + every, runs)
            if published < runs and in_flight < 2 * batch:
                keys = [f"s{i:07d}" for i in range(published, min(published + batch, runs))]
                for key in keys:
                    ledger = a.create_artifact(Ledger(), artifact_id=own_ledger(key))
                    with contextlib.suppress(a.InvalidState):  # made before a restart
                        await artifactr_ws.commit(ledger)
                    event = BenchRequested(key=key, ledger=own_ledger(key))
                    await reflexr_ws.publish(event, id=f"evt_{key}")
                published += len(keys)
            else:
                await asyncio.sleep(POLL_S)
    finally:
        client.close()


async def _sample(
    runtime: Runtime, pool: LocalPool, redis_handle: RedisHandle, client: redis.Redis
) -> dict[str, Any]:
    """Every process's footprint, Redis's memory and keys, and actonce's rows, now."""
    pids: dict[str, int | None] = {"worker": pool.pid("worker0")}
    worker = pids["worker"]
    for i, kid in enumerate(sorted(children(worker) if worker is not None else [])):
        pids[f"child{i}"] = kid
    pids["dispatcher"] = pool.pid("dispatcher")
    pids["redis"] = redis_handle.pid
    processes = {
        name: found.row()
        for name, pid in pids.items()
        if pid is not None and (found := footprint(pid)) is not None
    }
    memory = await asyncio.to_thread(client.info, "memory")
    keys = await asyncio.to_thread(client.dbsize)
    return {
        "processes": processes,
        "redis": {
            "used_memory": int(memory["used_memory"]),
            "keys": int(keys),
            **await asyncio.to_thread(_keys, client),
        },
        "tables": await actonce_rows(runtime.engine("actonce")),
    }


def _keys(client: redis.Redis) -> dict[str, Any]:
    """Redis's keys: how many never expire, and how many of each kind (a key with its id-like
    parts, `fir_…` or digits, as `*`)."""
    keys = list(client.scan_iter(count=1000))
    pipeline = client.pipeline(transaction=False)
    for key in keys:
        pipeline.ttl(key)
    ttls = pipeline.execute()
    kinds: Counter[str] = Counter()
    for key in keys:
        parts = key.decode(errors="replace").split(":")
        kinds[":".join("*" if ID_PART.search(part) else part for part in parts)] += 1
    return {"lasting": sum(1 for ttl in ttls if ttl == -1), "kinds": dict(sorted(kinds.items()))}


if __name__ == "__main__":
    sys.exit(run_stoppable(main, "soak"))
