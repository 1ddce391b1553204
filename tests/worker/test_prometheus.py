"""Metrics for a Prometheus where no Collector runs: a real Prometheus scrapes a real pool.

A worker (prefork, two children) and a dispatcher run with `ACTONCE_PROMETHEUS_PORT` (the worker's
main process on it, each child one port past it) and `ACTONCE_DISPATCHER_PROMETHEUS_PORT`, as an
operator sets them. A Prometheus server (Debian's `prometheus`, which `.ci/run` installs) scrapes
all four endpoints; the test asks Prometheus, through its HTTP API, for what the runs it made
came to, summed over the processes as a dashboard does.
"""

import socket
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager

import pytest
from pools import POOL_ENV, Pool, broker_url, running_pool, wait_for

from lab.prometheus import prometheus, query
from lab.redis import RedisHandle

pytestmark = pytest.mark.slow


def free_ports(count: int) -> int:
    """Return a port from which `count` ports in a row are free on loopback."""
    for _ in range(50):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            base = int(probe.getsockname()[1])
        if base + count < 65535 and all(_free(base + i) for i in range(count)):
            return base
    raise AssertionError(f"no {count} free ports in a row on loopback")


def _free(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


@pytest.fixture(scope="module")
def ports() -> int:
    return free_ports(5)


@pytest.fixture(scope="module")
def pool(
    redis_server: RedisHandle,
    tmp_path_factory: pytest.TempPathFactory,
    postgres_database: Callable[[], AbstractContextManager[str]],
    ports: int,
) -> Iterator[Pool]:
    env = {
        **POOL_ENV,
        "ACTONCE_BROKER_URL": broker_url(redis_server, 11),
        "ACTONCE_PROMETHEUS_PORT": str(ports),
        "ACTONCE_DISPATCHER_PROMETHEUS_PORT": str(ports + 3),
    }
    base = tmp_path_factory.mktemp("prometheus-pool")
    with running_pool("sqlite", env, base, postgres_database, workers=1, concurrency=2) as pool:
        yield pool


@pytest.fixture(scope="module")
def scraping(tmp_path_factory: pytest.TempPathFactory, ports: int) -> Iterator[str]:
    """A Prometheus server scraping the pool's four endpoints every second; yields its URL."""
    targets = [f"127.0.0.1:{ports + offset}" for offset in range(4)]
    home = tmp_path_factory.mktemp("prometheus")
    with prometheus(targets, home=home, listen=f"127.0.0.1:{ports + 4}") as url:
        yield url


def test_prometheus_scrapes_every_process_and_sums_the_runs_outcomes(
    pool: Pool, scraping: str
) -> None:
    scene = pool.scene("scraped")
    for key in ("one", "two", "three"):
        scene.request(key)
    scene.settled(runs=3)

    attempts = (
        'sum(actonce_attempts_total{actonce_outcome="succeeded",'
        f'actonce_workspace_id="{scene.workspace_id}"}})'
    )
    wait_for(lambda: query(scraping, attempts) == 3 or None, "3 attempts scraped", 30)

    # The worker's main process, both children and the dispatcher answer: a scrape under load
    # can miss its second, so the test waits for all four to have answered their last one.
    up = 'count(up{job="actonce"} == 1)'
    wait_for(lambda: query(scraping, up) == 4 or None, "all four endpoints up", 30)
    polls = wait_for(
        lambda: query(scraping, "sum(actonce_dispatcher_poll_duration_seconds_count)"),
        "the dispatcher's polls scraped",
        30,
    )
    assert polls > 0
    assert "telemetry on in the child (no OTLP; metrics for Prometheus" in pool.worker_log()
