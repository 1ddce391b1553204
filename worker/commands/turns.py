"""`actonce turns`: look after the durable turn requests, as an operator does.

A rule that sends a message asking for a thread's turn records a request in
`actonce_turn_requests` (`tasks.turns`), one row per message, which the dispatcher's sweep and the
turn workers read until it is settled. A settled request is kept as a record and never read again
by the pool: `actonce turns purge --older-than DAYS` removes those settled longer ago than that.
Settled means taken by artifactr's Runner, or given up on (its `ACTONCE_TURN_MAX_ASKS` asks spent,
its `turn_not_taken` letter kept); a request still waiting for its turn is never removed.
"""

from datetime import UTC, datetime, timedelta

import click

from actonce.worker.commands.opening import open_runtime, settings_for


@click.group()
def turns() -> None:
    """Look after turn requests: purge the settled ones."""


@turns.command("purge")
@click.option(
    "--older-than",
    "older_than_days",
    metavar="DAYS",
    type=click.FloatRange(min=0),
    required=True,
    help="Only requests taken, or given up on, more than DAYS ago (fractions allowed).",
)
@click.pass_obj
def turns_purge(app: str | None, older_than_days: float) -> None:
    """Delete settled turn requests: taken, or given up on, more than DAYS ago.

    A request still waiting for its turn is kept, however old. A given-up request's letter
    (`turn_not_taken`) cannot be replayed once its request is purged.
    """
    settings = settings_for(app)
    older_than = datetime.now(UTC) - timedelta(days=older_than_days)
    runtime = open_runtime(settings)
    try:
        removed = runtime.run(
            runtime.turn_requests.purge_settled(
                older_than=older_than, max_asks=settings.turn_max_asks
            )
        )
    finally:
        runtime.close()
    click.echo(f"purged {removed} settled turn request(s)")
