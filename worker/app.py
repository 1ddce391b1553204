"""The Celery app and its wiring: built by `create_app(settings)`, signals connected, nothing else.

Importing this module builds nothing: `create_app` makes the app from settings it is given, and
`celery -A actonce.worker.app` (Flower, `inspect`) gets one built from the environment on first
use of the module's `app` attribute. The settings stay outside Celery's configuration, which
Flower and `celery inspect conf` publish. Every signal handler actonce uses is connected here, so
the list reads at once:

- `worker_init` (the parent, before forking): start Sentry, load the definition and check the
  stores, or exit; a `threads` worker, which forks nothing, builds its one runtime here, its loop
  in a thread of its own that every task thread hands its coroutine to;
- `worker_process_init` (each prefork child): start Sentry again (its transport thread does not
  survive the fork), build the child's runtime and provide it to tasks;
- `worker_process_shutdown` (a prefork child) and `worker_shutdown` (the worker): close it;
- `worker_ready` (the parent, once its consumer reached the broker): log the one ready line,
  and silence Celery's warning, at each loss of the broker, that it will cancel running tasks
  by default one day (actonce keeps them running, `celery_config` says why).

Start a worker with `actonce worker`, or `celery -A actonce.worker.app worker -Q actonce.attempts`.
"""

import logging
import sys
import warnings
from typing import Any

from billiard.process import current_process
from celery import Celery
from celery.concurrency import get_implementation
from celery.concurrency.thread import TaskPool as ThreadPool
from celery.exceptions import CPendingDeprecationWarning
from celery.signals import (
    worker_init,
    worker_process_init,
    worker_process_shutdown,
    worker_ready,
    worker_shutdown,
)

from actonce.tasks.attempt import ATTEMPT_TASK
from actonce.tasks.lifecycle import worker_lost_retry_s
from actonce.tasks.turn_task import TURN_TASK
from actonce.worker.observers import setup
from actonce.worker.process import current, sentinels, telemetry
from actonce.worker.process.health import ready_line
from actonce.worker.process.interpreter import keep_startup_heap
from actonce.worker.settings import ATTEMPTS_QUEUE, TURNS_QUEUE, Settings, SettingsError

log = logging.getLogger("actonce.worker")

TASK_MODULES = ("actonce.tasks.attempt", "actonce.tasks.turn_task")
"""The modules that register actonce's tasks (`shared_task`), included by every app."""


def celery_config(settings: Settings) -> dict[str, Any]:
    """Return Celery's configuration for these settings: JSON only, late acks, prefetch 1."""
    transport = {"visibility_timeout": settings.visibility_timeout_s} | _sentinel_options(settings)
    return {
        "broker_url": _for_celery(settings.broker_url),
        "result_backend": _for_celery(settings.results_url),
        "broker_transport_options": transport,
        "result_backend_transport_options": transport,
        "broker_connection_retry_on_startup": True,
        "broker_connection_max_retries": settings.broker_max_retries,
        "task_serializer": "json",
        "result_serializer": "json",
        "accept_content": ["json"],
        "result_accept_content": ["json"],
        "task_acks_late": True,
        "worker_prefetch_multiplier": 1,
        # A child killed mid-attempt becomes a retry of the message, delivered once reflexr's
        # lease has lapsed, so the claim records the attempt abandoned and retries under the
        # rule's policy; the dispatcher's sweep finds it too if this message is lost.
        "task_retry_on_worker_lost": True,
        # Celery has no `task_default_retry_delay` setting: a task's `default_retry_delay`
        # (what a worker-lost retry waits) is set through its annotations.
        "task_annotations": {
            ATTEMPT_TASK: {"default_retry_delay": worker_lost_retry_s(settings.lease_ttl_s)}
        },
        "task_soft_time_limit": settings.soft_time_limit_s,
        "task_time_limit": settings.time_limit_s,
        "worker_send_task_events": True,
        "task_send_sent_event": True,
        # The pool's truth is reflexr's run; Flower follows the task events. Storing STARTED in
        # the result backend cost a Redis write per attempt for no reader.
        "task_track_started": False,
        # A broker that restarts must not kill the tasks running meanwhile: Celery would
        # terminate their children, so an attempt burned one of its rule's attempts, and a turn
        # killed after it started was recorded abandoned and never answered (artifactr's limit).
        # Running on is safe: kombu restores their unacked messages, and the redelivery finds the
        # run leased or finished (reflexr declines the claim) or the turn taken or busy.
        "worker_cancel_long_running_tasks_on_connection_loss": False,
        "task_default_queue": ATTEMPTS_QUEUE,
        "task_routes": {ATTEMPT_TASK: {"queue": ATTEMPTS_QUEUE}, TURN_TASK: {"queue": TURNS_QUEUE}},
        "result_expires": 86400,
        "worker_consumer": "actonce.worker.intake.consumer:IntakeConsumer",
    }


def create_app(settings: Settings) -> Celery:
    """Return the Celery app for `settings`, and make both this process's.

    The app includes actonce's task modules and, when it runs a worker, checks the definition
    and stores before forking and builds a runtime in each prefork child.
    """
    celery = Celery("actonce", include=list(TASK_MODULES))
    celery.conf.update(celery_config(settings))
    current.configure(settings, celery)
    worker_init.connect(_check_before_forking, dispatch_uid="actonce.check")
    worker_process_init.connect(_build_runtime, dispatch_uid="actonce.runtime")
    worker_process_shutdown.connect(_close_runtime, dispatch_uid="actonce.close")
    worker_shutdown.connect(_close_runtime, dispatch_uid="actonce.close_worker")
    worker_ready.connect(_log_ready, dispatch_uid="actonce.ready")
    worker_ready.connect(_keep_startup_heap, dispatch_uid="actonce.heap")
    worker_ready.connect(_hush_the_default_to_come, dispatch_uid="actonce.hush")
    return celery


def make_celery(settings: Settings) -> Celery:
    """Return a Celery app for `settings` that only sends: no process wiring, no signals.

    For clients (tests, benches, an app that enqueues by name) beside a process's own app.
    """
    celery = Celery("actonce", include=list(TASK_MODULES), set_as_current=False)
    celery.conf.update(celery_config(settings))
    return celery


def __getattr__(name: str) -> Any:
    # `celery -A actonce.worker.app` asks this module for `app`: build it from the environment
    # on that first ask, never at import.
    if name != "app":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    global _app
    if _app is None:
        try:
            settings = Settings.from_env()
        except SettingsError as invalid:
            print(f"actonce: {invalid}", file=sys.stderr)
            raise SystemExit(2) from invalid
        _app = create_app(settings)
    return _app


_app: Celery | None = None


def _check_before_forking(sender: Any = None, **_: object) -> None:
    # A worker that cannot load the definition, or whose stores disagree with it, would cancel
    # runs or fail every attempt: it exits here instead, naming the fix. SystemExit passes
    # Celery's signal dispatch, which swallows ordinary exceptions.
    threads = _runs_threads(sender)
    setup.observe(current.settings(), "worker", forks=not threads)
    # The intake keeps refused messages in this process: the app's observers hear of them too.
    setup.observe_also(current.check_or_exit(current.settings()))
    if threads:
        current.start(current.settings(), threaded=True)


def _runs_threads(worker: Any) -> bool:
    """Whether `worker` (a WorkController at `worker_init`) runs its tasks in threads."""
    pool = getattr(worker, "pool_cls", None)
    if pool is None:
        return False
    implementation = get_implementation(pool)
    return isinstance(implementation, type) and issubclass(implementation, ThreadPool)


def _build_runtime(**_: object) -> None:
    telemetry.forget_after_fork()
    setup.observe(current.settings(), "child", child=_process_index())
    current.start(current.settings())
    # A child serves attempts for its whole life: what it built to serve them stays.
    keep_startup_heap()


def _keep_startup_heap(**_: object) -> None:
    # The main process receives, acks and reports every message for the worker's life; by now
    # it has built its consumer, its pool (and, with threads, the runtime) and forked.
    keep_startup_heap()


def _process_index() -> int:
    """This prefork child's index in its pool, from 0: billiard gives a recycled child's index to
    the child that replaces it."""
    return int(getattr(current_process(), "index", 0) or 0)


def _close_runtime(**_: object) -> None:
    # A child recycled or stopped warm flushes what it recorded before it goes.
    try:
        current.stop()
    finally:
        telemetry.stop()


def _log_ready(sender: Any = None, **_: object) -> None:
    # Celery sends it once the consumer reached the broker; the stores were checked at
    # worker_init. Its own banner shows the broker's URL, not the stores.
    queues = sorted(sender.app.amqp.queues.consume_from) if sender is not None else []
    concurrency = getattr(getattr(sender, "controller", None), "concurrency", None)
    log.info(
        "%s", ready_line(current.settings(), role="worker", queues=queues, concurrency=concurrency)
    )


def _hush_the_default_to_come(**_: object) -> None:
    # Not at create_app: Celery's logging setup, later, puts its deprecation warnings back to
    # "always", ahead of any earlier filter.
    warnings.filterwarnings(
        "ignore",
        message=r"\s*In Celery 5\.1 we introduced an optional breaking change",
        category=CPendingDeprecationWarning,
    )


def _sentinel_options(settings: Settings) -> dict[str, Any]:
    """kombu's and Celery's sentinel transport options: the master's name and the sentinels'
    own password (Celery's `inspect conf` masks a `password` key)."""
    if not settings.broker_master_name:
        return {}
    options: dict[str, Any] = {"master_name": settings.broker_master_name}
    if settings.broker_sentinel_password is not None:
        secret = settings.broker_sentinel_password.get_secret_value()
        options["sentinel_kwargs"] = {"password": secret}
    return options


def _for_celery(url: str) -> str:
    # kombu and Celery read a sentinel URL's database and password off its first part only.
    return sentinels.parse(url).for_celery() if sentinels.is_sentinel(url) else url
