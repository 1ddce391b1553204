"""`actonce dead`: list, show, replay and purge dead letters, as an operator does.

Each command opens the runtime over the migrated stores and reads or changes the dead-letter
store (`worker.dead_letters.store`). Replaying is reflexr's operator `retry_run`, which makes the
run pending with a fresh budget, then an attempt message: the run's writes keep their derived ids,
so what earlier attempts wrote is not written twice. A replay checks the broker first, so one
that cannot send changes nothing, and marks the letter replayed only once the message is sent;
replaying a letter again once its run went on says so and sends nothing. `list` and `show` print
ids, reason codes, attempts and times; a letter's error text and raw body, which may quote
content, are printed by `show --detail` only.
"""

import sys
from datetime import UTC, datetime, timedelta
from typing import Any, Final

import click
from reflexr.core import SystemActor
from reflexr.workspace import WorkspaceRef

from actonce.tasks.lifecycle import Reason
from actonce.tasks.tracing import carried, continued
from actonce.worker.commands.opening import open_runtime, settings_for
from actonce.worker.dead_letters.store import DeadLetter
from actonce.worker.dead_letters.turn_letters import replay_turn, turn_of
from actonce.worker.observers import sentry, setup
from actonce.worker.process import telemetry
from actonce.worker.process.broker_access import BROKER_VARIABLE, fix_refusal, reach
from actonce.worker.process.health import reason
from actonce.worker.process.runtime import Runtime
from actonce.worker.settings import Settings, mask_url

OPERATOR: Final = SystemActor(name="actonce-operator")
"""Who operator commands (replay) act as in reflexr."""

REPLAYABLE: Final = ("dead", "cancelled", "skipped", "retrying")
"""The run statuses a replay gives a fresh budget (reflexr's operator `retry_run`)."""


@click.group()
def dead() -> None:
    """Inspect, replay and purge dead letters."""


@dead.command("reasons")
def dead_reasons() -> None:
    """List every reason code a letter or a failure can carry, with what it means.

    A run that failed permanently is dead-lettered with its failure's own reason, so a rule's own
    code can appear in `actonce dead list` too.
    """
    width = max(len(code) for code in Reason)
    for code in Reason:
        retried = "  (retried by reflexr)" if code.retried else ""
        click.echo(f"{code:<{width}}  {code.meaning}{retried}")


@dead.command("list")
@click.option("--limit", default=50, show_default=True, type=click.IntRange(min=1))
@click.option(
    "--reason", default=None, help="Only this reason code (`actonce dead reasons` lists them)."
)
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
    runtime = open_runtime(settings_for(app))
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
        where = f"{letter.tenant_id or '-'}/{letter.workspace_id or '-'}"
        click.echo(
            f"{letter.id}  {letter.dead_at:%Y-%m-%d %H:%M:%S}  {letter.reason:<20} "
            f"{letter.rule or '-':<20} {where}  {_subject(letter)}  "
            f"attempts={letter.attempts}{replayed}"
        )


def _subject(letter: DeadLetter) -> str:
    """What a letter gave up on: its run, or for a turn the message whose turn was not taken."""
    turn = turn_of(letter)
    return letter.run_id or (f"turn {turn.message_id}" if turn is not None else "-")


@dead.command("show")
@click.argument("letter_id")
@click.option(
    "--detail",
    is_flag=True,
    help="Include the error text and a refused message's raw body, which may quote content.",
)
@click.option(
    "--raw",
    "raw_only",
    is_flag=True,
    help="Write only the message's bytes as they arrived (base64 decoded), nothing else.",
)
@click.pass_obj
def dead_show(app: str | None, letter_id: str, detail: bool, raw_only: bool) -> None:
    """Show one dead letter as JSON: ids, reason, attempts and times (--detail: its text too).

    A refused message's bytes are its `raw`, shown by `--detail`, or alone by `--raw`.
    """
    runtime = open_runtime(settings_for(app))
    try:
        letter = runtime.run(runtime.dead_letters.get(letter_id))
    finally:
        runtime.close()
    if letter is None:
        raise click.ClickException(f"no dead letter {letter_id}")
    if raw_only:
        data = letter.raw_message()
        if data is None:
            raise click.ClickException(f"{letter_id} is the letter of a run: it kept no message")
        sys.stdout.flush()
        sys.stdout.buffer.write(data)
        sys.stdout.buffer.flush()
        return
    click.echo(letter.model_dump_json(indent=2, exclude=None if detail else set(CONTENT_FIELDS)))


CONTENT_FIELDS: Final = frozenset({"error", "raw"})
"""A letter's fields that may quote content (an action's error, a message's body): shown by
`dead show --detail` (or `--raw`) only, never by `dead list` or a plain `dead show`."""


@dead.command("replay")
@click.argument("letter_ids", nargs=-1, required=True)
@click.pass_obj
def dead_replay(app: str | None, letter_ids: tuple[str, ...]) -> None:
    """Give each letter's run a fresh budget and send it again; its writes keep their ids.

    A letter that cannot be replayed gets one line on stderr naming why, and the others are
    still replayed; the command then exits 1. An error it did not expect is printed by its type
    and first line and reported to Sentry by type and stack.
    """
    from actonce.worker.app import create_app

    settings = settings_for(app)
    setup.observe(settings, "dead replay")
    celery = create_app(settings)
    runtime = open_runtime(settings)
    failed = 0
    try:
        for letter_id in letter_ids:
            try:
                click.echo(runtime.run(replay(runtime, celery, letter_id)))
            except click.ClickException as refused:
                failed += 1
                click.echo(f"Error: {refused.format_message()}", err=True)
            except Exception as unexpected:
                failed += 1
                sentry.report_failure(unexpected, component="dead replay")
                click.echo(f"Error: replaying {letter_id} failed: {reason(unexpected)}", err=True)
    finally:
        runtime.close()
        telemetry.stop()
    if failed:
        sys.exit(1)


async def replay(runtime: Runtime, celery: Any, letter_id: str) -> str:
    """Replay one dead letter: reflexr's operator `retry_run`, then an attempt message.

    Raises:
        click.ClickException: If the letter is missing, or is a raw message with no run.
    """
    from actonce.worker.dispatching.dispatcher import event_traceparent, send_attempt
    from actonce.worker.dispatching.sent_marks import SentMarks

    letter = await runtime.dead_letters.get(letter_id)
    if letter is None:
        raise click.ClickException(f"no dead letter {letter_id}")
    if turn_of(letter) is not None:  # a turn given up on: a fresh budget, announced again
        check_broker(runtime.settings)  # before its budget is reset and its letter marked
        try:
            return await replay_turn(runtime.dead_letters, runtime.turn_requests, celery, letter)
        except LookupError as gone:
            raise click.ClickException(str(gone)) from gone
    if letter.run_id is None or letter.tenant_id is None or letter.workspace_id is None:
        raise click.ClickException(
            f"cannot replay {letter_id}: it keeps a message refused as {letter.reason}, not a "
            f"run, so there is no run to replay; read it with `actonce dead show {letter_id} "
            f"--raw`, remove it with `actonce dead purge {letter_id}`"
        )
    workspace = await runtime.reflexr.open(letter.tenant_id, letter.workspace_id, actor=OPERATOR)
    run = await workspace.run(letter.run_id)
    if letter.replays and run.status not in REPLAYABLE:
        # Replayed already and the run went on: sending again would only make a duplicate.
        return (
            f"{letter_id} was replayed already ({letter.replays}×): run {letter.run_id} is "
            f"{run.status}; nothing sent"
        )
    # Before anything changes: a replay that cannot send leaves the letter and run as they were.
    check_broker(runtime.settings)
    was = run.status
    if run.status in REPLAYABLE:
        await workspace.retry_run(letter.run_id)
        run = await workspace.run(letter.run_id)
    ref = WorkspaceRef(letter.tenant_id, letter.workspace_id)
    # Marked as a dispatcher marks what it sends: a dispatcher that finds the run pending (and,
    # with fair share, holds it for its turn) does not send it a second time.
    SentMarks.of(runtime.settings).mark(ref, run)
    # With telemetry, the replay is a span in the trace the run's event was published in, and
    # the attempt it sends joins that trace.
    parent = await event_traceparent(runtime, ref, run) if telemetry.running() else ""
    attributes = {"actonce.run_id": letter.run_id, "actonce.dead_letter_id": letter_id}
    with continued("actonce.replay", {"traceparent": parent} if parent else None, attributes):
        send_attempt(
            celery, letter.tenant_id, letter.workspace_id, letter.run_id, headers=carried()
        )
    await runtime.dead_letters.mark_replayed(letter_id, datetime.now(UTC))
    return f"replayed {letter_id}: run {letter.run_id} ({was} → pending), sent"


def check_broker(settings: Settings) -> None:
    """Fail in one line, at once, when the broker does not answer or refuses the connection.

    Raises:
        click.ClickException: Naming the broker (password masked), which of the two, and the
            error; for a refusal, the variable to fix.
    """
    unreached = reach(settings, timeout_s=2.0)
    if unreached is None:
        return
    broker = mask_url(settings.broker_url)
    if unreached.refused:
        raise click.ClickException(
            f"the broker at {broker} refused the connection ({unreached.why}): nothing was"
            f" replayed; {fix_refusal(BROKER_VARIABLE)}"
        )
    raise click.ClickException(
        f"the broker at {broker} does not answer ({unreached.why}): nothing was replayed"
    )


@dead.command("purge")
@click.argument("letter_ids", nargs=-1)
@click.option(
    "--older-than",
    "--older-than-days",
    "older_than_days",
    metavar="DAYS",
    type=click.FloatRange(min=0),
    default=None,
    help="Only letters dead more than DAYS ago (fractions allowed).",
)
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
    # In the command's words: the store's own refusal names its Python arguments.
    filtered = bool(letter_ids) or older_than_days is not None or replayed_only
    if not everything and not filtered:
        raise click.UsageError(
            "say which letters: their ids, --older-than DAYS or --replayed; "
            "to remove every letter, --everything"
        )
    if everything and filtered:
        raise click.UsageError("--everything takes no ids and no filter: give one or the other")
    older_than = (
        datetime.now(UTC) - timedelta(days=older_than_days) if older_than_days is not None else None
    )
    runtime = open_runtime(settings_for(app))
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
