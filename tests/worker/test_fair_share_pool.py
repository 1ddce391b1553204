"""Fair share on a real pool: one tenant's burst does not hold another tenant's run back, nothing
held back is stranded, and two dispatchers holding the same due runs send each once.

A pool of one `actonce worker` (prefork, 2 children) and its dispatcher, with the defaults of
fair share, on a fresh PostgreSQL database and the session's private Redis; a second `actonce
dispatch` joins for the last test. The bench's rule, one notice a run, so runs never conflict.
"""

import re
import subprocess
import sys
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Final

import pytest
from pools import POOL_ENV, Pool, broker_url, running_pool, wait_for, wait_until
from reflexr.core import Run, SourceActor
from reflexr.sql import SqlStorage
from reflexr.workspace import WorkspaceRef

from bench.definition import BenchRequested, prepare
from lab.processes import environment
from lab.redis import RedisHandle
from lab.settle import TERMINAL

pytestmark = pytest.mark.slow

FEED: Final = SourceActor(name="fair-feed")
BURST: Final = 200
"""Runs of the noisy tenant's burst."""


@pytest.fixture(scope="module")
def fair_pool(
    redis_server: RedisHandle,
    tmp_path_factory: pytest.TempPathFactory,
    postgres_database: Callable[[], AbstractContextManager[str]],
) -> Iterator[Pool]:
    """A pool of 2 children with fair share's defaults, on PostgreSQL."""
    env = {
        **POOL_ENV,
        "ACTONCE_APP": "bench.definition:app",
        "ACTONCE_BROKER_URL": broker_url(redis_server, 13),
    }
    base = tmp_path_factory.mktemp("fair-share")
    with running_pool("postgres", env, base, postgres_database, workers=1, concurrency=2) as pool:
        yield pool


def test_a_quiet_tenants_run_settles_while_another_tenants_burst_mostly_waits(
    fair_pool: Pool,
) -> None:
    pool = fair_pool
    # Given another tenant's burst of 200 runs, under way
    _publish(pool, "t_noisy", "w", [f"n{i}" for i in range(BURST)])
    wait_until(lambda: _done(pool, "t_noisy", "w") >= 4, "the burst under way", 90)
    # When a quiet tenant publishes one event
    _publish(pool, "t_quiet", "w", ["q0"])

    # Then its run settles before half the burst has
    def settled_with_burst() -> int | None:
        quiet = _runs(pool, "t_quiet", "w")
        if quiet and all(run.status in TERMINAL for run in quiet):
            return _done(pool, "t_noisy", "w")
        return None

    burst_done = wait_for(settled_with_burst, "the quiet tenant's run to settle", 90)
    assert burst_done < BURST // 2, f"the quiet run waited for {burst_done} of the burst's runs"
    assert [run.status for run in _runs(pool, "t_quiet", "w")] == ["succeeded"]
    # And `actonce status` shows the burst's tenant with runs due and held, and in flight
    said = subprocess.run(
        [sys.executable, "-m", "actonce.worker.cli", "status"],
        env=environment(pool.env),
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout
    shown = re.search(r"^tenant t_noisy: (\d+) due and held, (\d+) in flight$", said, re.M)
    assert shown is not None and int(shown[1]) + int(shown[2]) > 0, said
    # And every run of the burst held back is sent later: all of them succeed, in one attempt
    wait_until(lambda: _done(pool, "t_noisy", "w") >= BURST, "the whole burst to settle", 300)
    burst = _runs(pool, "t_noisy", "w")
    assert Counter((run.status, run.attempts) for run in burst) == {("succeeded", 1): BURST}


def test_two_dispatchers_holding_the_same_due_runs_send_each_once(
    fair_pool: Pool, tmp_path: Path
) -> None:
    pool = fair_pool
    # Given a second dispatcher on the same stores and broker
    log = tmp_path / "second-dispatcher.log"
    with log.open("w") as out:
        second = subprocess.Popen(
            [sys.executable, "-m", "actonce.worker.cli", "dispatch"],
            env=environment(pool.env),
            stdout=subprocess.DEVNULL,
            stderr=out,
        )
    try:
        wait_until(lambda: "dispatching to" in log.read_text(), "the second dispatcher", 60)
        # When three tenants burst at once, 40 runs each, in two workspaces each
        tenants = ["t_one", "t_two", "t_three"]
        for tenant in tenants:
            for workspace in ("a", "b"):
                _publish(pool, tenant, workspace, [f"{workspace}{i}" for i in range(20)])
        wait_until(
            lambda: all(_done(pool, t, w) >= 20 for t in tenants for w in ("a", "b")),
            "every tenant's runs to settle",
            300,
        )
    finally:
        second.terminate()
        second.wait(timeout=30)
    # Then each run was attempted once and delivered once, whichever dispatcher sent it
    deliveries = _deliveries(pool.worker_log())
    for tenant in tenants:
        for workspace in ("a", "b"):
            runs = _runs(pool, tenant, workspace)
            assert {(run.status, run.attempts) for run in runs} == {("succeeded", 1)}
            sent = [deliveries[(tenant, workspace, run.id)] for run in runs]
            assert sent == [1] * len(runs), f"{tenant}/{workspace} delivered {sent}"
    assert "Traceback" not in log.read_text()


# ─── how ──────────────────────────────────────────────────────────────────────


def _publish(pool: Pool, tenant: str, workspace: str, keys: list[str]) -> None:
    """Prepare the workspace and publish one event per key, in one transaction."""

    async def publish() -> None:
        await prepare(pool.runtime.artifactr, tenant, workspace)
        opened = await pool.runtime.reflexr.open(tenant, workspace, actor=FEED)
        events = [BenchRequested(key=key, writes=1) for key in keys]
        await opened.publish_many(events, ids=[f"evt_{tenant}_{key}" for key in keys])

    pool.run(publish())


def _runs(pool: Pool, tenant: str, workspace: str) -> list[Run]:
    storage = pool.runtime.reflexr.storage
    ref = WorkspaceRef(tenant, workspace)
    return pool.run(SqlStorage.runs(storage, ref))  # type: ignore[arg-type]


def _done(pool: Pool, tenant: str, workspace: str) -> int:
    return sum(run.status in TERMINAL for run in _runs(pool, tenant, workspace))


_SUCCEEDED: Final = re.compile(r"\] succeeded in [^:]+: (\{.*\})")
_IDS: Final = re.compile(
    r"'run_id': '(?P<run>[^']*)', 'tenant_id': '(?P<tenant>[^']*)', "
    r"'workspace_id': '(?P<workspace>[^']*)'"
)


def _deliveries(worker_log: str) -> Counter[tuple[str, str, str]]:
    """How many attempt deliveries the worker finished, by tenant, workspace and run id."""
    found: Counter[tuple[str, str, str]] = Counter()
    for match in _SUCCEEDED.finditer(worker_log):
        ids = _IDS.search(match.group(1))
        if ids is not None:
            found[(ids["tenant"], ids["workspace"], ids["run"])] += 1
    return found
