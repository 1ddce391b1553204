"""Where a contender's CPU goes at low load, process by process, and what it asks of Redis.

    python -m bench.low_profile [--contender pool2] [--events 120] [--out var/low-profile]

The contender starts on a fresh PostgreSQL database, as in `bench.bench`, and is warmed up; then,
for the low-load window alone (`--events` events of the `own` workload published 0.25 s apart,
until every run settled and `TAIL_S` after), py-spy records each of its Python processes, psutil
reads their CPU, and, for the pool, a `MONITOR` connection counts the commands its Redis served
by name (their arguments are not kept). It prints each process's CPU per event and the part of
it spent carrying messages (`queue_share`), the Redis commands per event, and `bench.profile`'s
summary of each process's profile, and writes the figures to `OUT/summary.json` and the raw
profiles beside them.

A profile of the whole bench (`bench.profile`'s docstring) mixes in what a window never pays:
imports, forking, the burst. This one is the low load's own. Redis's CPU is higher here than in
`bench.bench`: it also writes every command to the monitor. py-spy reads a process's memory 250
times a second (`--rate`), which costs its targets little, but not nothing: the CPU figures
are `bench.bench`'s to state; these say where they go.
"""

import argparse
import contextlib
import json
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any, Final

import redis

from actonce.worker.dispatching.dispatcher import CATCH_UP_ENTRIES
from bench import profile
from bench import workloads as w
from bench.bench import GAP_S, TAIL_S, bench_runtime, contender_env
from bench.contenders import KNOWN, running
from bench.measure import Reading, Sampler, window

PY_SPY: Final = shutil.which("py-spy", path=str(Path(sys.executable).parent)) or "py-spy"
"""py-spy beside this interpreter (the project's environment installs it), else on `PATH`."""

ATTACHED_S: Final = 1.0
"""How long py-spy is given to attach to every process before the window opens."""

UNPROFILED: Final = frozenset({"postgres", "redis", "other"})
"""Labels of processes not recorded: not Python, or not the contender's (py-spy itself)."""

QUEUE: Final = frozenset({"celery", "kombu", "billiard", "redis"})
"""The packages that carry an attempt from the dispatcher to a worker child and back."""

WORK: Final = frozenset(
    {"sqlalchemy", "asyncpg", "greenlet", "asyncio", "actonce", "reflexr", "artifactr", "relayr"}
)
"""The packages that fire runs and attempt them (and the loop they run on): what a reactor
does too, in one process."""


def queue_share(lines: list[str]) -> float:
    """The share of a raw profile's busy samples spent carrying messages: those whose innermost
    frame of a package in `QUEUE` or `WORK` is of one in `QUEUE`.

    A child's task runs under Celery's tracer, but the frames inside it are the attempt's; a
    dispatcher's send runs inside actonce's loop, but the frames inside it are kombu's and
    redis-py's. What is carried is the hop a reactor does not make: Celery's main process
    whole, the dispatcher's sends, marks and heartbeat, a child's reading of its task and
    return of its result. Frames of neither (the standard library's) decide nothing.
    """
    busy = carried = 0
    for line in lines:
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames = stack.split(";")
        if frames[-1] in profile.IDLE:
            continue
        busy += int(count)
        for frame in reversed(frames):
            found = profile.package(frame)
            if found in QUEUE:
                carried += int(count)
                break
            if found in WORK:
                break
    return carried / busy if busy else 0.0


class RedisCommands:
    """The commands a Redis serves, counted by name from a `MONITOR` connection, while open."""

    def __init__(self, url: str) -> None:
        self._monitor = redis.Redis.from_url(url).monitor()  # type: ignore[no-untyped-call]
        self._counts: Counter[str] = Counter()
        self._counting = True
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._count, name="redis-monitor", daemon=True)

    def __enter__(self) -> "RedisCommands":
        self._monitor.__enter__()
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        with self._lock:
            self._counting = False
        self._monitor.connection.disconnect()
        self._thread.join(5)

    def counts(self) -> Counter[str]:
        """The commands counted so far, by name."""
        with self._lock:
            return Counter(self._counts)

    def _count(self) -> None:
        try:
            while True:
                command = self._monitor.next_command()["command"]
                with self._lock:
                    if not self._counting:
                        return
                    self._counts[command.split(" ", 1)[0].strip('"').upper()] += 1
        except (redis.ConnectionError, OSError, ValueError):
            return  # disconnected by __exit__


class Recording:
    """py-spy recording each of `processes` into `directory`, from entering to leaving."""

    def __init__(self, processes: list[tuple[str, int]], directory: Path, rate: int) -> None:
        self.files = {
            (label, pid): directory / f"{label.replace(':', '-')}-{pid}.txt"
            for label, pid in processes
        }
        self._rate = rate
        self._spies: list[subprocess.Popen[bytes]] = []

    def __enter__(self) -> "Recording":
        for (_, pid), path in self.files.items():
            command = [PY_SPY, "record", "--nonblocking", "-r", str(self._rate), "-f", "raw"]
            self._spies.append(
                subprocess.Popen(
                    [*command, "-o", str(path), "--pid", str(pid)],
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.PIPE,
                )
            )
        time.sleep(ATTACHED_S)
        for spy in self._spies:
            if spy.poll() is not None:
                why = spy.stderr.read().decode(errors="replace") if spy.stderr else ""
                self.__exit__()  # the others are recording: stop them too
                raise RuntimeError(f"py-spy could not record: {why.strip()}")
        return self

    def still_recording(self) -> int:
        """How many of the py-spy processes are still running."""
        return sum(spy.poll() is None for spy in self._spies)

    def __exit__(self, *_: object) -> None:
        for spy in self._spies:
            if spy.poll() is None:
                spy.send_signal(2)  # SIGINT: py-spy writes what it recorded, then exits
        for spy in self._spies:
            spy.wait(60)


def profile_low_load(key: str, *, events: int, warmup: int, rate: int, out: Path) -> dict[str, Any]:
    """Run contender `key` through warm-up and a low-load window; return the window's figures
    and write the raw profiles under `out`."""
    contender = next((c for c in KNOWN if c.key == key), None)
    if contender is None:
        raise SystemExit(f"unknown contender {key!r}: one of {', '.join(c.key for c in KNOWN)}")
    out.mkdir(parents=True, exist_ok=True)
    log_dir = Path(tempfile.mkdtemp(prefix="actonce-low-profile-"))
    warm, slow = w.keys("w", warmup), w.keys("s", events)
    with bench_runtime(one_run=False) as (stores, runtime, _):
        runtime.run(w.prepare_workspace(runtime, warm + slow, "own"))
        env = contender_env(stores, Path(tempfile.mkdtemp(prefix="sql-", dir=log_dir)))
        with Sampler(None) as sampler, running(contender, env, log_dir) as broker_url:
            runtime.run(w.publish_burst(runtime, warm, "own"))
            runtime.run(w.settled(runtime, "own", warmup, 120, every_s=0.5))
            runtime.run(w.caught_up(runtime, "own", CATCH_UP_ENTRIES, 60))
            processes = [k for k in sampler.mark() if k[0] not in UNPROFILED]
            with (
                Recording(processes, out, rate) as recording,
                _commands_of(broker_url) as commands,
            ):
                before = sampler.mark()
                runtime.run(w.trickle(runtime, slow, GAP_S, "own"))
                runtime.run(w.settled(runtime, "own", warmup + events, 120, every_s=0.5))
                time.sleep(TAIL_S)
                after = sampler.mark()
                served = commands.counts() if commands is not None else Counter[str]()
    return window_figures(key, events, before, after, served, recording.files)


def _commands_of(broker_url: str | None) -> contextlib.AbstractContextManager[RedisCommands | None]:
    """Count the commands of the pool's broker; nothing for a reactor, which has none."""
    return RedisCommands(broker_url) if broker_url else contextlib.nullcontext()


def window_figures(
    key: str,
    events: int,
    before: Reading,
    after: Reading,
    served: Counter[str],
    files: dict[tuple[str, int], Path],
) -> dict[str, Any]:
    """The figures of a window between two CPU marks: per event, by process, with the part
    spent carrying messages, the Redis commands `served`, and where the raw `files` are."""
    spent = window(before, after, lambda label: label not in ("postgres", "other"))
    # Each process's CPU in the window times its profile's share spent on the queue; Redis is
    # all queue, and so is a prefork worker's main process. An estimate: samples are of time on
    # a CPU, taken `--rate` times a second.
    carried: dict[str, float] = {"redis": spent.get("redis", 0.0)} if "redis" in spent else {}
    prefork = any(label == "celery:children" for label, _ in files)
    for (label, pid), path in files.items():
        lines = path.read_text(errors="replace").splitlines() if path.exists() else []
        cpu_s = max(0.0, after.get((label, pid), 0.0) - before.get((label, pid), 0.0))
        # A prefork worker's main process only carries (actonce's intake check included: it
        # screens the messages); a threads worker's runs the attempts too, and is told apart.
        share = 1.0 if label == "celery" and prefork else queue_share(lines)
        carried[label] = carried.get(label, 0.0) + cpu_s * share
    return {
        "contender": key,
        "events": events,
        "cpu_ms_per_event": round(sum(spent.values()) * 1000 / events, 2),
        "cpu_ms_per_event_by_process": {
            label: round(s * 1000 / events, 2) for label, s in sorted(spent.items())
        },
        "queue_cpu_ms_per_event": round(sum(carried.values()) * 1000 / events, 2),
        "queue_cpu_ms_per_event_by_process": {
            label: round(s * 1000 / events, 2) for label, s in sorted(carried.items())
        },
        "redis_commands_per_event": {
            name: round(n / events, 2) for name, n in served.most_common()
        },
        "profiles": {f"{label} {pid}": str(path) for (label, pid), path in files.items()},
    }


def main(argv: list[str] | None = None) -> int:
    """`python -m bench.low_profile`: profile one contender's low load and print where it goes."""
    parser = argparse.ArgumentParser(prog="python -m bench.low_profile", description=__doc__)
    parser.add_argument("--contender", default="pool2", help="a `bench.bench` key (pool2)")
    parser.add_argument("--events", type=int, default=120, help="low-load events (120)")
    parser.add_argument("--warmup", type=int, default=30, help="warm-up runs (30)")
    parser.add_argument("--rate", type=int, default=250, help="py-spy samples per second (250)")
    parser.add_argument("--top", type=int, default=12, help="frames per process (12)")
    parser.add_argument("--out", type=Path, default=Path("var/low-profile"))
    options = parser.parse_args(argv)
    found = profile_low_load(
        options.contender,
        events=options.events,
        warmup=options.warmup,
        rate=options.rate,
        out=options.out,
    )
    (options.out / "summary.json").write_text(json.dumps(found, indent=2) + "\n")
    print(f"{found['contender']}: {found['cpu_ms_per_event']} ms of CPU per low-load event")
    queue = found["queue_cpu_ms_per_event_by_process"]
    for label, ms in found["cpu_ms_per_event_by_process"].items():
        print(f"  {label:<18} {ms:>7} ms, of which carrying messages {queue.get(label, 0.0)} ms")
    print(f"carrying messages in all: {found['queue_cpu_ms_per_event']} ms per event")
    if found["redis_commands_per_event"]:
        served = ", ".join(f"{n} {name}" for name, n in found["redis_commands_per_event"].items())
        print(f"Redis commands per event: {served}")
    for name, path in found["profiles"].items():
        lines = Path(path).read_text().splitlines() if Path(path).exists() else []
        print(f"\n### {name}: {path}")
        print(profile.report(profile.summarize(lines), options.top))
    print(f"\nwrote {options.out / 'summary.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
