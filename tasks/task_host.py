"""The process a task runs in, as the tasks see it: stores, loop and dead letters, by interface.

What a delivery's end makes of it is decided in `tasks.lifecycle` and announced to observers in
`tasks.observers`; the host only keeps what the task decided, and logs and reports nothing.

`tasks/` never imports `worker/`, so the attempt and turn tasks reach the process's stores
through `TaskHost`, a Protocol defined here and filled in by `actonce.worker` when a prefork
child starts (`worker_process_init`). A task asks `current()` for it; asking before a host was
provided raises `HostNotReady`, naming the signal that should have provided it, rather than
building handles on the wrong loop.
"""

from collections.abc import Coroutine
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

import artifactr
import artifactr.agent
import artifactr.core as a
from reflexr.core import Run
from reflexr.workspace import WorkspaceRef

from actonce.tasks.lifecycle import Reason
from actonce.tasks.observers import Letter
from actonce.tasks.turns import TurnRequest, TurnRequests


class HostNotReady(RuntimeError):
    """Raised when a task runs in a process whose host was never provided."""


@dataclass(frozen=True)
class TaskLimits:
    """The bounds a process sets on its tasks, read from its settings once."""

    max_message_bytes: int
    """The largest attempt message, in bytes, that is attempted rather than dead-lettered."""

    max_retry_delay_s: float
    """The furthest ahead a retry may be due: the intake refuses a message due later."""

    turn_wait_s: float
    """How long a turn worker waits for one turn to finish."""

    turn_max_asks: int
    """How many asks a turn request gets before it is dead-lettered `turn_not_taken`."""

    turn_backoff_s: float
    """How long a turn not taken waits before its next ask, doubled after each."""


class TaskHost(Protocol):
    """What the attempt and turn tasks need from the process that runs them."""

    @property
    def limits(self) -> "TaskLimits":
        """The process's bounds on what a task does, from its settings."""
        ...

    @property
    def loop_runs_between_tasks(self) -> bool:
        """Whether the process's loop runs between tasks, carrying on what a task left running
        (a turn past its wait); a prefork child's runs only while a task does."""
        ...

    @property
    def turn_requests(self) -> TurnRequests:
        """The durable turn requests that `send` records before its message."""
        ...

    def run[T](self, coroutine: Coroutine[Any, Any, T]) -> T:
        """Run a coroutine to its end on the process's one event loop, in the caller's trace."""
        ...

    def now(self) -> datetime:
        """Return the time on reflexr's clock."""
        ...

    async def attempt(self, ref: WorkspaceRef, run_id: str) -> tuple[bool, Run | None]:
        """Have reflexr's executor attempt exactly `run_id`; return whether it finished, and the
        run as the attempt left it (None if there is no such run)."""
        ...

    def hold_until(self, ref: WorkspaceRef, run: Run, eta: datetime) -> None:
        """Tell the dispatcher that `run`'s retry is on its way, so it sends no second one."""
        ...

    async def dead_letter_run(
        self, ref: WorkspaceRef, run: Run, *, task_id: str | None, queue: str | None
    ) -> Letter | None:
        """Keep a dead letter for a run reflexr left dead; return it if this call added it, None
        if another delivery had already."""
        ...

    async def dead_letter_message(
        self, raw: str, *, reason: Reason, error: str, task_id: str | None, queue: str | None
    ) -> Letter | None:
        """Keep a dead letter for a message that names no attempt; return it if it is new."""
        ...

    async def dead_letter_turn(
        self,
        request: TurnRequest,
        *,
        reason: Reason,
        error: str,
        task_id: str | None,
        queue: str | None,
    ) -> Letter | None:
        """Keep a dead letter for a turn request given up on, naming its tenant, workspace and
        message so a replay can announce it again; return it if this call added it."""
        ...

    async def open_workspace(
        self, tenant_id: str, workspace_id: str, *, actor: a.ExternalAgentActor
    ) -> artifactr.Workspace:
        """Open an artifactr workspace as `actor`."""
        ...

    def turn_runner(self) -> "artifactr.agent.Runner[Any]":
        """Return the process's Runner for the definition's turn agent."""
        ...


_host: TaskHost | None = None


def provide(host: TaskHost | None) -> None:
    """Make `host` the current process's host (None withdraws it, at process shutdown)."""
    global _host
    _host = host


def current() -> TaskHost:
    """Return the current process's host.

    Raises:
        HostNotReady: If no host was provided in this process.
    """
    if _host is None:
        raise HostNotReady(
            "no task host in this process: actonce.worker provides it in worker_process_init, "
            "in each prefork child; outside a worker, call "
            "actonce.worker.process.current.start(settings)"
        )
    return _host
