"""A command that cannot use its database says so without printing the URL's password.

`actonce` runs as a user runs it, with `ACTONCE_DATABASE_URL` holding a password: over a fresh
PostgreSQL database that is not migrated (the machine's server trusts loopback connections, so
the password is merely carried), and over a port where nothing listens. Each command fails, and
neither its output nor its traceback holds the password; the unmigrated store is named by its
URL, the password masked.
"""

import secrets
import subprocess
import sys
from typing import Final

import pytest

from lab.processes import environment, free_port

PASSWORD: Final = f"pw{secrets.token_hex(8)}"


def _actonce(database_url: str, *argv: str) -> subprocess.CompletedProcess[str]:
    env = environment({"ACTONCE_DATABASE_URL": database_url})
    return subprocess.run(
        [sys.executable, "-m", "actonce.worker.cli", *argv],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def _with_password(url: str) -> str:
    return url.replace("://postgres@", f"://postgres:{PASSWORD}@", 1)


def test_a_store_not_migrated_is_named_with_its_password_masked(postgres_url: str) -> None:
    done = _actonce(_with_password(postgres_url), "dead", "list")

    assert done.returncode != 0
    assert "actonce migrate" in done.stderr, done.stderr
    assert "postgres:***@" in done.stderr, done.stderr
    assert PASSWORD not in done.stdout + done.stderr


@pytest.mark.parametrize("argv", [("dead", "list"), ("migrate",)], ids=" ".join)
def test_a_database_that_does_not_answer_fails_without_printing_its_password(
    argv: tuple[str, ...],
) -> None:
    url = f"postgresql+asyncpg://postgres:{PASSWORD}@127.0.0.1:{free_port()}/nowhere"

    done = _actonce(url, *argv)

    assert done.returncode != 0
    assert done.stdout + done.stderr, "the command said nothing"
    assert PASSWORD not in done.stdout + done.stderr
