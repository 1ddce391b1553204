"""Run a bench module as `make bench` does, as a program, for a test, on the suite's PostgreSQL."""

import os
import subprocess
import sys
from pathlib import Path

from lab.postgres import POSTGRES_URL_VARIABLE, PostgresHandle

ROOT = Path(__file__).resolve().parents[1]


def run_bench(
    module: str, argv: list[str], postgres_server: PostgresHandle, timeout_s: float = 280
) -> "subprocess.CompletedProcess[str]":
    """Run `python -m module *argv` from the repository's root; return it, whatever its status.

    The bench makes its databases on `postgres_server`, the suite's (the `postgres_server`
    fixture), named to it by `ACTONCE_TEST_POSTGRES_SERVER` as `bench.stores` reads it: never a
    server at an address of its own, and never an embedded one started for each figure.
    """
    env = {**os.environ, POSTGRES_URL_VARIABLE: postgres_server.admin_dsn}
    return subprocess.run(
        [sys.executable, "-m", module, *argv],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )
