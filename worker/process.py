"""The current process's runtime: built by `worker_process_init`, used by tasks, closed at exit.

A task asks `current()` for it; asking before the child was initialised raises `RuntimeNotReady`
naming the signal that should have built it, rather than building handles on the wrong loop.
"""

import logging
import sys

from actonce.worker.definition import DefinitionError, load_definition
from actonce.worker.runtime import Runtime, RuntimeNotReady, StoresNotMigrated
from actonce.worker.settings import Settings

log = logging.getLogger("actonce.worker")

_runtime: Runtime | None = None


def check_or_exit(settings: Settings) -> None:
    """Load the definition and check the stores; print why and exit 3 if they do not fit."""
    try:
        Runtime(settings, load_definition(settings.app), one_run=True).open(check=True).close()
    except (DefinitionError, StoresNotMigrated) as unfit:
        log.critical("actonce refuses to start: %s", unfit)
        print(f"actonce refuses to start: {unfit}", file=sys.stderr)
        raise SystemExit(3) from unfit


def start(settings: Settings) -> Runtime:
    """Build this process's runtime, once; later calls return the same one."""
    global _runtime
    if _runtime is None:
        _runtime = Runtime(settings, load_definition(settings.app), one_run=True).open(check=False)
        log.info("runtime ready for %s", settings.app)
    return _runtime


def current() -> Runtime:
    """Return this process's runtime.

    Raises:
        RuntimeNotReady: If `worker_process_init` has not built it in this process.
    """
    if _runtime is None:
        raise RuntimeNotReady(
            "the worker's runtime is not built: worker_process_init builds it in each prefork "
            "child; outside a worker, call worker.process.start(settings) first"
        )
    return _runtime


def stop() -> None:
    """Close this process's runtime, if it was built."""
    global _runtime
    if _runtime is not None:
        try:
            _runtime.close()
        finally:
            _runtime = None
