"""The turn pools' harness: real `actonce` processes over a test's own stores, and what a test
counts there.

A `TurnPool` starts the dispatcher and workers as `actonce` processes, each in a session of its
own (so a kill takes its children), on one workspace and one thread of the demo's. A test counts
one turn as artifactr's log and the model see it (`Turns`): the rule's messages, the thread's
turns, their ends, the agent's replies, and the model's calls, which `turn_apps` counts across
processes.
"""

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final, TypeVar

import artifactr.core as a
import redis
from reflexr.core import Run
from turn_apps import CALLS_FILE, model_calls

from actonce.tasks.turns import TurnRequest
from actonce.worker.definition import load_definition
from actonce.worker.process.runtime import Runtime
from actonce.worker.settings import Settings
from actonce.worker.storage.migrate import migrate
from demo.definition import THREAD_ID, WorkRequested
from demo.feed import FEED, PEOPLE, prepare, request_work
from lab.redis import RedisHandle

TENANT: Final = "t_turns"
WORKSPACE: Final = "ws_turns"

T = TypeVar("T")


@dataclass(frozen=True)
class Turns:
    """One thread's turns, as artifactr's log and the model saw them."""

    rule_messages: list[str]
    """The ids of the messages the rule sent (notices left out)."""
    turns: int
    """Every `run_started` in the thread, whatever messages it carried."""
    ended: int
    """Every `run_ended` in the thread."""
    replies: int
    """The agent's messages in the thread."""
    model_calls: int
    """The model's calls, in every turn worker."""
    ends: list[str]
    """How each turn ended, in order: `completed`, `stopped`, or `failed:<reason>`
    (`failed:abandoned` for a turn whose claim lapsed)."""


@dataclass
class TurnPool:
    """A dispatcher and workers, each an `actonce` process, and a runtime over their stores."""

    tmp_path: Path
    env: dict[str, str]
    runtime: Runtime
    processes: dict[str, "subprocess.Popen[bytes]"] = field(default_factory=dict)

    def start(self, name: str, *arguments: str) -> None:
        """Start `actonce <arguments>` as process `name`, logging to `<name>.log`."""
        environment = {
            k: v for k, v in os.environ.items() if not k.startswith(("ACTONCE_", "REDIS_URL"))
        }
        environment.update(self.env)
        with open(self.tmp_path / f"{name}.log", "ab") as log:
            self.processes[name] = subprocess.Popen(
                [sys.executable, "-m", "actonce.worker.cli", *arguments],
                env=environment,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )

    def worker(self, name: str, queue: str) -> None:
        """Start a worker with one prefork child serving `queue`, and wait for it to serve."""
        self.start(name, "worker", "-c", "1", "-Q", queue, "-n", f"{name}-{os.getpid()}@%h")
        self.wait_for(lambda: "ready." in self.log(name) or None, f"{name} ready", 60)

    def serve(self, *turn_workers: str) -> None:
        """Start the dispatcher, a worker for attempts, and a worker for turns per name given."""
        self.start("dispatcher", "dispatch")
        self.worker("attempts", "actonce.attempts")
        for name in turn_workers:
            self.worker(name, "actonce.turns")

    def log(self, name: str) -> str:
        """What process `name` has logged so far."""
        path = self.tmp_path / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def child_of(self, name: str) -> int:
        """The pid of worker `name`'s one prefork child."""
        pid = self.processes[name].pid
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        assert len(children) == 1, children
        return int(children[0])

    def actonce(self, *arguments: str) -> str:
        """Run an `actonce` command to its end, which must succeed; return its output."""
        done = self.command(*arguments)
        assert done.returncode == 0, done.stderr
        return done.stdout

    def command(self, *arguments: str, **env: str) -> "subprocess.CompletedProcess[str]":
        """Run an `actonce` command to its end with the pool's settings, `env` over them."""
        environment = {
            k: v for k, v in os.environ.items() if not k.startswith(("ACTONCE_", "REDIS_URL"))
        }
        environment.update({**self.env, **env})
        return subprocess.run(
            [sys.executable, "-m", "actonce.worker.cli", *arguments],
            env=environment,
            capture_output=True,
            text=True,
            timeout=60,
        )

    def dead_listed(self, needle: str) -> str | None:
        """`actonce dead list`'s output once it names `needle`, else None."""
        out = self.actonce("dead", "list")
        return out if needle in out else None

    def wait_for(self, found: Callable[[], T | None], what: str, timeout_s: float = 45.0) -> T:
        """Poll `found` until it returns something; fail naming `what` and the logs."""
        deadline = time.monotonic() + timeout_s
        while (value := found()) is None:
            if time.monotonic() > deadline:
                logs = "\n".join(f"== {n}\n{self.log(n)[-3000:]}" for n in self.processes)
                raise AssertionError(f"no {what} after {timeout_s}s\n{logs}")
            time.sleep(0.2)
        return value

    def request(self, key: str = "turns", **knobs: object) -> None:
        """Publish a `WorkRequested` for `key` with the demo's knobs."""
        event = WorkRequested(key=key, **knobs)  # type: ignore[arg-type]
        self.runtime.run(request_work(self.runtime.reflexr, TENANT, WORKSPACE, event))

    def the_run(self) -> Run | None:
        """The workspace's one run, if there is one."""

        async def read() -> Run | None:
            workspace = await self.runtime.reflexr.open(TENANT, WORKSPACE, actor=FEED)
            runs = list(await workspace.runs())
            assert len(runs) <= 1, runs
            return runs[0] if runs else None

        return self.runtime.run(read())

    def runs(self) -> list[Run]:
        """Every run of the workspace."""

        async def read() -> list[Run]:
            workspace = await self.runtime.reflexr.open(TENANT, WORKSPACE, actor=FEED)
            return list(await workspace.runs())

        return self.runtime.run(read())

    def run_status(self) -> str | None:
        """The status of the workspace's one run, if there is one."""
        run = self.the_run()
        return run.status if run else None

    def requests(self) -> list[TurnRequest]:
        """The workspace's turn requests, taken or not."""

        sent = self.thread().rule_messages

        async def read() -> list[TurnRequest]:
            found = []
            for message_id in sent:
                got = await self.runtime.turn_requests.get(TENANT, WORKSPACE, message_id)
                if got is not None:
                    found.append(got)
            return found

        return self.runtime.run(read())

    def notices(self) -> list[str]:
        """The ids of the notices the rule's runs posted in the thread."""
        return [
            e.event.message_id
            for e in self._thread_log()
            if isinstance(e.event, a.MessagePosted) and e.event.kind == "notice"
        ]

    def thread(self) -> Turns:
        """Count the thread's messages, turns and replies, and the model's calls."""
        log = self._thread_log()
        posted = [e for e in log if isinstance(e.event, a.MessagePosted)]
        return Turns(
            rule_messages=[
                e.event.message_id
                for e in posted
                if e.event.kind == "message" and e.actor.participant.startswith("external_agent:")
            ],
            turns=sum(1 for e in log if isinstance(e.event, a.RunStarted)),
            ended=sum(1 for e in log if isinstance(e.event, a.RunEnded)),
            replies=sum(1 for e in posted if e.actor.participant.startswith("agent:")),
            model_calls=model_calls(Path(self.env[CALLS_FILE])),
            ends=[
                e.event.status + (f":{e.event.reason}" if e.event.reason else "")
                for e in log
                if isinstance(e.event, a.RunEnded)
            ],
        )

    def replied_and_ended(self, replies: int, ended: int) -> bool | None:
        """True once the thread holds `replies` replies and `ended` ended turns, for
        `wait_for`: a turn's run ends in artifactr just after its reply is posted."""
        seen = self.thread()
        return (seen.replies, seen.ended) == (replies, ended) or None

    def _thread_log(self) -> list[a.Envelope]:
        """The thread's entries in artifactr's log, read as a person of the workspace."""

        async def read() -> list[a.Envelope]:
            workspace = await self.runtime.artifactr.open(TENANT, WORKSPACE, actor=PEOPLE)
            return list(await workspace.read(threads={THREAD_ID}))

        return self.runtime.run(read())

    def kill(self, name: str) -> None:
        """SIGKILL process `name` and its children, as a machine that died would leave them."""
        process = self.processes[name]
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=10)

    def stop(self) -> None:
        """End every process this pool started, children included."""
        for process in self.processes.values():
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(timeout=10)


@contextlib.contextmanager
def pool_maker(
    tmp_path: Path, redis_server: RedisHandle, redis_db: int
) -> Iterator[Callable[..., TurnPool]]:
    """Yield a maker of pools for a definition and settings, on Redis database `redis_db` of
    `redis_server` (emptied first); their stores are migrated and their processes start later.
    Every pool made is stopped after."""
    made: list[TurnPool] = []

    def make(app: str, **settings: str) -> TurnPool:
        env = {
            "ACTONCE_APP": app,
            "ACTONCE_BROKER_URL": redis_server.url.rsplit("/", 1)[0] + f"/{redis_db}",
            "ACTONCE_VAR_DIR": str(tmp_path / "var"),
            "ACTONCE_LEASE_TTL_S": "3",
            "ACTONCE_DEDUPE_TTL_S": "5",
            "ACTONCE_SOFT_TIME_LIMIT_S": "50",
            "ACTONCE_TIME_LIMIT_S": "60",
            "ACTONCE_VISIBILITY_TIMEOUT_S": "400",
            CALLS_FILE: str(tmp_path / "model-calls.txt"),
            **settings,
        }
        client = redis.Redis.from_url(env["ACTONCE_BROKER_URL"])
        client.flushdb()
        client.close()
        parsed = Settings.from_env(env)
        asyncio.run(migrate(parsed))
        runtime = Runtime(parsed, load_definition("demo.definition:app"), one_run=False).open()
        runtime.run(prepare(runtime.artifactr, TENANT, WORKSPACE))
        pool = TurnPool(tmp_path, env, runtime)
        made.append(pool)
        return pool

    try:
        yield make
    finally:
        for pool in made:
            pool.stop()
            pool.runtime.close()
