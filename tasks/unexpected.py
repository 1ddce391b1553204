"""An error no branch of a task expected: its type leaves the process, its text does not.

Celery publishes a failed task's exception, its repr and its traceback, in the `task-failed`
event (Redis, then Flower) and in its result when one is kept. An error that escaped reflexr's
executor or the pool's own writes is a library's, and a library's text may quote what it failed
on: a database error its message (a trigger's, a constraint's), artifactr's `PatchFailed` the
artifact. So a task raises `UnexpectedError` in its place, naming the error's types and the
task's ids only, and listed in the task's `throws`: Celery logs it at INFO without a traceback,
and sentry-sdk's Celery integration leaves it alone. The error itself is logged at ERROR with its
traceback, which stays in the worker's log and, when Sentry started in the process, is its
report there: by type and stack, its text dropped by the pool's scrubbing.

The run is not lost: it stays as its last committed transaction left it, and the dispatcher's
sweep sends it again once its lease lapses.
"""

import logging
from typing import Any

from celery import Task
from celery.exceptions import Retry

from actonce.tasks.lifecycle import Reason
from actonce.tasks.outage import is_store_outage, retry_through


class UnexpectedError(Exception):
    """Raised (as a task's FAILURE) in place of an error nothing expected: its types and the
    task's ids, never its text, which is in the worker's log."""


def escaped(
    task: Task[Any, Any], error: Exception, log: logging.Logger, *, kind: str, what: str
) -> Exception:
    """Return what `task` raises (`from None`) for `error`, which escaped its body: its retry
    for a store's outage (`tasks.outage`, logged as `kind`), else an `UnexpectedError`
    (`contained`, logged as `what`).

    Raises:
        Exception: `error` itself, if it ends the task on purpose (`ends_the_task`).
    """
    if ends_the_task(task, error):
        raise error
    if is_store_outage(error):
        retry: Exception = retry_through(task, error, log, kind)  # celery's Retry is untyped
        return retry
    return contained(error, log, what)


def ends_the_task(task: Task[Any, Any], error: BaseException) -> bool:
    """Return whether `error` is how `task` means to end: Celery's `Retry`, or one of the
    exceptions it `throws` (a dead letter's, a malformed message's), raised on purpose."""
    return isinstance(error, (Retry, *task.throws))


def contained(error: BaseException, log: logging.Logger, what: str) -> UnexpectedError:
    """Log `error` with its traceback at ERROR, and return the `UnexpectedError` to raise in its
    place (`from None`, so that Celery's traceback does not carry it either).

    Args:
        error: What escaped the task.
        log: The task's logger; with Sentry started, the line is reported there.
        what: Which task and ids, as the task's log lines name them (`attempt run_id=…`).
    """
    kinds = kinds_of(error)
    log.error("%s failed unexpectedly (%s)", what, kinds, exc_info=error)
    return UnexpectedError(
        f"{Reason.UNEXPECTED_ERROR}: {kinds} in {what}; its traceback is in the worker log"
    )


def kinds_of(error: BaseException) -> str:
    """Name `error` by its type, and an exception group by its members' types:
    `ExceptionGroup(DBAPIError)`."""
    if isinstance(error, BaseExceptionGroup):
        members = sorted({kinds_of(member) for member in error.exceptions})
        return f"{type(error).__name__}({', '.join(members)})"
    return type(error).__name__
