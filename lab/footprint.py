"""What a process holds: its resident memory and its open file descriptors, read with psutil.

The soak (`bench.soak`) reads these for every process of the pool, window after window: a leak
shows as growth after warm-up.
"""

from dataclasses import asdict, dataclass
from typing import Any

import psutil


@dataclass(frozen=True)
class Footprint:
    """One process's footprint at one moment."""

    pid: int
    """The process read."""

    rss_kb: int
    """Its resident set size (`VmRSS`), in KiB."""

    fds: int
    """How many file descriptors it has open (`/proc/<pid>/fd`)."""

    def row(self) -> dict[str, Any]:
        """The footprint as JSON."""
        return asdict(self)


def footprint(pid: int) -> Footprint | None:
    """Return process `pid`'s footprint now, or None if it is gone or cannot be read."""
    try:
        process = psutil.Process(pid)
        with process.oneshot():
            return Footprint(pid, process.memory_info().rss // 1024, process.num_fds())
    except psutil.Error:
        return None
