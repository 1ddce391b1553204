"""Beyond one machine, on paper: `python -m bench.capacity [var/bench.json]`.

From one bench run's medians (`bench.bench`'s `var/bench.json`, or a file of `bench/results/`)
for one contender on one workload, it derives, and prints as the benchmarks page's table:

- the attempts/s one PostgreSQL core carries: 1 / the PostgreSQL CPU per attempt. The CPU is
  that of the backends serving the contender's database (`postgres_cpu_ms`); where the run read
  them, the server's own processes (WAL writer, checkpointer, ...: `postgres_server_cpu_ms`)
  are added, and the page says which was counted;
- the statements and transactions per second that rate means (the contender's counts per
  attempt, and PostgreSQL's own count of transactions);
- how many pool machines, each running the contender's measured attempts/s, saturate a
  PostgreSQL of 1, 2, 4, ... cores kept `--busy` busy;
- the most one workspace carried in the run, over every contender: a workspace's transactions
  queue on its row lock, whichever database it is on, so a second database, or tenants split
  across databases, takes over from one PostgreSQL's cores, never from one workspace's lock.

It is arithmetic on measured parts, not a measurement: it assumes PostgreSQL's CPU per attempt
stays as measured as the load grows (the WAL's group commit makes it fall; lock waits and a
working set past memory make it rise), and that the pool machines are like this one.
"""

import argparse
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

BUSY: Final = 0.7
"""The share of its cores a PostgreSQL is planned to be kept busy: headroom for bursts,
vacuum and checkpoints."""

CORES: Final = (1, 2, 4, 8, 16, 32)
"""The PostgreSQL sizes the table shows."""

ONE_WORKSPACE: Final = ("own", "shared")
"""The workloads whose runs all land on one workspace."""


@dataclass(frozen=True)
class OnPaper:
    """What one PostgreSQL carries, derived from one contender's medians on one workload."""

    contender: str
    """The contender's name, as the bench's tables give it."""

    attempts_per_s: float
    """The contender's median attempts/s on the measured machine: one pool machine's."""

    postgres_ms: float
    """PostgreSQL CPU per attempt counted: the backends', plus the server's when read."""

    server_counted: bool
    """Whether `postgres_ms` includes the server's own processes."""

    statements: float
    """Statements per attempt, as the contender's processes counted them."""

    pg_transactions: float
    """Transactions per attempt, as PostgreSQL counted them."""

    one_workspace_per_s: float | None
    """The most attempts/s any contender made on one workspace in the run, if one was run."""

    @property
    def per_core(self) -> float:
        """Attempts/s one PostgreSQL core carries, all of it busy."""
        return 1000.0 / self.postgres_ms

    def machines(self, cores: int, busy: float) -> float:
        """Pool machines that keep a PostgreSQL of `cores` cores `busy` busy."""
        return cores * busy * self.per_core / self.attempts_per_s


def on_paper(figures: dict[str, Any], workload: str, contender: str) -> OnPaper:
    """Derive `OnPaper` from a bench run's `figures` (`var/bench.json` as parsed).

    Raises:
        KeyError: If the run has no such workload or contender.
    """
    summary = figures["summary"]
    measured = summary[workload][contender]
    backends = measured["postgres_cpu_ms"]["median"]
    server = measured.get("postgres_server_cpu_ms", {}).get("median")
    lock_bound = [
        by["attempts_per_s"]["median"]
        for name in ONE_WORKSPACE
        for by in summary.get(name, {}).values()
    ]
    return OnPaper(
        contender=measured["name"],
        attempts_per_s=measured["attempts_per_s"]["median"],
        postgres_ms=backends + (server or 0.0),
        server_counted=server is not None,
        statements=measured["statements"]["median"],
        pg_transactions=measured["pg_transactions"]["median"],
        one_workspace_per_s=max(lock_bound) if lock_bound else None,
    )


def report(paper: OnPaper, cores: Sequence[int], busy: float) -> str:
    """The derivation as text, then as the benchmarks page's table."""
    counted = (
        "backends and the server's own processes"
        if paper.server_counted
        else "backends serving the database"
    )
    lines = [
        f"{paper.contender}: {paper.attempts_per_s:g} attempts/s on this machine",
        f"PostgreSQL CPU per attempt ({counted}): {paper.postgres_ms:.2f} ms",
        f"one PostgreSQL core carries {paper.per_core:.0f} attempts/s,"
        f" {paper.per_core * paper.statements:.0f} statements/s,"
        f" {paper.per_core * paper.pg_transactions:.0f} transactions/s",
    ]
    if paper.one_workspace_per_s is not None:
        lines.append(
            f"one workspace carried at most {paper.one_workspace_per_s:g} attempts/s in this run"
            " (its row lock, whichever database it is on)"
        )
    lines += [
        "",
        f"| PostgreSQL cores, {busy:.0%} busy | attempts/s | transactions/s | pool machines |",
        "|---:|---:|---:|---:|",
    ]
    for n in cores:
        rate = n * busy * paper.per_core
        lines.append(
            f"| {n} | {rate:.0f} | {rate * paper.pg_transactions:.0f}"
            f" | {paper.machines(n, busy):.1f} |"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m bench.capacity`: print what one PostgreSQL carries, from a bench run."""
    parser = argparse.ArgumentParser(prog="python -m bench.capacity", description=__doc__)
    parser.add_argument("figures", type=Path, nargs="?", default=Path("var/bench.json"))
    parser.add_argument("--workload", default="spread", help="spread (own, shared)")
    parser.add_argument("--contender", default="pool2", help="a key of the run (pool2)")
    parser.add_argument("--busy", type=float, default=BUSY, help=f"share of cores ({BUSY})")
    options = parser.parse_args(argv)
    try:
        figures = json.loads(options.figures.read_text())
        paper = on_paper(figures, options.workload, options.contender)
    except (OSError, ValueError) as error:
        print(f"cannot read {options.figures}: {error}", file=sys.stderr)
        return 2
    except KeyError as error:
        print(f"{options.figures} has no {error}: run the bench with it", file=sys.stderr)
        return 2
    print(f"from {options.figures} ({figures.get('when', '?')}), workload {options.workload}")
    print(report(paper, CORES, options.busy))
    return 0


if __name__ == "__main__":
    sys.exit(main())
