"""The `actonce` command: worker, dispatch, migrate, dead letters, explain and the demo.

Every command reads the same settings (`ACTONCE_*`, see `worker.settings`) and loads the same
application definition (`ACTONCE_APP` or `--app`).
"""

import asyncio
import json
import logging
import signal
import sys
from datetime import UTC, datetime, timedelta
from typing import Any

import click
from reflexr.core import SystemActor
from reflexr.workspace import WorkspaceRef

from actonce.worker import reporting
from actonce.worker.dead_letters import DeadLetter
from actonce.worker.definition import DefinitionError, load_definition
from actonce.worker.runtime import Runtime, StoresNotMigrated, migrate
from actonce.worker.settings import ATTEMPTS_QUEUE, TURNS_QUEUE, Settings, SettingsError
from actonce.worker.turn_letters import replay_turn, turn_of

OPERATOR = SystemActor(name="actonce-operator")
"""Who operator commands (replay) act as in reflexr."""


def _settings(app: str | None) -> Settings:
    try:
        return Settings.from_env(None, **({"app": app} if app else {}))
    except SettingsError as invalid:
        raise click.ClickException(str(invalid)) from invalid


def _runtime(settings: Settings) -> Runtime:
    try:
        return Runtime(settings, load_definition(settings.app), one_run=False).open(check=True)
    except (DefinitionError, StoresNotMigrated) as unfit:
        raise click.ClickException(str(unfit)) from unfit


@click.group()
@click.option("--app", "app", envvar="ACTONCE_APP", help="The definition, as module:attribute.")
@click.pass_context
def main(ctx: click.Context, app: str | None) -> None:
    """actonce: run reflexr rules' attempts on Celery, each write into artifactr made once."""
    ctx.obj = app


@main.command()
@click.pass_obj
def migrate_cmd(app: str | None) -> None:
    """Create or upgrade every store's tables (run once, at deploy)."""
    for line in asyncio.run(migrate(_settings(app))):
        click.echo(f"migrated {line}")


main.add_command(migrate_cmd, name="migrate")


@main.command()
@click.option("-c", "--concurrency", type=int, help="Worker processes (ACTONCE_CONCURRENCY).")
@click.option(
    "-Q",
    "--queues",
    default=f"{ATTEMPTS_QUEUE},{TURNS_QUEUE}",
    show_default=True,
    help="Queues to serve, comma-separated: split attempts and turns across pools with it.",
)
@click.option("-l", "--loglevel", default="INFO", show_default=True)
@click.option("-n", "--hostname", default=None, help="The worker's node name.")
@click.pass_obj
def worker(
    app: str | None, concurrency: int | None, queues: str, loglevel: str, hostname: str | None
) -> None:
    """Start a prefork worker pool serving the attempts queue."""
    settings = _settings(app)
    from actonce.worker.app import create_app

    argv = [
        "worker",
        "-P",
        "prefork",
        "-E",
        "-c",
        str(concurrency or settings.concurrency),
        "-Q",
        queues,
        "--loglevel",
        loglevel,
    ]
    if hostname:
        argv += ["-n", hostname]
    create_app(settings).worker_main(argv)


@main.command()
@click.option("--once", is_flag=True, help="Poll once and exit.")
@click.option("-l", "--loglevel", default="INFO", show_default=True)
@click.pass_obj
def dispatch(app: str | None, once: bool, loglevel: str) -> None:
    """Evaluate rules and send due runs to the pool, until stopped."""
    from actonce.worker.app import create_app
    from actonce.worker.dispatcher import Dispatcher

    logging.basicConfig(
        level=loglevel.upper(), format="[%(asctime)s: %(levelname)s/%(name)s] %(message)s"
    )
    settings = _settings(app)
    reporting.init_sentry(settings)
    celery = create_app(settings)
    runtime = _runtime(settings)
    try:
        dispatcher = Dispatcher(runtime, celery)
        if once:
            click.echo(json.dumps(runtime.run(dispatcher.poll()).__dict__))
            return
        stop = asyncio.Event()

        async def serve() -> None:
            loop = asyncio.get_running_loop()
            for signum in (signal.SIGINT, signal.SIGTERM):
                loop.add_signal_handler(signum, stop.set)
            await dispatcher.serve(stop)

        click.echo(f"dispatching to {ATTEMPTS_QUEUE} every {runtime.settings.poll_interval_s}s")
        runtime.run(serve())
        click.echo(f"dispatcher stopped: {dispatcher.stats.line()}")
    finally:
        runtime.close()


@main.group()
def dead() -> None:
    """Inspect, replay and purge dead letters."""


@dead.command("list")
@click.option("--limit", default=50, show_default=True)
@click.option("--reason", default=None, help="Only this reason code.")
@click.option("--tenant", "tenant_id", default=None, help="Only this tenant.")
@click.option("--workspace", "workspace_id", default=None, help="Only this workspace.")
@click.option("--all", "include_replayed", is_flag=True, help="Include replayed letters.")
@click.pass_obj
def dead_list(
    app: str | None,
    limit: int,
    reason: str | None,
    tenant_id: str | None,
    workspace_id: str | None,
    include_replayed: bool,
) -> None:
    """List dead letters, newest first."""
    runtime = _runtime(_settings(app))
    try:
        letters = runtime.run(
            runtime.dead_letters.list(
                limit=limit,
                reason=reason,
                tenant_id=tenant_id,
                workspace_id=workspace_id,
                include_replayed=include_replayed,
            )
        )
    finally:
        runtime.close()
    if not letters:
        click.echo("no dead letters")
    for letter in letters:
        replayed = f" replayed×{letter.replays}" if letter.replays else ""
        click.echo(
            f"{letter.id}  {letter.dead_at:%Y-%m-%d %H:%M:%S}  {letter.reason:<20} "
            f"{letter.rule or '-':<20} {_subject(letter)}  attempts={letter.attempts}{replayed}"
        )


def _subject(letter: DeadLetter) -> str:
    """What a letter gave up on: its run, or for a turn the message whose turn was not taken."""
    turn = turn_of(letter)
    return letter.run_id or (f"turn {turn.message_id}" if turn is not None else "-")


@dead.command("show")
@click.argument("letter_id")
@click.pass_obj
def dead_show(app: str | None, letter_id: str) -> None:
    """Show one dead letter as JSON."""
    runtime = _runtime(_settings(app))
    try:
        letter = runtime.run(runtime.dead_letters.get(letter_id))
    finally:
        runtime.close()
    if letter is None:
        raise click.ClickException(f"no dead letter {letter_id}")
    click.echo(letter.model_dump_json(indent=2))


@dead.command("replay")
@click.argument("letter_ids", nargs=-1, required=True)
@click.pass_obj
def dead_replay(app: str | None, letter_ids: tuple[str, ...]) -> None:
    """Give each letter's run a fresh budget and send it again; its writes keep their ids."""
    from actonce.worker.app import create_app

    settings = _settings(app)
    reporting.init_sentry(settings)
    celery = create_app(settings)
    runtime = _runtime(settings)
    try:
        for letter_id in letter_ids:
            click.echo(runtime.run(replay(runtime, celery, letter_id)))
    finally:
        runtime.close()


async def replay(runtime: Runtime, celery: Any, letter_id: str) -> str:
    """Replay one dead letter: reflexr's operator `retry_run`, then an attempt message.

    Raises:
        click.ClickException: If the letter is missing, or is a raw message with no run.
    """
    from actonce.worker.dispatcher import send_attempt

    letter = await runtime.dead_letters.get(letter_id)
    if letter is None:
        raise click.ClickException(f"no dead letter {letter_id}")
    if turn_of(letter) is not None:  # a turn given up on: a fresh budget, announced again
        try:
            return await replay_turn(runtime.dead_letters, runtime.turn_requests, celery, letter)
        except LookupError as gone:
            raise click.ClickException(str(gone)) from gone
    if letter.run_id is None or letter.tenant_id is None or letter.workspace_id is None:
        raise click.ClickException(
            f"{letter_id} is a {letter.reason} message with no run to replay; purge it"
        )
    workspace = await runtime.reflexr.open(letter.tenant_id, letter.workspace_id, actor=OPERATOR)
    run = await workspace.run(letter.run_id)
    if run.status in ("dead", "cancelled", "skipped", "retrying"):
        await workspace.retry_run(letter.run_id)
    await runtime.dead_letters.mark_replayed(letter_id, datetime.now(UTC))
    send_attempt(celery, letter.tenant_id, letter.workspace_id, letter.run_id)
    return f"replayed {letter_id}: run {letter.run_id} ({run.status} → pending), sent"


@dead.command("purge")
@click.argument("letter_ids", nargs=-1)
@click.option("--older-than-days", type=float, default=None)
@click.option("--replayed", "replayed_only", is_flag=True, help="Only replayed letters.")
@click.option("--everything", is_flag=True, help="Purge every letter (needs this flag).")
@click.pass_obj
def dead_purge(
    app: str | None,
    letter_ids: tuple[str, ...],
    older_than_days: float | None,
    replayed_only: bool,
    everything: bool,
) -> None:
    """Delete dead letters: by id, by age, replayed ones, or --everything."""
    older_than = (
        datetime.now(UTC) - timedelta(days=older_than_days) if older_than_days is not None else None
    )
    runtime = _runtime(_settings(app))
    try:
        removed = runtime.run(
            runtime.dead_letters.purge(
                ids=list(letter_ids) or None,
                older_than=older_than,
                replayed_only=replayed_only,
                everything=everything,
            )
        )
    except ValueError as refused:
        raise click.ClickException(str(refused)) from refused
    finally:
        runtime.close()
    click.echo(f"purged {removed} dead letter(s)")


@main.command()
@click.argument("run", metavar="TENANT/WORKSPACE/RUN_ID")
@click.pass_obj
def explain(app: str | None, run: str) -> None:
    """List each write a run made or set out to make, its derived id and whether it exists."""
    from actonce.worker.explain import explain_run

    ref, run_id = _run_ref(run)
    runtime = _runtime(_settings(app))
    try:
        explanation = runtime.run(
            explain_run(
                runtime.reflexr,
                runtime.artifactr,
                runtime.ledger,
                ref,
                run_id,
                relayr_engine=runtime.engine("relayr"),
            )
        )
    except LookupError as missing:
        raise click.ClickException(str(missing)) from missing
    finally:
        runtime.close()
    for line in explanation.lines():
        click.echo(line)


def _run_ref(value: str) -> tuple[WorkspaceRef, str]:
    parts = value.split("/")
    if len(parts) != 3:
        raise click.BadParameter("name the run as TENANT/WORKSPACE/RUN_ID")
    return WorkspaceRef(parts[0], parts[1]), parts[2]


@main.command()
@click.option("--runs", type=int, default=None, help="Runs to feed (ACTONCE_DEMO_RUNS).")
@click.pass_obj
def demo(app: str | None, runs: int | None) -> None:
    """Run the demo: Redis, dispatcher, workers and Flower, a stream of runs, a report."""
    from actonce.worker.demo_run import run_demo

    settings = _settings(app)
    code = run_demo(
        settings,
        runs=runs or settings.demo_runs,
        exit_when_settled=settings.exit_when_settled,
    )
    raise SystemExit(code)


if __name__ == "__main__":
    sys.exit(main())
