"""The strongest in-process peer: which way of running relayr's reactor was fastest, and every
contender's ratios to it.

The bench runs relayr in process several ways (`bench.contenders.IN_PROCESS`: `serve` at its
default poll and at 0.1 s, the tight loop in 1 and 2 processes). The peer of a workload is the one
of those with the highest median attempts/s over the rounds; the headline ratio is against it.
Like `x_reactor`, each ratio is taken round by round (the contender's figure over the peer's in
the same round, then the median and spread), since the machine's speed drifts between rounds.
"""

import statistics
from typing import Any, Final

from bench.contenders import IN_PROCESS, KNOWN

PEER_KEYS: Final = frozenset(c.key for c in KNOWN if c.kind in IN_PROCESS)
"""The `var/bench.json` keys of every in-process contender."""

RATIOS: Final = {"x_peer": "attempts_per_s", "cpu_x_peer": "cpu_ms"}
"""The ratios to the peer taken round by round, and the figure each divides."""

TIGHT_LOOP: Final = "loop1"
"""The tight loop in one process: what the pool's targets of issue 52 are judged against,
whichever peer is the strongest (`paired_loop`, beside `paired_peer`)."""


def strongest(by: dict[str, Any]) -> str | None:
    """The key of the in-process contender with the highest median attempts/s in one workload's
    summary (`bench.bench.summarise`), or None if none ran."""
    peers = [key for key in by if key in PEER_KEYS]
    return max(peers, key=lambda key: by[key]["attempts_per_s"]["median"], default=None)


def add_peer_ratios(summary: dict[str, Any], rounds: list[dict[str, Any]]) -> None:
    """Add to every contender of every workload of `summary` which contender is the peer
    (`peer`), the ratio of its median attempts/s to the peer's (`x_peer`), and the ratios round
    by round (`paired_peer`: `x_peer` for attempts/s, `cpu_x_peer` for CPU per attempt), and
    the same round-by-round ratios to the tight loop in one process (`paired_loop`) when it
    ran.

    Args:
        summary: `bench.bench.summarise`'s result, changed in place.
        rounds: The rounds it summarised, as `var/bench.json`'s `rounds_measured` keeps them.
    """
    for workload, by in summary.items():
        peer = strongest(by)
        if peer is None:
            continue
        peer_rate = by[peer]["attempts_per_s"]["median"]
        for key, figures in by.items():
            figures["peer"] = peer
            if peer_rate > 0:
                figures["x_peer"] = round(figures["attempts_per_s"]["median"] / peer_rate, 2)
            figures["paired_peer"] = paired(rounds, workload, key, peer)
        if TIGHT_LOOP in by:
            for key, figures in by.items():
                figures["paired_loop"] = paired(rounds, workload, key, TIGHT_LOOP)


def paired(rounds: list[dict[str, Any]], workload: str, key: str, base: str) -> dict[str, Any]:
    """The ratios (`RATIOS`) of contender `key` to contender `base` in `workload`, round by
    round: their median and spread, for each ratio both were measured for."""
    found: dict[str, dict[str, float]] = {}
    for ratio, figure in RATIOS.items():
        ratios = [
            measured[key][figure] / measured[base][figure]
            for measured in (r.get(workload, {}) for r in rounds)
            if key in measured and base in measured and measured[base][figure] > 0
        ]
        if ratios:
            found[ratio] = _median_and_spread(ratios)
    return found


def report(summary: dict[str, Any]) -> list[str]:
    """Lines naming each workload's peer and every contender's ratios to it, round by round."""
    lines: list[str] = []
    for workload, by in summary.items():
        peer = strongest(by)
        if peer is None:
            continue
        lines.append(f"\n{workload}: against the strongest peer, {by[peer]['name']}, by round")
        lines.append(f"{'contender':<48}{'× peer attempts/s':>24}{'× peer CPU/attempt':>24}")
        for figures in by.values():
            paired = figures.get("paired_peer", {})
            lines.append(
                f"{figures['name']:<48}{cell(paired.get('x_peer')):>24}"
                f"{cell(paired.get('cpu_x_peer')):>24}"
            )
    return lines


def cell(ratio: dict[str, float] | None) -> str:
    """A ratio round by round as a table cell: its median and its spread, or `-`."""
    if not ratio:
        return "-"
    return f"{ratio['median']:.2f} ({ratio['min']:.2f}–{ratio['max']:.2f})"


def _median_and_spread(values: list[float]) -> dict[str, float]:
    return {
        "median": round(statistics.median(values), 2),
        "min": round(min(values), 2),
        "max": round(max(values), 2),
    }
