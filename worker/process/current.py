"""This process's pool side: its settings and Celery app, and its runtime once built.

`actonce.worker.app.create_app` configures the process (`configure`); in a worker,
`worker_process_init` builds each prefork child's `Runtime` (`start`) and provides it to the tasks
as their `TaskHost`; `worker_process_shutdown` closes it (`stop`). The settings live here, not in
Celery's configuration, which `celery inspect conf` and Flower publish.
"""

import logging
import sys

from celery import Celery

from actonce.tasks import task_host
from actonce.worker.definition import Definition, DefinitionError, load_definition
from actonce.worker.observers import setup
from actonce.worker.process.broker_access import BrokerRefused, check_broker_access
from actonce.worker.process.runtime import Runtime, RuntimeNotReady, StoresNotMigrated
from actonce.worker.process.worker_host import WorkerHost
from actonce.worker.settings import Settings
from actonce.worker.storage.unreachable import StoreUnreachable

log = logging.getLogger("actonce.worker")

_configured: tuple[Settings, Celery] | None = None
_runtime: Runtime | None = None


def configure(settings: Settings, celery: Celery) -> None:
    """Make `settings` and `celery` this process's; `create_app` calls it."""
    global _configured
    _configured = (settings, celery)


def settings() -> Settings:
    """Return this process's settings.

    Raises:
        RuntimeNotReady: If no app was created in this process.
    """
    return _app_made()[0]


def celery() -> Celery:
    """Return this process's Celery app.

    Raises:
        RuntimeNotReady: If no app was created in this process.
    """
    return _app_made()[1]


def check_or_exit(settings: Settings) -> Definition:
    """Check that the broker lets actonce in, load the definition and check the stores, and
    return the definition; print why and exit 3 if they do not fit."""
    try:
        check_broker_access(settings)
        definition = load_definition(settings.app)
        Runtime(settings, definition, one_run=True).open(check=True).close()
    except (BrokerRefused, DefinitionError, StoresNotMigrated, StoreUnreachable) as unfit:
        log.critical("actonce refuses to start: %s", unfit)
        print(f"actonce refuses to start: {unfit}", file=sys.stderr)
        raise SystemExit(3) from unfit
    return definition


def start(settings: Settings, *, threaded: bool = False) -> Runtime:
    """Build this process's runtime, once, and provide it to the tasks; later calls return it.

    `threaded` runs its loop in a thread of its own, for a worker whose tasks run in threads
    (`--pool threads`): their coroutines share that loop, and their waits overlap.
    """
    global _runtime
    if _runtime is None:
        _runtime = Runtime(
            settings,
            load_definition(settings.app),
            one_run=True,
            celery=celery(),
            threaded=threaded,
        ).open(check=False)
        setup.observe_also(_runtime.definition)
        task_host.provide(WorkerHost(_runtime))
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
            "child; outside a worker, call actonce.worker.process.current.start(settings) first"
        )
    return _runtime


def stop() -> None:
    """Close this process's runtime, if it was built, and withdraw it from the tasks."""
    global _runtime
    if _runtime is not None:
        task_host.provide(None)
        try:
            _runtime.close()
        finally:
            _runtime = None


def _app_made() -> tuple[Settings, Celery]:
    if _configured is None:
        raise RuntimeNotReady(
            "no actonce app in this process: call actonce.worker.app.create_app(settings)"
        )
    return _configured
