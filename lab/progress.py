"""How far long work has got: a bar on a terminal, a plain line every few seconds otherwise.

`make chaos`, `make soak` and `make bench` run for minutes to an hour. Each reports the units
done of the total (runs settled, or measures), a short note (faults injected so far, the last
window's rate), the time elapsed and an estimate of what is left, on stderr, so stdout keeps
only the report. On a terminal it is rich's live bar; piped to a file or a CI log, one line
every `every_s` and one at the end, which a supervisor's log keeps and a test can read.
"""

import sys
import threading
import time
from types import TracebackType
from typing import Final, Self, TextIO

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.progress import Progress as RichProgress

LINE_EVERY_S: Final = 5.0
"""How often the plain (not a terminal) form writes its line."""


class Progress:
    """How far one piece of long work is, shown as it goes.

    Call `update` as often as the work likes, or seldom: the bar redraws itself, and the plain
    form's line is written by a thread of its own every `every_s`, however long a step takes
    (and on `close`, so the last line is the final count). Use it as a context manager, or
    `start` and `close`.

    Args:
        label: What the work is (`chaos`, `soak`, `bench`), the start of every line.
        total: How many units make the whole.
        unit: What is counted, plural (`runs`, `measures`); a line says `<done>/<total> <unit>`.
        stream: Where it writes; stderr by default.
        every_s: How often the plain form writes a line.
        bar: Whether to draw a bar; by default when `stream` is a terminal.
    """

    def __init__(
        self,
        label: str,
        total: int,
        *,
        unit: str = "runs",
        stream: TextIO | None = None,
        every_s: float = LINE_EVERY_S,
        bar: bool | None = None,
    ) -> None:
        self.label = label
        self.total = max(0, total)
        self.unit = unit
        self.done = 0
        self.note = ""
        self._stream = stream if stream is not None else sys.stderr
        self._every_s = every_s
        self._bar = self._stream.isatty() if bar is None else bar
        self._started = time.monotonic()
        self._rich: RichProgress | None = None
        self._task: TaskID | None = None
        self._closed = threading.Event()
        self._ticker: threading.Thread | None = None

    def start(self) -> Self:
        """Start the clock and show the first count (0 of the total)."""
        self._started = time.monotonic()
        if self._bar:
            self._rich = RichProgress(
                TextColumn(f"[bold]{self.label}[/bold]"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn(self.unit),
                TimeElapsedColumn(),
                TextColumn("left"),
                TimeRemainingColumn(),
                TextColumn("{task.fields[note]}"),
                console=Console(file=self._stream),
                transient=False,
            )
            self._task = self._rich.add_task(self.label, total=self.total, note="")
            self._rich.start()
        else:
            self._write()
            self._ticker = threading.Thread(target=self._tick, name="progress", daemon=True)
            self._ticker.start()
        return self

    def update(self, done: int, note: str | None = None) -> None:
        """Say that `done` units of the total are done now, with `note` if given (else the
        last one)."""
        self.done = min(max(0, done), self.total) if self.total else max(0, done)
        if note is not None:
            self.note = note
        if self._rich is not None and self._task is not None:
            self._rich.update(self._task, completed=self.done, note=self.note)

    def advance(self, units: int = 1, note: str | None = None) -> None:
        """Say that `units` more units are done."""
        self.update(self.done + units, note)

    def close(self) -> None:
        """Show the final count and stop drawing; calling it again does nothing."""
        if self._closed.is_set():
            return
        self._closed.set()
        if self._rich is not None:
            self._rich.stop()
            self._rich = None
        if self._ticker is not None:
            self._ticker.join()
            self._write()

    def line(self) -> str:
        """The plain form's line: `<label>: <done>/<total> <unit>, <note>; elapsed …, left …`."""
        elapsed = time.monotonic() - self._started
        note = f", {self.note}" if self.note else ""
        return (
            f"{self.label}: {self.done}/{self.total} {self.unit}{note}; "
            f"elapsed {_clock(elapsed)}, left {self._left(elapsed)}"
        )

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # ─── how ──────────────────────────────────────────────────────────────────

    def _left(self, elapsed: float) -> str:
        # At the rate so far: steady work (a soak) is what this is for; a bench's first
        # measures are no slower than its last.
        if not self.done or not self.total:
            return "unknown"
        return "~" + _clock(elapsed / self.done * (self.total - self.done))

    def _tick(self) -> None:
        while not self._closed.wait(self._every_s):
            self._write()

    def _write(self) -> None:
        print(self.line(), file=self._stream, flush=True)


def _clock(seconds: float) -> str:
    whole = int(seconds)
    return f"{whole // 3600}:{whole // 60 % 60:02d}:{whole % 60:02d}"
