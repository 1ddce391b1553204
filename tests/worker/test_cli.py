"""The `actonce` command: every command explains itself, and a bad configuration stops it clearly.

Click's `CliRunner` runs `actonce --help` and the `--help` of every command and subcommand, found
by walking the group, so a new command is covered when it is added. A definition that
`ACTONCE_APP` cannot name, and settings that do not hold together, make commands exit non-zero
with a message naming the variable to change. Last, `actonce explain` runs over migrated SQLite
stores where a real run of the demo's rule made its writes, and prints them.
"""

import asyncio
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import click
import pytest
from click.testing import CliRunner, Result
from reflexr.core import Run, SystemActor

from actonce.tasks.lifecycle import Reason
from actonce.tasks.turns import TurnRequest
from actonce.worker.cli import main
from actonce.worker.commands.turns import turns
from actonce.worker.dead_letters.store import DeadLetter, run_letter_id
from actonce.worker.definition import load_definition
from actonce.worker.process.runtime import Runtime
from actonce.worker.settings import Settings
from demo.definition import WorkRequested
from demo.feed import prepare, request_work


def _commands(group: click.Group, path: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    """Every command's and subcommand's path under `group`."""
    context = click.Context(group)
    for name in group.list_commands(context):
        command = group.get_command(context, name)
        assert command is not None
        yield (*path, name)
        if isinstance(command, click.Group):
            yield from _commands(command, (*path, name))


COMMANDS = sorted(_commands(main))


def _invoke(*args: str) -> Result:
    return CliRunner().invoke(main, list(args), prog_name="actonce")


def test_actonce_help_lists_every_command() -> None:
    result = _invoke("--help")

    assert result.exit_code == 0, result.output
    assert result.output.startswith("Usage: actonce")
    for name in ("migrate", "worker", "dispatch", "dead", "explain"):
        assert name in result.output


@pytest.mark.parametrize("path", COMMANDS, ids=" ".join)
def test_every_command_and_subcommand_shows_its_usage(path: tuple[str, ...]) -> None:
    result = _invoke(*path, "--help")

    assert result.exit_code == 0, result.output
    assert result.output.startswith(f"Usage: actonce {' '.join(path)}"), result.output


def test_the_commands_include_the_dead_letter_subcommands_and_explain() -> None:
    assert {("dead", "list"), ("dead", "show"), ("dead", "replay"), ("dead", "purge")} <= set(
        COMMANDS
    )
    assert ("explain",) in COMMANDS
    assert ("turns", "purge") in COMMANDS


def test_dead_reasons_lists_every_reason_of_the_lifecycle_with_its_meaning() -> None:
    # As an operator runs it: the command, in a process of its own, with no store configured.
    done = subprocess.run(
        [sys.executable, "-m", "actonce.worker.cli", "dead", "reasons"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )

    assert done.returncode == 0, done.stderr
    lines = {line.split()[0]: line for line in done.stdout.splitlines()}
    assert list(lines) == [reason.value for reason in Reason]
    for reason in Reason:
        assert reason.meaning in lines[reason.value]
        assert ("retried by reflexr" in lines[reason.value]) is reason.retried


@pytest.mark.parametrize("app", ["no-colon", "actonce_no_such_module:app", "demo.definition:nope"])
def test_dead_list_with_a_bad_actonce_app_exits_naming_actonce_app(
    app: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("ACTONCE_VAR_DIR", str(tmp_path))
    monkeypatch.setenv("ACTONCE_APP", app)

    result = _invoke("dead", "list")

    assert result.exit_code != 0
    assert "ACTONCE_APP" in result.output, result.output
    assert app in result.output


@pytest.mark.parametrize(
    "command", [("migrate",), ("dead", "list"), ("dispatch", "--once"), ("worker",)], ids=str
)
def test_invalid_settings_exit_naming_the_variable(
    command: tuple[str, ...], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("ACTONCE_VAR_DIR", str(tmp_path))
    monkeypatch.setenv("ACTONCE_VISIBILITY_TIMEOUT_S", "10")

    result = _invoke(*command)

    assert result.exit_code != 0
    assert "ACTONCE_VISIBILITY_TIMEOUT_S" in result.output, result.output
    assert not list(tmp_path.iterdir()), "a command with invalid settings touched the stores"


@pytest.mark.parametrize(
    ("command", "said"),
    [
        (("worker", "-c", "0"), "'-c' / '--concurrency': 0 is not in the range x>=1"),
        (("worker", "-Q", "actonce.attempts,actonce.turn"), "not 'actonce.turn'"),
        (("dispatch", "--once", "-l", "verbose"), "'verbose' is not one of 'debug', 'info'"),
        (("dead", "list", "--limit", "0"), "'--limit': 0 is not in the range x>=1"),
        (("dead", "purge", "--older-than-days", "-1"), "-1.0 is not in the range x>=0"),
        (("dead", "purge", "--older-than", "-1"), "-1.0 is not in the range x>=0"),
        (("turns", "purge", "--older-than", "-1"), "-1.0 is not in the range x>=0"),
        (("turns", "purge"), "Missing option '--older-than'"),
        (("status", "--timeout", "-1"), "'--timeout': -1.0 is not in the range x>=0"),
    ],
    ids=lambda value: " ".join(value) if isinstance(value, tuple) else "",
)
def test_an_option_out_of_range_is_a_usage_error_before_anything_starts(
    command: tuple[str, ...], said: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("ACTONCE_VAR_DIR", str(tmp_path))

    result = _invoke(*command)

    assert result.exit_code == 2, result.output
    assert said in result.output, result.output
    assert not list(tmp_path.iterdir()), "a refused command touched the stores"


@pytest.fixture
def migrated(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Migrated SQLite stores of this test's own, which every command of the test uses."""
    monkeypatch.setenv("ACTONCE_VAR_DIR", str(tmp_path))
    monkeypatch.delenv("ACTONCE_DATABASE_URL", raising=False)
    assert _invoke("migrate").exit_code == 0


def test_explain_prints_a_real_runs_writes_over_sql_stores(
    migrated: None,
) -> None:
    run = _run_the_demo_once(Settings.from_env())

    result = _invoke("explain", f"acme/ws_cli/{run.id}")

    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert [line.split()[:1] for line in lines[1:5]] == [["notice"], ["create"], ["edit"], ["edit"]]
    assert lines[-1].startswith("4 write(s): 4 exist, 0 missing")


def test_explain_of_a_run_that_is_not_there_exits_saying_so(
    migrated: None,
) -> None:

    result = _invoke("explain", "acme/ws_cli/fir_nope")

    assert result.exit_code != 0
    assert "no run fir_nope in acme/ws_cli" in result.output


def test_dead_list_narrows_to_a_tenant_and_a_workspace(
    migrated: None,
) -> None:
    settings = Settings.from_env()
    runtime = Runtime(settings, load_definition(settings.app), one_run=False).open()
    try:
        for tenant, workspace, run in [("acme", "ws_a", "fir_a"), ("acme", "ws_b", "fir_b")]:
            letter = DeadLetter(
                id=run_letter_id(tenant, workspace, run, 1),
                tenant_id=tenant,
                workspace_id=workspace,
                run_id=run,
                rule="demo:work",
                reason="not_allowed",
                error="no",
                attempts=1,
                dead_at=datetime.now(UTC),
            )
            assert runtime.run(runtime.dead_letters.add(letter))
    finally:
        runtime.close()

    everything = _invoke("dead", "list")
    in_b = _invoke("dead", "list", "--tenant", "acme", "--workspace", "ws_b")
    elsewhere = _invoke("dead", "list", "--workspace", "ws_c")

    assert "fir_a" in everything.output and "fir_b" in everything.output, everything.output
    assert "fir_b" in in_b.output and "fir_a" not in in_b.output, in_b.output
    assert elsewhere.output.strip() == "no dead letters"


def test_dead_list_narrows_to_a_reason_and_purge_takes_only_what_its_filters_name(
    migrated: None,
) -> None:
    # Given three letters: one not_allowed dead three days ago, one replayed, one fresh
    settings = Settings.from_env()
    runtime = Runtime(settings, load_definition(settings.app), one_run=False).open()
    now = datetime.now(UTC)
    letters = {
        "fir_old": ("not_allowed", now - timedelta(days=3)),
        "fir_replayed": ("attempts_exhausted", now),
        "fir_fresh": ("attempts_exhausted", now),
    }
    ids = {run: run_letter_id("acme", "ws", run, 1) for run in letters}
    try:
        for run, (reason, dead_at) in letters.items():
            letter = DeadLetter(
                id=ids[run],
                tenant_id="acme",
                workspace_id="ws",
                run_id=run,
                rule="demo:work",
                reason=reason,
                error="no",
                attempts=1,
                dead_at=dead_at,
            )
            assert runtime.run(runtime.dead_letters.add(letter))
        runtime.run(runtime.dead_letters.mark_replayed(ids["fir_replayed"], now))
    finally:
        runtime.close()
    # Then `--reason` lists only that reason's
    by_reason = _invoke("dead", "list", "--reason", "not_allowed")
    assert "fir_old" in by_reason.output and "fir_fresh" not in by_reason.output, by_reason.output
    # and purge with no filter refuses, removing nothing
    refused = _invoke("dead", "purge")
    assert refused.exit_code == 2 and "to remove every letter, --everything" in refused.output
    both = _invoke("dead", "purge", "--everything", "--replayed")
    assert both.exit_code == 2 and "--everything takes no ids" in both.output, both.output
    assert "fir_old" in _invoke("dead", "list").output
    # and each filter removes only what it names: by age, then replayed, then the rest
    assert "purged 0 dead letter(s)" in _invoke("dead", "purge", "--older-than", "4").output
    assert "purged 1 dead letter(s)" in _invoke("dead", "purge", "--older-than", "2").output
    assert "fir_old" not in _invoke("dead", "list", "--all").output
    # (`--older-than-days`, the option's first name, still works)
    assert "purged 0 dead letter(s)" in _invoke("dead", "purge", "--older-than-days", "2").output
    assert "purged 1 dead letter(s)" in _invoke("dead", "purge", "--replayed").output
    left = _invoke("dead", "list", "--all").output
    assert "fir_replayed" not in left and "fir_fresh" in left, left
    assert "purged 1 dead letter(s)" in _invoke("dead", "purge", "--everything").output
    assert _invoke("dead", "list", "--all").output.strip() == "no dead letters"


def test_turns_purge_removes_settled_requests_older_than_its_days_and_keeps_waiting_ones(
    migrated: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a budget of 2 asks, and requests taken or given up on 10 days ago or 1 day ago,
    # and one asked once 10 days ago, still waiting for its turn
    monkeypatch.setenv("ACTONCE_TURN_MAX_ASKS", "2")
    settings = Settings.from_env()
    now = datetime.now(UTC)
    long_ago, lately = now - timedelta(days=10), now - timedelta(days=1)
    made = {
        "msg_taken_long_ago": {"taken_at": long_ago},
        "msg_taken_lately": {"taken_at": lately},
        "msg_given_up_long_ago": {"asks": 2},
        "msg_given_up_lately": {"asks": 2, "asked_at": lately},
        "msg_waiting": {"asks": 1},
    }
    runtime = Runtime(settings, load_definition(settings.app), one_run=False).open()
    try:
        for message_id, fields in made.items():
            request = TurnRequest(
                tenant_id="acme",
                workspace_id="ws",
                thread_id="thr_1",
                message_id=message_id,
                rule="demo:work",
                requested_at=long_ago,
                **{"asked_at": long_ago, **fields},
            )
            assert runtime.run(runtime.turn_requests.request(request))
    finally:
        runtime.close()

    # When the operator purges those settled more than a week ago, with the group's own command
    runner = CliRunner()
    purged = runner.invoke(turns, ["purge", "--older-than", "7"], prog_name="actonce turns")
    # and, a day later, those settled more than half a day ago, through `actonce`
    again = _invoke("turns", "purge", "--older-than", "0.5")

    # Then each removes only what it names, and the waiting request stays however old
    assert purged.exit_code == 0, purged.output
    assert purged.output == "purged 2 settled turn request(s)\n"
    assert again.exit_code == 0, again.output
    assert again.output == "purged 2 settled turn request(s)\n"
    runtime = Runtime(settings, load_definition(settings.app), one_run=False).open()
    try:
        left = [
            message_id
            for message_id in made
            if runtime.run(runtime.turn_requests.get("acme", "ws", message_id)) is not None
        ]
    finally:
        runtime.close()
    assert left == ["msg_waiting"]


def test_turns_purge_of_stores_never_migrated_says_so_and_changes_nothing(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("ACTONCE_VAR_DIR", str(tmp_path))
    monkeypatch.delenv("ACTONCE_DATABASE_URL", raising=False)

    result = CliRunner().invoke(turns, ["purge", "--older-than", "7"], prog_name="actonce turns")

    assert result.exit_code == 1, result.output
    assert "actonce migrate" in result.output, result.output


def _run_the_demo_once(settings: Settings) -> Run:
    """Feed one `WorkRequested` and have reflexr's reactor run its run over the SQL stores."""
    runtime = Runtime(settings, load_definition(settings.app), one_run=False).open(check=True)

    async def feed_and_run() -> Run:
        await prepare(runtime.artifactr, "acme", "ws_cli")
        await request_work(runtime.reflexr, "acme", "ws_cli", WorkRequested(key="cli"))
        reactor = runtime.reactor()
        system = await runtime.reflexr.open("acme", "ws_cli", actor=SystemActor(name="tests"))
        for _ in range(100):
            await reactor.settle()
            runs = await system.runs()
            if runs and runs[0].status in ("succeeded", "dead"):
                return runs[0]
            await asyncio.sleep(0.01)
        raise TimeoutError(f"the demo's run did not finish: {runs}")

    try:
        return runtime.run(feed_and_run())
    finally:
        runtime.close()
