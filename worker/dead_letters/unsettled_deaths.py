"""The dead runs no delivery settled: found by the dispatcher, and given their dead letter.

A run's dead letter is written by the delivery whose attempt left the run dead, right after
reflexr committed it (`tasks.attempt`). If that delivery's process is killed in between, its
unacknowledged message is delivered again and the next delivery writes the letter; but Redis keeps
nothing on disk, and a restart in that window loses the message too. The run is then dead in
reflexr, with no letter and nothing left to write one: an operator listing the letters never sees
it. `UnsettledDeaths` closes that gap from the dispatcher: now and then it reads the runs that
died lately and writes the letter of each that has none. The letter's id derives from the run and
its epoch (`worker.dead_letters.letter`), so a late delivery and several dispatchers still keep one.

Only deaths between `DEATH_GRACE_S` and `LOOKBACK` old are looked at: younger ones are their
delivery's to settle, and older ones were looked at by a dispatcher running then. A dispatcher
that starts looks back over the last `LOOKBACK`; a letter purged within that long of its run's
death may come back once, from the next dispatcher to start.
"""

import logging
import time
from datetime import datetime, timedelta
from typing import Final

from reflexr.sql.tables import RunRow
from reflexr.workspace import WorkspaceRef
from sqlalchemy import select

from actonce.tasks import observers
from actonce.tasks.observers import RunLettered
from actonce.worker.dead_letters.store import run_letter_id
from actonce.worker.process.runtime import Runtime
from actonce.worker.process.worker_host import WorkerHost

SWEEP_EVERY_S: Final = 10.0
"""How often the dispatcher looks for dead runs without a letter."""

DEATH_GRACE_S: Final = 5.0
"""How long after a run's death its delivery has to write the letter before the sweep does: a
settling delivery takes milliseconds; one whose store went away meanwhile retries, and the
letter the sweep writes in its place is the same letter, without the task's id."""

LOOKBACK: Final = timedelta(hours=1)
"""How long ago a run may have died and still be looked at."""

DUE_LOOKBACK: Final = timedelta(days=1)
"""How long before its death a dead run's last attempt may have been due and still be found:
the runs are found through reflexr's due index, and a dead run's `next_attempt_at` is when its
last attempt was due, not when it died."""

log = logging.getLogger("actonce.dispatcher")

type _Death = tuple[str, str, str, int]
"""A death by tenant, workspace, run and epoch: what a run's letter id derives from."""


class UnsettledDeaths:
    """Writes the dead letter of each run that died lately without one.

    Args:
        runtime: The dispatcher's runtime, opened.
    """

    def __init__(self, runtime: Runtime) -> None:
        self._runtime = runtime
        self._host = WorkerHost(runtime)
        self._next_sweep = 0.0
        # Deaths seen with their letter, until they leave the lookback: each is read once.
        self._lettered: dict[_Death, datetime] = {}

    async def sweep(self) -> int:
        """Write the letters of the dead runs that lack one, at most every `SWEEP_EVERY_S`
        (sooner when a death it skipped comes out of its grace); return how many this call
        wrote."""
        if time.monotonic() < self._next_sweep:
            return 0
        self._next_sweep = time.monotonic() + SWEEP_EVERY_S
        now = self._runtime.reflexr.clock()
        self._lettered = {death: at for death, at in self._lettered.items() if at > now - LOOKBACK}
        grace = timedelta(seconds=DEATH_GRACE_S)
        written = 0
        for death, died_at in await self._recent_deaths(now):
            if death in self._lettered:
                continue
            if died_at > now - grace:
                # Its delivery may be settling it: look again once its grace is over.
                ends_in_s = (died_at + grace - now).total_seconds()
                self._next_sweep = min(self._next_sweep, time.monotonic() + ends_in_s)
                continue
            if await self._runtime.dead_letters.get(run_letter_id(*death)) is None:
                written += await self._write(death)
            self._lettered[death] = died_at
        return written

    async def _recent_deaths(self, now: datetime) -> list[tuple[_Death, datetime]]:
        """The runs dead now that died within `LOOKBACK`, with when they died."""
        epoch = RunRow.body["epoch"].as_integer()
        updated_at = RunRow.body["updated_at"].as_string()
        query = select(RunRow.tenant_id, RunRow.workspace_id, RunRow.id, epoch, updated_at).where(
            RunRow.status == "dead", RunRow.next_attempt_at >= now - LOOKBACK - DUE_LOOKBACK
        )
        async with self._runtime.engine("reflexr").connect() as connection:
            rows = (await connection.execute(query)).all()
        deaths = []
        for tenant_id, workspace_id, run_id, run_epoch, died in rows:
            died_at = datetime.fromisoformat(died)
            if died_at > now - LOOKBACK:
                deaths.append(((tenant_id, workspace_id, run_id, int(run_epoch)), died_at))
        return deaths

    async def _write(self, death: _Death) -> int:
        """Write the letter of `death` if its run is still dead in that epoch; return 1 if this
        call added it."""
        tenant_id, workspace_id, run_id, epoch = death
        ref = WorkspaceRef(tenant_id, workspace_id)
        run = await self._runtime.reflexr.storage.run(ref, run_id)
        if run is None or run.status != "dead" or run.epoch != epoch:
            return 0  # replayed meanwhile: its next attempt settles it
        letter = await self._host.dead_letter_run(ref, run, task_id=None, queue=None)
        if letter is None:
            return 0
        observers.announce(RunLettered(letter=letter))
        return 1
