"""A wrong configuration is reported in one line that says what is wrong, and never its password.

Through `actonce` as an operator types it (a real process, its real stderr): a database on a
closed port, a database that does not exist, a MySQL URL, a misspelt driver and a store that was
never migrated each get their own one-line message, with the password masked and no traceback;
only the unmigrated store is told to run `actonce migrate`. `actonce migrate` fails the same
way. A misspelt `ACTONCE_*` variable gets a warning naming the setting it was probably meant as.
A definition that does not fit is refused at start by `actonce worker` (exit 3) and the
commands: a rule whose retries wait past `ACTONCE_MAX_RETRY_DELAY_S`, or runs waiting for a rule
it lacks.
"""

import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy.engine import make_url

from actonce.worker.process.runtime import Runtime
from actonce.worker.settings import Settings
from demo import definition as demo
from demo.definition import WorkRequested
from demo.feed import request_work
from lab.postgres import PostgresHandle
from lab.processes import environment
from tests.worker.retry_apps import LONGEST_WAIT_S

SECRET = "s3cret-pw"


def _actonce(tmp_path: Path, *args: str, **env: str) -> "subprocess.CompletedProcess[str]":
    return subprocess.run(
        [sys.executable, "-m", "actonce.worker.cli", *args],
        env=environment({"ACTONCE_VAR_DIR": str(tmp_path / "var"), **env}),
        capture_output=True,
        text=True,
        timeout=120,
    )


def _one_line_error(done: "subprocess.CompletedProcess[str]") -> str:
    assert done.returncode != 0, done.stdout
    assert "Traceback" not in done.stderr, done.stderr
    assert SECRET not in done.stderr + done.stdout
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    return lines[0]


@pytest.mark.parametrize("command", [("migrate",), ("dead", "list")], ids=" ".join)
def test_a_database_on_a_closed_port_is_unreachable(
    tmp_path: Path, command: tuple[str, ...]
) -> None:
    url = f"postgresql+asyncpg://actonce:{SECRET}@127.0.0.1:1/actonce"

    line = _one_line_error(_actonce(tmp_path, *command, ACTONCE_DATABASE_URL=url))

    assert "cannot reach the reflexr store's database at" in line, line
    assert "actonce:***@127.0.0.1:1/actonce" in line, line
    assert "migrate`" not in line, line


@pytest.mark.parametrize("command", [("migrate",), ("dead", "list")], ids=" ".join)
def test_a_database_that_does_not_exist_says_so(
    tmp_path: Path, command: tuple[str, ...], postgres_server: PostgresHandle
) -> None:
    url = postgres_server.database_url("actonce_no_such_database")
    with_password = make_url(url).set(password=SECRET).render_as_string(hide_password=False)

    line = _one_line_error(_actonce(tmp_path, *command, ACTONCE_DATABASE_URL=with_password))

    assert "database 'actonce_no_such_database' does not exist" in line, line


@pytest.mark.parametrize(
    ("url", "driver"),
    [
        (f"mysql://actonce:{SECRET}@127.0.0.1/actonce", "mysql"),
        (f"postgresql://actonce:{SECRET}@127.0.0.1/actonce", "postgresql"),
        (f"posgresql+asyncpg://actonce:{SECRET}@127.0.0.1/actonce", "posgresql+asyncpg"),
    ],
)
def test_an_unsupported_url_names_its_driver_and_the_supported_ones(
    tmp_path: Path, url: str, driver: str
) -> None:
    for command in (("migrate",), ("dead", "list")):
        line = _one_line_error(_actonce(tmp_path, *command, ACTONCE_DATABASE_URL=url))

        assert f"names the driver {driver!r}, which actonce does not support" in line, line
        assert "postgresql+asyncpg://USER:PASSWORD@HOST:PORT/DATABASE" in line, line


def test_only_a_store_without_tables_is_told_to_migrate(tmp_path: Path) -> None:
    line = _one_line_error(_actonce(tmp_path, "dead", "list"))

    assert "has no reflexr_alembic_version: run `actonce migrate`" in line, line
    assert _actonce(tmp_path, "migrate").returncode == 0
    assert _actonce(tmp_path, "dead", "list").returncode == 0


@pytest.mark.parametrize(
    ("command", "variable", "dsn", "why"),
    [
        # Each process that reports to Sentry, through the door its user starts it by
        ("worker -c 1", "ACTONCE_SENTRY_DSN", f"{SECRET}@sentry.example/1", "Unsupported scheme"),
        ("dispatch", "SENTRY_DSN", "https://sentry.example/1", "Missing public key"),
        (
            "dead replay dl_1",
            "SENTRY_DSN",
            f"https://{SECRET}@sentry.example/project",
            "Invalid project in DSN",
        ),
    ],
)
def test_a_sentry_dsn_that_is_not_one_is_refused_in_one_line_without_its_key(
    tmp_path: Path, command: str, variable: str, dsn: str, why: str
) -> None:
    line = _one_line_error(_actonce(tmp_path, *command.split(), **{variable: dsn}))

    assert line.startswith("Error: invalid settings: ACTONCE_SENTRY_DSN: "), line
    assert "not a Sentry DSN, https://KEY@HOST/PROJECT" in line, line
    assert why in line and "else SENTRY_DSN" in line, line


@pytest.mark.parametrize(
    ("variable", "url", "why"),
    [
        ("ACTONCE_BROKER_URL", "localhost:6379", "must specify one of the following schemes"),
        ("REDIS_URL", f"amqp://guest:{SECRET}@127.0.0.1//", "must specify one of the following"),
    ],
)
def test_a_broker_url_that_is_not_redis_is_refused_in_one_line(
    tmp_path: Path, variable: str, url: str, why: str
) -> None:
    line = _one_line_error(_actonce(tmp_path, "dispatch", "--once", **{variable: url}))

    assert line.startswith("Error: invalid settings: ACTONCE_BROKER_URL: "), line
    assert "not a Redis URL, redis://[USER:PASSWORD@]HOST:PORT/DB" in line and why in line, line


@pytest.mark.parametrize(
    ("variable", "value", "why"),
    [
        # `inf` passed `> 0` and stopped the dispatcher with OverflowError; 1e15 s likewise
        ("ACTONCE_LEASE_TTL_S", "inf", "Input should be a finite number"),
        ("ACTONCE_TURN_GRACE_S", "1e15", "Input should be less than or equal to 604800"),
    ],
)
def test_a_duration_that_is_not_finite_or_past_a_week_is_refused_in_one_line(
    tmp_path: Path, variable: str, value: str, why: str
) -> None:
    line = _one_line_error(_actonce(tmp_path, "dispatch", "--once", **{variable: value}))

    assert line == f"Error: invalid settings: {variable}: {why}", line


def test_a_misspelt_variable_is_warned_about_with_the_closest_setting(tmp_path: Path) -> None:
    done = _actonce(tmp_path, "migrate", ACTONCE_CONCURENCY="4", ACTONCE_DATABSE_URL="x")

    assert done.returncode == 0, done.stderr
    assert (
        "ACTONCE_CONCURENCY is not an actonce setting and is ignored: "
        "did you mean ACTONCE_CONCURRENCY?"
    ) in done.stderr
    assert "ACTONCE_DATABSE_URL is not an actonce setting" in done.stderr
    assert "did you mean ACTONCE_DATABASE_URL?" in done.stderr


@pytest.mark.slow  # starts `actonce worker`
def test_a_rule_whose_retries_wait_past_the_limit_is_refused_until_the_limit_is_raised(
    tmp_path: Path,
) -> None:
    # Given migrated stores and a definition whose rule waits 480 s before its last attempt
    app = {"ACTONCE_APP": "tests.worker.retry_apps:long_waits"}
    assert _actonce(tmp_path, "migrate", **app).returncode == 0
    # When a worker starts under the default limit (300 s), it refuses, saying which rule and why
    worker = _actonce(tmp_path, "worker", **app)
    assert worker.returncode == 3, worker.stderr
    refusal = f"demo:work waits up to {LONGEST_WAIT_S}s"
    assert refusal in worker.stderr and "ACTONCE_MAX_RETRY_DELAY_S (300s)" in worker.stderr
    # and so does a command
    line = _one_line_error(_actonce(tmp_path, "dead", "list", **app))
    assert refusal in line and "raise ACTONCE_MAX_RETRY_DELAY_S" in line, line
    # Then with the limit raised to the rule's wait, it is accepted
    raised = _actonce(tmp_path, "dead", "list", ACTONCE_MAX_RETRY_DELAY_S="480", **app)
    assert raised.returncode == 0 and "no dead letters" in raised.stdout, raised.stderr


@pytest.mark.slow  # starts `actonce worker`
def test_runs_waiting_for_a_rule_the_definition_lacks_keep_workers_from_starting(
    tmp_path: Path,
) -> None:
    # Given a demo run of `demo:work` waiting in the stores
    env = {"ACTONCE_VAR_DIR": str(tmp_path / "var")}
    assert _actonce(tmp_path, "migrate").returncode == 0
    runtime = Runtime(Settings.from_env(env), demo.app, one_run=False).open()
    try:
        runtime.run(request_work(runtime.reflexr, "t", "w", WorkRequested(key="waiting")))
        assert runtime.run(runtime.reactor().evaluate()) == 1
    finally:
        runtime.close()
    # When a worker starts on a definition without that rule, it refuses, naming the rule
    other = {"ACTONCE_APP": "bench.definition:app"}
    worker = _actonce(tmp_path, "worker", **other)
    assert worker.returncode == 3, worker.stderr
    assert "runs are waiting for rules ['demo:work']" in worker.stderr, worker.stderr
    # and the definition that has it starts, as far as a command's check
    assert _actonce(tmp_path, "dead", "list").returncode == 0
