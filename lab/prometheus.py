"""A Prometheus server on the loopback, scraping given targets: for the suite and the docs' picture.

It runs Debian's `prometheus` binary (`apt-get install prometheus`; `.ci/run` installs it) with a
configuration of its own in a folder of its own, and stops it on leaving.
"""

import contextlib
import json
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Final

INSTALL: Final = "apt-get install prometheus (Debian's package; .ci/run installs it)"
"""How to get the binary, for the error that says it is missing."""


class PrometheusMissing(RuntimeError):
    """Raised when no `prometheus` binary is on `PATH`; names how to install it."""


@contextlib.contextmanager
def prometheus(
    targets: Sequence[str], *, home: Path, listen: str, every_s: float = 1.0
) -> Iterator[str]:
    """Run Prometheus scraping `targets` (`host:port`) every `every_s`, listening on `listen`,
    its data under `home`; yield its URL once it is ready, and stop it after.

    Raises:
        PrometheusMissing: If the binary is not on `PATH`.
    """
    binary = shutil.which("prometheus")
    if binary is None:
        raise PrometheusMissing(f"no prometheus binary on PATH: {INSTALL}")
    config = home / "prometheus.yml"
    config.write_text(
        f"global:\n  scrape_interval: {every_s:g}s\n  scrape_timeout: {every_s:g}s\n"
        "scrape_configs:\n  - job_name: actonce\n"
        f"    static_configs:\n      - targets: {json.dumps(list(targets))}\n"
    )
    with (home / "prometheus.log").open("w") as log:
        process = subprocess.Popen(
            [
                binary,
                f"--config.file={config}",
                f"--storage.tsdb.path={home / 'data'}",
                f"--web.listen-address={listen}",
            ],
            stdout=subprocess.DEVNULL,
            stderr=log,
        )
    try:
        url = f"http://{listen}"
        deadline = time.monotonic() + 30
        while get(f"{url}/-/ready") is None:
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"Prometheus did not start: see {home / 'prometheus.log'}")
            time.sleep(0.1)
        yield url
    finally:
        process.terminate()
        process.wait(timeout=30)


def get(url: str) -> str | None:
    """Return the body at `url`, or None if nothing answers."""
    try:
        with urllib.request.urlopen(url, timeout=2) as answer:
            return str(answer.read().decode())
    except OSError:
        return None


def query(url: str, promql: str) -> float | None:
    """Return the value of `promql` in the Prometheus at `url` now, or None while it has none."""
    answer = get(f"{url}/api/v1/query?{urllib.parse.urlencode({'query': promql})}")
    if answer is None:
        return None
    result = json.loads(answer)["data"]["result"]
    return float(result[0]["value"][1]) if result else None


def query_range(url: str, promql: str, began: float, ended: float) -> list[dict[str, Any]]:
    """Return every series of `promql` between `began` and `ended` (Unix seconds), a point a
    second."""
    parameters = urllib.parse.urlencode(
        {"query": promql, "start": began, "end": ended, "step": "1"}
    )
    answer = get(f"{url}/api/v1/query_range?{parameters}")
    if answer is None:
        raise RuntimeError(f"Prometheus at {url} did not answer")
    result: list[dict[str, Any]] = json.loads(answer)["data"]["result"]
    return result
