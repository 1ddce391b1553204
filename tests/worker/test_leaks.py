"""Nothing but ids and codes leaves the database; no password leaves the process; Sentry hears of
each dead letter once.

One real pool runs here: `actonce worker` (prefork, `-c 2`), a turn worker (`-Q actonce.turns`)
and `actonce dispatch`, on a private `redis-server` that requires a password and on a fresh
PostgreSQL database reached as a role with a password, both in the URLs, with `SENTRY_DSN`
pointing at a Sentry server this test runs on the loopback (`sentry_capture.SentryCapture`). Its
definition is `bench.leaky:app`, whose probe runs write a marker in a thread title, a notice, a
created artifact and a keyed edit, then end: one succeeds, one fails with artifactr's
`patch_failed` (whose text quotes the artifact), one raises with the marker in its message, one
fails permanently with it. Its ask runs send the turn worker's assistant a message holding a
marker, three times: the assistant's model answers with a reply marker of its own, raises an
error holding both, or answers while the agent records nothing, so that message is never taken
and its request is dead-lettered `turn_not_taken` (`ACTONCE_TURN_MAX_ASKS=1`); each turn is
waited for until it settled. A malformed attempt message names a field after another marker, and
an undecodable body carries a third.

Every channel is then searched for the markers and the passwords: everything Redis saw
(`MONITOR`, kombu's base64 bodies decoded), every key left in Redis (results among them), the
Celery events, the workers' (turn worker's included) and dispatcher's logs, Flower's pages and
API, `celery inspect conf` and `celery report`, the output of `actonce dead list/show`, `explain`
and `migrate`, the dead letters' listed fields, every Sentry envelope, and every span and metric
the pool's processes exported over OTLP to a receiver on the loopback (`otlp_receiver`),
telemetry being on. A control shows the search finds what is there: a run id in each channel
that carries ids, each turn's message id in the telemetry and the refused one's in Sentry, the
turns' markers in the threads artifactr keeps, and the probes' markers in `dead show --detail`.
"""

import asyncio
import base64
import binascii
import contextlib
import json
import re
import secrets
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Final

import artifactr.core as a
import asyncpg
import kombu
import pytest
import redis
from celery_events import celery_events
from otlp_receiver import Received, otlp_receiver
from reflexr.core import Run, SystemActor
from sentry_capture import SentryCapture
from sqlalchemy.engine import make_url

from actonce.tasks.attempt import ATTEMPT_TASK
from actonce.tasks.turns import TurnRequest
from actonce.worker.dead_letters.store import DeadLetter
from actonce.worker.definition import load_definition
from actonce.worker.process.runtime import Runtime
from actonce.worker.settings import ATTEMPTS_QUEUE, Settings
from bench.leaky import AskRequested, ProbeRequested, TurnEnding, reply_marker
from lab.flower import flower
from lab.pool import LocalPool
from lab.postgres import PostgresHandle, fresh_postgres_database
from lab.processes import environment, free_port
from lab.redis import RedisHandle, find_or_start_redis
from lab.settle import wait_settled

pytestmark = pytest.mark.slow

TENANT: Final = "t_leak"
WORKSPACE: Final = "ws_leak"
TOKEN: Final = secrets.token_hex(6)
REDIS_PASSWORD: Final = f"redispw{TOKEN}"
PG_PASSWORD: Final = f"pgpw{TOKEN}"
SENTRY_KEY: Final = f"sentrykey{TOKEN}"
SENTRY_ENVIRONMENT: Final = "leaks-staging"
ROLE: Final = f"leak_{TOKEN}"
ENDINGS: Final = ("succeed", "patch_failed", "raise", "permanent")
MARKERS: Final = {ending: f"MARK{ending.replace('_', '')}{TOKEN}" for ending in ENDINGS}
"""One marker per run, by how it ends: each is written by the run, never sent to the pool."""
TURNS: Final[tuple[TurnEnding, ...]] = ("reply", "raise", "refuse")
TURN_MARKERS: Final = {turn: f"MARKask{turn}{TOKEN}" for turn in TURNS}
"""One marker per turn, by how it ends: in the message the rule sends the assistant."""
REPLY_MARKERS: Final = {turn: reply_marker(marker) for turn, marker in TURN_MARKERS.items()}
"""What the assistant's model answers each: posted, in its error, or dropped unrecorded."""
READER: Final = a.UserActor(id="leak-reader", name="Leak reader")
"""Who reads the turns' threads in artifactr, for the controls."""
MALFORMED_MARKER: Final = f"MARKmalformed{TOKEN}"
"""Sent in the malformed messages themselves: Redis and Celery's events carry it by nature."""
FEED: Final = SystemActor(name="leak-test")
SHOWING_URLS: Final = (
    "celery inspect conf",
    "celery report",
    "flower: /worker/",
    "flower: /api/workers",
    "flower: /broker",
)
"""The channels that show the broker's URL: each must show it, password masked."""
CARRYING_RUN_IDS: Final = (
    "redis",
    "celery events",
    "log: worker0",
    "flower: /api/tasks",
    "sentry",
    "telemetry",
    "actonce: dead list --all",
    "dead letters' listed fields",
)
"""The channels that name every dead run; pages about workers or settings name none."""
LETTERS: Final = 6
"""The dead letters: three probes', the refused turn's and the two malformed messages'."""


@dataclass
class Leaky:
    """The running pool and everything each channel captured."""

    env: dict[str, str]
    local: LocalPool
    runtime: Runtime
    sentry: SentryCapture
    redis_seen: "Monitor"
    events: list[dict[str, Any]]
    flower_url: str
    migrated: str
    telemetry: Received
    runs: list[Run] = field(default_factory=list)
    turns: "SettledTurns | None" = None
    malformed_task_id: str = ""
    undecodable_task_id: str = ""

    def letters(self) -> list[DeadLetter]:
        """Every dead letter."""
        return self.runtime.run(self.runtime.dead_letters.list(limit=100, include_replayed=True))

    def actonce(self, *argv: str) -> str:
        """Run an `actonce` command with the pool's settings; return its output, both streams."""
        return _run([sys.executable, "-m", "actonce.worker.cli", *argv], self.env)

    def celery(self, *argv: str) -> str:
        """Run a `celery -A actonce.worker.app` command with the pool's settings."""
        return _run([sys.executable, "-m", "celery", "-A", "actonce.worker.app", *argv], self.env)


@dataclass(frozen=True)
class SettledTurns:
    """The ask rule's turns, settled: each one's message id, and its thread in artifactr."""

    messages: dict[str, str]
    """Each turn's message id, by how it ends."""
    threads: dict[str, list[a.Envelope]]
    """Each turn's thread, every entry, by how it ends."""


class Monitor:
    """Everything a Redis server is asked, from its `MONITOR` stream, read in a thread."""

    def __init__(self, port: int, password: str) -> None:
        self._socket = socket.create_connection(("127.0.0.1", port))
        self._socket.sendall(f"AUTH {password}\r\nMONITOR\r\n".encode())
        self._chunks: list[bytes] = []
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def seen(self) -> bytes:
        """What Redis was asked so far, with every base64 run in it decoded and appended."""
        return _decoded(b"".join(self._chunks))

    def stop(self) -> None:
        with contextlib.suppress(OSError):
            self._socket.shutdown(socket.SHUT_RDWR)
        self._socket.close()
        self._thread.join(timeout=5)

    def _read(self) -> None:
        with contextlib.suppress(OSError):
            while chunk := self._socket.recv(65536):
                self._chunks.append(chunk)


@pytest.fixture(scope="module")
def leaky(
    tmp_path_factory: pytest.TempPathFactory, postgres_server: PostgresHandle
) -> Iterator[Leaky]:
    """The pool with passwords everywhere, its runs settled, every channel capturing."""
    base = tmp_path_factory.mktemp("leaks")
    with contextlib.ExitStack() as stack:
        sentry = stack.enter_context(SentryCapture(key=SENTRY_KEY))
        server: RedisHandle = stack.enter_context(
            find_or_start_redis(None, directory=base, password=REDIS_PASSWORD)
        )
        database_url = stack.enter_context(_database_with_password(postgres_server))
        otlp_endpoint, telemetry = stack.enter_context(otlp_receiver())
        env = {
            "OTEL_EXPORTER_OTLP_ENDPOINT": otlp_endpoint,
            "OTEL_METRIC_EXPORT_INTERVAL": "500",
            "OTEL_BSP_SCHEDULE_DELAY": "500",
            "ACTONCE_APP": "bench.leaky:app",
            "ACTONCE_BROKER_URL": server.url,
            "ACTONCE_DATABASE_URL": database_url,
            "SENTRY_DSN": sentry.dsn,
            "ACTONCE_SENTRY_ENVIRONMENT": SENTRY_ENVIRONMENT,
            "ACTONCE_LEASE_TTL_S": "3",
            "ACTONCE_SOFT_TIME_LIMIT_S": "50",
            "ACTONCE_TIME_LIMIT_S": "60",
            "ACTONCE_VISIBILITY_TIMEOUT_S": "400",
            # The refused turn is given up on at its first ask, the others are taken by theirs.
            "ACTONCE_TURN_MAX_ASKS": "1",
            "ACTONCE_TURN_WAIT_S": "20",
        }
        assert REDIS_PASSWORD in env["ACTONCE_BROKER_URL"]
        assert PG_PASSWORD in env["ACTONCE_DATABASE_URL"]
        port = int(server.url.rsplit(":", 1)[1].split("/")[0])
        monitor = Monitor(port, REDIS_PASSWORD)
        stack.callback(monitor.stop)
        settings = Settings.from_env(env)
        migrated = _run([sys.executable, "-m", "actonce.worker.cli", "migrate"], env)
        assert "migrated" in migrated, migrated
        events: list[dict[str, Any]] = []
        stack.enter_context(celery_events(settings, events))
        flower_port = free_port()
        stack.enter_context(flower(env, port=flower_port, log_file=base / "logs" / "flower.log"))
        runtime = Runtime(settings, load_definition(settings.app), one_run=False).open()
        stack.callback(runtime.close)
        local = stack.enter_context(
            LocalPool(env, workers=1, concurrency=2, turn_workers=1, log_dir=base / "logs")
        )
        local.wait_ready(timeout_s=90)
        flower_url = f"http://127.0.0.1:{flower_port}"
        _wait_for_flower(flower_url)
        leaky = Leaky(env, local, runtime, sentry, monitor, events, flower_url, migrated, telemetry)
        leaky.runs = _settle_probes(leaky)
        leaky.turns = _settle_turns(leaky)
        leaky.malformed_task_id = _send_malformed(leaky)
        leaky.undecodable_task_id = _send_undecodable(leaky)
        _wait_for_letters(leaky, LETTERS)
        yield leaky


def test_sentry_hears_of_each_dead_letter_once_by_ids_and_never_of_a_retry(leaky: Leaky) -> None:
    by_ending = {_ending(run): run for run in leaky.runs}
    seen = [(run.status, run.attempts, run.reason) for run in leaky.runs]
    assert by_ending["succeed"].status == "succeeded", seen
    for ending in ("patch_failed", "raise"):  # each was retried once before it died
        assert (by_ending[ending].status, by_ending[ending].attempts) == ("dead", 2)
    assert (by_ending["permanent"].status, by_ending["permanent"].attempts) == ("dead", 1)
    assert by_ending["patch_failed"].reason == "patch_failed"

    # Then Sentry has one event per dead letter, tagged with its ids, and nothing else
    events = leaky.sentry.wait_for(lambda found: len(found) >= LETTERS, "six Sentry events")
    tags = [event.get("tags", {}) for event in events]
    others = [
        _said(event) for event in events if event.get("tags", {}).get("dead_letter") != "true"
    ]
    assert not others, others
    # tagged with the environment ACTONCE_SENTRY_ENVIRONMENT names
    assert {event.get("environment") for event in events} == {SENTRY_ENVIRONMENT}, events
    letters = {letter.id: letter for letter in leaky.letters()}
    assert sorted(tag["dead_letter_id"] for tag in tags) == sorted(letters), (tags, letters)
    for tag in tags:
        letter = letters[tag["dead_letter_id"]]
        assert tag["reason"] == letter.reason
        assert tag["run_id"] == (letter.run_id or "-")
        assert tag["tenant_id"] == (letter.tenant_id or "-")
        assert tag["workspace_id"] == (letter.workspace_id or "-")
        assert tag["rule"] == (letter.rule or "-")
    reasons = sorted(letter.reason for letter in letters.values())
    assert reasons == sorted(
        ["attempts_exhausted", "attempts_exhausted", "probe_refused", "turn_not_taken"]
        + ["malformed_message"] * 2
    ), reasons
    malformed = {
        letter.task_id for letter in letters.values() if letter.reason == "malformed_message"
    }
    assert malformed == {leaky.malformed_task_id, leaky.undecodable_task_id}


def test_no_password_and_no_content_leaves_the_database(leaky: Leaky) -> None:
    outputs = _command_outputs(leaky)
    channels = _channels(leaky, outputs)
    secrets_ = {"redis password": REDIS_PASSWORD, "postgres password": PG_PASSWORD}
    contents = {f"marker of {ending}": marker for ending, marker in MARKERS.items()}
    contents["malformed marker"] = MALFORMED_MARKER
    contents.update({f"message of the {turn} turn": TURN_MARKERS[turn] for turn in TURNS})
    contents.update({f"reply of the {turn} turn": REPLY_MARKERS[turn] for turn in TURNS})
    # The malformed messages themselves are seen by Redis (kept `unacked` until their ack),
    # Celery's events and Flower (the kwargs a task received): that is the sender's text, shown
    # by Celery, not what actonce made of it.
    sent_by_the_test = ("redis", "celery events", "flower")

    hits = []
    for channel, text in channels.items():
        for what, needle in {**secrets_, **contents}.items():
            if needle == MALFORMED_MARKER and channel.startswith(sent_by_the_test):
                continue
            if needle.encode() in text:
                at = text.index(needle.encode())
                hits.append(f"{what} in {channel}: …{text[max(0, at - 200) : at + 60]!r}")
        if not channel.startswith("sentry") and SENTRY_KEY.encode() in text:
            hits.append(f"the Sentry key in {channel}")
    assert not hits, "\n".join(hits)

    # Control: the search finds what is there. A run id is in every channel that carries ids,
    control = next(run for run in leaky.runs if run.status == "dead").id.encode()
    missing = [name for name in CARRYING_RUN_IDS if control not in channels[name]]
    assert not missing, f"the control id {control!r} is missing from {missing}"
    # each turn's message id is in the telemetry and the turn worker's log, the refused one's in
    # `dead list`, and its letter's id in Sentry,
    assert leaky.turns is not None
    for turn, message_id in leaky.turns.messages.items():
        for name in ("telemetry", "log: turns0"):
            assert message_id.encode() in channels[name], (turn, message_id, name)
    refused = leaky.turns.messages["refuse"].encode()
    assert refused in channels["actonce: dead list --all"], channels["actonce: dead list --all"]
    [turn_letter] = [letter for letter in leaky.letters() if letter.reason == "turn_not_taken"]
    assert turn_letter.id.encode() in channels["sentry"], turn_letter
    # the turns' markers are in the threads artifactr keeps: the reply posted, the error recorded,
    kept = {turn: repr(thread) for turn, thread in leaky.turns.threads.items()}
    for turn in TURNS:
        assert TURN_MARKERS[turn] in kept[turn], (turn, kept[turn])
    assert REPLY_MARKERS["reply"] in kept["reply"], kept["reply"]
    assert REPLY_MARKERS["raise"] in kept["raise"], kept["raise"]
    assert REPLY_MARKERS["refuse"] not in kept["refuse"], kept["refuse"]  # recorded nowhere
    # the pages and reports about settings show the broker's URL, with its password masked,
    showing_urls = [name for name in channels if name.startswith(SHOWING_URLS)]
    assert len(showing_urls) >= 5, showing_urls
    for name in showing_urls:
        assert b"redis://:**" in channels[name], (name, channels[name][:2000])
    # the malformed message's failure is among the results (dispatched attempts store none),
    assert leaky.malformed_task_id.encode() in channels["results"], channels["results"][:2000]
    # the worker's stats, its broker connection among them, are there to search,
    assert b'"broker"' in channels["celery inspect stats"], channels["celery inspect stats"]
    # and the markers are in the database, shown by `dead show --detail` alone.
    detail = "".join(output for name, output in outputs.items() if name.startswith("detail: "))
    for ending in ("patch_failed", "raise", "permanent"):
        assert MARKERS[ending] in detail, (ending, detail)
    assert MALFORMED_MARKER in detail


def test_the_dispatchers_unexpected_failure_is_reported_without_its_password(
    leaky: Leaky, postgres_server: PostgresHandle
) -> None:
    # By now, any event for a retry would have arrived long since: still one per dead letter
    before = len(leaky.sentry.events())
    assert before == LETTERS, leaky.sentry.events()

    # When the database stops letting the pool's role in, under the running dispatcher
    asyncio.run(_lock_out(postgres_server, ROLE))

    # Then its failing poll is reported to Sentry, tagged with its component, with no password
    def dispatcher_failures(found: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [e for e in found[before:] if (e.get("tags") or {}).get("component") == "dispatcher"]

    events = leaky.sentry.wait_for(dispatcher_failures, "the dispatcher's failure")
    [failure] = dispatcher_failures(events)
    assert failure["level"] == "error"
    assert failure["exception"]["values"], failure
    sent = leaky.sentry.received()
    log = leaky.local.log("dispatcher").encode()
    assert b"poll failed" in log
    for secret in (REDIS_PASSWORD, PG_PASSWORD):
        assert secret.encode() not in sent
        assert secret.encode() not in log


# ─── how ──────────────────────────────────────────────────────────────────────


def _said(event: dict[str, Any]) -> tuple[object, ...]:
    """What a Sentry event is about: its logger, template and exceptions' types."""
    exceptions = (event.get("exception") or {}).get("values") or []
    template = (event.get("logentry") or {}).get("message")
    return event.get("logger"), template, [exception.get("type") for exception in exceptions]


def _command_outputs(leaky: Leaky) -> dict[str, str]:
    """Each command's output by its name, run a few at a time: `detail: …` are the controls."""
    commands: dict[str, tuple[str, ...]] = {
        "celery inspect conf": ("celery", "inspect", "conf", "--timeout", "5"),
        "celery inspect stats": ("celery", "inspect", "stats", "--timeout", "5"),
        "celery report": ("celery", "report"),
        "actonce: dead list --all": ("actonce", "dead", "list", "--all"),
    }
    for letter in leaky.letters():
        commands[f"actonce: dead show {letter.id}"] = ("actonce", "dead", "show", letter.id)
        commands[f"detail: {letter.id}"] = ("actonce", "dead", "show", "--detail", letter.id)
    for run in leaky.runs:
        commands[f"actonce: explain {run.id}"] = (
            "actonce",
            "explain",
            f"{TENANT}/{WORKSPACE}/{run.id}",
        )
    with ThreadPoolExecutor(max_workers=4) as workers:
        running = {
            name: workers.submit(leaky.celery if program == "celery" else leaky.actonce, *argv)
            for name, (program, *argv) in commands.items()
        }
        return {name: future.result() for name, future in running.items()}


def _channels(leaky: Leaky, outputs: dict[str, str]) -> dict[str, bytes]:
    channels: dict[str, bytes] = {"redis": leaky.redis_seen.seen()}
    channels["results"], channels["redis keys"] = _every_key(leaky.env["ACTONCE_BROKER_URL"])
    channels["celery events"] = json.dumps(leaky.events, default=str).encode()
    for name in ("worker0", "turns0", "dispatcher", "flower"):
        path = leaky.local.log_dir / f"{name}.log"
        channels[f"log: {name}"] = path.read_bytes() if path.exists() else b""
    for page, body in _flower(leaky).items():
        channels[f"flower: {page}"] = body
    channels["actonce: migrate"] = leaky.migrated.encode()
    for name, output in outputs.items():
        if not name.startswith("detail: "):
            channels[name] = output.encode()
    channels["dead letters' listed fields"] = "\n".join(
        letter.model_dump_json(exclude={"error", "raw"}) for letter in leaky.letters()
    ).encode()
    channels["sentry"] = leaky.sentry.received()
    # Exports go every half second: wait until the dead runs' and the turns' spans are in, then
    # take all.
    dead = [run.id.encode() for run in leaky.runs if run.status == "dead"]
    assert leaky.turns is not None
    dead += [message_id.encode() for message_id in leaky.turns.messages.values()]
    deadline = time.monotonic() + 20
    while not all(some_id in _exported(leaky.telemetry) for some_id in dead):
        assert time.monotonic() < deadline, "the dead runs' and turns' spans were never exported"
        time.sleep(0.1)
    channels["telemetry"] = _exported(leaky.telemetry)
    # Kept beside the logs, to read what each channel held when the search finds something.
    kept = leaky.local.log_dir.parent / "channels"
    kept.mkdir(exist_ok=True)
    for number, (name, text) in enumerate(channels.items()):
        (kept / f"{number:03}-{re.sub(r'[^A-Za-z0-9_.-]+', '_', name)[:80]}.txt").write_bytes(text)
    return channels


def _exported(received: Received) -> bytes:
    """Everything the pool's processes exported over OTLP so far, as the receiver got it."""
    with received.lock:
        return b"".join(received.raw)


def _flower(leaky: Leaky) -> dict[str, bytes]:
    tasks = json.loads(_get(f"{leaky.flower_url}/api/tasks?limit=1000"))
    workers = list(json.loads(_get(f"{leaky.flower_url}/api/workers?refresh=true")))
    pages = ["/", "/workers", "/tasks", "/broker", "/api/tasks", "/api/workers?refresh=true"]
    pages += ["/api/queues/length", "/metrics"]
    pages += [f"/worker/{name}" for name in workers]
    pages += [f"/task/{task_id}" for task_id in tasks]
    pages += [f"/api/task/info/{task_id}" for task_id in tasks]
    pages += [f"/api/task/result/{task_id}" for task_id in tasks]
    return {page: _get(f"{leaky.flower_url}{page}") for page in pages}


def _get(url: str) -> bytes:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return bytes(response.read())
    except urllib.error.HTTPError as refused:  # an error page is a page too
        return bytes(refused.read())


def _every_key(url: str) -> tuple[bytes, bytes]:
    """Every key's value: the task results', then all others', base64 runs decoded in each."""
    client = redis.Redis.from_url(url)
    try:
        results, others = [], []
        for key in client.scan_iter(count=1000):
            kind = client.type(key)
            if kind == b"string":
                value: Any = client.get(key)
            elif kind == b"list":
                value = client.lrange(key, 0, -1)
            elif kind == b"hash":
                value = client.hgetall(key)
            elif kind == b"set":
                value = client.smembers(key)
            elif kind == b"zset":
                value = client.zrange(key, 0, -1, withscores=True)
            else:
                value = kind
            dumped = repr((key, value)).encode()
            (results if key.startswith(b"celery-task-meta-") else others).append(dumped)
        return _decoded(b"\n".join(results)), _decoded(b"\n".join(others))
    finally:
        client.close()


def _decoded(raw: bytes) -> bytes:
    """`raw`, then each base64 run in it decoded (kombu keeps message bodies in base64)."""
    decoded = [
        base64.b64decode(run + b"=" * (-len(run) % 4))
        for run in re.findall(rb"[A-Za-z0-9+/]{16,}={0,2}", raw)
        if _is_base64(run)
    ]
    return raw + b"\n" + b"\n".join(decoded)


def _is_base64(run: bytes) -> bool:
    try:
        base64.b64decode(run + b"=" * (-len(run) % 4))
    except (binascii.Error, ValueError):
        return False
    return True


def _run(argv: list[str], env: dict[str, str]) -> str:
    done = subprocess.run(
        argv, env=environment(env), capture_output=True, text=True, timeout=120, check=False
    )
    return done.stdout + done.stderr


@contextlib.contextmanager
def _database_with_password(server: PostgresHandle) -> Iterator[str]:
    """A fresh database on the suite's server, owned by a role with a password; its URL, the
    server's own with that role, carries the password."""
    with fresh_postgres_database("actonce_leak", server) as url:
        name = make_url(url).database
        asyncio.run(_admin(server, f"CREATE ROLE {ROLE} LOGIN PASSWORD '{PG_PASSWORD}'"))
        try:
            asyncio.run(_admin(server, f'ALTER DATABASE "{name}" OWNER TO {ROLE}'))
            as_role = make_url(url).set(username=ROLE, password=PG_PASSWORD)
            yield as_role.render_as_string(hide_password=False)
        finally:
            asyncio.run(_admin(server, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
            asyncio.run(_admin(server, f"DROP ROLE IF EXISTS {ROLE}"))


async def _admin(server: PostgresHandle, statement: str) -> None:
    connection = await asyncpg.connect(server.admin_dsn)
    try:
        await connection.execute(statement)
    finally:
        await connection.close()


async def _lock_out(server: PostgresHandle, role: str) -> None:
    connection = await asyncpg.connect(server.admin_dsn)
    try:
        await connection.execute(f"ALTER ROLE {role} NOLOGIN")
        await connection.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = $1", role
        )
    finally:
        await connection.close()


def _wait_for_flower(url: str) -> None:
    deadline = time.monotonic() + 60
    while True:
        with contextlib.suppress(OSError, ValueError):
            if json.loads(_get(f"{url}/api/workers?refresh=true")):
                return
        assert time.monotonic() < deadline, "flower did not answer in 60s"
        time.sleep(0.5)


def _settle_probes(leaky: Leaky) -> list[Run]:
    async def publish_and_settle() -> list[Run]:
        workspace = await leaky.runtime.reflexr.open(TENANT, WORKSPACE, actor=FEED)
        for ending in ENDINGS:
            event = ProbeRequested(
                key=ending.replace("_", "-"), marker=MARKERS[ending], ending=ending
            )
            await workspace.publish(event, id=f"evt_probe_{ending}")
        return list(await wait_settled(workspace.runs, runs=len(ENDINGS), timeout_s=90))

    runs = leaky.runtime.run(publish_and_settle())
    assert len(runs) == len(ENDINGS) and all(run.status in ("succeeded", "dead") for run in runs), (
        runs,
        leaky.local.log("worker0")[-4000:],
    )
    return runs


def _settle_turns(leaky: Leaky) -> SettledTurns:
    """Have the ask rule send each turn's message, and wait until every turn settled: the reply
    posted and the turn ended, the failure recorded, the refused request dead-lettered."""

    async def publish_and_settle() -> list[Run]:
        workspace = await leaky.runtime.reflexr.open(TENANT, WORKSPACE, actor=FEED)
        for turn in TURNS:
            event = AskRequested(key=f"ask-{turn}", marker=TURN_MARKERS[turn], turn=turn)
            await workspace.publish(event, id=f"evt_ask_{turn}")
        every = len(ENDINGS) + len(TURNS)
        return list(await wait_settled(workspace.runs, runs=every, timeout_s=90))

    runs = [run for run in leaky.runtime.run(publish_and_settle()) if run.rule == "leaky:ask"]
    assert len(runs) == len(TURNS) and all(run.status == "succeeded" for run in runs), (
        runs,
        leaky.local.log("worker0")[-4000:],
    )
    sent = {_said_to(run)["turn"]: _said_to(run) for run in runs}
    messages: dict[str, str] = {turn: sent[turn]["message"] for turn in TURNS}
    threads = {turn: sent[turn]["thread"] for turn in TURNS}

    def settled() -> dict[str, list[a.Envelope]] | None:
        logs: dict[str, list[a.Envelope]] = {
            turn: leaky.runtime.run(_thread(leaky, threads[turn])) for turn in TURNS
        }
        requests = {turn: leaky.runtime.run(_request(leaky, messages[turn])) for turn in TURNS}
        letters = {letter.reason for letter in leaky.letters()}
        done = {
            "reply": _ends(logs["reply"]) == ["completed"] and _replies(logs["reply"]) == 1,
            "raise": _ends(logs["raise"]) == ["failed"] and _replies(logs["raise"]) == 0,
            "refuse": "turn_not_taken" in letters and not _ends(logs["refuse"]),
        }
        taken = all(requests[turn].taken_at for turn in ("reply", "raise"))
        return logs if all(done.values()) and taken else None

    deadline = time.monotonic() + 90
    while (logs := settled()) is None:
        assert time.monotonic() < deadline, (leaky.letters(), leaky.local.log("turns0")[-4000:])
        time.sleep(0.3)
    return SettledTurns(messages, logs)


def _said_to(run: Run) -> dict[str, str]:
    """What an ask run returned: its turn's ending, thread id and message id."""
    assert isinstance(run.output, dict), run
    return {key: str(value) for key, value in run.output.items()}


async def _thread(leaky: Leaky, thread_id: str) -> list[a.Envelope]:
    workspace = await leaky.runtime.artifactr.open(TENANT, WORKSPACE, actor=READER)
    return list(await workspace.read(threads={thread_id}))


async def _request(leaky: Leaky, message_id: str) -> TurnRequest:
    found = await leaky.runtime.turn_requests.get(TENANT, WORKSPACE, message_id)
    assert found is not None, message_id
    return found


def _ends(log: list[a.Envelope]) -> list[str]:
    """How each turn in a thread ended, in order."""
    return [e.event.status for e in log if isinstance(e.event, a.RunEnded)]


def _replies(log: list[a.Envelope]) -> int:
    """The agent's messages in a thread."""
    return sum(
        1
        for e in log
        if isinstance(e.event, a.MessagePosted) and e.actor.participant.startswith("agent:")
    )


def _ending(run: Run) -> str:
    """How the run ended, by the marker its error quotes (a success has no error)."""
    found = [ending for ending in ENDINGS if MARKERS[ending] in (run.error or "")]
    return found[0] if found else "succeed"


def _send_malformed(leaky: Leaky) -> str:
    """An attempt message with a field named after the marker, and the marker as its value."""
    kwargs = {"tenant_id": TENANT, "workspace_id": WORKSPACE, MALFORMED_MARKER: MALFORMED_MARKER}
    sent = leaky.local.celery.send_task(ATTEMPT_TASK, kwargs=kwargs, queue=ATTEMPTS_QUEUE)
    return str(sent.id)


def _send_undecodable(leaky: Leaky) -> str:
    """A body Celery cannot decode as JSON, holding the marker."""
    task_id = str(uuid.uuid4())
    with kombu.Connection(leaky.env["ACTONCE_BROKER_URL"]) as connection:
        connection.Producer().publish(
            b'{"not json ' + MALFORMED_MARKER.encode(),
            exchange=ATTEMPTS_QUEUE,
            routing_key=ATTEMPTS_QUEUE,
            content_type="application/json",
            content_encoding="utf-8",
            headers={"id": task_id, "task": ATTEMPT_TASK, "lang": "py"},
            declare=[kombu.Queue(ATTEMPTS_QUEUE, kombu.Exchange(ATTEMPTS_QUEUE, "direct"))],
        )
    return task_id


def _wait_for_letters(leaky: Leaky, count: int) -> None:
    deadline = time.monotonic() + 30
    while len(leaky.letters()) < count:
        assert time.monotonic() < deadline, (leaky.letters(), leaky.local.log("worker0")[-4000:])
        time.sleep(0.2)
