"""Flower for the lab: Celery's monitor on a loopback port, against a pool's broker.

`python -m lab.flower` is `make flower`: it starts Flower on 5555, or, when a Flower already
answers there (the demo's), says so and leaves it be, so the two never fight over the port.
"""

import argparse
import os
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Final

from lab.processes import STOP_GRACE_S, end, environment, free_port

FLOWER_PORT: Final = 5555
"""Where Flower listens unless the port is taken: the demo's and `make flower`'s."""


def flower_port(preferred: int = FLOWER_PORT) -> int:
    """Return `preferred` when it is free on the loopback, else another free port."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        try:
            probe.bind(("127.0.0.1", preferred))
        except OSError:
            return free_port()
    return preferred


def flower_answers(port: int) -> bool:
    """Whether a Flower answers on the loopback `port` (its `/healthcheck` says OK)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthcheck", timeout=2) as reply:
            return bool(reply.status == 200 and reply.read().strip() == b"OK")
    except (urllib.error.URLError, OSError, ValueError):
        return False


@contextmanager
def flower(
    settings_env: Mapping[str, str], *, port: int, log_file: Path
) -> Iterator["subprocess.Popen[bytes]"]:
    """Run Flower on the loopback `port` against the pool's broker, and stop it afterwards.

    Its HTTP API is open (`FLOWER_UNAUTHENTICATED_API`): it listens on 127.0.0.1 only. It sees
    task events live only, so start it before the attempts it should show.
    """
    log_file.parent.mkdir(parents=True, exist_ok=True)
    with open(log_file, "ab") as log:
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "celery",
                "-A",
                "actonce.worker.app",
                "flower",
                f"--port={port}",
                "--address=127.0.0.1",
            ],
            env={**environment(settings_env), "FLOWER_UNAUTHENTICATED_API": "true"},
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        yield process
    finally:
        end(process, grace_s=STOP_GRACE_S)


def main(argv: Sequence[str] | None = None) -> int:
    """`make flower`: join the Flower on the port if one answers, else run one there (exec)."""
    parser = argparse.ArgumentParser(prog="python -m lab.flower", description=main.__doc__)
    parser.add_argument("--port", type=int, default=FLOWER_PORT)
    port: int = parser.parse_args(argv).port
    if flower_answers(port):
        print(f"flower: already running at http://127.0.0.1:{port}/ (the demo's?); use it")
        return 0
    if flower_port(port) != port:
        print(f"flower: port {port} is taken by something that is not Flower", file=sys.stderr)
        return 1
    argv = [sys.executable, "-m", "celery", "-A", "actonce.worker.app", "flower"]
    os.execv(sys.executable, [*argv, f"--port={port}", "--address=127.0.0.1"])


if __name__ == "__main__":
    sys.exit(main())
