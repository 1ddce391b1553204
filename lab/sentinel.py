"""A Redis Sentinel group for the lab: a master, a replica and three sentinels, on the loopback.

Every server is a private `redis-server` (the same binary `lab.redis` starts: the one on `PATH`,
else redlite's bundled one) on a free port, in a temporary directory of its own, saving nothing;
sentinels are `redis-server <conf> --sentinel`, their configuration written here (a sentinel
rewrites its file as it learns). Sentinels notice a lost master quickly (`down_after_ms`), so a
test of a failover waits seconds, not the production default's half a minute. `stop` ends
everything the group started, whatever state a test left it in.
"""

import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType
from typing import Final, Self

import redis

from lab.processes import end, free_port
from lab.redis import HOW_TO_GET_REDIS, RedisUnavailable, redis_server_binary

MASTER_NAME: Final = "actonce"
"""The name the lab's sentinels monitor their master by."""

QUORUM: Final = 2
"""How many of the three sentinels must agree that the master is down before a failover."""

READY_TIMEOUT_S: Final = 30.0
"""How long the group has to come up: the replica in sync, each sentinel knowing the others."""


class SentinelGroup:
    """A running master, replica and sentinels; use `start_sentinel_group` to make one.

    Args:
        binary: The `redis-server` every process runs.
        home: The group's directory, removed by `stop`.
        master_name: The name the sentinels know the master by.
        password: The master's and replica's password, if any.
        sentinel_password: The sentinels' own password, if any.
        down_after_ms: How long the master may be silent before a sentinel calls it down.
    """

    def __init__(
        self,
        binary: str,
        home: Path,
        *,
        master_name: str,
        password: str | None,
        sentinel_password: str | None,
        down_after_ms: int,
    ) -> None:
        self.master_name = master_name
        self._binary = binary
        self._home = home
        self._password = password
        self._sentinel_password = sentinel_password
        self._down_after_ms = down_after_ms
        self._servers: dict[int, subprocess.Popen[bytes]] = {}
        self._sentinels: dict[int, subprocess.Popen[bytes]] = {}

    @property
    def url(self) -> str:
        """The broker URL of the group, `sentinel://HOST:PORT;...;sentinel://HOST:PORT/0`, with
        the master's password on the first part when it has one."""
        auth = f":{self._password}@" if self._password else ""
        parts = [f"sentinel://127.0.0.1:{port}" for port in self._sentinels]
        parts[0] = parts[0].replace("sentinel://", f"sentinel://{auth}", 1)
        return ";".join(parts) + "/0"

    @property
    def sentinel_ports(self) -> list[int]:
        """The sentinels' ports."""
        return list(self._sentinels)

    def master(self) -> tuple[str, int]:
        """Return the master's address as the first sentinel that answers names it.

        Raises:
            RedisUnavailable: If no sentinel answers.
        """
        for port in self._sentinels:
            named = self._named_by(port)
            if named is not None:
                return named
        raise RedisUnavailable(f"no sentinel of {self._home} names a master; see its logs")

    def master_pid(self) -> int:
        """Return the pid of the server that is master now."""
        return self._servers[self.master()[1]].pid

    def kill_master(self) -> int:
        """SIGKILL the master the sentinels name now; return its port. It stays down."""
        port = self.master()[1]
        process = self._servers[port]
        process.send_signal(signal.SIGKILL)
        process.wait()
        return port

    def wait_promoted(self, old_port: int, timeout_s: float = 30.0) -> tuple[str, int]:
        """Wait until every sentinel names a master other than the one on `old_port`, and it
        answers as a master; return its address.

        Raises:
            RedisUnavailable: If that did not happen within `timeout_s`.
        """
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            named = {self._named_by(port) for port in self._sentinels}
            if len(named) == 1:
                address = named.pop()
                if address is not None and address[1] != old_port and self._is_master(address):
                    return address
            time.sleep(0.1)
        raise RedisUnavailable(
            f"the sentinels did not promote a new master within {timeout_s}s; see the logs in "
            f"{self._home}"
        )

    def stop(self) -> None:
        """Stop every server and sentinel the group started, and remove its directory."""
        for process in [*self._sentinels.values(), *self._servers.values()]:
            if process.poll() is None:
                end(process, grace_s=3.0)
        self._sentinels.clear()
        self._servers.clear()
        shutil.rmtree(self._home, ignore_errors=True)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # ─── how ──────────────────────────────────────────────────────────────────

    def start(self, sentinels: int) -> None:
        """Start the master, its replica and `sentinels` sentinels; wait until they are one."""
        master = self._start_server()
        self._start_server(replica_of=master)
        for _ in range(sentinels):
            self._start_sentinel(master)
        self._wait_ready(master, sentinels)

    def _start_server(self, replica_of: int | None = None) -> int:
        port = free_port()
        arguments = ["--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
        if self._password:
            # The replica, once promoted, is the master the old one would follow: both need both.
            arguments += ["--requirepass", self._password, "--masterauth", self._password]
        if replica_of is not None:
            arguments += ["--replicaof", "127.0.0.1", str(replica_of)]
        self._servers[port] = self._spawn(f"redis-{port}", arguments)
        return port

    def _start_sentinel(self, master: int) -> int:
        port = free_port()
        home = self._home / f"sentinel-{port}"
        home.mkdir()
        lines = [
            f"port {port}",
            "bind 127.0.0.1",
            f"dir {home}",
            f"sentinel monitor {self.master_name} 127.0.0.1 {master} {QUORUM}",
            f"sentinel down-after-milliseconds {self.master_name} {self._down_after_ms}",
            f"sentinel failover-timeout {self.master_name} {self._down_after_ms * 3}",
            f"sentinel parallel-syncs {self.master_name} 1",
        ]
        if self._password:
            lines.append(f"sentinel auth-pass {self.master_name} {self._password}")
        if self._sentinel_password:
            # Sentinels talk to each other with the password they require themselves.
            lines += [
                f"requirepass {self._sentinel_password}",
                f"sentinel sentinel-pass {self._sentinel_password}",
            ]
        conf = home / "sentinel.conf"
        conf.write_text("\n".join(lines) + "\n")
        self._sentinels[port] = self._spawn(f"sentinel-{port}", [str(conf), "--sentinel"])
        return port

    def _spawn(self, name: str, arguments: list[str]) -> "subprocess.Popen[bytes]":
        with open(self._home / f"{name}.log", "ab") as log_file:
            return subprocess.Popen(
                [self._binary, *arguments],
                cwd=self._home,
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def _wait_ready(self, master: int, sentinels: int) -> None:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            for name, process in [*self._servers.items(), *self._sentinels.items()]:
                if process.poll() is not None:
                    raise RedisUnavailable(
                        f"redis-server {name} exited with {process.returncode}; see the logs in "
                        f"{self._home}"
                    )
            if self._replica_in_sync(master) and all(
                self._knows_the_group(port, sentinels) for port in self._sentinels
            ):
                return
            time.sleep(0.1)
        raise RedisUnavailable(
            f"the sentinel group did not come up within {READY_TIMEOUT_S}s; see the logs in "
            f"{self._home}"
        )

    def _replica_in_sync(self, master: int) -> bool:
        replica = [port for port in self._servers if port != master]
        return self._info(replica[0]).get("master_link_status") == "up"

    def _knows_the_group(self, port: int, sentinels: int) -> bool:
        """Whether the sentinel on `port` knows the replica and every other sentinel: only then
        can the group agree on a failover."""
        client = self._sentinel_client(port)
        try:
            replicas: object = client.sentinel_slaves(self.master_name)
            others: object = client.sentinel_sentinels(self.master_name)
        except redis.RedisError:
            return False
        finally:
            client.close()
        if not isinstance(replicas, list) or not isinstance(others, list):
            return False
        return len(replicas) == 1 and len(others) == sentinels - 1

    def _named_by(self, port: int) -> tuple[str, int] | None:
        client = self._sentinel_client(port)
        try:
            reply: object = client.sentinel_get_master_addr_by_name(self.master_name)
        except redis.RedisError:
            return None
        finally:
            client.close()
        if not isinstance(reply, list | tuple) or len(reply) != 2:
            return None  # it knows no such master yet
        host, master_port = reply
        return str(host), int(master_port)

    def _is_master(self, address: tuple[str, int]) -> bool:
        return self._info(address[1]).get("role") == "master"

    def _info(self, port: int) -> dict[str, object]:
        client = redis.Redis(
            port=port, password=self._password, socket_connect_timeout=1.0, socket_timeout=1.0
        )
        try:
            return dict(client.info("replication"))
        except redis.RedisError:
            return {}
        finally:
            client.close()

    def _sentinel_client(self, port: int) -> redis.Redis:
        return redis.Redis(
            port=port,
            password=self._sentinel_password,
            socket_connect_timeout=1.0,
            socket_timeout=1.0,
            decode_responses=True,
        )


def start_sentinel_group(
    directory: Path | None = None,
    *,
    master_name: str = MASTER_NAME,
    sentinels: int = 3,
    password: str | None = None,
    sentinel_password: str | None = None,
    down_after_ms: int = 1000,
) -> SentinelGroup:
    """Start a master, a replica and `sentinels` sentinels on the loopback; return them running.

    Args:
        directory: Where the group's own temporary directory is made (the system's when None).
        master_name: The name the sentinels monitor the master by.
        sentinels: How many sentinels watch it; a failover needs `QUORUM` of them.
        password: The master's and replica's password (`requirepass`), if any.
        sentinel_password: The password the sentinels require themselves, if any.
        down_after_ms: How long the master may be silent before a sentinel calls it down.

    Raises:
        RedisUnavailable: If no `redis-server` can be found, or the group does not come up.
    """
    binary = redis_server_binary()
    if binary is None:
        raise RedisUnavailable(f"no redis-server is on PATH: {HOW_TO_GET_REDIS}")
    if directory is not None:
        directory.mkdir(parents=True, exist_ok=True)
    home = Path(tempfile.mkdtemp(prefix="actonce-sentinels-", dir=directory))
    group = SentinelGroup(
        binary,
        home,
        master_name=master_name,
        password=password,
        sentinel_password=sentinel_password,
        down_after_ms=down_after_ms,
    )
    try:
        group.start(sentinels)
    except BaseException:
        group.stop()
        raise
    return group
