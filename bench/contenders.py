"""The contenders, each started as real processes on a migrated database and stopped after.

- `pool`: one `actonce worker` with `processes` prefork children, and `actonce dispatch`, on a
  private Redis (`lab.pool.LocalPool`), with actonce's default settings, or with a linger
  (`ACTONCE_LINGER_S`) in `LINGERING`, run only when named;
- `threads`: `processes` `actonce worker --pool threads -c THREADS_IN_FLIGHT` processes and
  `actonce dispatch`, likewise: each process keeps that many attempts in flight on one loop,
  as the reactor keeps its `concurrency` (10) in flight;
- `reactor`: `processes` processes of `python -m bench.reactor_serve` (relayr-ai's reactor, as
  reflexr's docs serve it, at its `poll_s`: reflexr's default, 1 s, unless given) on the same
  database;
- `loop`: `processes` processes of `python -m bench.reactor_loop` (the same reactor in the
  tightest loop its public API allows: evaluate, execute, sleep only when a pass did nothing).

The in-process contenders (`IN_PROCESS`: `reactor` and `loop`) are the peer: the bench states
the pool's headline ratio against the fastest of them (`bench.peer`).

A pool contender with `telemetry` exports its traces and metrics over OTLP to a loopback sink
(`bench.otlp_sink`) at the SDK's default intervals, as a pool beside a Collector does: beside the
same pool without it, it shows what telemetry costs.
"""

import contextlib
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Literal

from bench import reactor_loop, reactor_serve
from bench.otlp_sink import otlp_sink
from lab.pool import LocalPool
from lab.redis import find_or_start_redis

type Kind = Literal["pool", "threads", "reactor", "loop"]

IN_PROCESS: Final[frozenset[Kind]] = frozenset({"reactor", "loop"})
"""The kinds that run relayr's reactor in process: the peer."""

MODULES: Final[dict[Kind, tuple[str, str]]] = {
    "reactor": ("bench.reactor_serve", reactor_serve.READY),
    "loop": ("bench.reactor_loop", reactor_loop.READY),
}
"""What each in-process kind runs, and the line it prints once it serves."""

THREADS_IN_FLIGHT: Final = 10
"""Attempts in flight per `threads` worker process: the reactor's default concurrency."""


@dataclass(frozen=True)
class Contender:
    """One way of running the rules: which, and with how many processes."""

    kind: Kind
    processes: int
    linger_s: float = 0.0
    """The pool's `ACTONCE_LINGER_S`; its default, 0, unless a contender is about the trade."""

    telemetry: bool = False
    """Whether the pool exports OpenTelemetry traces and metrics (to a loopback sink)."""

    poll_s: float | None = None
    """A `reactor`'s `serve` poll interval; None for the default: reflexr's, 1 s, unless the
    bench's `--reactor-poll-s` says otherwise."""

    @property
    def name(self) -> str:
        """How the tables name it."""
        noun = "process" if self.processes == 1 else "processes"
        who = {
            "pool": "actonce pool, prefork",
            "threads": "actonce pool, threads",
            "reactor": "relayr Reactor.serve",
            "loop": "relayr Reactor, tight loop",
        }[self.kind]
        linger = f", linger {self.linger_s:g} s" if self.linger_s else ""
        telemetry = ", telemetry over OTLP" if self.telemetry else ""
        poll = ""
        if self.kind == "reactor":
            poll = ", default poll" if self.poll_s is None else f", {self.poll_s:g} s poll"
        return f"{who}{poll}, {self.processes} {noun}{linger}{telemetry}"

    @property
    def key(self) -> str:
        """How `var/bench.json` names it."""
        linger = f"-linger{self.linger_s:g}" if self.linger_s else ""
        poll = f"-poll{self.poll_s:g}" if self.poll_s is not None else ""
        return f"{self.kind}{self.processes}{poll}{linger}{'-otel' if self.telemetry else ''}"


BASELINE = Contender("reactor", 1)
"""What `x_reactor` compares every rate with: relayr's reactor served in one process, at the
bench's `--reactor-poll-s`. The headline is against the fastest peer (`bench.peer`)."""

ALL = (
    BASELINE,
    Contender("reactor", 1, poll_s=0.1),
    Contender("loop", 1),
    Contender("loop", 2),
    Contender("pool", 1),
    Contender("pool", 2),
    Contender("pool", 4),
    Contender("pool", 2, telemetry=True),
    Contender("threads", 1),
    Contender("threads", 2),
)
"""What `make bench` runs."""

LINGERING = (Contender("pool", 2, linger_s=0.5), Contender("pool", 2, linger_s=1.0))
"""The pool of 2 trading latency for CPU: only when `--contenders` names them."""

SERVED_BY_TWO = (Contender("reactor", 2),)
"""`serve` in 2 processes: an earlier bench's row, only when `--contenders` names it."""

KNOWN = ALL + LINGERING + SERVED_BY_TWO
"""Every contender `--contenders` may name."""


@contextlib.contextmanager
def running(contender: Contender, env: Mapping[str, str], log_dir: Path) -> Iterator[str | None]:
    """Start `contender`'s processes with `env` (the `ACTONCE_*` store variables, the
    definition), wait until they serve, yield the pool's private broker URL (None for a
    reactor or a loop), and stop them all on leaving."""
    if contender.kind in ("pool", "threads"):
        threads = contender.kind == "threads"
        with (
            otlp_sink() if contender.telemetry else contextlib.nullcontext("") as sink,
            find_or_start_redis(None) as redis_handle,
            LocalPool(
                {
                    **env,
                    "ACTONCE_BROKER_URL": redis_handle.url,
                    "ACTONCE_LINGER_S": str(contender.linger_s),
                    **({"OTEL_EXPORTER_OTLP_ENDPOINT": sink} if sink else {}),
                },
                workers=contender.processes if threads else 1,
                concurrency=THREADS_IN_FLIGHT if threads else contender.processes,
                pool="threads" if threads else "prefork",
                log_dir=log_dir,
                loglevel="WARNING",
            ) as pool,
        ):
            pool.wait_ready(120.0)
            yield redis_handle.url
        return
    module, ready = MODULES[contender.kind]
    poll = {} if contender.poll_s is None else {"BENCH_REACTOR_POLL_S": str(contender.poll_s)}
    logs = [log_dir / f"{contender.kind}{i}.log" for i in range(contender.processes)]
    processes: list[subprocess.Popen[bytes]] = []
    try:
        for log in logs:
            with open(log, "ab") as log_file:
                processes.append(
                    subprocess.Popen(
                        [sys.executable, "-m", module],
                        env={**env, **poll},
                        stdin=subprocess.DEVNULL,
                        stdout=log_file,
                        stderr=subprocess.STDOUT,
                    )
                )
        _wait_for(ready, logs)
        yield None
    finally:
        for process in processes:
            process.terminate()
        for process in processes:
            try:
                process.wait(20)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def _wait_for(line: str, logs: list[Path], timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not all(p.exists() and line in p.read_text(errors="replace") for p in logs):
        if time.monotonic() > deadline:
            raise RuntimeError(f"the reactors did not serve in {timeout_s}s: see {logs}")
        time.sleep(0.1)
