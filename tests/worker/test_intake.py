"""Hostile input: no message pushed onto actonce's queues can stop the pool or loop in it.

Each shape is written raw onto the real queue of a real prefork `actonce worker`, the way kombu's
Redis transport writes a message (LPUSH of its JSON envelope onto the list named like the
queue). For every shape: the letter is kept under the id of the message's bytes, with its reason
and those bytes; the worker's main process is the same process, its consumer was never torn
down; nothing is left in Redis's `unacked` hash; and a clean run sent right after succeeds with
each of its writes once. Pickle and YAML bodies carry payloads whose loading would create a
marker file: it must never appear.

That a letter is written once is the store's primary key; what could happen twice is what the
worker does about it. Each pool reports to a Sentry server of its own on the loopback
(`sentry_capture.SentryCapture`), and every letter must get exactly one Sentry report (tagged with
its id) and one warning line in the worker's log, once a clean run has settled after it: a
message screened again, or a letter announced by a second path, would show as two.
"""

import base64
import bz2
import json
import pickle
import time
import uuid
import zlib
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Final

import pytest
import redis
from click.testing import CliRunner, Result
from pools import POOL_ENV, REDIS_DB, Pool, Scene, broker_url, running_pool
from sentry_capture import SentryCapture

from actonce.tasks.attempt import ATTEMPT_TASK
from actonce.tasks.turn_task import TURN_TASK
from actonce.worker.cli import main
from actonce.worker.dead_letters.store import RAW_LIMIT_BYTES, DeadLetter, intake_letter_id
from actonce.worker.settings import ATTEMPTS_QUEUE, TURNS_QUEUE
from demo.definition import RUNBOOK_ID, TIMELINE_ID
from lab.redis import RedisHandle

pytestmark = pytest.mark.slow

MARKER: Final = Path("/tmp") / f"actonce-intake-marker-{uuid.uuid4().hex}"
"""The file a pickle or YAML payload would create if anything loaded it."""

PREPARED: Final = frozenset({TIMELINE_ID, RUNBOOK_ID})
"""The artifacts every scene holds before any run."""

TORN_DOWN: Final = ("Connection to broker lost", "Trying to reconnect", "Unrecoverable error")
"""What Celery logs when its consumer is torn down or its worker gives up."""


class TouchesMarker:
    """Pickled, it is a call that creates `MARKER` when unpickled."""

    def __reduce__(self) -> tuple[Any, ...]:
        return (Path.touch, (MARKER,))


YAML_PAYLOAD: Final = (
    f'!!python/object/apply:pathlib.Path.touch [!!python/object/apply:pathlib.Path ["{MARKER}"]]'
)
"""A YAML document whose unsafe loading would create `MARKER`."""


@dataclass(frozen=True)
class Shape:
    """One hostile message: its bytes, the queue it is pushed on, the reason it must get."""

    item: bytes
    reason: str
    queue: str = ATTEMPTS_QUEUE
    task_id: str | None = None
    """The task id the letter must carry, when the message had a valid one."""


def body_of(args: list[Any], kwargs: dict[str, Any], embed: dict[str, Any] | None = None) -> str:
    """Return a protocol-2 body as kombu's Redis transport stores it: base64 of its JSON."""
    embed = embed if embed is not None else {"callbacks": None, "errbacks": None, "chain": None}
    return base64.b64encode(json.dumps([args, kwargs, embed]).encode()).decode()


def envelope(
    *,
    task: object = ATTEMPT_TASK,
    task_id: object = None,
    queue: str = ATTEMPTS_QUEUE,
    kwargs: dict[str, Any] | None = None,
    body: object = None,
    headers: dict[str, Any] | None = None,
    properties: dict[str, Any] | None = None,
    drop: tuple[str, ...] = (),
    **top: object,
) -> dict[str, Any]:
    """Return a message as kombu's Redis transport writes it, with the changes given.

    `headers` and `properties` are merged over the usual ones; `drop` names dotted keys to
    remove (`properties.delivery_tag`); other keywords replace top-level keys.
    """
    task_id = str(uuid.uuid4()) if task_id is None else task_id
    kwargs = (
        {"tenant_id": "t_pool", "workspace_id": "ws_nowhere", "run_id": "fir_nothing"}
        if kwargs is None
        else kwargs
    )
    message: dict[str, Any] = {
        "body": body_of([], kwargs) if body is None else body,
        "content-encoding": "utf-8",
        "content-type": "application/json",
        "headers": {
            "lang": "py",
            "task": task,
            "id": task_id,
            "shadow": None,
            "eta": None,
            "expires": None,
            "group": None,
            "group_index": None,
            "retries": 0,
            "timelimit": [None, None],
            "root_id": task_id,
            "parent_id": None,
            "argsrepr": "()",
            "kwargsrepr": repr(kwargs),
            "origin": "gen1@intake-test",
            "ignore_result": False,
            "replaced_task_nesting": 0,
            "stamped_headers": None,
            "stamps": {},
            **(headers or {}),
        },
        "properties": {
            "correlation_id": task_id,
            "reply_to": str(uuid.uuid4()),
            "delivery_mode": 2,
            "delivery_info": {"exchange": "", "routing_key": queue},
            "priority": 0,
            "body_encoding": "base64",
            "delivery_tag": str(uuid.uuid4()),
            **(properties or {}),
        },
        **top,
    }
    for dotted in drop:
        *path, last = dotted.split(".")
        holder = message
        for part in path:
            holder = holder[part]
        del holder[last]
    return message


def raw(message: object) -> bytes:
    """Return a message's bytes as LPUSH writes them."""
    return json.dumps(message).encode()


def shape(message: object, reason: str, queue: str = ATTEMPTS_QUEUE, **kwargs: Any) -> Shape:
    """Return the shape of a message given as an object (encoded as JSON) or as bytes."""
    item = message if isinstance(message, bytes) else raw(message)
    task_id = kwargs.pop("task_id", None)
    if task_id is None and isinstance(message, dict):
        candidate = (
            (message.get("headers") or {}).get("id")
            if isinstance(message.get("headers"), dict)
            else None
        )
        known = reason in ("unknown_task", "eta_out_of_range", "unsupported_content")
        task_id = candidate if known else None
    return Shape(item, reason, queue, task_id)


def far(seconds: float) -> str:
    """Return the ISO time `seconds` from now."""
    return (datetime.now(UTC) + timedelta(seconds=seconds)).isoformat()


def compressed(method: Callable[[bytes], bytes], name: str) -> dict[str, Any]:
    """Return a message whose body is compressed with `method`, as kombu marks it."""
    data = method(json.dumps([[], {"run_id": "x" * 100_000}, {}]).encode())
    return envelope(body=base64.b64encode(data).decode(), headers={"compression": name})


MALFORMED = "malformed_message"
UNKNOWN = "unknown_task"
INVALID = "invalid_id"
UNSUPPORTED = "unsupported_content"
ETA = "eta_out_of_range"
OVERSIZED = "oversized"

TURN_KWARGS: Final = {"tenant_id": "t_pool", "workspace_id": "ws_nowhere", "message_id": "msg_x"}

SHAPES: Final[dict[str, Shape]] = {
    # ── envelopes
    "not-json": shape(b'{"not json', MALFORMED),
    "not-utf8": shape(b"\xff\xfe\x00\x81 garbage", MALFORMED),
    "empty": shape(b"", MALFORMED),
    "json-list": shape(b"[1, 2, 3]", MALFORMED),
    "json-string": shape(b'"a message"', MALFORMED),
    "json-number": shape(b"42", MALFORMED),
    "json-null": shape(b"null", MALFORMED),
    "deeply-nested": shape(b"[" * 1500 + b"]" * 1500, MALFORMED),
    "nul-in-envelope": shape(raw(envelope())[:-1] + b', "x": "\x00"}', MALFORMED),
    # ── properties
    "no-properties": shape(envelope(drop=("properties",)), MALFORMED),
    "properties-list": shape(
        envelope(properties=None, drop=("properties",)) | {"properties": []}, MALFORMED
    ),
    "no-delivery-tag": shape(envelope(drop=("properties.delivery_tag",)), MALFORMED),
    "delivery-tag-number": shape(envelope(properties={"delivery_tag": 7}), MALFORMED),
    "no-delivery-info": shape(envelope(drop=("properties.delivery_info",)), MALFORMED),
    "delivery-info-string": shape(envelope(properties={"delivery_info": "x"}), MALFORMED),
    "routed-elsewhere": shape(
        envelope(properties={"delivery_info": {"exchange": "", "routing_key": "celery"}}),
        MALFORMED,
    ),
    "body-encoding-hex": shape(envelope(properties={"body_encoding": "hex"}), MALFORMED),
    "priority-text": shape(envelope(properties={"priority": "high"}), MALFORMED),
    # ── headers
    "no-headers": shape(envelope(drop=("headers",)), MALFORMED),
    "headers-list": shape(envelope(drop=("headers",)) | {"headers": ["task"]}, MALFORMED),
    "no-id": shape(envelope(drop=("headers.id",)), MALFORMED),
    "id-number": shape(envelope(task_id=12345), MALFORMED),
    "id-nul": shape(envelope(task_id="abc\x00def"), INVALID),
    "id-too-long": shape(envelope(task_id="a" * 300), INVALID),
    "id-control-chars": shape(envelope(task_id="\x1b[31mred"), INVALID),
    "id-empty": shape(envelope(task_id=""), INVALID),
    "id-slash": shape(envelope(task_id="../../etc/passwd"), INVALID),
    "no-task": shape(envelope(drop=("headers.task",)), MALFORMED),
    "task-number": shape(envelope(task=7), MALFORMED),
    "task-list": shape(envelope(task=["actonce.attempt_run"]), MALFORMED),
    "task-object": shape(envelope(task={"name": ATTEMPT_TASK}), MALFORMED),
    "task-unknown": shape(envelope(task="evil.task"), UNKNOWN),
    "task-celery-accumulate": shape(envelope(task="celery.accumulate"), UNKNOWN),
    "task-celery-chord-unlock": shape(envelope(task="celery.chord_unlock"), UNKNOWN),
    "task-backend-cleanup": shape(envelope(task="celery.backend_cleanup"), UNKNOWN),
    "turn-on-attempts-queue": shape(envelope(task=TURN_TASK, kwargs=TURN_KWARGS), UNKNOWN),
    "attempt-on-turns-queue": shape(envelope(queue=TURNS_QUEUE), UNKNOWN, queue=TURNS_QUEUE),
    "eta-not-a-time": shape(envelope(headers={"eta": "tomorrow"}), MALFORMED),
    "eta-number": shape(envelope(headers={"eta": 1e12}), MALFORMED),
    "eta-far-future": shape(envelope(headers={"eta": far(30 * 86400)}), ETA),
    "eta-year-9999": shape(envelope(headers={"eta": "9999-12-31T23:59:59+00:00"}), ETA),
    "expires-garbage": shape(envelope(headers={"expires": "never"}), MALFORMED),
    "timelimit-text": shape(envelope(headers={"timelimit": "x"}), MALFORMED),
    "retries-negative": shape(envelope(headers={"retries": -1}), MALFORMED),
    "shadow-name": shape(envelope(headers={"shadow": "innocent.task"}), MALFORMED),
    "root-id-nul": shape(envelope(headers={"root_id": "r\x00"}), INVALID),
    "parent-id-number": shape(envelope(headers={"parent_id": 5}), MALFORMED),
    "protocol-1": shape(
        envelope(drop=("headers.task",), body=base64.b64encode(b'{"task": "x"}').decode()),
        MALFORMED,
    ),
    # ── content types and encodings
    "content-type-data": shape(envelope(**{"content-type": "application/data"}), UNSUPPORTED),
    "content-type-missing": shape(envelope(drop=("content-type",)), UNSUPPORTED),
    "content-encoding-binary": shape(envelope(**{"content-encoding": "binary"}), UNSUPPORTED),
    "pickle": shape(
        envelope(
            body=base64.b64encode(pickle.dumps(TouchesMarker())).decode(),
            **{"content-type": "application/x-python-serialize", "content-encoding": "binary"},
        ),
        UNSUPPORTED,
    ),
    "yaml": shape(
        envelope(
            body=base64.b64encode(YAML_PAYLOAD.encode()).decode(),
            **{"content-type": "application/x-yaml"},
        ),
        UNSUPPORTED,
    ),
    "msgpack": shape(envelope(**{"content-type": "application/x-msgpack"}), UNSUPPORTED),
    "zlib": shape(compressed(zlib.compress, "application/x-gzip"), UNSUPPORTED),
    "bz2": shape(compressed(bz2.compress, "application/x-bz2"), UNSUPPORTED),
    # ── bodies
    "body-not-base64": shape(envelope(body="!!! not base64 !!!"), MALFORMED),
    "body-missing": shape(envelope(drop=("body",)), MALFORMED),
    "body-number": shape(envelope(body=12), MALFORMED),
    "body-not-json": shape(envelope(body=base64.b64encode(b"{nope").decode()), MALFORMED),
    "body-not-utf8": shape(envelope(body=base64.b64encode(b"\xff\xfe").decode()), MALFORMED),
    "body-object": shape(
        envelope(body=base64.b64encode(b'{"args": [], "kwargs": {}}').decode()), MALFORMED
    ),
    "body-two-parts": shape(envelope(body=base64.b64encode(b"[[], {}]").decode()), MALFORMED),
    "body-args-string": shape(
        envelope(body=base64.b64encode(b'["abc", {}, {}]').decode()), MALFORMED
    ),
    "body-with-callback": shape(
        envelope(body=body_of([], {}, {"callbacks": [{"task": "celery.accumulate"}]})), MALFORMED
    ),
    # ── ids among the arguments
    "run-id-nul": shape(
        envelope(kwargs={"tenant_id": "t_pool", "workspace_id": "ws_x", "run_id": "fir_\x00"}),
        INVALID,
    ),
    "tenant-id-too-long": shape(
        envelope(kwargs={"tenant_id": "t" * 201, "workspace_id": "ws_x", "run_id": "fir_x"}),
        INVALID,
    ),
    "workspace-id-slash": shape(
        envelope(kwargs={"tenant_id": "t_pool", "workspace_id": "ws/../x", "run_id": "fir_x"}),
        INVALID,
    ),
    "positional-id-newline": shape(
        envelope(body=body_of(["t_pool", "ws_x", "fir_x\nforged log line"], {})), INVALID
    ),
    # ── turn messages
    "turn-message-id-control": shape(
        envelope(
            task=TURN_TASK,
            queue=TURNS_QUEUE,
            kwargs={**TURN_KWARGS, "message_id": "msg_\x07"},
        ),
        INVALID,
        queue=TURNS_QUEUE,
    ),
    "turn-body-object": shape(
        envelope(task=TURN_TASK, queue=TURNS_QUEUE, body=base64.b64encode(b"{}").decode()),
        MALFORMED,
        queue=TURNS_QUEUE,
    ),
    "turn-not-json": shape(b"\x00\x01 not a turn", MALFORMED, queue=TURNS_QUEUE),
    "turn-celery-task": shape(
        envelope(task="celery.accumulate", queue=TURNS_QUEUE), UNKNOWN, queue=TURNS_QUEUE
    ),
    # ── size
    "oversized": shape(envelope(kwargs={"run_id": "x" * 5000}), OVERSIZED),
    "oversized-binary": shape(b"\xff" * (RAW_LIMIT_BYTES * 2), OVERSIZED),
}
"""Every hostile shape, by name: what is pushed, where, and the reason its letter must have."""


@dataclass
class SentriedPool(Pool):
    """The module's pool, its processes reporting to a Sentry server of its own."""

    sentry: SentryCapture


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def pool(
    request: pytest.FixtureRequest,
    redis_server: RedisHandle,
    tmp_path_factory: pytest.TempPathFactory,
    postgres_database: Callable[[], AbstractContextManager[str]],
) -> Iterator[SentriedPool]:
    """The shared pool of `conftest.pool` (a worker `-c 2` and a dispatcher on the backend),
    with `SENTRY_DSN` naming a capture of its own: each backend's letters have the same ids."""
    backend: str = request.param
    base = tmp_path_factory.mktemp(f"intake-{backend}")
    with SentryCapture() as sentry:
        env = {
            **POOL_ENV,
            "ACTONCE_BROKER_URL": broker_url(redis_server, REDIS_DB[backend]),
            "SENTRY_DSN": sentry.dsn,
        }
        with running_pool(backend, env, base, postgres_database, workers=1, concurrency=2) as on:
            yield SentriedPool(on.backend, on.env, on.local, on.runtime, sentry)


@dataclass
class Intake:
    """The pool under hostile input: its worker's pid, its broker, and what a shape did."""

    pool: SentriedPool
    pid: int
    broker: redis.Redis
    sent: list[bytes] = field(default_factory=list)

    def push(self, item: bytes, queue: str = ATTEMPTS_QUEUE) -> None:
        """Write a message onto `queue` as kombu's Redis transport does: LPUSH of its bytes."""
        self.broker.lpush(queue, item)

    def letter(self, item: bytes, timeout_s: float = 20.0) -> DeadLetter:
        """Wait for the letter of the message `item`, found by the id its bytes make."""
        letter_id = intake_letter_id(item)
        return self.pool.letter(lambda found: found.id == letter_id, timeout_s)

    def assert_told_once(self, letter: DeadLetter) -> None:
        """Assert Sentry got exactly one report of `letter`, and the worker logged exactly one
        warning line of it; call it once a clean run has settled after the letter."""
        reports = [
            event
            for event in self.pool.sentry.wait_for(
                lambda found: any(_letter_id_of(event) == letter.id for event in found),
                f"a Sentry report of {letter.id}",
            )
            if _letter_id_of(event) == letter.id
        ]
        assert len(reports) == 1, reports
        assert reports[0]["level"] == "warning" and reports[0]["tags"]["reason"] == letter.reason
        warnings = [
            line
            for line in self.pool.worker_log().splitlines()
            if f"dead letter {letter.id} " in line
        ]
        assert len(warnings) == 1, warnings
        assert "WARNING/" in warnings[0], warnings

    def assert_unharmed(self) -> None:
        """Assert the worker's main process is the one the module started, its consumer never
        torn down, and nothing is left unacked."""
        self.pool.assert_alive()
        assert self.pool.local._processes["worker0"].pid == self.pid
        log = self.pool.worker_log()
        for words in TORN_DOWN:
            assert words not in log, f"the worker said {words!r}:\n{log[-4000:]}"
        deadline = time.monotonic() + 20
        while self.broker.hlen("unacked"):
            assert time.monotonic() < deadline, f"left unacked: {self.broker.hgetall('unacked')}"
            time.sleep(0.1)


@pytest.fixture(scope="module")
def intake(pool: SentriedPool) -> Intake:
    """The module's pool, with its worker's pid taken once, before any hostile message."""
    broker = redis.Redis.from_url(pool.env["ACTONCE_BROKER_URL"])
    return Intake(pool, pool.local._processes["worker0"].pid, broker)


ON_POSTGRES: Final = frozenset(
    {
        "not-json",
        "not-utf8",
        "nul-in-envelope",
        "deeply-nested",
        "no-properties",
        "id-nul",
        "id-control-chars",
        "task-celery-accumulate",
        "eta-far-future",
        "pickle",
        "zlib",
        "run-id-nul",
        "turn-not-json",
        "oversized-binary",
    }
)
"""The shapes also run on PostgreSQL: the check is the same on every store, the letters differ
by what they hold (NUL, bytes that are not UTF-8, control characters, a cut body)."""


@pytest.mark.parametrize(
    "name",
    [
        pytest.param(name, marks=() if name in ON_POSTGRES else pytest.mark.sqlite_only)
        for name in SHAPES
    ],
)
def test_a_hostile_message_is_dead_lettered_once_and_the_pool_serves_on(
    intake: Intake, scene: Scene, name: str
) -> None:
    shape = SHAPES[name]

    # When the message is pushed raw onto its queue
    intake.push(shape.item, shape.queue)

    # Then its letter holds its reason, its queue and its bytes, exactly
    letter = intake.letter(shape.item)
    assert letter.reason == shape.reason, letter
    assert (letter.run_id, letter.queue, letter.raw_bytes) == (None, shape.queue, len(shape.item))
    kept = letter.raw_message()
    assert kept is not None
    if len(shape.item) <= RAW_LIMIT_BYTES // 2:
        assert kept == shape.item, "the letter should keep the message's bytes whole"
    else:
        assert shape.item.startswith(kept[:1024]), "the letter should keep the message's start"
    if shape.task_id is not None:
        assert letter.task_id == shape.task_id, letter
    assert not MARKER.exists(), "a pickle or YAML payload was loaded"

    # And the worker serves on: same process, nothing unacked, a clean run writes each thing once
    intake.assert_unharmed()
    assert_a_clean_run_succeeds(scene)
    # And, by then, the letter was told of once: one Sentry report, one warning line
    intake.assert_told_once(letter)


def test_the_same_hostile_message_twice_makes_one_letter_and_two_messages_two(
    intake: Intake, scene: Scene
) -> None:
    # Given one malformed message pushed twice, and another with the same task id
    task_id = str(uuid.uuid4())
    first = raw(envelope(task_id=task_id, task="evil.task"))
    second = raw(envelope(task_id=task_id, task="evil.other"))
    for item in (first, first, second):
        intake.push(item)

    # Then the two different messages have a letter each, the twice-pushed one a single letter
    one, two = intake.letter(first), intake.letter(second)
    assert one.id != two.id
    assert (one.task_id, two.task_id) == (task_id, task_id)
    intake.assert_unharmed()
    assert intake.broker.llen(ATTEMPTS_QUEUE) == 0, "both copies should be gone from the queue"
    assert_a_clean_run_succeeds(scene)
    # And each letter was told of once, the twice-pushed one's too
    intake.assert_told_once(one)
    intake.assert_told_once(two)


def test_pickle_and_yaml_payloads_would_create_the_marker_if_loaded(tmp_path: Path) -> None:
    # The payloads are real: loading them in this process creates the marker (then removed).
    assert not MARKER.exists()
    pickle.loads(pickle.dumps(TouchesMarker()))  # loading it here is the point
    assert MARKER.exists()
    MARKER.unlink()
    assert "!!python/object/apply" in YAML_PAYLOAD


@pytest.mark.parametrize(
    "headers",
    [
        pytest.param({}, id="plain"),
        pytest.param({"eta": far(-3600)}, id="expired-eta"),
        pytest.param({"eta": far(2)}, id="eta-soon"),
        pytest.param({"sentry-trace": "0" * 32 + "-" + "1" * 16, "baggage": "x=y"}, id="extra"),
    ],
)
def test_a_valid_message_pushed_raw_reaches_the_task(
    intake: Intake, headers: dict[str, Any]
) -> None:
    # Given a valid attempt message for a run that does not exist, pushed raw
    task_id = str(uuid.uuid4())
    run_id = f"fir_raw{uuid.uuid4().hex[:8]}"
    kwargs = {"tenant_id": "t_pool", "workspace_id": "ws_nowhere", "run_id": run_id}
    intake.push(raw(envelope(task_id=task_id, kwargs=kwargs, headers=headers)))

    # Then the intake let it through: the task ran and dead-lettered it as an unknown run
    letter = intake.pool.letter(lambda found: found.task_id == task_id)
    assert letter.reason == "unknown_run", letter
    intake.assert_unharmed()
    intake.assert_told_once(letter)


def test_a_valid_message_sent_twice_under_one_id_runs_each_write_once(
    intake: Intake, scene: Scene
) -> None:
    # Given a run that succeeded
    scene.request("twice_raw")
    (run,) = scene.settled()

    # When its attempt is pushed raw twice more, under one task id
    item = raw(
        envelope(
            kwargs={"tenant_id": "t_pool", "workspace_id": scene.workspace_id, "run_id": run.id}
        )
    )
    intake.push(item)
    intake.push(item)

    # Then both copies are taken and acked, and nothing was written twice
    deadline = time.monotonic() + 20
    while intake.broker.llen(ATTEMPTS_QUEUE):
        assert time.monotonic() < deadline
        time.sleep(0.1)
    intake.assert_unharmed()
    assert_writes_once(scene, ["twice_raw"])
    assert scene.runs()[0].attempts == 1


@pytest.mark.parametrize("name", ["not-utf8", "task-celery-accumulate"])
def test_an_operator_reads_a_refused_message_cannot_replay_it_and_purges_it(
    intake: Intake, monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    # Given a refused message's letter (bytes that are not UTF-8, or a JSON envelope)
    item = SHAPES[name].item + uuid.uuid4().hex.encode()
    intake.push(item)
    letter = intake.letter(item)
    for variable, value in intake.pool.env.items():
        monkeypatch.setenv(variable, value)

    # When the operator shows it, replays it, then purges it
    shown = invoke("dead", "show", letter.id)
    raw_shown = invoke("dead", "show", letter.id, "--raw")
    replayed = invoke("dead", "replay", letter.id)
    purged = invoke("dead", "purge", letter.id)

    # Then show prints the letter and, with --raw, the message's exact bytes
    assert shown.exit_code == 0, shown.output
    assert json.loads(shown.output)["id"] == letter.id
    assert raw_shown.exit_code == 0 and raw_shown.stdout_bytes == item
    # And replay refuses it, saying there is no run to replay; purge removes it
    assert replayed.exit_code != 0
    assert "no run to replay" in replayed.output, replayed.output
    assert purged.exit_code == 0 and "purged 1" in purged.output, purged.output
    assert letter.id not in [found.id for found in intake.pool.letters()]


# ─── how ──────────────────────────────────────────────────────────────────────


def _letter_id_of(event: dict[str, Any]) -> str | None:
    """The id of the dead letter a Sentry event reports, or None for any other event."""
    tags = event.get("tags") or {}
    return tags.get("dead_letter_id") if isinstance(tags, dict) else None


def invoke(*args: str) -> Result:
    """Run `actonce` with `args` in this process, as an operator would."""
    return CliRunner().invoke(main, list(args), prog_name="actonce")


def assert_a_clean_run_succeeds(scene: Scene) -> None:
    """Request one piece of work in `scene`; assert it succeeds with each write once."""
    key = f"after_{uuid.uuid4().hex[:8]}"
    scene.request(key)
    (run,) = scene.settled()
    assert run.status == "succeeded", run
    assert_writes_once(scene, [key])


def assert_writes_once(scene: Scene, keys: list[str]) -> None:
    """Assert the runs of `keys` made each of their writes once, and nothing else."""
    census = scene.census()
    assert census.duplicates() == {}, census.duplicates()
    assert len(census.messages) == len(keys), census.messages
    assert len(set(census.artifacts) - PREPARED) == len(keys), census.artifacts
    assert len(census.proposals) == len(keys), census.proposals
    for key in keys:
        assert census.edits[(TIMELINE_ID, f"/entries/{key}")] == 1
