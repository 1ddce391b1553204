"""Sent marks: which (run, epoch, status) the pool has sent recently, so it sends each once.

The dispatcher sees a waiting run on every poll until a worker claims it, and a retrying run
both through the task's own retry and through its poll. A Redis `SET NX EX` per
`actonce:sent:{tenant}:{workspace}:{run}:{epoch}:{status}` lets one of them send it. The status is
in the key so that an orphan (the same epoch, now `running` past its lease) is sent again. A mark
expires, so a message lost after its mark was set is sent again by a later poll; whatever slips
through is a duplicate reflexr's claim declines.

A mark does not expire while the attempts queue still holds messages: under overload a message
may wait in the queue longer than a mark lives, and sending its run again then would only lengthen
the queue (each lapse added another message per waiting run, so a backlog fed itself). The
dispatcher renews the marks of the due runs it sees while the queue is not empty; a message lost
meanwhile (one a killed worker had taken) is sent again once the queue has drained and the mark has
lapsed, or redelivered by Redis after its visibility timeout, whichever comes first.
"""

from collections.abc import Callable, Iterable, Sequence
from datetime import UTC, datetime
from functools import cache
from typing import Final, Protocol

import redis
from reflexr.core import Run

from actonce.worker.process.broker_access import broker_client
from actonce.worker.settings import KEY_PREFIX, Settings

PEEK_LIMIT: Final = 200
"""The most waiting messages `SentMarks.claim_keys` reads to learn which names are queued."""


class _Ref(Protocol):
    @property
    def tenant_id(self) -> str: ...
    @property
    def workspace_id(self) -> str: ...


class SentMarks:
    """Marks of sent attempts in Redis.

    Args:
        client: The broker's Redis.
        ttl_s: How long a mark of a run due now lasts.
    """

    def __init__(self, client: "redis.Redis", *, ttl_s: int) -> None:
        self._client = client
        self._ttl_s = ttl_s

    @staticmethod
    @cache
    def of(settings: Settings) -> "SentMarks":
        """Return this process's marks on the settings' broker."""
        return SentMarks(broker_client(settings), ttl_s=settings.dedupe_ttl_s)

    def claim_many(
        self, due: Iterable[tuple[_Ref, Run]], *, unless_queued: str | None = None
    ) -> list[bool]:
        """Set the marks of sending each of `due` now, in one round trip; True where it was unset.

        The dispatcher sees every waiting run on every poll: one `SET NX` per run per poll as
        separate round trips made a poll's cost grow with the queue. With
        `unless_queued` (a queue's name), while that queue holds messages, a mark found set is
        renewed for another `ttl_s`: its message is likely still waiting there. (A run is due
        only once a retry's time has come, so no longer mark, `mark(until=…)`, is shortened.)
        """
        due = list(due)
        if not due:
            return []
        pipe = self._client.pipeline(transaction=False)
        if unless_queued is not None:
            pipe.llen(unless_queued)
        for ref, run in due:
            pipe.set(self._key(ref, run), b"1", nx=True, ex=self._ttl_s)
        results = pipe.execute()
        if unless_queued is None:
            return [bool(result) for result in results]
        waiting, claimed = results[0], [bool(result) for result in results[1:]]
        if not waiting:
            return claimed
        renew = self._client.pipeline(transaction=False)
        for (ref, run), new in zip(due, claimed, strict=True):
            if not new:
                renew.expire(self._key(ref, run), self._ttl_s)
        renew.execute()
        return claimed

    def claim_keys(
        self,
        names: Sequence[str],
        *,
        ttl_s: int,
        queue: str,
        named_by: Callable[[bytes], str | None],
    ) -> list[bool]:
        """Set the marks `actonce:<name>` for `ttl_s`; True where a mark was unset and no message
        waiting in `queue` has that name (`named_by` names a queued message, or says `None`).

        A name whose message waits in the queue has its mark set or renewed and is not claimed:
        announcing again each turn of a backlog that only waited for the turn worker sent far
        more announcements than messages had been lost. One whose message is not there (a killed
        worker had taken it, or a Redis restart emptied the queue) is claimed once its mark has
        lapsed, however long the queue. Up to `PEEK_LIMIT` waiting messages are read; a longer
        queue is taken to hold every name, until it is shorter.
        """
        if not names:
            return []
        waiting = self._client.lrange(queue, 0, PEEK_LIMIT)
        everything = len(waiting) > PEEK_LIMIT
        queued = {named_by(i) for i in waiting if isinstance(i, bytes)} if not everything else set()
        held = [everything or name in queued for name in names]
        pipe = self._client.pipeline(transaction=False)
        for name, in_queue in zip(names, held, strict=True):
            pipe.set(f"{KEY_PREFIX}{name}", b"1", nx=not in_queue, ex=ttl_s)
        claimed = pipe.execute()
        return [not in_queue and bool(new) for in_queue, new in zip(held, claimed, strict=True)]

    def mark(self, ref: _Ref, run: Run, *, until: datetime | None = None) -> None:
        """Set the mark, whether or not it was set: the task itself is sending the run again."""
        self._client.set(self._key(ref, run), b"1", ex=self._ttl(until))

    def _ttl(self, until: datetime | None) -> int:
        if until is None:
            return self._ttl_s
        wait_s = (until - datetime.now(UTC)).total_seconds()
        return max(1, int(wait_s) + self._ttl_s)

    @staticmethod
    def _key(ref: _Ref, run: Run) -> str:
        return (
            f"{KEY_PREFIX}sent:{ref.tenant_id}:{ref.workspace_id}:{run.id}:{run.epoch}:{run.status}"
        )
