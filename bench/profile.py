"""Where a contender's CPU goes: a py-spy profile of the bench's processes, by process and package.

Record a contender's whole process tree while the bench runs it, then summarize::

    py-spy record --subprocesses --nonblocking -r 100 -f raw -o var/profile-pool2.txt -- \\
        python -m bench.bench --runs 300 --rounds 1 --warmup 10 --low-load 100 \\
        --contenders pool2 --workloads own --no-shared --out var/profile-pool2.json
    python -m bench.profile var/profile-pool2.txt

py-spy samples a thread whenever it is not asleep, so a thread that is runnable but waiting for a
core counts too: on a machine kept busy, shares are of time on or waiting for a CPU, not of CPU
time. The bench's own figures (`cpu_ms_by_process`) are the CPU; this says where, within a
process, it goes. Samples of a loop waiting in `epoll` are idle and left out. SQLAlchemy's
asyncio API runs the ORM in greenlets, whose stacks start in SQLAlchemy: their caller in the
lattice packages is not in the sample.
"""

import argparse
import sys
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from bench.measure import label_of_command

IDLE: Final = frozenset({"EpollSelector.select (selectors.py:468)"})
"""A leaf frame that is a loop waiting for its sockets: not work."""

OWN: Final = ("actonce", "reflexr", "artifactr", "relayr")
"""The packages whose frames the summary names one by one."""


@dataclass
class ProcessKind:
    """The busy samples of one kind of process (the dispatcher, Celery's children, ...)."""

    name: str
    samples: int = 0
    by_package: Counter[str] = field(default_factory=Counter)
    by_frame: Counter[str] = field(default_factory=Counter)
    by_leaf: Counter[str] = field(default_factory=Counter)

    def add(self, frames: Sequence[str], count: int) -> None:
        """Count one stack: its leaf's package, and its innermost frame of `OWN`'s packages,
        which owns the work of the libraries it called (SQLAlchemy's, asyncpg's, ...)."""
        self.samples += count
        self.by_package[package(frames[-1])] += count
        self.by_leaf[_function(frames[-1])] += count
        own = [f for f in frames if package(f) in OWN]
        self.by_frame[
            _function(own[-1])
            if own
            else f"(no such frame; the stack starts in {package(frames[0])})"
        ] += count


def package(frame: str) -> str:
    """The top-level package of a py-spy frame, `stdlib:<module>` for a file outside any."""
    path = frame.rpartition(" (")[2].rstrip(")").rsplit(":", 1)[0]
    head, slash, _ = path.partition("/")
    return head if slash else "stdlib:" + path.removesuffix(".py")


def _function(frame: str) -> str:
    """A frame without its line: `Executor._call (reflexr/workspace/executor.py)`."""
    name, _, where = frame.rpartition(" (")
    return f"{name} ({where.rstrip(')').rsplit(':', 1)[0]})"


def kind_of(command: str, stacks: Iterable[Sequence[str]]) -> str:
    """The kind of the process that ran `command`, labelled as the bench's `cpu_ms_by_process`
    labels it (`other` is the bench itself); Celery's children are the ones running the attempt
    task, since they share their parent's command line."""
    label = label_of_command(command)
    if label == "celery" and any(
        any(f.startswith("attempt_run ") for f in frames) for frames in stacks
    ):
        return "celery:children"
    return label


def busy_stacks(lines: Iterable[str]) -> dict[str, list[tuple[list[str], int]]]:
    """Group py-spy's raw lines (`process ...;frame;...;frame count`) by the process that ran
    them: its `process` frame (`?` when the line names none), then each busy stack's own frames
    and its count. A stack is its innermost process's: py-spy nests each child under its
    parents. Stacks of a loop waiting for its sockets (`IDLE`) are left out."""
    by_process: defaultdict[str, list[tuple[list[str], int]]] = defaultdict(list)
    for line in lines:
        stack, _, count = line.rstrip("\n").rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames = stack.split(";")
        inner = max((i for i, f in enumerate(frames) if f.startswith("process ")), default=-1)
        own = frames[inner + 1 :]
        if own and own[-1] not in IDLE:
            by_process[frames[inner] if inner >= 0 else "?"].append((own, int(count)))
    return by_process


def summarize(lines: Iterable[str]) -> list[ProcessKind]:
    """Group py-spy's raw lines by process kind (`busy_stacks`, `kind_of`), busiest first."""
    kinds: dict[str, ProcessKind] = {}
    for command, stacks in busy_stacks(lines).items():
        name = kind_of(command, (frames for frames, _ in stacks))
        kind = kinds.setdefault(name, ProcessKind(name))
        for frames, samples in stacks:
            kind.add(frames, samples)
    return sorted(kinds.values(), key=lambda k: -k.samples)


def report(kinds: Sequence[ProcessKind], top: int) -> str:
    """The summary as text: each kind's share, its packages, and its heaviest own frames."""
    total = sum(k.samples for k in kinds) or 1
    out: list[str] = []
    for kind in kinds:
        share = 100 * kind.samples / total
        out.append(f"== {kind.name}: {kind.samples} busy samples ({share:.0f}% of all)")
        packages = ", ".join(
            f"{name} {100 * n / kind.samples:.0f}%" for name, n in kind.by_package.most_common(8)
        )
        out.append(f"  by the package running: {packages}")
        out.append("  the functions running:")
        out.extend(
            f"    {100 * n / kind.samples:5.1f}%  {frame}"
            for frame, n in kind.by_leaf.most_common(min(top, 5))
        )
        out.append(
            "  innermost frame of actonce or a lattice package, with the libraries it called:"
        )
        out.extend(
            f"    {100 * n / kind.samples:5.1f}%  {frame}"
            for frame, n in kind.by_frame.most_common(top)
        )
    return "\n".join(out)


def read_raw(path: Path) -> list[str] | None:
    """Return the lines of py-spy's raw output at `path`; None, said on stderr, when it cannot be
    read."""
    try:
        return path.read_text(errors="replace").splitlines()
    except OSError as error:
        print(f"cannot read the profile: {error}", file=sys.stderr)
        return None


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.profile", description=__doc__)
    parser.add_argument("profile", type=Path, help="py-spy's `-f raw` output")
    parser.add_argument("--top", type=int, default=20, help="frames per process kind (20)")
    options = parser.parse_args(argv)
    lines = read_raw(options.profile)
    if lines is None:
        return 2
    kinds = summarize(lines)
    if not kinds:
        print(f"{options.profile}: no busy samples (is it py-spy's `-f raw`?)", file=sys.stderr)
        return 1
    print(report(kinds, options.top))
    return 0


if __name__ == "__main__":
    sys.exit(main())
