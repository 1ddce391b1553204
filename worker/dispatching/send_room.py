"""The send room: how many attempt messages the fair dispatcher may add to the queue now.

Whatever waits in the attempts queue is first in, first out: a run sent behind it waits for all
of it. The fair dispatcher therefore keeps the queue short, and holds the rest of what is due in
its backlog (`worker.dispatching.fair_backlog`) where it can still choose the order. Short, but
never empty while runs wait: a worker child that finds the queue empty idles, and a lone burst
must keep its throughput.

The queue may hold `ACTONCE_FAIR_QUEUED_PER_CHILD` messages per worker child the dispatcher
sees. It sees the children in kombu's unacked hash: with late acks and a prefetch of 1, each
busy child holds one delivered, unacknowledged message, so while messages wait, the unacked
count is the number of children taking from the queue (retries waiting for their time are held
there too, and count as children: the queue is then only longer). It takes the most seen over
`CHILDREN_WINDOW_S`, and never fewer than `ACTONCE_CONCURRENCY`, one worker's. The queue also
holds at least what the workers drain in two top-ups (`TOP_UP_EVERY_S`): quick attempts on many
children are not starved between them.
"""

import math
import time
from collections import deque
from typing import Final

TOP_UP_EVERY_S: Final = 0.025
"""How often a serving dispatcher with runs held tops the queue up, at most: a Redis round trip
each. Once the workers' drain is known, it tops up as the queue is half drained, at most every
`TOP_UP_AT_MOST_EVERY_S`: slow attempts cost no round trips for nothing."""

TOP_UP_AT_MOST_EVERY_S: Final = 0.25
"""The longest wait between two top-ups while runs are held."""

CHILDREN_WINDOW_S: Final = 30.0
"""How long a count of worker children seen is believed: children that went away stop counting
after it."""

DRAIN_WINDOW_S: Final = 1.0
"""How long the workers' drain of the queue is counted over before it says a rate: a single
top-up's reading is too short to tell a rate from a jump."""


class SendRoom:
    """The attempts queue's allowed length, from what the workers are seen to take.

    Args:
        per_child: Messages allowed to wait per worker child seen.
        least_children: Children assumed before any are seen (a worker's concurrency).
        top_up_s: How often the queue is topped up while runs are held.
    """

    def __init__(self, *, per_child: float, least_children: int, top_up_s: float) -> None:
        self._per_child = per_child
        self._least = least_children
        self._top_up_s = top_up_s
        self._seen: deque[tuple[float, int]] = deque()  # (when, unacked): a sliding maximum
        self._last: tuple[float, int] | None = None  # (when, queued) after the last top-up
        self._window: tuple[float, int] | None = None  # (since, drained) this drain window
        self._drain_per_s = 0.0

    @property
    def children(self) -> int:
        """The worker children seen taking from the queue lately, at least `least_children`."""
        return max(self._least, self._seen[0][1] if self._seen else 0)

    def limit(self) -> int:
        """How many messages may wait in the queue."""
        by_children = math.ceil(self._per_child * self.children)
        by_drain = math.ceil(2 * self._drain_per_s * self._top_up_s)
        return max(1, by_children, by_drain)

    def wait_s(self) -> float:
        """How long to wait before the next top-up: until the workers drained half the queue."""
        if self._drain_per_s <= 0:
            return self._top_up_s
        half_s = self.limit() / (2 * self._drain_per_s)
        return min(TOP_UP_AT_MOST_EVERY_S, max(self._top_up_s, half_s))

    def room(self, queued: int, unacked: int, now: float | None = None) -> int:
        """Take in a reading of the queue (`queued` waiting, `unacked` delivered and not
        acknowledged) and return how many messages may be added to it now."""
        at = time.monotonic() if now is None else now
        if queued > 0 or unacked > 0:
            while self._seen and self._seen[-1][1] <= unacked:
                self._seen.pop()
            self._seen.append((at, unacked))
        while self._seen and self._seen[0][0] < at - CHILDREN_WINDOW_S:
            self._seen.popleft()
        drained = max(0, self._last[1] - queued) if self._last is not None else 0
        since, counted = self._window if self._window is not None else (at, 0)
        counted += drained
        if at - since >= DRAIN_WINDOW_S:
            self._drain_per_s = counted / (at - since)
            since, counted = at, 0
        self._window = (since, counted)
        room = max(0, self.limit() - queued)
        self._last = (at, queued)
        return room

    def sent(self, count: int) -> None:
        """Count `count` messages sent after the last reading: the queue is that much longer."""
        if self._last is not None:
            self._last = (self._last[0], self._last[1] + count)
