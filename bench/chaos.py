"""The act-once proof under faults: `python -m bench.chaos [--runs N] [--seed S] [--backend B]`.

N runs of `chaos:act` (a create, a keyed edit, a notice each) on a local pool (a dispatcher and
one `actonce worker` with 2 prefork children) over fresh stores and a private Redis, while the
harness injects, all decided by `--seed`:

- `designed_exception`: attempt 1 of about a third of the runs raises after its 1st, 2nd or 3rd
  write (the event's `fail_after`);
- `designed_death`: a few runs end with a permanent failure after their writes (`die`);
- `sigkill`: a worker child is SIGKILLed every couple of seconds (a busy one when it can be found);
- `duplicate_delivery`: a fraction of the runs' attempt messages are sent again (`send_attempt`);
- `redis_restart`: the private Redis is killed and started again, empty, once mid-way;
- `database_restart` (PostgreSQL): the harness's own embedded PostgreSQL crashes
  (`pg_ctl restart -m immediate`) and comes back, once, while the turn worker is down for its
  first restart (below); attempt workers and the dispatcher must carry on without a hand. It is
  kept out of a running turn on purpose: a turn whose connection dies after its `run_started`
  is recorded abandoned by artifactr and its message counts as taken, so no pool can answer it
  (one such turn was the only shortfall of a 1,000-run chaos that crashed the database anywhere);
- `competing_edit`: a writer in the harness keeps editing the board the runs edit, so their
  keyed edits meet version conflicts (`version_conflict_met`, summed from the attempts' log
  lines, counts those the runs' edits re-read after; `competing_edit_lost`, the writer's own).

A share of the runs (`SEND_SHARE`) also `send` a message to a thread of their own, which asks for
the thread assistant's turn: a turn agent on pydantic-ai's function model, whose every call is
noted in a file. Turns are served by a turn worker of their own (`-Q actonce.turns`, one child),
as the operations docs recommend in production, so the SIGKILLs stay on the attempts' children; the
turn side has its own fault:

- `turn_worker_restart`: twice, the turn worker is stopped (warm: a turn it runs ends first),
  the announcements waiting for it are dropped from Redis (`turn_announcements_dropped`), and it
  is started again a few seconds later; the dispatcher must announce them again
  (`turns_reannounced`, from its log). The Redis restart loses announcements too.

Each send must come to exactly one message, one turn, one reply and one model call
(`sends_once`). A turn killed after it started (artifactr records it `abandoned` and counts its
message taken, so nothing answers it: the limit the docs state under Turns) is counted apart,
as `abandoned_turns`, never as a pass; the faults are laid out so that none should be.

When every run has settled it checks, from artifactr's log and reflexr's runs: every run
terminal; every expected write (ids recomputed with `tasks.ids`) present exactly once and with
its content; no write that was not expected; the dead runs and dead letters exactly the runs
designed to die (waiting `LETTERS_TIMEOUT_S` for the letters the dispatcher's sweep writes for a
death whose delivery was lost); no published event without its terminal run. Exit 1 on any
violation; the figures go to `var/chaos.json`.

As it goes it shows the runs settled of the total, the faults injected so far, the time elapsed
and an estimate of what is left (`lab.progress`: a bar on a terminal, a line every few seconds
on stderr otherwise). SIGTERM or Ctrl-C stops it and everything it started (the pool, its
Redis, its PostgreSQL), and it exits 128 plus the signal's number (`lab.processes.run_stoppable`).
"""

import argparse
import asyncio
import contextlib
import json
import logging
import random
import re
import signal
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import artifactr.core as a
import redis
from reflexr.core import Run, SourceActor

from actonce.tasks import ids
from actonce.worker.dead_letters.unsettled_deaths import DEATH_GRACE_S, SWEEP_EVERY_S
from actonce.worker.process.runtime import Runtime
from actonce.worker.settings import TURNS_QUEUE, Settings
from actonce.worker.storage.migrate import migrate
from bench.definition import (
    BOARD_ID,
    LEDGER_ID,
    MODEL_CALLS_FILE,
    THREAD_ID,
    Board,
    ChaosRequested,
    Receipt,
    app,
    board_value,
    notice_text,
    prepare,
    send_text,
    send_thread,
)
from bench.stores import fresh_stores, owned_postgres_stores
from lab.census import artifactr_census
from lab.pool import LocalPool
from lab.postgres import PostgresHandle
from lab.processes import run_stoppable
from lab.progress import Progress
from lab.redis import RedisHandle, find_or_start_redis
from lab.settle import TERMINAL, wait_settled
from lab.tables import settled_runs

log = logging.getLogger("actonce.chaos")

TENANT: Final = "chaos"
WORKSPACE: Final = "proof"
FEED: Final = SourceActor(name="chaos-feed")
RIVAL: Final = a.UserActor(id="chaos-rival", name="Competing writer")

FAIL_SHARE: Final = 0.3
"""The share of runs whose first attempt raises after one of its writes."""

DIE_SHARE: Final = 0.05
"""The share of runs designed to die permanently."""

DUPLICATE_SHARE: Final = 0.1
"""The share of runs whose attempt message is sent again, at each of two moments."""

KILL_EVERY_S: Final = 2.0
"""How often an attempt worker's child is SIGKILLed while runs are being fed."""

TURN_WORKER: Final = "turns0"
"""The pool's one turn worker, as `LocalPool` names it."""

TURNS_DOWN_S: Final = 3.0
"""How long the turn worker stays down on each `turn_worker_restart`, sends going on meanwhile."""

ABANDONED: Final = (
    "artifactr's limit: a turn killed after run_started is recorded abandoned and its message "
    "counts as taken, so nothing answers it"
)
"""Why an abandoned turn is not a pass, and not actonce's to fix: said in the report."""

SEND_SHARE: Final = 0.05
"""The share of runs that also send a message asking for a turn."""

TURNS_TIMEOUT_S: Final = 120.0
"""How long after the runs settled every send's turn may take to end: a turn worker killed
holding its thread's claim leaves it to the next after the Runner's 30 s `claim_ttl`."""

PROGRESS_EVERY_S: Final = 2.0
"""How often the harness counts the runs settled, for its progress."""

LETTERS_TIMEOUT_S: Final = DEATH_GRACE_S + 2 * SWEEP_EVERY_S + 10
"""How long after the runs settled every dead run may take to have its letter: one whose
delivery was lost with its worker is lettered by the dispatcher's sweep
(`worker.dead_letters.unsettled_deaths`), after a grace."""


@dataclass(frozen=True)
class Planned:
    """One run the harness asks for, and how it should misbehave."""

    key: str
    fail_after: int
    die: bool
    send: bool = False


def plan(runs: int, seed: int) -> list[Planned]:
    """Return the runs to publish, deterministic from `seed`; which send has its own draw, so
    the other faults fall where they did before sends existed."""
    rng = random.Random(seed)
    sends = random.Random(f"send-{seed}")
    planned = []
    for i in range(runs):
        fail_after = rng.randint(1, 3) if rng.random() < FAIL_SHARE else 0
        die = rng.random() < DIE_SHARE
        planned.append(Planned(f"k{seed}-{i:05d}", fail_after, die, sends.random() < SEND_SHARE))
    return planned


def pool_env(stores: dict[str, str], broker_url: str) -> dict[str, str]:
    """The pool's `ACTONCE_*` variables for the figures: short leases, quick polls, a short
    grace before the dispatcher announces an untaken turn again."""
    return {
        "ACTONCE_APP": "bench.definition:app",
        "ACTONCE_BROKER_URL": broker_url,
        "ACTONCE_LEASE_TTL_S": "2",
        "ACTONCE_POLL_INTERVAL_S": "0.1",
        "ACTONCE_TIME_LIMIT_S": "120",
        "ACTONCE_SOFT_TIME_LIMIT_S": "100",
        "ACTONCE_TURN_GRACE_S": "5",
        "ACTONCE_TURN_BACKOFF_S": "1",
        **stores,
    }


def run_chaos(
    runs: int = 1000,
    seed: int = 7,
    backend: str = "postgres",
    *,
    log_dir: Path | None = None,
    settle_timeout_s: float | None = None,
) -> dict[str, Any]:
    """Run the harness and return its figures; `violations` lists what broke act-once.

    Raises:
        PostgresUnreachable: If `backend` is postgres and no database can be made.
        RedisUnavailable: If no private `redis-server` can be started.
    """
    planned = plan(runs, seed)
    started = time.monotonic()
    with contextlib.ExitStack() as stack:
        # On PostgreSQL the harness owns its server (an embedded one), so it can crash it.
        database: PostgresHandle | None = None
        if backend == "postgres":
            stores, database = stack.enter_context(owned_postgres_stores("actonce_chaos"))
        else:
            stores = stack.enter_context(fresh_stores(backend, "actonce_chaos"))
        redis_handle = stack.enter_context(find_or_start_redis(None))
        env = pool_env(stores, redis_handle.url)
        calls_dir = Path(tempfile.mkdtemp(prefix="actonce-chaos-"))
        env[MODEL_CALLS_FILE] = str(calls_dir / "model-calls.txt")
        settings = Settings.from_env(env)
        asyncio.run(migrate(settings))
        runtime = Runtime(settings, app, one_run=False).open()
        try:
            runtime.run(prepare(runtime.artifactr, TENANT, WORKSPACE))
            with LocalPool(env, workers=1, concurrency=2, log_dir=log_dir, turn_workers=1) as pool:
                pool.wait_ready(90.0)
                with Progress("chaos", runs) as progress:
                    figures = runtime.run(
                        _drive(
                            runtime,
                            pool,
                            redis_handle,
                            database,
                            planned,
                            random.Random(seed + 1),
                            settle_timeout_s or 120.0 + runs * 0.5,
                            Path(env[MODEL_CALLS_FILE]),
                            progress,
                        )
                    )
                figures["logs"] = str(pool.log_dir)
            # What the competing writer did to the runs: each attempt's log line counts the
            # version conflicts its edits met (a lower bound: a killed child logs nothing).
            met = sum(
                int(n)
                for name in (f"worker{i}" for i in range(pool.workers))
                for n in re.findall(r"\bconflicts=(\d+)", pool.log(name))
            )
            figures["faults"]["version_conflict_met"] = met
            figures["turns_reannounced"] = pool.log("dispatcher").count("turn re-announced")
        finally:
            runtime.close()
    figures.update(backend=backend, seed=seed, seconds=round(time.monotonic() - started, 1))
    return figures


async def _drive(
    runtime: Runtime,
    pool: LocalPool,
    redis_handle: RedisHandle,
    database: PostgresHandle | None,
    planned: list[Planned],
    rng: random.Random,
    settle_timeout_s: float,
    model_calls: Path,
    progress: Progress,
) -> dict[str, Any]:
    reflexr_ws = await runtime.reflexr.open(TENANT, WORKSPACE, actor=FEED)
    people = await runtime.artifactr.open(TENANT, WORKSPACE, actor=RIVAL)
    for p in planned:
        if p.send:
            with contextlib.suppress(a.InvalidState):
                await people.commit(a.CreateThread(thread_id=send_thread(p.key), title=p.key))
    faults: Counter[str] = Counter()
    faults["designed_exception"] = sum(1 for p in planned if p.fail_after)
    faults["designed_death"] = sum(1 for p in planned if p.die)
    seq_to_key: dict[int, str] = {}
    watcher = asyncio.create_task(_show_progress(runtime, progress, faults, seq_to_key))
    stop = asyncio.Event()
    held: set[str] = set()
    settled = asyncio.Event()
    supervisor = asyncio.create_task(_supervise(pool, settled, held, faults))
    background = [
        asyncio.create_task(_compete(runtime, stop, faults)),
        asyncio.create_task(_kill(pool, stop, faults)),
    ]
    runs = len(planned)
    feed_s = max(8.0, runs / 40)
    batch = 10
    moments = {
        runs // 5: "turns_restart",
        runs // 3: "duplicates",
        runs // 2: "restart",
        (2 * runs) // 3: "duplicates",
        (4 * runs) // 5: "turns_restart",
    }
    try:
        for start in range(0, runs, batch):
            for p in planned[start : start + batch]:
                event = ChaosRequested(key=p.key, fail_after=p.fail_after, die=p.die, send=p.send)
                published = await reflexr_ws.publish(event, id=f"evt_{p.key}")
                seq_to_key[published.envelope.seq] = p.key
            for at, what in moments.items():
                if start <= at < start + batch:
                    if what == "restart":
                        await asyncio.to_thread(redis_handle.restart)
                        faults["redis_restart"] += 1
                    elif what == "turns_restart":
                        # The first restart also crashes the database, while no turn runs;
                        # the feed waits for it, as it waits for the Redis restart.
                        down = asyncio.Event() if database is not None else None
                        resume = asyncio.Event()
                        background.append(
                            asyncio.create_task(
                                _restart_turns(
                                    pool, redis_handle, held, faults, down=down, resume=resume
                                )
                            )
                        )
                        if down is not None and database is not None:
                            await down.wait()
                            await asyncio.to_thread(database.restart)
                            faults["database_restart"] += 1
                            database = None
                        resume.set()
                    else:
                        await _duplicate(runtime, pool, rng, faults)
            await asyncio.sleep(feed_s * batch / runs)
        await asyncio.sleep(KILL_EVERY_S)  # one more kill among the last runs
    finally:
        stop.set()
        await asyncio.gather(*background, return_exceptions=True)
    try:
        found = await wait_settled(
            reflexr_ws.runs, runs=runs, timeout_s=settle_timeout_s, poll_s=0.5
        )
        await _turns_ended(people, [p.key for p in planned if p.send], TURNS_TIMEOUT_S)
        await _lettered(runtime, sum(r.status == "dead" for r in found), LETTERS_TIMEOUT_S)
    finally:
        settled.set()
        await supervisor
        watcher.cancel()
    figures = await _check(runtime, planned, seq_to_key, found, faults)
    figures.update(await _check_sends(people, planned, model_calls, figures["violations"]))
    return figures


async def _show_progress(
    runtime: Runtime, progress: Progress, faults: Counter[str], published: dict[int, str]
) -> None:
    """Count the runs settled every `PROGRESS_EVERY_S` and show them with the faults injected
    so far, until cancelled; a count that fails (the database restarting) waits for the next."""
    engine = runtime.engine("reflexr")
    while True:
        injected = {k: n for k, n in faults.items() if not k.startswith("designed_") and n}
        kinds = ", ".join(f"{k}={n}" for k, n in sorted(injected.items()))
        note = f"{len(published)} published, {sum(injected.values())} faults injected ({kinds})"
        try:
            progress.update((await settled_runs(engine)).runs, note)
        except Exception:
            progress.update(progress.done, note)
        await asyncio.sleep(PROGRESS_EVERY_S)


async def _restart_turns(
    pool: LocalPool,
    redis_handle: RedisHandle,
    held: set[str],
    faults: Counter[str],
    *,
    down: asyncio.Event | None = None,
    resume: asyncio.Event | None = None,
) -> None:
    """Stop the turn worker (warm), drop the announcements waiting for it, start it again.

    With `down`, it is set once the turn worker has stopped, and the restart goes on only once
    `resume` is set: the feed crashes the database in between.

    A warm stop lets a turn it runs end, so no turn is abandoned; the announcements dropped are
    lost as a broker that lost them would lose them, and only the dispatcher's re-announce can
    bring their turns back.
    """
    held.add(TURN_WORKER)
    try:
        warm = await asyncio.to_thread(pool.stop_process, TURN_WORKER, 60.0)
        faults["turn_worker_restart" if warm else "turn_worker_killed"] += 1
        if down is not None:
            down.set()
        if resume is not None:
            await resume.wait()
        await asyncio.sleep(TURNS_DOWN_S)  # sends go on meanwhile: their announcements wait
        client = redis.Redis.from_url(redis_handle.url)
        try:
            pipe = client.pipeline()
            pipe.llen(TURNS_QUEUE)
            pipe.delete(TURNS_QUEUE)
            dropped, _ = pipe.execute()
            faults["turn_announcements_dropped"] += int(dropped)
        except redis.RedisError:
            faults["turn_announcements_drop_failed"] += 1
        finally:
            client.close()
    finally:
        if down is not None:
            down.set()  # a stop that failed must not leave the feed waiting
        held.discard(TURN_WORKER)  # the supervisor starts it again within a second


async def _turns_ended(people: Any, keys: list[str], timeout_s: float) -> None:
    """Wait until each send's thread has a turn that ended, or `timeout_s` has passed."""
    deadline = time.monotonic() + timeout_s
    waiting = set(keys)
    while waiting and time.monotonic() < deadline:
        log = await people.read(threads={send_thread(key) for key in waiting})
        ended = {e.event.thread_id for e in log if isinstance(e.event, a.RunEnded)}
        waiting = {key for key in waiting if send_thread(key) not in ended}
        if waiting:
            await asyncio.sleep(0.5)


async def _lettered(runtime: Runtime, dead: int, timeout_s: float) -> None:
    """Wait until there are `dead` letters or more, or `timeout_s` has passed."""
    deadline = time.monotonic() + timeout_s
    while await runtime.dead_letters.count(include_replayed=True) < dead:
        if time.monotonic() >= deadline:
            return
        await asyncio.sleep(0.5)


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


async def _check_sends(
    people: Any, planned: list[Planned], model_calls: Path, violations: list[str]
) -> dict[str, Any]:
    """Count each send's messages, turns, replies and model calls: exactly one each, or a
    violation; a send whose one turn was abandoned is counted apart (`ABANDONED`)."""
    keys = [p.key for p in planned if p.send]
    calls = await asyncio.to_thread(_lines, model_calls)
    log = await people.read(threads={send_thread(key) for key in keys}) if keys else []
    per_send: dict[str, tuple[int, int, int, int]] = {}
    abandoned: list[str] = []
    for key in keys:
        thread = send_thread(key)
        ours = [e for e in log if getattr(e.event, "thread_id", None) == thread]
        posted = [e for e in ours if isinstance(e.event, a.MessagePosted)]
        messages = sum(
            1
            for e in posted
            if e.event.kind == "message" and e.actor.participant.startswith("external_agent:")
        )
        replies = sum(1 for e in posted if e.actor.participant.startswith("agent:"))
        turns = sum(1 for e in ours if isinstance(e.event, a.RunStarted))
        ended = [e.event for e in ours if isinstance(e.event, a.RunEnded)]
        called = sum(1 for line in calls if send_text(key) in line)
        per_send[key] = (messages, turns, replies, called)
        # Started and never answered: recorded abandoned by the thread's next claimant, or
        # still `running` when no claimant came.
        if (messages, turns, replies) == (1, 1, 0) and (
            not ended or any(e.reason == "abandoned" for e in ended)
        ):
            abandoned.append(key)
    not_once = {
        key: counts
        for key, counts in per_send.items()
        if counts != (1, 1, 1, 1) and key not in abandoned
    }
    if not_once:
        violations.append(
            f"{len(not_once)} sends without exactly one message, turn, reply and model call "
            f"(messages, turns, replies, calls): {dict(list(not_once.items())[:5])}"
        )
    return {
        "sends": len(keys),
        "send_messages": sum(m for m, _, _, _ in per_send.values()),
        "send_turns": sum(t for _, t, _, _ in per_send.values()),
        "send_replies": sum(r for _, _, r, _ in per_send.values()),
        "send_model_calls": sum(c for _, _, _, c in per_send.values()),
        "sends_once": sum(1 for counts in per_send.values() if counts == (1, 1, 1, 1)),
        "abandoned_turns": len(abandoned),
        "abandoned": {"sends": abandoned, "reason": ABANDONED} if abandoned else {},
    }


async def _compete(runtime: Runtime, stop: asyncio.Event, faults: Counter[str]) -> None:
    """Edit the runs' board (another path) as fast as a person could not, until `stop`."""
    workspace = await runtime.artifactr.open(TENANT, WORKSPACE, actor=RIVAL)
    n = 0
    while not stop.is_set():
        board = await workspace.artifact(BOARD_ID)
        patch = a.JsonPatch(ops=({"op": "add", "path": f"/noise/n{n}", "value": "x"},))
        try:
            await workspace.commit(
                a.EditArtifact(artifact_id=BOARD_ID, base_version=board.version, patch=patch)
            )
            faults["competing_edit"] += 1
            n += 1
        except a.VersionConflict:
            faults["competing_edit_lost"] += 1
        except Exception:  # the database restarting under it: a person would try again too
            faults["competing_edit_failed"] += 1
            await asyncio.sleep(0.2)
        await asyncio.sleep(0.02)


async def _kill(pool: LocalPool, stop: asyncio.Event, faults: Counter[str]) -> None:
    """SIGKILL an attempt worker's child every `KILL_EVERY_S`, a busy one if one is found
    quickly, until `stop`."""
    while not stop.is_set():
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=KILL_EVERY_S)
        if stop.is_set():
            return
        faults[await asyncio.to_thread(_kill_one, pool)] += 1


async def _supervise(
    pool: LocalPool, settled: asyncio.Event, held: set[str], faults: Counter[str]
) -> None:
    """Start again any process that exited, but those `held` down on purpose, every second
    until `settled`: as a supervisor does in production, also after the faults stop (a worker
    revived just before can still exit as its broker or database comes back)."""
    while not settled.is_set():
        for _ in await asyncio.to_thread(pool.revive, held=frozenset(held)):
            faults["worker_process_restarted"] += 1
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(settled.wait(), timeout=KILL_EVERY_S / 2)


def _kill_one(pool: LocalPool) -> str:
    try:
        pool.kill_worker_child(signal.SIGKILL, timeout_s=1.0)
        return "sigkill"
    except Exception:  # no busy child found, or the broker is restarting: kill any child
        children = [pid for kids in pool.worker_children().values() for pid in kids]
        if not children:
            return "sigkill_missed"
        with contextlib.suppress(ProcessLookupError):
            import os

            os.kill(random.choice(children), signal.SIGKILL)
        return "sigkill_idle_child"


async def _duplicate(
    runtime: Runtime, pool: LocalPool, rng: random.Random, faults: Counter[str]
) -> None:
    """Send the attempt message of a share of the runs made so far again."""
    from actonce.worker.dispatching.dispatcher import send_attempt

    workspace = await runtime.reflexr.open(TENANT, WORKSPACE, actor=FEED)
    made = await workspace.runs()
    chosen = rng.sample(made, k=max(1, int(len(made) * DUPLICATE_SHARE))) if made else []
    for run in chosen:
        try:
            await asyncio.to_thread(send_attempt, pool.celery, TENANT, WORKSPACE, run.id)
            faults["duplicate_delivery"] += 1
        except Exception:
            faults["duplicate_delivery_unsent"] += 1


def expected_ids(run_id: str, key: str) -> tuple[str, str]:
    """The receipt's artifact id and the notice's message id `chaos:act` derives for a run."""
    receipt = Receipt(key=key)
    art = ids.write_digest(run_id, 0, *ids.write_key("create", receipt.kind, receipt.to_json()), 0)
    msg = ids.write_digest(run_id, 0, *ids.write_key("notice", THREAD_ID, notice_text(key)), 0)
    return f"{ids.ARTIFACT}{art}", f"{ids.MESSAGE}{msg}"


async def _check(
    runtime: Runtime,
    planned: list[Planned],
    seq_to_key: dict[int, str],
    found: list[Run],
    faults: Counter[str],
) -> dict[str, Any]:
    violations: list[str] = []
    by_key: dict[str, list[Run]] = {}
    for run in found:
        for seq in run.matched:
            if seq in seq_to_key:
                by_key.setdefault(seq_to_key[seq], []).append(run)
    nonterminal = [r.id for r in found if r.status not in TERMINAL]
    lost = [p.key for p in planned if p.key not in by_key]
    lost += [p.key for p in planned if any(r.status not in TERMINAL for r in by_key.get(p.key, []))]
    twice = [key for key, rs in by_key.items() if len(rs) > 1]
    if nonterminal:
        violations.append(f"{len(nonterminal)} runs not terminal: {nonterminal[:5]}")
    if lost:
        violations.append(f"{len(lost)} published events without a terminal run: {lost[:5]}")
    if twice:
        violations.append(f"{len(twice)} events fired more than one run: {twice[:5]}")

    workspace = await runtime.artifactr.open(TENANT, WORKSPACE, actor=RIVAL)
    census = await artifactr_census(workspace)
    contents: dict[str, str] = {}
    in_send_threads: set[str] = set()
    send_threads = {send_thread(p.key) for p in planned if p.send}
    for envelope in await workspace.read():
        event: Any = envelope.event
        if getattr(event, "type", None) == "message_posted":
            contents[event.message_id] = event.content
            if event.thread_id in send_threads:
                in_send_threads.add(event.message_id)  # counted by `_check_sends`
    receipts = {v.id: v.data for v in await workspace.artifacts(Receipt)}
    entries = (await workspace.get(Board, BOARD_ID)).data.entries

    expected_messages: dict[str, str] = {}
    expected_artifacts: dict[str, str] = {}
    expected_edits: dict[tuple[str, str], str] = {}
    for p in planned:
        for run in by_key.get(p.key, [])[:1]:
            art, msg = expected_ids(run.id, p.key)
            expected_artifacts[art] = p.key
            expected_messages[msg] = p.key
            expected_edits[(BOARD_ID, f"/entries/{p.key}")] = p.key
    writes_expected = len(expected_messages) + len(expected_artifacts) + len(expected_edits)
    counts = [
        *(census.messages[m] for m in expected_messages),
        *(census.artifacts[x] for x in expected_artifacts),
        *(census.edits[e] for e in expected_edits),
    ]
    writes_found = sum(1 for c in counts if c >= 1)
    duplicates = sum(c - 1 for c in counts if c > 1)
    missing = sum(1 for c in counts if c == 0)
    wrong_content = [
        m
        for m, key in expected_messages.items()
        if m in contents and contents[m] != notice_text(key)
    ]
    wrong_content += [
        x for x, key in expected_artifacts.items() if x in receipts and receipts[x].key != key
    ]
    wrong_content += [
        path for (_, path), key in expected_edits.items() if entries.get(key) != board_value(key)
    ]
    unexpected = [
        m for m in census.messages if m not in expected_messages and m not in in_send_threads
    ]
    unexpected += [
        x
        for x in census.artifacts
        if x not in expected_artifacts and x not in (LEDGER_ID, BOARD_ID)
    ]
    unexpected += [
        f"{art}{path}"
        for art, path in census.edits
        if (art, path) not in expected_edits and not path.startswith("/noise/")
    ]
    unexpected += list(census.proposals)
    if duplicates:
        violations.append(f"{duplicates} duplicate writes: {census.duplicates()}")
    if missing:
        violations.append(f"{missing} expected writes missing")
    if wrong_content:
        violations.append(f"{len(wrong_content)} writes with wrong content: {wrong_content[:5]}")
    if unexpected:
        violations.append(f"{len(unexpected)} unexpected writes: {unexpected[:5]}")

    designed = {p.key for p in planned if p.die}
    dead_runs = {key for key, rs in by_key.items() if any(r.status == "dead" for r in rs)}
    run_key = {r.id: key for key, rs in by_key.items() for r in rs}
    letters = await runtime.dead_letters.list(limit=10 * len(planned) + 100, include_replayed=True)
    lettered = [run_key.get(letter.run_id or "", f"?{letter.id}") for letter in letters]
    if dead_runs != designed:
        violations.append(
            f"dead runs differ from the designed: unexpected {sorted(dead_runs - designed)[:5]}, "
            f"missing {sorted(designed - dead_runs)[:5]}"
        )
    if sorted(lettered) != sorted(designed):
        violations.append(
            f"dead letters differ from the designed: {len(lettered)} letters for "
            f"{len(designed)} designed; extra {sorted(set(lettered) - designed)[:5]}, "
            f"missing {sorted(designed - set(lettered))[:5]}"
        )
    statuses = Counter(r.status for r in found)
    attempts = Counter(r.attempts for r in found)
    return {
        "runs": len(planned),
        "runs_found": len(found),
        "statuses": dict(statuses),
        "attempts_histogram": {str(k): v for k, v in sorted(attempts.items())},
        "writes_expected": writes_expected,
        "writes_found": writes_found,
        "duplicates": duplicates,
        "missing": missing,
        "wrong_content": len(wrong_content),
        "unexpected": len(unexpected),
        "nonterminal": len(nonterminal),
        "messages_lost": len(lost),
        "dead_expected": len(designed),
        "dead_found": len(dead_runs),
        "dead_letters": len(lettered),
        "faults": dict(sorted(faults.items())),
        "violations": violations,
    }


def _print(figures: dict[str, Any]) -> None:
    rows = [
        (k, figures[k])
        for k in (
            "backend",
            "runs",
            "statuses",
            "attempts_histogram",
            "writes_expected",
            "writes_found",
            "duplicates",
            "missing",
            "wrong_content",
            "unexpected",
            "nonterminal",
            "messages_lost",
            "dead_expected",
            "dead_found",
            "dead_letters",
            "sends",
            "send_messages",
            "send_turns",
            "send_replies",
            "send_model_calls",
            "sends_once",
            "abandoned_turns",
            "turns_reannounced",
            "faults",
            "seconds",
        )
    ]
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        print(f"{key:<{width}}  {value}")
    if figures["abandoned_turns"]:
        print(f"ABANDONED TURNS (not a pass; {ABANDONED}): {figures['abandoned']['sends']}")
    if figures["violations"]:
        print("VIOLATIONS:")
        for violation in figures["violations"]:
            print(f"  - {violation}")
    elif not figures["abandoned_turns"]:
        print(
            "no violations: every write landed exactly once, and every send made one message, "
            "one turn, one reply and one model call"
        )


def main(argv: list[str] | None = None) -> int:
    """`python -m bench.chaos`: run the harness, print and save the figures, exit 1 on a fault."""
    parser = argparse.ArgumentParser(prog="python -m bench.chaos", description=__doc__)
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--backend", choices=("postgres", "sqlite"), default="postgres")
    parser.add_argument("--out", type=Path, default=Path("var/chaos.json"))
    options = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    figures = run_chaos(options.runs, options.seed, options.backend)
    _print(figures)
    options.out.parent.mkdir(parents=True, exist_ok=True)
    options.out.write_text(json.dumps(figures, indent=2) + "\n")
    print(f"wrote {options.out}")
    return 1 if figures["violations"] else 0


if __name__ == "__main__":
    sys.exit(run_stoppable(main, "chaos"))
