"""`make metrics-picture`: the pool's main metrics over a `make run`, as Prometheus scraped them.

It starts a Prometheus server (Debian's `prometheus`) scraping every process of the demo's pool
each second, runs the demo (`python -m demo`, as `make run` does) with `ACTONCE_PROMETHEUS_PORT`
and `ACTONCE_DISPATCHER_PROMETHEUS_PORT` set and `ACTONCE_EXIT_WHEN_SETTLED=1`, then asks
Prometheus for the run's series and plots them (matplotlib) into `docs/images/pool-metrics.png`:
attempts per second by outcome, settle latency p50/p95, queue depth, and dead letters by reason.
"""

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Final

from lab.prometheus import PrometheusMissing, prometheus, query_range

ROOT: Final = Path(__file__).resolve().parent.parent
OUT: Final = ROOT / "docs" / "images" / "pool-metrics.png"
BASE_PORT: Final = 19464
"""The worker's main process; its two children and the dispatcher take the next three."""


def _latency(quantile: float) -> str:
    return (
        f"histogram_quantile({quantile}, "
        "sum by (le) (rate(actonce_run_settle_latency_seconds_bucket[30s])))"
    )


PANELS: Final = (
    (
        "Attempts per second, by outcome",
        "sum by (actonce_outcome) (rate(actonce_attempts_total[15s]))",
        "actonce_outcome",
    ),
    ("Settle latency from firing (s)", _latency(0.5), "p50"),
    ("Queue depth", "sum by (actonce_queue) (actonce_queue_depth)", "actonce_queue"),
    (
        "Dead letters, by reason",
        "sum by (actonce_reason) (actonce_dead_letters_total)",
        "actonce_reason",
    ),
)
"""Each panel: its title, its query, and the label that names its lines."""


def main() -> int:
    """Scrape a demo run and plot it; return the process's exit status."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=120, help="runs the demo feeds")
    parser.add_argument("--out", type=Path, default=OUT)
    arguments = parser.parse_args()
    try:
        _scrape_and_plot(arguments.runs, arguments.out)
    except PrometheusMissing as missing:
        print(missing, file=sys.stderr)
        return 2
    print(f"wrote {arguments.out}")
    return 0


def _scrape_and_plot(runs: int, out: Path) -> None:
    targets = [f"127.0.0.1:{BASE_PORT + offset}" for offset in range(4)]
    with (
        tempfile.TemporaryDirectory() as home,
        prometheus(targets, home=Path(home), listen=f"127.0.0.1:{BASE_PORT + 10}") as url,
    ):
        began = time.time()
        _demo(runs, Path(home))
        time.sleep(3)  # the last scrape after the pool settled
        _plot(url, began, time.time(), out)


def _demo(runs: int, home: Path) -> None:
    env = {
        **os.environ,
        "ACTONCE_PROMETHEUS_PORT": str(BASE_PORT),
        "ACTONCE_DISPATCHER_PROMETHEUS_PORT": str(BASE_PORT + 3),
        "ACTONCE_EXIT_WHEN_SETTLED": "1",
        "ACTONCE_DEMO_RUNS": str(runs),
        "ACTONCE_VAR_DIR": str(home / "var"),
    }
    subprocess.run([sys.executable, "-m", "demo"], cwd=ROOT, env=env, check=True)


def _plot(url: str, began: float, ended: float, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(2, 2, figsize=(12, 7), constrained_layout=True)
    for axis, (title, query, label) in zip(axes.flat, PANELS, strict=True):
        series = query_range(url, query, began, ended)
        if title.startswith("Settle"):
            p95 = query_range(url, _latency(0.95), began, ended)
            series += [{**one, "metric": {"p95": "p95"}} for one in p95]
        for one in series:
            points = [(float(t) - began, float(v)) for t, v in one["values"] if v != "NaN"]
            if points:
                name = one["metric"].get(label) or ("p95" if "p95" in one["metric"] else "p50")
                axis.plot(*zip(*points, strict=True), label=name)
        axis.set_title(title)
        axis.set_xlabel("seconds into the run")
        axis.legend(loc="upper right", fontsize="small")
    figure.suptitle("make run, as Prometheus scraped the pool (every process, summed)")
    out.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(out, dpi=90)


if __name__ == "__main__":
    raise SystemExit(main())
