"""Why a worker process ends: its exit status and the one line that says why.

Celery's `app.worker_main` drops the worker's exit status (its `start` catches click's `Exit`
and the status is lost), so a worker that gave up (its broker gone beyond its retries, an
unrecoverable error) exited 0 and a supervisor restarting on failure left the pool down.
`run_worker` runs the worker and returns the status Celery set, with the last critical line
Celery or actonce logged: the caller prints it and exits with that status.
"""

import logging
from typing import Any

from celery import Celery
from celery.signals import after_setup_logger, worker_shutdown

from actonce.worker.process.health import reason


def run_worker(celery: Celery, argv: list[str]) -> tuple[int, str | None]:
    """Run `celery worker` with `argv` until it stops; return its exit status and why.

    Returns:
        The status the worker stopped with (0 after a warm shutdown), and the first line of the
        last critical message logged while it ran, if any.
    """
    status: list[int] = []
    words = _LastWords()

    def record(sender: Any = None, **_: object) -> None:
        code = getattr(sender, "exitcode", None)
        status.append(code if isinstance(code, int) else 0)

    def listen(logger: logging.Logger | None = None, **_: object) -> None:
        # Celery's logging setup empties the root's (and its own loggers') handlers as the
        # worker starts: listen on the root once it is set up.
        (logger or logging.getLogger()).addHandler(words)

    worker_shutdown.connect(record, weak=False)
    after_setup_logger.connect(listen, weak=False)
    try:
        celery.worker_main(argv)
    finally:
        logging.getLogger().removeHandler(words)
        after_setup_logger.disconnect(listen)
        worker_shutdown.disconnect(record)
    return (status[-1] if status else 0), words.last


class _LastWords(logging.Handler):
    """Keeps the first line of the last CRITICAL record logged, and its error's type and first
    line when the record does not say them: Celery logs an unrecoverable error by its repr, and
    redis-py's repr drops the text (`auth:NoPermissionError`, not which command was refused).
    The traceback above it in the same log already holds that text."""

    def __init__(self) -> None:
        super().__init__(level=logging.CRITICAL)
        self.last: str | None = None

    def emit(self, record: logging.LogRecord) -> None:
        try:
            line = record.getMessage().splitlines()[0]
            error = record.exc_info[1] if record.exc_info else None
            if error is not None:
                why = reason(error)
                if why.partition(": ")[2] and why not in line:
                    line = f"{line} ({why})"
            self.last = line
        except Exception:  # a record that cannot format: keep the one before
            return
