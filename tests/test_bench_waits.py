"""The bench's sampler tells what a contender's PostgreSQL backends wait for: a backend of another
process waiting for a row that a third holds is tallied as a lock wait; the bench's own
connections are not the contender's. It reads the suite's PostgreSQL (the `postgres_server`
fixture), as the bench reads the server it was given."""

import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from sqlalchemy.engine import make_url

from bench.measure import Sampler
from lab.postgres import PostgresHandle

_HOLDER = """
import asyncio, sys, asyncpg
async def main():
    c = await asyncpg.connect(sys.argv[1])
    await c.execute("CREATE TABLE IF NOT EXISTS rows (id int PRIMARY KEY, n int)")
    await c.execute("INSERT INTO rows VALUES (1, 0) ON CONFLICT DO NOTHING")
    t = c.transaction(); await t.start()
    await c.execute("SELECT n FROM rows WHERE id = 1 FOR UPDATE")
    print("held", flush=True)
    await asyncio.sleep(60)
asyncio.run(main())
"""

_WAITER = """
import asyncio, sys, asyncpg
async def main():
    c = await asyncpg.connect(sys.argv[1])
    await c.execute("UPDATE rows SET n = n + 1 WHERE id = 1")
asyncio.run(main())
"""


@contextmanager
def _process(code: str, dsn: str) -> Iterator[subprocess.Popen[str]]:
    child = subprocess.Popen([sys.executable, "-c", code, dsn], stdout=subprocess.PIPE, text=True)
    try:
        yield child
    finally:
        child.kill()
        child.wait(10)


@pytest.mark.timeout(60)
def test_a_backend_waiting_for_a_held_row_is_tallied_as_a_lock_wait(
    postgres_server: PostgresHandle, postgres_url: str
) -> None:
    # On the suite's server: a URL of its own, made libpq's (an embedded server's socket folder
    # stays in the query, as asyncpg reads it)
    dsn = make_url(postgres_url).set(drivername="postgresql").render_as_string(hide_password=False)
    database = make_url(postgres_url).database
    with (
        Sampler(database, postgres_server.admin_dsn, every_s=0.05) as sampler,
        _process(_HOLDER, dsn) as holder,
    ):
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        assert not any(w.startswith("Lock:") for w in sampler.waits())
        with _process(_WAITER, dsn):
            deadline = time.monotonic() + 20
            while sampler.waits()["Lock:transactionid"] == 0:
                assert time.monotonic() < deadline, sampler.waits()
                time.sleep(0.05)
