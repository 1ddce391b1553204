"""The dispatcher: evaluates rules, polls due runs, and sends one attempt message per due run.

It runs reflexr's own `tick` (schedules) and `evaluate` (rules → pending runs), then polls
`due_runs` across workspaces and sends `{tenant_id, workspace_id, run_id}` to the attempts queue.
A (run, epoch, status) is sent once while its mark lives (`worker.dispatching.sent_marks`); whatever
slips through is a duplicate that reflexr's claim declines. It is also the sweeper: a run whose
retry message was lost, or whose worker died (an orphan past its lease), is due again and is sent
again; a dead run whose delivery never wrote its letter gets it
(`worker.dead_letters.unsettled_deaths`). Several dispatchers may run: reflexr leases evaluation per
workspace, and marks dedupe sending.
"""

import asyncio
import contextlib
import logging
import time
from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Final

from celery import Celery
from kombu.messaging import Producer
from reflexr.core import Run
from reflexr.sql.tables import EventRow, WorkspaceRow
from reflexr.workspace import Reactor, RunPolicy, WorkspaceRef
from sqlalchemy import select

from actonce.tasks.attempt import ATTEMPT_TASK
from actonce.tasks.tracing import carried, continued
from actonce.tasks.turns import sweep
from actonce.worker.dead_letters.unsettled_deaths import UnsettledDeaths
from actonce.worker.dispatching.fair_backlog import FairBacklog, Held
from actonce.worker.dispatching.held_report import tell_held
from actonce.worker.dispatching.in_flight import in_flight_by_tenant
from actonce.worker.dispatching.nudge import Appended, Nudges
from actonce.worker.dispatching.rule_listeners import Listeners
from actonce.worker.dispatching.send_room import TOP_UP_EVERY_S, SendRoom
from actonce.worker.dispatching.sent_marks import SentMarks
from actonce.worker.dispatching.turn_sends import announced, send_turn, turn_name
from actonce.worker.observers import sentry
from actonce.worker.observers.metrics import DispatcherMetrics
from actonce.worker.process import telemetry
from actonce.worker.process.broker_access import broker_client
from actonce.worker.process.health import HEARTBEAT_EVERY_S, backoff_s, beat, ready_line, reason
from actonce.worker.process.runtime import Runtime, new_holder
from actonce.worker.settings import ATTEMPTS_QUEUE, QUEUES, TURNS_QUEUE, UNACKED_KEY
from actonce.worker.storage.bounded_reads import reading_up_to
from actonce.worker.storage.committed_runs import ReportingStorage
from actonce.worker.storage.leases import UpsertLeaseStorage

FULL_EVALUATION_EVERY_S: Final = 30.0
"""How often the dispatcher evaluates every workspace, not only those whose log has grown."""

STATS_EVERY_S: Final = 60.0
"""How often a serving dispatcher logs its figures (`DispatchStats`) at INFO."""

MEMO_S: Final = 5.0
"""How long the dispatcher remembers, in memory, a run it found marked as sent: a Redis restart
loses the marks and the queue, and such a run is sent again at most twice this much later (the
due scan backs off to it too). Never more than a quarter of a mark's life
(`ACTONCE_DEDUPE_TTL_S`): memo and scan back-off together renew a mark before it lapses while its
message waits in the queue."""

CPU_BURST_S: Final = 2.0
"""How many seconds of its CPU share the dispatcher may spend at once (`CpuBudget`): a few costly
polls in a row at low load go at once; only sustained load stretches the cycle."""

CATCH_UP_ENTRIES: Final = 100
"""How far quiet entries may carry a workspace's log past its last evaluation before the
dispatcher evaluates it anyway, once the log stands still and it has CPU to spare: reflexr's
evaluation reads every entry past a rule's cursor, so after a burst the next event would pay for
every run fact the burst left behind."""

EVALUATION_BATCH: Final = 100
"""How many log entries one of reflexr's evaluation transactions takes. Each commits its
firings, which the dispatcher sends while the next batch is evaluated: after a burst of events,
the workers start on the first hundred instead of idling until all are fired."""

KEEP_LEASE_S: Final = 1.0
"""How long a workspace's evaluation lease stays taken after an evaluation ended
(`worker.storage.leases`): at low load each event's evaluation took and deleted it, two
statements spent on a lease the same dispatcher asks for again at the workspace's next event,
while a second dispatcher waits at most this much longer for a workspace this one has just
evaluated."""

EVENT_CONTEXTS_KEPT: Final = 10_000
"""How many runs' event contexts a dispatcher with telemetry remembers, the oldest forgotten
first: a run still waiting is read again when it is sent again."""

TURN_SWEEP_EVERY_S: Final = 5.0
"""How often the dispatcher looks for untaken turn requests, at most (more often when
`ACTONCE_TURN_GRACE_S` is shorter)."""

log = logging.getLogger("actonce.dispatcher")

# Every poll reads the heads: one statement object, so its cache key is computed once.
_HEADS = select(WorkspaceRow.tenant_id, WorkspaceRow.workspace_id, WorkspaceRow.head_seq).where(
    WorkspaceRow.head_seq > 0
)


class DispatcherGaveUp(RuntimeError):
    """Raised by `serve` when polls kept failing: the dispatcher cannot go on; exit non-zero."""


@dataclass(frozen=True)
class Polled:
    """What one poll did."""

    fired: int
    """Runs reflexr's evaluation created."""

    due: int
    """Runs found due."""

    sent: int
    """Attempt messages sent."""


@dataclass
class DispatchStats:
    """What a dispatcher has done since it started, and the CPU each half of its polls took."""

    polls: int = 0
    """Polls made."""

    fired: int = 0
    """Runs reflexr's evaluation created."""

    evaluations: int = 0
    """Workspaces evaluated: those whose log had grown, and all of them on a full pass."""

    skipped: int = 0
    """Workspaces whose log had grown only by facts no rule listens to: not evaluated."""

    partial: int = 0
    """Evaluations of only the rules that heard something new
    (`worker.dispatching.rule_listeners.Listeners`)."""

    sent: int = 0
    """Attempt messages sent."""

    nudged: int = 0
    """Appends to reflexr's log PostgreSQL told the dispatcher of (`worker.dispatching.nudge`)."""

    lettered: int = 0
    """Dead letters written for runs no delivery settled
    (`worker.dead_letters.unsettled_deaths`)."""

    held: int = 0
    """Runs due and held for their tenant's turn, now (fair share)."""

    firing_cpu_s: float = 0.0
    """CPU in reflexr's `tick` and `evaluate`: the rules' firing, which any reactor pays."""

    sending_cpu_s: float = 0.0
    """CPU in looking for due runs, marking and sending them: what the pool adds."""

    def line(self) -> str:
        """One log line of these figures, `key=value` separated by spaces."""
        return (
            f"polls={self.polls} evaluations={self.evaluations} partial={self.partial} "
            f"skipped={self.skipped} fired={self.fired} "
            f"sent={self.sent} nudged={self.nudged} lettered={self.lettered} held={self.held} "
            f"firing_cpu_s={self.firing_cpu_s:.3f} sending_cpu_s={self.sending_cpu_s:.3f}"
        )


class Dispatcher:
    """Feeds the pool from reflexr's stores.

    Args:
        runtime: A runtime opened with `one_run=False`, on this process's loop.
        celery: The app whose broker the attempts queue is on.
    """

    def __init__(self, runtime: Runtime, celery: Celery) -> None:
        self._runtime = runtime
        self._celery = celery
        self._marks = SentMarks.of(runtime.settings)
        # One holder for all its reactors: a lease one of them keeps is the others' too.
        self._holder = new_holder()
        self._reactor = runtime.reactor(batch_size=EVALUATION_BATCH, holder=self._holder)
        self._listeners = Listeners.of(runtime.definition.rules)
        self._evaluators: dict[frozenset[str], Reactor[Any]] = {}
        self._next_turn_sweep = datetime.now(UTC)
        self._next_due_scan = 0.0
        self._scan_every_s = runtime.settings.sweep_interval_s
        self._next_full_evaluation = 0.0
        self._evaluated_heads: dict[WorkspaceRef, int] = {}
        self._read_heads = False
        self._cursors: dict[WorkspaceRef, int] = {}
        self.catch_up_entries = CATCH_UP_ENTRIES
        self.budget = CpuBudget(runtime.settings.dispatcher_max_cpu)
        self._memo: dict[tuple[str, str, str, int, str], float] = {}
        self._memo_pruned = 0.0
        self._memo_s = min(MEMO_S, runtime.settings.dedupe_ttl_s / 4)
        self._schedules = bool(runtime.reflexr.schedules)
        self._policy = RunPolicy.of(runtime.reflexr.rules.values())
        self._fired: list[tuple[WorkspaceRef, Run]] = []
        self._event_traceparents: dict[tuple[str, str, str], str] = {}
        self._metrics = DispatcherMetrics(runtime.settings, QUEUES, UNACKED_KEY)
        self._fired_committed = asyncio.Event()
        fair = runtime.settings
        # With fair share, what is due waits here for its tenant's turn, not in the queue.
        self._backlog = (
            FairBacklog(fair.weights, per_tenant=fair.dispatch_batch) if fair.fair_share else None
        )
        self._room = SendRoom(
            per_child=fair.fair_queued_per_child,
            least_children=fair.concurrency,
            top_up_s=TOP_UP_EVERY_S,
        )
        self._holding = asyncio.Event()
        self._held_new = 0
        self._dropped_seen = 0
        self._more_due = False
        storage = runtime.reflexr.storage
        if isinstance(storage, ReportingStorage):
            storage.listen(self._on_saved)
        self._leases = storage if isinstance(storage, UpsertLeaseStorage) else None
        if self._leases is not None:
            self._leases.keep_released = timedelta(seconds=KEEP_LEASE_S)
        self.stats = DispatchStats()
        self._unsettled = UnsettledDeaths(runtime)
        self._nudges = Nudges(runtime.engine("reflexr"), self._listeners.quiet)
        self._beats = broker_client(
            runtime.settings, socket_connect_timeout=2.0, socket_timeout=5.0
        )

    async def poll(self) -> Polled:
        """Tick schedules, evaluate rules, and send every due run not sent already.

        Due runs are looked for on a dispatcher's first poll, when a poll fired some, when the
        last look filled a batch, and every `sweep_interval_s` otherwise: under load every waiting
        run is due on every poll, and reading and marking them all at every poll cost the
        dispatcher CPU that grew with the queue, for runs it had sent already. A look that finds
        only runs sent already waits twice as long before the next, up to the marks' memo
        (`MEMO_S`).

        The runs an evaluation fires are sent as each of its transactions commits
        (`worker.storage.committed_runs`), without a look, unless their rule orders its runs by
        scope: those wait for the look, which knows which run of a scope is first.
        """
        # Thread CPU, not wall time: the loop runs nothing but this poll, and waiting on the
        # stores is not cost. The sends made while an evaluation runs count as firing.
        began = time.thread_time()
        started = time.monotonic()
        sent_before = self.stats.sent
        if self._schedules:  # `tick` reads every workspace: only when there is something to tick
            await self._reactor.tick()
        fired, handled = await self._evaluate_and_send()
        if self._leases is not None:
            await self._leases.release_kept()
        evaluated = time.thread_time()
        self.stats.polls += 1
        self.stats.fired += fired
        self.stats.firing_cpu_s += evaluated - began
        try:
            # Fired runs not sent or held meanwhile (scope-ordered, or marked already) need a
            # look.
            polled = await self._send_due(look=fired > handled)
        finally:
            self.stats.sending_cpu_s += time.thread_time() - evaluated
            self._metrics.polled(time.monotonic() - started)
        return Polled(fired=fired, due=polled.due, sent=self.stats.sent - sent_before)

    async def _evaluate_and_send(self) -> tuple[int, int]:
        """Evaluate (`_evaluate`), sending the runs it fires as their transactions commit;
        return the runs fired and those sent or held for their turn (`_send`)."""
        evaluation = asyncio.ensure_future(self._evaluate())
        sent = 0
        try:
            while True:
                committed = asyncio.ensure_future(self._fired_committed.wait())
                await asyncio.wait({evaluation, committed}, return_when=asyncio.FIRST_COMPLETED)
                committed.cancel()
                sent += await self._send_fired()
                if evaluation.done():
                    return evaluation.result(), sent
        finally:
            if not evaluation.done():
                evaluation.cancel()
                await asyncio.gather(evaluation, return_exceptions=True)

    def _on_saved(self, ref: WorkspaceRef, runs: Sequence[Run]) -> None:
        """Keep the runs a committed transaction fired that can start now, to send at once: a
        pending run due now, of a rule enabled and not ordered by scope."""
        now = self._runtime.reflexr.clock()
        policy = self._policy
        for run in runs:
            if (
                run.status == "pending"
                and run.next_attempt_at <= now
                and run.rule not in policy.ordered
                and run.rule not in policy.disabled
            ):
                self._fired.append((ref, run))
        if self._fired:
            self._fired_committed.set()

    async def _send_fired(self) -> int:
        """Send the runs kept by `_on_saved`; return how many were sent or held (`_send`)."""
        fired, self._fired = self._fired, []
        self._fired_committed.clear()
        parents = await self._event_contexts(fired)
        return self._send(fired, time.monotonic(), parents)

    async def _event_contexts(
        self, due: Sequence[tuple[WorkspaceRef, Run]]
    ) -> Mapping[tuple[str, str, str], str]:
        """Return the `traceparent` the first event of each of `due` was published in, by
        tenant, workspace and run id (a run's id is unique in its workspace only), when telemetry
        runs (else nothing, and nothing is read): one read of reflexr's log
        per run, remembered for as long as the run may be sent again."""
        if not telemetry.running():
            return {}
        known = self._event_traceparents
        for ref, run in due:
            key = (ref.tenant_id, ref.workspace_id, run.id)
            if key not in known:
                known[key] = await event_traceparent(self._runtime, ref, run)
        if len(known) > EVENT_CONTEXTS_KEPT:
            for run_id in list(known)[: len(known) - EVENT_CONTEXTS_KEPT]:
                del known[run_id]
        return known

    def _send_span(
        self, ref: WorkspaceRef, run: Run, parent: str | None
    ) -> AbstractContextManager[object]:
        """The span of one send, in the trace of the run's event; none without telemetry."""
        if parent is None:
            return contextlib.nullcontext()
        return continued(
            f"actonce.send {run.rule}",
            {"traceparent": parent} if parent else None,
            {
                "actonce.tenant_id": ref.tenant_id,
                "actonce.workspace_id": ref.workspace_id,
                "actonce.run_id": run.id,
                "actonce.rule": run.rule,
            },
        )

    async def _evaluate(self) -> int:
        """Evaluate the workspaces whose log has grown since this dispatcher last evaluated
        them, and every workspace every `FULL_EVALUATION_EVERY_S`; return the runs fired.

        reflexr's `evaluate()` visits every workspace, and each visit costs a lease and a few reads
        even when nothing is new: thousands of idle workspaces would make every poll slow. One read
        of every workspace's head finds the few that moved, and one read of the types appended since
        tells which rules can hear any of them (`worker.dispatching.rule_listeners`): only those are
        evaluated, and a head moved by the attempts' own run facts alone is not evaluated at all. A
        poll that PostgreSQL's notifications told of every append since the last
        (`worker.dispatching.nudge.Appended`) takes both from them, with no statement: only the
        workspaces heard to grow, up to the last entry heard; told that nothing was appended, it
        reads nothing, and looks only at the workspaces it last saw standing behind (for the
        catch-up, below). It reads them again after a poll that failed, or met a workspace's lease
        held by another dispatcher, and where the notifications leave a gap. The full pass, which
        reads every head, picks up what moves no head: a rule deployed or edited since, and a
        workspace another dispatcher was evaluating (its lease held) when this one looked. It too
        leaves a workspace whose log grew only by quiet entries since its last evaluation of every
        rule to the catch-up: reading every such backlog at once, on every full pass, spent the
        CPU budget in one go, and the budget then held back the next events' polls. The catch-up
        evaluates every rule of a workspace whose quiet stretch reached `catch_up_entries` once its
        log stands still for a poll, while the budget has CPU to spare.

        Each evaluation reads the log up to the head this poll read, no further
        (`worker.storage.bounded_reads`): what was appended since is the next poll's. A workspace
        counts as evaluated only once its rules' cursors reached that head: reflexr's `evaluate`
        skips a workspace whose lease another dispatcher holds, and that one may be evaluating other
        rules.
        """
        now = time.monotonic()
        full = now >= self._next_full_evaluation
        if full:
            self._next_full_evaluation = now + FULL_EVALUATION_EVERY_S
        appended = self._nudges.drain()
        if full or self._read_heads:
            appended = None
        # Until this evaluation went through every workspace: one that failed half way lost
        # what the notifications said, and the next poll reads the store instead.
        self._read_heads = True
        contended = False
        if appended is None:
            heads = await self._heads()
        elif appended.grown:
            heads = appended.heads()
        else:
            # Told of every append, and there was none: each log stands where this dispatcher
            # last saw it, and only one with a quiet stretch to catch up on has anything to do.
            heads = self._standing_behind()
        every = self._listeners.every
        fired = 0
        caught_up = False
        # The workspaces with the least to read first: a quiet tenant's event is not evaluated
        # after another tenant's burst of a thousand, a poll later than it could be.
        evaluated = self._evaluated_heads
        for ref, head in sorted(
            heads.items(), key=lambda item: item[1] - evaluated.get(item[0], 0)
        ):
            last = self._evaluated_heads.get(ref)
            if last is not None and head < last:
                continue  # heard of entries an evaluation has read already
            rules = every
            if last == head and not full:
                # A log that stood still since the last poll, with a long quiet stretch past
                # its last evaluation: pay it now, one workspace a poll, not on the next event.
                # Only a still log: during a burst the attempts' facts keep coming, and
                # reading them as they come cost the dispatcher CPU for every attempt of a burst
                # in one workspace.
                lagging = self._quiet_stretch_behind(ref, head)
                if caught_up or not lagging or not self.budget.spare(time.monotonic()):
                    continue
                caught_up = True
            else:
                # The full pass looks from the last evaluation of every rule, not the last look:
                # a stretch of quiet entries is never its reason to read them all, every 30 s,
                # everywhere.
                since = self._cursors.get(ref) if full else last
                if since is not None and since != head:
                    rules = await self._hearing(ref, since, head, appended)
                if not rules:
                    self._evaluated_heads[ref] = head
                    self.stats.skipped += 1
                    continue
            # Up to the head as read before: entries appended meanwhile (the firing's own facts,
            # the attempts') move it again, so the next poll looks once more.
            with reading_up_to(ref, head, rules=rules):
                fired_here = await self._evaluator(rules).evaluate(ref)
            fired += fired_here
            if not fired_here and not await self._reached(ref, rules, head):
                # Another dispatcher held the lease: look again next poll, whatever wakes it.
                contended = True
                continue
            self._evaluated_heads[ref] = head
            if rules == every:
                self._cursors[ref] = head
            else:
                self.stats.partial += 1
            self.stats.evaluations += 1
        self._read_heads = contended
        return fired

    def _standing_behind(self) -> dict[WorkspaceRef, int]:
        """Each workspace whose last head seen is a quiet stretch behind
        (`_quiet_stretch_behind`), and that head."""
        return {
            ref: head
            for ref, head in self._evaluated_heads.items()
            if self._quiet_stretch_behind(ref, head)
        }

    def _quiet_stretch_behind(self, ref: WorkspaceRef, head: int) -> bool:
        """Whether `head` is `catch_up_entries` or more past this dispatcher's last evaluation
        of every rule of `ref`: the catch-up's to read."""
        return head - self._cursors.get(ref, head) >= self.catch_up_entries

    def _evaluator(self, rules: frozenset[str]) -> "Reactor[Any]":
        """The reactor that evaluates `rules` alone; every rule's is the dispatcher's own."""
        if rules == self._listeners.every:
            return self._reactor
        if rules not in self._evaluators:
            self._evaluators[rules] = self._runtime.reactor(
                batch_size=EVALUATION_BATCH, rules=rules, holder=self._holder
            )
        return self._evaluators[rules]

    async def _hearing(
        self, ref: WorkspaceRef, after: int, head: int, appended: Appended | None
    ) -> frozenset[str]:
        """The rules some entry after `after` up to `head` may concern; empty if none may.

        The types are the notifications' (`appended`) where they cover those entries, else
        read."""
        listeners = self._listeners
        if listeners.always == listeners.every:
            return listeners.every
        heard = None if appended is None else appended.types(ref, after, head)
        if heard is not None:
            return listeners.hearing(heard)
        query = (
            select(EventRow.event_type)
            .distinct()
            .where(
                EventRow.tenant_id == ref.tenant_id,
                EventRow.workspace_id == ref.workspace_id,
                EventRow.seq > after,
                EventRow.seq <= head,
                EventRow.event_type.in_(listeners.listened),
            )
        )
        async with self._runtime.engine("reflexr").connect() as connection:
            types = (await connection.execute(query)).scalars().all()
        return listeners.hearing(types)

    async def _reached(self, ref: WorkspaceRef, rules: frozenset[str], head: int) -> bool:
        """Whether each of `rules` has evaluated the log of `ref` up to `head`."""
        progress = await self._runtime.reflexr.storage.progress(ref)
        return all(name in progress and progress[name].cursor >= head for name in rules)

    async def _heads(self) -> dict[WorkspaceRef, int]:
        """Every workspace with a log, and its head `seq`: one statement."""
        async with self._runtime.engine("reflexr").connect() as connection:
            rows = (await connection.execute(_HEADS)).all()
        return {WorkspaceRef(tenant, workspace): head for tenant, workspace, head in rows}

    async def _send_due(self, *, look: bool) -> Polled:
        """Send the due runs not sent already, if `look` or the next due scan is due; then
        sweep (`_sweep`)."""
        runtime = self._runtime
        batch = runtime.settings.dispatch_batch
        backlog = self._backlog
        # With fair share, due runs past those held were left in reflexr: look for them once
        # most of the held ones went.
        refill = backlog is not None and self._more_due and len(backlog) < batch // 2
        if not (look or refill or time.monotonic() >= self._next_due_scan):
            await self._sweep()
            return Polled(fired=0, due=0, sent=0)
        due = await runtime.reflexr.storage.due_runs(
            now=runtime.reflexr.clock(), limit=batch, policy=self._policy
        )
        now = time.monotonic()
        sent_before = self.stats.sent
        self._send(due, now, await self._event_contexts(due))
        sent = self.stats.sent - sent_before
        # A full batch that sent something may hide more due runs: look again at once (with
        # fair share, once the held runs went). One that found only runs sent already is a
        # queue waiting for workers: each such look reads them all again, so the next waits
        # longer, never past the memo (marks must be renewed while their messages wait).
        progressed = sent + self._held_new
        if backlog is not None:
            self._more_due = len(due) >= batch and progressed > 0
        full = backlog is None and len(due) >= batch and sent > 0
        sweep_s = runtime.settings.sweep_interval_s
        idle = due and not progressed
        self._scan_every_s = (
            max(sweep_s, min(2 * self._scan_every_s, self._memo_s)) if idle else sweep_s
        )
        self._next_due_scan = 0.0 if full else now + self._scan_every_s
        await self._sweep()
        if sent:
            log.debug("due=%s sent=%s", len(due), sent)
        return Polled(fired=0, due=len(due), sent=sent)

    def _send(
        self,
        due: Sequence[tuple[WorkspaceRef, Run]],
        now: float,
        parents: Mapping[tuple[str, str, str], str] | None = None,
    ) -> int:
        """Send each of `due` not marked as sent, and mark it; return how many went. With
        telemetry, each send is a span in the trace of its run's event (`parents`:
        `_event_contexts`).

        With fair share, hold them instead (`FairBacklog`) and send, in turn, what the queue
        has room for (`_top_up`); return how many of `due` are sent or held, runs found
        marked as sent left out.
        """
        backlog = self._backlog
        if backlog is None:
            return self._send_now([Held(ref, run, now) for ref, run in due], now, parents)
        self._forget_marks(now)
        fresh = [(ref, run) for ref, run in due if _mark_key(ref, run) not in self._memo]
        self._held_new = backlog.hold(fresh, now)
        if backlog.dropped != self._dropped_seen:
            self._dropped_seen = backlog.dropped
            self._more_due = True
        if len(backlog):
            self._holding.set()
        self._top_up(now)
        return len(fresh)

    def _top_up(self, now: float | None = None) -> int:
        """Send held runs, in turn, while the attempts queue has room (`SendRoom`) and their
        tenant is under `fair_tenant_max_in_flight`; return how many went."""
        backlog = self._backlog
        if not backlog:
            return 0
        at = time.monotonic() if now is None else now
        pipe = self._beats.pipeline(transaction=False)
        pipe.llen(ATTEMPTS_QUEUE)
        pipe.hlen(UNACKED_KEY)
        queued, unacked = pipe.execute()
        room = self._room.room(int(queued), int(unacked), at)
        tenants = self._tenant_room(backlog)
        sent = 0
        while room > 0 and backlog:
            taken = backlog.take(room, tenants)
            if not taken:
                break
            if tenants is not None:
                for held in taken:
                    tenants[held.ref.tenant_id] -= 1
            went = self._send_now(taken, at, self._event_traceparents)
            room -= went
            sent += went
        self._room.sent(sent)
        self.stats.held = len(backlog)
        return sent

    def _tenant_room(self, backlog: FairBacklog) -> dict[str, int] | None:
        """How many more attempts each tenant holding runs may have in flight; None when no
        tenant has a cap."""
        cap = self._runtime.settings.fair_tenant_max_in_flight
        if cap is None:
            return None
        flying = in_flight_by_tenant(
            self._beats, max_bytes=self._runtime.settings.max_message_bytes
        )
        return {tenant: cap - flying[tenant] for tenant in backlog.by_tenant()}

    def _send_now(
        self,
        due: Sequence[Held],
        now: float,
        parents: Mapping[tuple[str, str, str], str] | None = None,
    ) -> int:
        """Send each of `due` not marked as sent, and mark it; return how many went."""
        parents = parents or {}
        self._forget_marks(now)
        # A run marked in the last `MEMO_S` is still marked in Redis (its mark lives
        # `dedupe_ttl_s`): asking again would only cost a `SET NX`, once per waiting run per scan.
        fresh_held = [held for held in due if _mark_key(held.ref, held.run) not in self._memo]
        fresh = [(held.ref, held.run) for held in fresh_held]
        claimed = self._marks.claim_many(fresh, unless_queued=ATTEMPTS_QUEUE)
        unsent = [pair for pair, new in zip(fresh, claimed, strict=True) if new]
        for held, new in zip(fresh_held, claimed, strict=True):
            if new:
                self._metrics.waited(held.ref.tenant_id, held.ref.workspace_id, now - held.since)
        for ref, run in fresh:
            self._memo[_mark_key(ref, run)] = now + self._memo_s
        if unsent:
            # One pipeline for the lot (kombu's publish batch), not a round trip and a new
            # Redis client per message, which cost the dispatcher CPU on every send for nothing
            # the message needs (`bench.sends` measures it).
            with self._celery.producer_or_acquire() as producer, producer.batch():
                for ref, run in unsent:
                    parent = parents.get((ref.tenant_id, ref.workspace_id, run.id))
                    with self._send_span(ref, run, parent):
                        send_attempt(
                            self._celery,
                            ref.tenant_id,
                            ref.workspace_id,
                            run.id,
                            producer=producer,
                            headers=carried(),
                        )
        self.stats.sent += len(unsent)
        now_due = self._runtime.reflexr.clock()
        oldest = min((run.next_attempt_at for _, run in unsent), default=now_due)
        self._metrics.sent((now_due - oldest).total_seconds())
        return len(unsent)

    def _forget_marks(self, now: float) -> None:
        if len(self._memo) > 4 * self._runtime.settings.dispatch_batch or now >= self._memo_pruned:
            self._memo = {key: until for key, until in self._memo.items() if until > now}
            self._memo_pruned = now + self._memo_s

    async def _sweep(self) -> None:
        """Announce the lost turns again (`_sweep_turns`) and write the dead letters no
        delivery wrote (`worker.dead_letters.unsettled_deaths`)."""
        await self._sweep_turns()
        self.stats.lettered += await self._unsettled.sweep()

    async def _sweep_turns(self) -> None:
        """Announce again each turn request still untaken a grace after it was made and after
        it was due, whose announcement does not wait in the turns queue: its message, or the turn
        task's retry, was lost (`SentMarks.claim_keys`)."""
        settings = self._runtime.settings
        grace_s = settings.turn_grace_s
        now = datetime.now(UTC)
        if now < self._next_turn_sweep:
            return
        self._next_turn_sweep = now + timedelta(seconds=min(TURN_SWEEP_EVERY_S, grace_s / 2))
        stale = await sweep(
            self._runtime.turn_requests,
            requested_before=now - timedelta(seconds=grace_s),
            limit=100,
            max_asks=settings.turn_max_asks,  # a spent budget was dead-lettered: leave it
            # In its back-off, a request's turn task asks when it is due: only one still
            # untaken a grace after that lost its task.
            due_before=now - timedelta(seconds=grace_s),
        )
        # Once per two graces: the announcement just sent has that long to be taken. Not while
        # its announcement waits in the turns queue.
        resend_s = max(1, round(2 * grace_s))
        max_bytes = settings.max_message_bytes
        claimed = self._marks.claim_keys(
            [turn_name(*request.key) for request in stale],
            ttl_s=resend_s,
            queue=TURNS_QUEUE,
            named_by=lambda item: announced(item, max_bytes),
        )
        for request, unsent in zip(stale, claimed, strict=True):
            if unsent:
                send_turn(self._celery, request)
                log.info(
                    "turn re-announced message_id=%s asks=%s", request.message_id, request.asks
                )

    async def serve(self, stop: asyncio.Event) -> None:
        """Poll until `stop` is set, writing a heartbeat to Redis at most every second.

        It logs its ready line after its first poll and heartbeat succeeded: its stores and its
        broker answer. A failed poll is logged in one line and retried after a back-off (1 s,
        doubling to 30 s).

        Raises:
            DispatcherGaveUp: When `dispatcher_max_failed_polls` polls in a row failed.

        A poll starts every `poll_interval_s`, or later while polls are costly: the dispatcher
        keeps its CPU under `dispatcher_max_cpu` of one core, over a few seconds (`CpuBudget`:
        single costly polls at low load are not held back). Each evaluation that finds new
        entries costs about the same whatever their number (a transaction per rule, twice),
        so under load, polling less often evaluates the same entries for less; an idle
        dispatcher's polls are cheap and keep the full rate. On PostgreSQL, an append to
        reflexr's log (`worker.dispatching.nudge`) starts the next poll at once (or `linger_s`
        later, so that the appends meanwhile share its evaluation), within the same CPU budget, and
        while it listens the polls between appends come every `sweep_interval_s` (at least
        every second, never more often than `poll_interval_s`): they only sweep, tick schedules
        and beat the heartbeat, where polls at the full rate cost an idle dispatcher CPU for
        nothing new.
        """
        feeding = asyncio.ensure_future(self._feed(stop))
        try:
            await self._serve(stop)
        finally:
            feeding.cancel()
            await asyncio.gather(feeding, return_exceptions=True)
            await self.close()

    async def _feed(self, stop: asyncio.Event) -> None:
        """While runs are held for their turn, top the queue up as the workers drain it
        (`SendRoom.wait_s`), between polls and during them: a worker child that finished takes
        the next run then, not at the next poll. A failed top-up is retried at the next; a poll
        says what fails."""
        while not stop.is_set():
            if not self._backlog:
                self._holding.clear()
                await self._holding.wait()
                continue
            try:
                self._top_up()
            except Exception as error:
                log.debug("top-up failed (%s)", reason(error))
            await _wait(stop, self._room.wait_s())

    async def close(self) -> None:
        """Release the evaluation leases it keeps and stop listening for appends; a
        dispatcher that only `poll`s calls it when done.

        A store that cannot be reached then is logged in one line: the leases lapse after
        `ACTONCE_LEASE_TTL_S`, and the dispatcher stops as it would have.
        """
        try:
            if self._leases is not None:
                await self._leases.release_kept(everything=True)
        except Exception as error:
            log.warning(
                "the evaluation leases it kept were not released (%s): they lapse after"
                " ACTONCE_LEASE_TTL_S",
                reason(error),
            )
        finally:
            await self._nudges.close()

    async def _serve(self, stop: asyncio.Event) -> None:
        settings = self._runtime.settings
        interval_s = settings.poll_interval_s
        # While appends wake it, a poll between them only sweeps, ticks and beats the heartbeat.
        listening_s = max(interval_s, min(settings.sweep_interval_s, HEARTBEAT_EVERY_S))
        budget = self.budget
        next_report = time.monotonic() + STATS_EVERY_S
        next_beat = 0.0
        failed = 0
        ready = False
        while not stop.is_set():
            if time.monotonic() >= next_report:
                log.info("dispatcher %s", self.stats.line())
                next_report += STATS_EVERY_S
            started, began = time.monotonic(), time.thread_time()
            try:
                await self.poll()
                if time.monotonic() >= next_beat:
                    beat(self._beats, polls=self.stats.polls)
                    if self._backlog is not None:
                        tell_held(self._beats, self._backlog.by_tenant())
                    next_beat = time.monotonic() + HEARTBEAT_EVERY_S
            except Exception as error:
                # One line per back-off step, the traceback at DEBUG, and a limit.
                failed += 1
                if failed >= settings.dispatcher_max_failed_polls:
                    raise DispatcherGaveUp(
                        f"{failed} polls in a row failed, the last with {error!r}"
                    ) from error
                wait_s = backoff_s(failed)
                log.warning(
                    "poll failed (%s); retrying in %.0fs (%d of %d failed polls in a row)",
                    reason(error),
                    wait_s,
                    failed,
                    settings.dispatcher_max_failed_polls,
                )
                log.debug("poll failed", exc_info=error)
                if failed == 1:  # once a streak: the back-off's retries are the same failure
                    sentry.report_failure(error, component="dispatcher")
                await _wait(stop, wait_s)
                continue
            if failed:
                log.info("polls succeed again after %d failed", failed)
            failed = 0
            if not ready:
                # Its stores answered the poll and its broker the heartbeat: ready, once.
                ready = True
                log.info(
                    "%s; dispatching to %s every %ss",
                    ready_line(settings, role="dispatcher", queues=QUEUES),
                    ATTEMPTS_QUEUE,
                    interval_s,
                )
            budget.spend(time.thread_time() - began, time.monotonic(), started=started)
            earliest_s = budget.wait_s()
            listened = self._nudges.listening
            await self._nudges.listen()
            if self._nudges.listening and not listened:
                log.info("listening for appends; polling every %ss between them", listening_s)
            every_s = listening_s if self._nudges.listening else interval_s
            next_at = max(started + every_s, time.monotonic() + earliest_s)
            # A nudge starts the next poll early, never before the CPU budget allows it.
            await _wait(stop, earliest_s)
            await self._nudged_or_stopped(stop, max(0.0, next_at - time.monotonic()))
            self.stats.nudged = self._nudges.received

    async def _nudged_or_stopped(self, stop: asyncio.Event, timeout_s: float) -> None:
        """Wait until `stop` is set, an append is heard, or `timeout_s` passed; after an
        append, wait `linger_s` more, for the appends that follow it."""
        if not self._nudges.listening:
            await _wait(stop, timeout_s)
            return
        heard = asyncio.ensure_future(self._nudges.wait(timeout_s))
        waits = {asyncio.ensure_future(stop.wait()), heard}
        try:
            await asyncio.wait(waits, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiting in waits:
                waiting.cancel()
            await asyncio.gather(*waits, return_exceptions=True)
        linger_s = self._runtime.settings.linger_s
        if linger_s and heard.done() and not heard.cancelled() and heard.result() is True:
            await _wait(stop, linger_s)


@dataclass
class CpuBudget:
    """A token bucket of CPU seconds: `share` of one core, of which `burst_s` worth may be
    spent at once.

    It refills at `share` CPU seconds per second of wall time, up to `share * burst_s`; polls
    spend it; while it is in debt, the next poll waits until the debt is repaid. The debt is
    capped at one burst: an evaluation cannot be split, and one of a burst of events, which reads
    all of them, would otherwise silence the dispatcher (no nudge, sweep or heartbeat) for
    `1 / share` times as long. At low load an event's evaluation goes at once instead of waiting
    out a cycle `1 / share` times its cost, while sustained load is still held to `share` of a
    core.
    """

    share: float
    burst_s: float = CPU_BURST_S
    _tokens: float = field(default=0.0, init=False)
    _at: float | None = field(default=None, init=False)

    def spend(self, cpu_s: float, now: float, *, started: float | None = None) -> None:
        """Spend `cpu_s`, used by a poll from `started` (default: `now`, at once) to `now`; the
        debt never exceeds one burst, so a poll waits at most `burst_s` however costly the last
        one was.

        The refill while the poll ran is not capped by the burst: the poll spent as it went. A
        burst's evaluation that mostly waits on PostgreSQL stays under its share of a core
        however long it takes, and must not make the next poll wait, as a cap applied to the
        whole stretch made it do (the low-load events after a burst then waited out a debt the
        burst never ran up).
        """
        began = now if started is None else started
        if self._at is not None:
            began = max(began, self._at)
        capacity = self.share * self.burst_s
        spent_while = self._refilled(began) + (now - began) * self.share - cpu_s
        self._tokens = max(min(capacity, spent_while), -capacity)
        self._at = now

    def wait_s(self) -> float:
        """How long from the last `spend` until the budget is out of debt."""
        return max(0.0, -self._tokens / self.share)

    def spare(self, now: float) -> bool:
        """Whether at least half of the burst is in the budget at `now`: the dispatcher is
        not busy."""
        return self._refilled(now) >= self.share * self.burst_s / 2

    def _refilled(self, now: float) -> float:
        """The tokens at `now`: full before the first spend, never more than the burst."""
        capacity = self.share * self.burst_s
        if self._at is None:
            return capacity
        return min(capacity, self._tokens + (now - self._at) * self.share)


async def event_traceparent(runtime: Runtime, ref: WorkspaceRef, run: Run) -> str:
    """Return the W3C `traceparent` the first event `run` matched was published in, as reflexr
    kept it on the envelope; empty when it was published in no trace."""
    seq = min(run.matched) if run.matched else run.fired_seq
    found = await runtime.reflexr.storage.read(ref, after_seq=seq - 1, limit=1)
    return (found[0].traceparent or "") if found else ""


def send_attempt(
    celery: Celery,
    tenant_id: str,
    workspace_id: str,
    run_id: str,
    *,
    producer: Producer | None = None,
    headers: Mapping[str, str] | None = None,
) -> Any:
    """Send one attempt message: ids only, JSON, to the attempts queue.

    Its result is ignored: nobody waits on it (the run in reflexr is the outcome, and Flower
    reads the task events), so the worker stores none and the dispatcher subscribes to none.
    Through a `producer` in a publish batch (`Producer.batch`), it goes when the batch is
    flushed, with its `task-sent` event. `headers` carry the trace the attempt joins
    (`tasks.tracing`), W3C.
    """
    return celery.send_task(
        ATTEMPT_TASK,
        kwargs={"tenant_id": tenant_id, "workspace_id": workspace_id, "run_id": run_id},
        queue=ATTEMPTS_QUEUE,
        serializer="json",
        ignore_result=True,
        producer=producer,
        headers=dict(headers) if headers else None,
    )


def _mark_key(ref: WorkspaceRef, run: Any) -> tuple[str, str, str, int, str]:
    return (ref.tenant_id, ref.workspace_id, run.id, run.epoch, run.status)


async def _wait(stop: asyncio.Event, seconds: float) -> None:
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), timeout=seconds)
