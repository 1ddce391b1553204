"""What a task stopped by Celery's soft time limit does: it is delivered again, at once.

In a prefork child the soft limit (`ACTONCE_SOFT_TIME_LIMIT_S`) cancels the task's coroutine
(`actonce.worker.process.soft_limit`). An attempt's action is cancelled and reflexr's executor
releases the run's lease, leaving the run `running`; a turn still running in its thread is stopped
(recorded ``stopped``; its message counts as taken). Nothing is settled yet, so the task does not
fail: it retries, and the next delivery settles on what the stores hold. For an attempt, reflexr's
claim records the cancelled attempt as failed (``abandoned``), and the rule's `RetryPolicy`
decides when it runs again, or its attempts have run out and it is dead-lettered. For a turn, the
message is found taken. Each soft limit costs an attempt of the run or an ask of the turn's
budget, so a task that always runs past it ends as a dead letter, not a loop.
"""

import logging
from typing import Any

from celery import Task
from celery.exceptions import Retry

from actonce.tasks.lifecycle import SOFT_LIMIT_RETRY_S


def retry_after_soft_limit(task: Task[Any, Any], log: logging.Logger, what: str) -> Retry:
    """Send `task`'s retry after its soft time limit stopped it, log it as `what` (ids only),
    and return it to raise."""
    log.warning(
        "%s task_id=%s: stopped at its soft time limit (ACTONCE_SOFT_TIME_LIMIT_S=%ss); "
        "delivered again in %ss",
        what,
        task.request.id,
        task.app.conf.task_soft_time_limit,
        SOFT_LIMIT_RETRY_S,
    )
    return task.retry(countdown=SOFT_LIMIT_RETRY_S, max_retries=None, throw=False)
