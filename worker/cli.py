"""The `actonce` command: worker, dispatch, migrate, dead letters, turn requests and explain.

Every command reads the same settings (`ACTONCE_*`, see `worker.settings`) and loads the same
application definition (`ACTONCE_APP` or `--app`), through `worker.commands.opening`. The
dead-letter commands are a group of their own, `worker.dead_letters.commands`, wired in here.
"""

import asyncio
import json
import logging
import signal
import sys
from typing import Final

import click
from reflexr.workspace import WorkspaceRef

from actonce.worker.commands.opening import open_runtime, settings_for
from actonce.worker.commands.turns import turns
from actonce.worker.dead_letters.commands import dead
from actonce.worker.observers import setup
from actonce.worker.process import telemetry
from actonce.worker.process.exit_status import run_worker
from actonce.worker.settings import QUEUES
from actonce.worker.storage.migrate import MigrationFailed, migrate

log = logging.getLogger("actonce.cli")

LOG_LEVELS: Final = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
"""The levels `actonce dispatch -l` takes."""


@click.group()
@click.option("--app", "app", envvar="ACTONCE_APP", help="The definition, as module:attribute.")
@click.pass_context
def main(ctx: click.Context, app: str | None) -> None:
    """actonce: run reflexr rules' attempts on Celery, each write into artifactr made once."""
    ctx.obj = app


main.add_command(dead)
main.add_command(turns)


@main.command()
@click.pass_obj
def migrate_cmd(app: str | None) -> None:
    """Create or upgrade every store's tables (run once, at deploy)."""
    try:
        lines = asyncio.run(migrate(settings_for(app)))
    except MigrationFailed as failed:
        # The operator gets one line; the traceback goes to the log, at DEBUG.
        log.debug("migrate failed", exc_info=failed)
        raise click.ClickException(str(failed)) from failed
    for line in lines:
        click.echo(f"migrated {line}")


main.add_command(migrate_cmd, name="migrate")


@main.command()
@click.option(
    "-P",
    "--pool",
    type=click.Choice(["prefork", "threads"]),
    help="prefork children, or threads over one loop in this process (ACTONCE_POOL).",
)
@click.option(
    "-c",
    "--concurrency",
    type=click.IntRange(min=1),
    help="Prefork children, or attempts in flight with threads (ACTONCE_CONCURRENCY).",
)
@click.option(
    "-Q",
    "--queues",
    default=",".join(QUEUES),
    show_default=True,
    callback=lambda _context, _option, value: _actonce_queues(value),
    help="Queues to serve, comma-separated: split attempts and turns across pools with it.",
)
@click.option("-l", "--loglevel", default="INFO", show_default=True)
@click.option("-n", "--hostname", default=None, help="The worker's node name.")
@click.pass_obj
def worker(
    app: str | None,
    pool: str | None,
    concurrency: int | None,
    queues: str,
    loglevel: str,
    hostname: str | None,
) -> None:
    """Start a worker serving the attempts and turns queues."""
    settings = settings_for(app)
    if pool is not None:
        settings = settings.model_copy(update={"pool": pool})
    from actonce.worker.app import create_app

    argv = [
        "worker",
        "-P",
        settings.pool,
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
    status, why = run_worker(create_app(settings), argv)
    if status:
        # One line for the supervisor's journal; the worker's log above has the details.
        # sys.__stderr__: Celery still redirects sys.stderr into its log.
        print(
            f"actonce worker stopped with status {status}: {why or 'see its log'}",
            file=sys.__stderr__,
        )
        sys.exit(status)


@main.command()
@click.option("--once", is_flag=True, help="Poll once and exit.")
@click.option(
    "-l",
    "--loglevel",
    default="INFO",
    show_default=True,
    type=click.Choice(LOG_LEVELS, case_sensitive=False),
)
@click.pass_obj
def dispatch(app: str | None, once: bool, loglevel: str) -> None:
    """Evaluate rules and send due runs to the pool, until stopped."""
    from actonce.worker.app import create_app
    from actonce.worker.dispatching.dispatcher import Dispatcher, DispatcherGaveUp
    from actonce.worker.process.broker_access import BrokerRefused, check_broker_access
    from actonce.worker.process.interpreter import keep_startup_heap

    logging.basicConfig(
        level=loglevel.upper(), format="[%(asctime)s: %(levelname)s/%(name)s] %(message)s"
    )
    settings = settings_for(app)
    setup.observe(settings, "dispatcher")
    try:
        check_broker_access(settings)
    except BrokerRefused as refused:
        raise click.ClickException(str(refused)) from refused
    celery = create_app(settings)
    runtime = open_runtime(settings)
    setup.observe_also(runtime.definition)
    try:
        dispatcher = Dispatcher(runtime, celery)
        if once:
            try:
                polled = runtime.run(dispatcher.poll())
            finally:
                runtime.run(dispatcher.close())
            click.echo(json.dumps(polled.__dict__))
            return
        keep_startup_heap()
        stop = asyncio.Event()

        async def serve() -> None:
            loop = asyncio.get_running_loop()
            for signum in (signal.SIGINT, signal.SIGTERM):
                loop.add_signal_handler(signum, stop.set)
            await dispatcher.serve(stop)

        # It logs its ready line itself, once its first poll and heartbeat succeeded.
        try:
            runtime.run(serve())
        except DispatcherGaveUp as gave_up:
            click.echo(f"actonce dispatch stopped with status 1: {gave_up}", err=True)
            sys.exit(1)
        click.echo(f"dispatcher stopped: {dispatcher.stats.line()}")
    finally:
        runtime.close()
        telemetry.stop()


@main.command()
@click.option(
    "--require",
    type=click.Choice(["worker", "dispatcher"]),
    multiple=True,
    help="What must answer for exit 0 (repeatable); by default both.",
)
@click.option("--node", default=None, help="Ping only this worker node (celery@HOST).")
@click.option(
    "--timeout",
    default=1.0,
    show_default=True,
    type=click.FloatRange(min=0),
    help="Seconds to wait for pings.",
)
@click.pass_obj
def status(app: str | None, require: tuple[str, ...], node: str | None, timeout: float) -> None:
    """Report workers, the dispatcher's last poll, queues and dead letters; exit 1 if unhealthy."""
    from actonce.worker.commands.status import PARTS, gather

    required = require or PARTS
    found = gather(settings_for(app), timeout_s=timeout, node=node)
    for line in found.lines(required):
        click.echo(line)
    if found.problems(required):
        sys.exit(1)


@main.command()
@click.argument("run", metavar="TENANT/WORKSPACE/RUN_ID")
@click.pass_obj
def explain(app: str | None, run: str) -> None:
    """List each write a run made or set out to make, its derived id and whether it exists."""
    from actonce.worker.commands.explain import explain_run

    ref, run_id = _run_ref(run)
    runtime = open_runtime(settings_for(app))
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


def _actonce_queues(value: str) -> str:
    """Return `-Q`'s value if it names only actonce's queues: the dispatcher sends nowhere else,
    so a worker on any other queue would serve nothing."""
    unknown = [name for name in value.split(",") if name.strip() not in QUEUES]
    if unknown:
        raise click.BadParameter(
            f"actonce sends to {' and '.join(QUEUES)} only, not {', '.join(map(repr, unknown))}"
        )
    return value


def _run_ref(value: str) -> tuple[WorkspaceRef, str]:
    parts = value.split("/")
    if len(parts) != 3:
        raise click.BadParameter("name the run as TENANT/WORKSPACE/RUN_ID")
    return WorkspaceRef(parts[0], parts[1]), parts[2]


if __name__ == "__main__":
    sys.exit(main())
