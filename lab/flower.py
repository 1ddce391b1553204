"""Flower for the lab: Celery's monitor on a loopback port, against a pool's broker."""

import subprocess
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

from lab.processes import STOP_GRACE_S, end, environment


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
