"""The demo with an observer of its own: each event it is told of, one JSON line in a file.

`counted` is the demo plus `Tally`, which appends one line per event it hears to the file named
by `OBSERVED_FILE` (every pool process appends to the same file, a line in one write), so a test
reads what each process's observers were told, as an application's counter would count it.
"""

import dataclasses
import json
import os
from typing import Final

from actonce.tasks.observers import (
    AttemptSettled,
    MessageRefused,
    Observer,
    RunLettered,
    TurnSettled,
)
from demo import definition as demo

FILE_VARIABLE: Final = "OBSERVED_FILE"
"""The variable that names the file `Tally` appends to."""


class Tally(Observer):
    """Writes one line per event: the hook, what happened, the ids and the letter's reason."""

    def attempt_settled(self, event: AttemptSettled) -> None:
        self._write(
            "attempt",
            event.happened,
            run_id=event.run_id,
            rule=event.rule,
            letter=event.letter.reason if event.letter else None,
            made=event.writes.get("made", 0),
        )

    def turn_settled(self, event: TurnSettled) -> None:
        self._write("turn", event.happened, message_id=event.message_id)

    def message_refused(self, event: MessageRefused) -> None:
        self._write("refused", "refused", reason=event.reason, task_id=event.task_id)

    def run_lettered(self, event: RunLettered) -> None:
        self._write("lettered", "dead", run_id=event.letter.run_id)

    def _write(self, hook: str, happened: str, **fields: object) -> None:
        line = json.dumps({"hook": hook, "happened": happened, "pid": os.getpid(), **fields})
        descriptor = os.open(os.environ[FILE_VARIABLE], os.O_WRONLY | os.O_APPEND | os.O_CREAT)
        try:
            os.write(descriptor, (line + "\n").encode())
        finally:
            os.close(descriptor)


counted = dataclasses.replace(demo.app, observers=(Tally(),))
"""The demo, every lifecycle event also told to `Tally`."""
