"""The soak's curves as a picture: `python -m bench.soak_plot [RESULT.json] [--out PNG]`.

Four panels over the runs settled, one point per sample of a `bench.soak` result: each
process's resident memory, each process's open file descriptors, Redis's memory and key count,
and the attempts per second of each window. Without a result named, the newest
`bench/results/*-soak-*.json`; the picture goes to `docs/images/soak.png`.
"""

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Final

from bench.soak import RESULTS

PICTURE: Final = Path("docs/images/soak.png")


def plot(figures: dict[str, Any], out: Path) -> None:
    """Draw the samples of a soak result (`bench.soak.Soaked.figures`) to `out` (a PNG)."""
    import matplotlib

    matplotlib.use("Agg")  # a file, never a window: it runs in CI and over ssh
    import matplotlib.pyplot as plt

    samples = figures["samples"]
    settled = [s["settled"] for s in samples]
    names = list(dict.fromkeys(name for s in samples for name in s["processes"]))
    figure, ((rss, fds), (store, rate)) = plt.subplots(2, 2, figsize=(11, 7), sharex=True)
    for name in names:
        points = [(s["settled"], s["processes"][name]) for s in samples if name in s["processes"]]
        rss.plot([x for x, _ in points], [p["rss_kb"] / 1024 for _, p in points], "o-", label=name)
        fds.plot([x for x, _ in points], [p["fds"] for _, p in points], "o-", label=name)
    rss.set_title("resident memory (MiB)")
    fds.set_title("open file descriptors")
    rss.legend(fontsize="small")
    store.plot(settled, [s["redis"]["used_memory"] / 1024 / 1024 for s in samples], "o-")
    store.set_title("Redis used_memory (MiB), keys (right)")
    keys = store.twinx()
    keys.plot(settled, [s["redis"]["keys"] for s in samples], "s--", color="tab:red")
    keys.set_ylim(bottom=0)
    rate.plot(settled, [s["attempts_per_s"] for s in samples], "o-")
    rate.set_title("attempts per second, window before each sample")
    for axis in (rss, fds, store, rate):
        axis.set_ylim(bottom=0)
        axis.axvspan(0, settled[0], color="grey", alpha=0.15)  # the warm-up window
        axis.grid(alpha=0.3)
    for axis in (store, rate):
        axis.set_xlabel("runs settled")
    figure.suptitle(
        f"python -m bench.soak --runs {figures['runs']} --every {figures['every']} "
        f"(warm-up shaded; {figures['when'][:10]})"
    )
    figure.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(out, dpi=100)
    plt.close(figure)


def main(argv: list[str] | None = None) -> int:
    """`python -m bench.soak_plot`: draw a soak result."""
    parser = argparse.ArgumentParser(prog="python -m bench.soak_plot", description=__doc__)
    parser.add_argument("result", type=Path, nargs="?", help="a bench.soak JSON (the newest)")
    parser.add_argument("--out", type=Path, default=PICTURE)
    options = parser.parse_args(argv)
    result: Path | None = options.result
    if result is None:
        found = sorted(RESULTS.glob("*-soak-*.json"), key=lambda p: p.stat().st_mtime)
        if not found:
            print(f"no soak result in {RESULTS}: run `make soak` first", file=sys.stderr)
            return 1
        result = found[-1]
    plot(json.loads(result.read_text()), options.out)
    print(f"drew {options.out} from {result}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
