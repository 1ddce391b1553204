"""The dispatcher's CPU per low-load event, part by part, while a real pool attempts the runs.

The bench (`bench.bench`) reads the dispatcher's CPU from outside, as one figure. This splits it:
the dispatcher serves in this process, on a fresh PostgreSQL database (the nudge trigger
installed) and a private Redis, while a real `actonce worker` (prefork, 2 children) attempts what
it sends. Events the bench's rule hears are published one at a time, `--gap` seconds apart, from a
thread with a runtime of its own, each round into a workspace of its own. The dispatcher's loop
thread's CPU over a round is split into its polls' evaluation and sends, the sends alone
(`Dispatcher._send`: the sent marks and the publish, `task-sent` event included), the due scans
and sweeps, the notifications it heard (`Nudges._notified`), the heartbeat, and the rest (its
loop's own)::

    python -m bench.dispatcher_split --rounds 3 --events 120
"""

import argparse
import asyncio
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from reflexr.core import SourceActor

import actonce.worker.dispatching.dispatcher as dispatching
from actonce.worker.app import make_celery
from actonce.worker.definition import load_definition
from actonce.worker.dispatching.dispatcher import Dispatcher
from actonce.worker.process.health import beat
from actonce.worker.process.runtime import Runtime
from actonce.worker.settings import Settings
from actonce.worker.storage.migrate import migrate
from bench.definition import BenchRequested, prepare
from bench.stores import fresh_stores
from lab.pool import LocalPool
from lab.redis import find_or_start_redis

FEED: Final = SourceActor(name="bench-split")
PARTS: Final = ("loop", "polls", "sends", "due_and_sweeps", "notifications", "heartbeat", "rest")
"""The columns, in ms of the loop thread's CPU per event; `sends` is part of `polls`."""


@dataclass
class ThreadClock:
    """Thread CPU spent inside the functions it wraps, by name."""

    spent: dict[str, float] = field(default_factory=dict)

    def wrap[**P, R](self, name: str, function: Callable[P, R]) -> Callable[P, R]:
        """`function`, counting its thread CPU under `name`."""
        self.spent.setdefault(name, 0.0)

        def counted(*args: P.args, **kwargs: P.kwargs) -> R:
            began = time.thread_time()
            try:
                return function(*args, **kwargs)
            finally:
                self.spent[name] += time.thread_time() - began

        return counted


def split_round(
    runtime: Runtime, publisher: Runtime, dispatcher: Dispatcher, clock: ThreadClock, args: Any
) -> dict[str, float]:
    """Publish `args.events` events `args.gap` apart into a fresh workspace while `dispatcher`
    serves; return each part's ms of loop-thread CPU per event."""
    workspace = f"split-{time.monotonic_ns():x}"
    publisher.run(prepare(publisher.artifactr, "t", workspace))
    opened = publisher.run(publisher.reflexr.open("t", workspace, actor=FEED))

    def publish() -> None:
        for i in range(args.events):
            began = time.monotonic()
            publisher.run(opened.publish(BenchRequested(key=f"e{i}")))
            time.sleep(max(0.0, args.gap - (time.monotonic() - began)))

    async def serve() -> dict[str, float]:
        stop = asyncio.Event()
        serving = asyncio.ensure_future(dispatcher.serve(stop))
        await asyncio.sleep(2.0)  # listening, its first polls made
        stats, before = dispatcher.stats, dict(clock.spent)
        polls, sweeps = stats.firing_cpu_s, stats.sending_cpu_s
        fired, began = stats.fired, time.thread_time()
        # Another thread: publishing is the app's CPU, not the dispatcher's.
        await asyncio.get_running_loop().run_in_executor(None, publish)
        for _ in range(600):
            if stats.fired - fired >= args.events:
                break
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.5)  # the last attempt's run facts, heard
        loop_s = time.thread_time() - began
        spent = {name: clock.spent[name] - before[name] for name in clock.spent}
        parts = {
            "loop": loop_s,
            "polls": stats.firing_cpu_s - polls,
            "sends": spent["sends"],
            "due_and_sweeps": stats.sending_cpu_s - sweeps,
            "notifications": spent["notifications"],
            "heartbeat": spent["heartbeat"],
        }
        parts["rest"] = loop_s - sum(
            parts[name] for name in ("polls", "due_and_sweeps", "notifications", "heartbeat")
        )
        if stats.fired - fired != args.events:
            raise RuntimeError(f"fired {stats.fired - fired} runs for {args.events} events")
        stop.set()
        await serving
        return {name: 1000 * seconds / args.events for name, seconds in parts.items()}

    return runtime.run(serve())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--events", type=int, default=120)
    parser.add_argument("--gap", type=float, default=0.25, help="seconds between events")
    args = parser.parse_args(argv)
    figures: dict[str, list[float]] = {name: [] for name in PARTS}
    with (
        tempfile.TemporaryDirectory() as scratch,
        fresh_stores("postgres", "actonce_split") as stores,
    ):
        server = find_or_start_redis(None, directory=Path(scratch))
        try:
            env = {
                **stores,
                "ACTONCE_APP": "bench.definition:app",
                "ACTONCE_BROKER_URL": server.url,
            }
            settings = Settings.from_env(env)
            asyncio.run(migrate(settings))
            definition = load_definition(settings.app)
            runtime = Runtime(settings, definition, one_run=False).open()
            publisher = Runtime(settings, definition, one_run=False, threaded=True).open()
            dispatcher = Dispatcher(runtime, make_celery(settings))
            clock = ThreadClock()
            # Instance attributes shadow the methods: only this dispatcher is measured.
            setattr(dispatcher, "_send", clock.wrap("sends", dispatcher._send))  # noqa: B010
            nudges = dispatcher._nudges
            setattr(nudges, "_notified", clock.wrap("notifications", nudges._notified))  # noqa: B010
            setattr(dispatching, "beat", clock.wrap("heartbeat", beat))  # noqa: B010
            try:
                with LocalPool(
                    env,
                    workers=1,
                    concurrency=2,
                    dispatcher=False,
                    loglevel="WARNING",
                    log_dir=Path(scratch) / "logs",
                ) as pool:
                    pool.wait_ready(120.0)
                    for round_ in range(args.rounds):
                        parts = split_round(runtime, publisher, dispatcher, clock, args)
                        for name in PARTS:
                            figures[name].append(parts[name])
                        said = ", ".join(f"{name} {parts[name]:.2f}" for name in PARTS)
                        print(f"round {round_ + 1}: {said} ms of CPU per event", flush=True)
            finally:
                setattr(dispatching, "beat", beat)  # noqa: B010
                runtime.run(dispatcher.close())
                publisher.close()
                runtime.close()
        finally:
            server.stop()
    for name in PARTS:
        values = figures[name]
        print(
            f"{name:<15} {statistics.median(values):6.2f} ms per event"
            f" ({min(values):.2f}–{max(values):.2f})"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
