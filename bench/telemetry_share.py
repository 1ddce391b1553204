"""What share of the pool's busy samples telemetry takes, from a py-spy profile of `pool2-otel`.

The bench's paired rows (`pool2` beside `pool2-otel`) give telemetry's cost as a ratio of two
noisy CPU figures; this gives it from inside one run, by counting the samples whose stack passes
through OpenTelemetry's code or actonce's telemetry modules::

    py-spy record --subprocesses --nonblocking -r 100 -f raw -o var/profile-otel.txt -- \\
        python -m bench.bench --runs 300 --rounds 1 --warmup 10 --low-load 30 \\
        --contenders pool2-otel --workloads own --no-shared --out var/profile-otel.json
    python -m bench.telemetry_share var/profile-otel.txt

Only the pool's processes count (the dispatcher, Celery's main process and its children); the
bench's own process is left out. Samples taken while a process imports or starts telemetry are
reported apart: they are paid once per process, not per attempt. Redis and PostgreSQL run no
Python, so py-spy cannot see them: the share is of the pool's Python processes, and so an upper
bound of the share of everything the bench's CPU per attempt counts.
"""

import argparse
import sys
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from bench.profile import busy_stacks, kind_of, package, read_raw

TELEMETRY_PACKAGES: Final = frozenset(
    {
        # OpenTelemetry is a namespace package: py-spy names its frames from the next level down.
        "trace",
        "metrics",
        "sdk",
        "exporter",
        "proto",
        "context",
        "propagate",
        "baggage",
        "processor",
        "attributes",
        "util",
        "semconv",
        "_logs",
        "google",
        "requests",
        "urllib3",
    }
)
"""Packages whose frames are telemetry's: OpenTelemetry's, protobuf's, and the HTTP its
exporters send through (nothing else in a pool process speaks HTTP)."""

TELEMETRY_MODULES: Final = (
    "lattice_core/otel/",
    "actonce/tasks/tracing.py",
    "actonce/worker/process/exporting.py",
    "actonce/worker/process/telemetry.py",
    "actonce/worker/observers/metrics.py",
)
"""actonce's and the lattice's own telemetry code."""


@dataclass
class Share:
    """One process kind's busy samples, and how many of them were telemetry's."""

    kind: str
    steady: int = 0
    steady_telemetry: int = 0
    starting: int = 0
    starting_telemetry: int = 0
    heaviest: Counter[str] = field(default_factory=Counter)

    @property
    def percent(self) -> float:
        """Telemetry's share of the steady samples, in percent."""
        return 100 * self.steady_telemetry / self.steady if self.steady else 0.0


def is_telemetry(frame: str) -> bool:
    """Whether a py-spy frame (`function (path:line)`) is in telemetry's code."""
    path = frame.rpartition(" (")[2]
    return package(frame) in TELEMETRY_PACKAGES or any(m in path for m in TELEMETRY_MODULES)


def is_starting(frames: Sequence[str]) -> bool:
    """Whether a stack is a process importing modules or starting telemetry: paid once."""
    return any(
        f.startswith("_find_and_load ")
        or (f.startswith("start ") and "actonce/worker/process/telemetry.py" in f)
        for f in frames
    )


def shares(lines: Iterable[str]) -> list[Share]:
    """Count py-spy's raw lines by the pool's process kinds, busiest first."""
    by_kind: dict[str, Share] = {}
    for command, counted in busy_stacks(lines).items():
        kind = kind_of(command, (frames for frames, _ in counted))
        if kind == "other" or command == "?":
            continue
        share = by_kind.setdefault(kind, Share(kind))
        for frames, samples in counted:
            telemetry = [f for f in frames if is_telemetry(f)]
            if is_starting(frames):
                share.starting += samples
                share.starting_telemetry += samples if telemetry else 0
                continue
            share.steady += samples
            if telemetry:
                share.steady_telemetry += samples
                share.heaviest[telemetry[0].rsplit(":", 1)[0] + ")"] += samples
    return sorted(by_kind.values(), key=lambda s: -s.steady)


def report(found: Sequence[Share], top: int) -> str:
    """The shares as text: per kind, then over the pool, then the heaviest telemetry frames."""
    out = ["process kind          steady samples  telemetry's  share   (starting: of which)"]
    for s in found:
        out.append(
            f"{s.kind:<22}{s.steady:>14}{s.steady_telemetry:>13}{s.percent:>7.1f}%"
            f"   ({s.starting}: {s.starting_telemetry})"
        )
    steady = sum(s.steady for s in found)
    telemetry = sum(s.steady_telemetry for s in found)
    percent = 100 * telemetry / steady if steady else 0.0
    out.append(f"{'the pool':<22}{steady:>14}{telemetry:>13}{percent:>7.1f}%")
    heaviest: Counter[str] = Counter()
    for s in found:
        heaviest.update(s.heaviest)
    out.append("outermost telemetry frame of the steady samples:")
    out.extend(f"  {n:>6}  {frame}" for frame, n in heaviest.most_common(top))
    return "\n".join(out)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.telemetry_share", description=__doc__)
    parser.add_argument("profile", type=Path, help="py-spy's `-f raw` output of a pool")
    parser.add_argument("--top", type=int, default=10, help="telemetry frames listed (10)")
    options = parser.parse_args(argv)
    lines = read_raw(options.profile)
    if lines is None:
        return 2
    found = shares(lines)
    if not found:
        print(f"{options.profile}: no busy samples of a pool's process", file=sys.stderr)
        return 1
    print(report(found, options.top))
    return 0


if __name__ == "__main__":
    sys.exit(main())
