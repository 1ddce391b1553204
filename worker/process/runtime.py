"""One process's runtime: its event loop, SQL engines and store handles, built once.

SQL engines, reflexr's and artifactr's storage and their `asyncio.Condition`s belong to the loop
that first uses them, so a prefork child builds one `Runtime` in `worker_process_init`, with one
`asyncio.Runner` that lives as long as the child, and hands every task's coroutine to it: never
`asyncio.run` per task; the loop is uvloop's unless `ACTONCE_EVENT_LOOP` says otherwise
(`worker.process.interpreter`). The dispatcher and the CLI build one too. `close()` undoes `open()`,
in reverse.

The attempt seam is reflexr's own executor over a storage view (`worker.storage.one_run`) whose
`due_runs` answers with just the run a task names, so that `Reactor.execute(limit=1)` leases,
claims, runs, renews and records exactly that run. A `Reactor` per attempt, with a holder of its
own: two attempts of a run under one holder would both get the lease.
"""

import asyncio
import concurrent.futures
import functools
import logging
import os
import socket
import threading
import uuid
from collections.abc import Callable, Collection, Coroutine, Sequence
from typing import Any, Final

import artifactr
import artifactr.agent
import artifactr.sql
import reflexr.sql
import reflexr.workspace as rw
from celery import Celery
from lattice_core.sql.sqlite import create_sqlite_engine
from reflexr.core import Rule, Run
from reflexr.workspace import Reactor, RunPolicy, WorkspaceRef, run_lease
from relayr.events import BRIDGED
from relayr.inbound.followers import SOURCE
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from actonce.tasks.outbound import Outbound, TurnDesk
from actonce.tasks.turns import SqlTurnRequests, TurnRequest, retired
from actonce.worker.dead_letters.store import SqlDeadLetters
from actonce.worker.definition import (
    Definition,
    DefinitionError,
    check_retry_delays,
    check_turn_agent,
    cut_short_by_the_soft_limit,
)
from actonce.worker.dispatching.turn_sends import send_turn
from actonce.worker.process.interpreter import new_event_loop
from actonce.worker.process.soft_limit import run_to_soft_limit
from actonce.worker.settings import Settings, mask_url
from actonce.worker.storage.cause_ledger import SqlLedger
from actonce.worker.storage.committed_runs import ReportingStorage
from actonce.worker.storage.one_run import OneRunStorage, attempting
from actonce.worker.storage.unreachable import StoreUnreachable, describe

log = logging.getLogger("actonce.runtime")

POOL_RECYCLE_S: Final = 1800
"""How old a pooled PostgreSQL connection may get before it is replaced, in seconds."""


class RuntimeNotReady(RuntimeError):
    """Raised when a task uses the runtime before `worker_process_init` built it."""


class StoresNotMigrated(RuntimeError):
    """Raised at start when a store's tables are missing: run `actonce migrate` first."""


class Runtime:
    """A process's loop, engines and handles for one application definition.

    Args:
        settings: The pool's settings.
        definition: The application definition every process shares.
        one_run: Whether reflexr's storage answers only the current task's run (workers), or
            every due run (the dispatcher, the CLI).
        celery: The app that announces turns a `send` asks for; without it, a `send` in this
            process raises `RuntimeNotReady` after recording its turn request (the dispatcher's
            sweep announces it later).
        threaded: Whether the loop runs in a thread of its own, so that several threads (a
            `--pool threads` worker's) hand it coroutines at once and their waits overlap; else
            it runs in the calling thread, one coroutine at a time (a prefork child, the CLI).
    """

    def __init__(
        self,
        settings: Settings,
        definition: Definition,
        *,
        one_run: bool,
        celery: Celery | None = None,
        threaded: bool = False,
    ) -> None:
        self.settings = settings
        self.definition = definition
        self._celery = celery
        self._one_run = one_run
        loop_factory = functools.partial(new_event_loop, settings.event_loop)
        self._runner: asyncio.Runner | LoopThread = (
            LoopThread(loop_factory) if threaded else asyncio.Runner(loop_factory=loop_factory)
        )
        self._engines: dict[str, AsyncEngine] = {}
        self._turn_runner: artifactr.agent.Runner[Any] | None = None

    @property
    def loop_runs_between_calls(self) -> bool:
        """Whether the loop runs between `run` calls (a threaded runtime's), or only during them
        (a prefork child's): then what a call leaves running is cancelled as it returns."""
        return isinstance(self._runner, LoopThread)

    def run[T](self, coroutine: Coroutine[Any, Any, T], *, timeout_s: float | None = None) -> T:
        """Run a coroutine to its end on this process's loop.

        On a loop that runs only during calls, the tasks the coroutine started and left running
        are cancelled before this returns, as `asyncio.run` cancels them.

        Raises:
            TimeoutError: If `timeout_s` passed first (threaded loops only); the coroutine is
                cancelled.
            SoftTimeLimitExceeded: If Celery's soft time limit passed first (a prefork child's
                loop: `worker.process.soft_limit`); the coroutine is cancelled.
        """
        if isinstance(self._runner, LoopThread):
            return self._runner.run(coroutine, timeout_s=timeout_s)
        return run_to_soft_limit(self._runner, _leaving_nothing_running(coroutine))

    def open(self, *, check: bool = True) -> "Runtime":
        """Build the engines and the handles on this process's loop; check they fit.

        Raises:
            StoresNotMigrated: If `check` and a store's tables are missing.
            StoreUnreachable: If `check` and a store's database cannot be used (unreachable,
                missing, refusing the login, or an unsupported URL); one line, password masked.
            DefinitionError: If `check` and the definition's rules and actions disagree, or
                waiting runs name rules the definition does not know.
        """
        self.run(self._open(check=check))
        return self

    def close(self) -> None:
        """Dispose of the engines and close the loop: what `open` made, in reverse."""
        try:
            if self._turn_runner is not None:
                self.run(self._turn_runner.aclose())
            for engine in reversed(list(self._engines.values())):
                self.run(engine.dispose())
        finally:
            self._engines.clear()
            self._runner.close()

    # ─── what tasks use ───────────────────────────────────────────────────────

    def engine(self, store: str) -> AsyncEngine:
        """Return the engine of `store`; stores on one URL share one engine."""
        url = self.settings.store_url(store)
        if url not in self._engines:
            self._engines[url] = make_engine(url)
        return self._engines[url]

    def turn_runner(self) -> "artifactr.agent.Runner[Any]":
        """Return this process's Runner for the definition's turn agent, made on first use, and
        again after a turn task closed it to leave nothing running (`tasks.turns.retired`).

        Raises:
            DefinitionError: If the definition has no `turn_agent`.
        """
        if self._turn_runner is None or retired(self._turn_runner):
            if self.definition.turn_agent is None:
                raise DefinitionError(
                    f"{self.settings.app!r} has no turn_agent, yet a turn was asked for"
                )
            self._turn_runner = artifactr.agent.Runner(self.definition.turn_agent(), app=None)
        return self._turn_runner

    def reactor(
        self,
        *,
        batch_size: int = 500,
        rules: Collection[str] | None = None,
        holder: str | None = None,
    ) -> Reactor[Any]:
        """Return a new Reactor with a holder of its own: one per attempt, it does no I/O.

        `batch_size` is how many log entries each of its evaluation transactions reads
        (reflexr's default, 500). With `rules`, it knows only those of the definition's rules:
        it evaluates them alone, over the same storage (the dispatcher's evaluation of the rules
        an append concerns); its executor must not be used, as it would cancel the runs of the
        others. `holder` is its name in leases, by default a new one (`new_holder`).
        """
        holder = holder or new_holder()
        workspaces = self.reflexr
        if rules is not None:
            chosen = [rule for rule in self.definition.rules if rule.name in rules]
            workspaces = self._reflexr_workspaces(workspaces.storage, chosen)
        return Reactor(
            workspaces,
            actions=self.actions,
            deps=self.deps,
            holder=holder,
            lease_ttl=self.settings.lease_ttl,
            concurrency=1,
            batch_size=batch_size,
        )

    async def attempt(self, ref: WorkspaceRef, run_id: str) -> tuple[bool, Run | None]:
        """Have reflexr's executor attempt exactly `run_id`; return whether it finished, and the
        run as the attempt left it (None if there is no such run).

        A finished attempt's run is the one its last transaction committed; otherwise the run
        is read: something else may have moved it.
        """
        holder = new_holder()
        with attempting(ref, run_id, holder=holder, ttl=self.settings.lease_ttl) as target:
            try:
                finished = await self.reactor(holder=holder).execute(limit=1) > 0
            finally:
                if target.leased:  # taken with the run's read, and never asked for
                    await self.reflexr.storage.release_lease(ref, run_lease(run_id), holder)
        if finished and target.saved is not None:
            return True, target.saved
        return finished, await self.reflexr.storage.run(ref, run_id)

    # ─── how ──────────────────────────────────────────────────────────────────

    async def _open(self, *, check: bool) -> None:
        definition = self.definition
        if check:
            await self._check_migrated()
        storage = (
            OneRunStorage(
                self.engine("reflexr"),
                unordered_rules=[rule.name for rule in definition.rules if rule.ordering == "none"],
            )
            if self._one_run
            else ReportingStorage(self.engine("reflexr"))
        )
        self.reflexr = self._reflexr_workspaces(storage, definition.rules)
        self.artifactr = artifactr.Workspaces(
            artifactr.sql.SqlStorage(self.engine("artifactr")),
            types=list(definition.artifact_types),
            authorize=definition.artifactr_authorize,
        )
        self.ledger = SqlLedger(self.engine("relayr"))
        self.turn_requests = SqlTurnRequests(self.engine("actonce"))
        self.outbound = Outbound(
            self.artifactr,
            self.ledger,
            allowlists=definition.allowlists,
            turns=TurnDesk(self.turn_requests, self._announce_turn),
        )
        self.actions = dict(definition.actions(self.outbound))
        self.deps = definition.deps(self.outbound)
        self.dead_letters = SqlDeadLetters(self.engine("actonce"))
        try:
            self.reactor()
        except Exception as mismatch:
            raise DefinitionError(
                f"the definition {self.settings.app!r} does not hold together: {mismatch}"
            ) from mismatch
        if check:
            check_turn_agent(definition, repr(self.settings.app))
            check_retry_delays(definition, self.settings.max_retry_delay_s, repr(self.settings.app))
            for warning in cut_short_by_the_soft_limit(
                definition,
                soft_time_limit_s=self.settings.soft_time_limit_s,
                turn_wait_s=self.settings.turn_wait_s,
            ):
                log.warning("%s", warning)
            await self._check_known_rules()

    def _reflexr_workspaces(self, storage: rw.Storage, rules: Sequence[Rule]) -> rw.Workspaces:
        definition = self.definition
        return rw.Workspaces(
            storage,
            events=[*BRIDGED, *definition.events],
            emitted=definition.emitted,
            publishers={"artifactr": [SOURCE]},
            rules=rules,
            max_depth=definition.max_depth,
            authorize=definition.reflexr_authorize,
        )

    async def _announce_turn(self, request: TurnRequest) -> None:
        # Hand a turn request to the turn workers: a message on the turns queue, ids only.
        if self._celery is None:
            raise RuntimeNotReady(
                "this runtime has no Celery app to announce turns with: pass celery= to Runtime"
            )
        send_turn(self._celery, request)

    async def _check_migrated(self) -> None:
        for store, table in _VERSION_TABLES.items():
            url = self.settings.store_url(store)
            try:
                async with self.engine(store).connect() as connection:
                    # Reached: only a missing table means the store needs `actonce migrate`.
                    try:
                        await connection.execute(text(f"SELECT 1 FROM {table} LIMIT 1"))
                    except Exception as missing:
                        raise StoresNotMigrated(
                            f"the {store} store at {mask_url(url)} has no {table}: "
                            f"run `actonce migrate` (or `make migrate`) once before starting"
                        ) from missing
            except StoresNotMigrated:
                raise
            except Exception as failed:
                raise StoreUnreachable(describe(store, url, failed)) from failed

    async def _check_known_rules(self) -> None:
        """Refuse to start when waiting runs name rules it lacks: a worker would cancel them."""
        known = self.definition.rule_names
        storage = self.reflexr.storage
        due = await reflexr.sql.SqlStorage.due_runs(
            storage,  # type: ignore[arg-type]
            now=self.reflexr.clock(),
            limit=1000,
            policy=RunPolicy.of(self.reflexr.rules.values()),
        )
        unknown = sorted({run.rule for _, run in due if run.rule not in known})
        if unknown:
            raise DefinitionError(
                f"runs are waiting for rules {unknown} that {self.settings.app!r} does not "
                f"define; a worker would cancel them. Deploy the definition that has them."
            )


def new_holder() -> str:
    """A name in leases no other reactor has: host, process and a random part."""
    return f"actonce-{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:12]}"


class LoopThread:
    """An event loop running in a daemon thread of its own, fed coroutines from other threads.

    What `asyncio.Runner` is for one thread, for many: each `run` blocks its caller until its
    coroutine ends, while the loop interleaves every caller's coroutines. The loop runs between
    calls too, so background work (a turn the Runner carries on, a pool's connection reset) is
    not frozen until the next call.
    """

    def __init__(
        self, loop_factory: Callable[[], asyncio.AbstractEventLoop] = asyncio.new_event_loop
    ) -> None:
        self._loop = loop_factory()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="actonce-loop", daemon=True
        )
        self._thread.start()

    def run[T](self, coroutine: Coroutine[Any, Any, T], *, timeout_s: float | None = None) -> T:
        """Run `coroutine` on the loop and return its result, from any thread but the loop's.

        Raises:
            TimeoutError: If `timeout_s` passed first; the coroutine is cancelled.
            RuntimeError: If called from the loop's own thread (it would wait on itself), or
                after `close`.
        """
        if threading.current_thread() is self._thread:
            coroutine.close()
            raise RuntimeError("LoopThread.run was called from its own loop: await instead")
        if self._loop.is_closed():
            coroutine.close()
            raise RuntimeError("LoopThread.run was called after close")
        future = asyncio.run_coroutine_threadsafe(coroutine, self._loop)
        try:
            return future.result(timeout_s)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise TimeoutError(f"the coroutine ran past {timeout_s}s and was cancelled") from None

    def close(self) -> None:
        """Cancel what still runs on the loop, stop it and close it; a second call does nothing."""
        if self._loop.is_closed():
            return
        self.run(_cancel_others())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.run_until_complete(self._loop.shutdown_asyncgens())
        self._loop.close()


async def _leaving_nothing_running[T](coroutine: Coroutine[Any, Any, T]) -> T:
    """Await `coroutine`, then cancel what it left running, and wait for that to end.

    For a loop that stops until the next call, which may be another task's: what a call left
    running (the turn Runner's look at a thread a `claim_ttl` on, a hand-over) would freeze
    meanwhile and wake inside that call. `asyncio.run` cancels it too.
    """
    try:
        return await coroutine
    finally:
        if len(asyncio.all_tasks()) > 1:
            await _cancel_others()


async def _cancel_others() -> None:
    """Cancel every task of the running loop but this one, and wait for them to end."""
    others = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
    for task in others:
        task.cancel()
    await asyncio.gather(*others, return_exceptions=True)


def make_engine(url: str) -> AsyncEngine:
    """Return an engine for a store URL: SQLite through lattice's own, else SQLAlchemy's.

    Its errors never quote a statement's parameters (`hide_parameters`): they hold messages'
    content and artifacts' data, and an error's text reaches logs, task results and Sentry.
    """
    if url.startswith("sqlite"):
        path = url.split(":///", 1)[-1]
        if path and path != ":memory:":
            os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        return create_sqlite_engine(url, hide_parameters=True)
    # No `pool_pre_ping`: it pings before every checkout, a round trip per transaction, and an
    # attempt runs several. A connection the server dropped fails its statement instead,
    # SQLAlchemy then invalidates the pool, and the attempt is retried (reflexr's policy,
    # Celery's retry) or the dispatcher's poll runs again; `pool_recycle` replaces connections
    # before a server or a proxy times them out.
    return create_async_engine(url, pool_recycle=POOL_RECYCLE_S, hide_parameters=True)


_VERSION_TABLES: Final = {
    "reflexr": "reflexr_alembic_version",
    "artifactr": "artifactr_alembic_version",
    "relayr": "relayr_alembic_version",
    "actonce": "actonce_alembic_version",
}
"""A table per store whose absence means the store was never migrated."""
