"""The seam: each event reaches every observer once, in order; a failing observer breaks nothing.

In memory, with observers that record what they are told; the pool's own observers (the log line
and Sentry) are checked through real workers in `tests/worker` (`test_reporting`, the turn and
dead-letter suites), which read the log lines and Sentry reports the observers make.
"""

import logging
from collections.abc import Iterator

import pytest

from actonce.tasks import observers
from actonce.tasks.lifecycle import Follows, Happened, Reason
from actonce.tasks.observers import (
    AttemptSettled,
    Letter,
    LogObserver,
    MessageRefused,
    Observer,
    RunLettered,
    TurnSettled,
)


class Recording(Observer):
    """Records each hook it is told, with a name to tell recorders apart."""

    def __init__(self, name: str, told: list[str]) -> None:
        self.name = name
        self.told = told

    def attempt_settled(self, event: AttemptSettled) -> None:
        self.told.append(f"{self.name}:attempt:{event.happened}")

    def turn_settled(self, event: TurnSettled) -> None:
        self.told.append(f"{self.name}:turn:{event.outcome}")

    def message_refused(self, event: MessageRefused) -> None:
        self.told.append(f"{self.name}:refused:{event.reason}")

    def run_lettered(self, event: RunLettered) -> None:
        self.told.append(f"{self.name}:lettered:{event.letter.id}")


class Failing(Observer):
    def attempt_settled(self, event: AttemptSettled) -> None:
        raise RuntimeError("an observer's own bug")


@pytest.fixture(autouse=True)
def _restored() -> Iterator[None]:
    before = observers.installed()
    yield
    observers.install(before)


LETTER = Letter(
    id="dl_1", reason=Reason.ATTEMPTS_EXHAUSTED, run_id="fir_1", rule="demo:work", attempts=3
)


def test_each_event_reaches_each_observer_once_in_order() -> None:
    told: list[str] = []
    observers.install([Recording("first", told), Recording("second", told)])

    observers.announce(AttemptSettled(happened=Happened.SUCCEEDED, task_id="t", queue="q"))
    observers.announce(
        TurnSettled(
            happened=Happened.TURN_TAKEN,
            outcome="taken",
            task_id="t",
            tenant_id="acme",
            workspace_id="ws",
            message_id="msg_1",
            asks=1,
        )
    )
    observers.announce(MessageRefused(reason=Reason.OVERSIZED, queue="q", task_id=None))
    observers.announce(RunLettered(letter=LETTER))

    assert told == [
        "first:attempt:succeeded",
        "second:attempt:succeeded",
        "first:turn:taken",
        "second:turn:taken",
        "first:refused:oversized",
        "second:refused:oversized",
        "first:lettered:dl_1",
        "second:lettered:dl_1",
    ]


def test_an_observer_that_raises_is_logged_and_the_next_one_is_still_told(
    caplog: pytest.LogCaptureFixture,
) -> None:
    told: list[str] = []
    observers.install([Failing(), Recording("after", told)])

    observers.announce(AttemptSettled(happened=Happened.DEAD, task_id="t", queue="q"))

    assert told == ["after:attempt:dead"]
    assert "observer Failing failed on AttemptSettled" in caplog.text


def test_what_follows_is_read_from_the_table() -> None:
    retried = AttemptSettled(happened=Happened.STORE_OUTAGE, task_id="t", queue="q")
    quiet = AttemptSettled(happened=Happened.NOT_CLAIMED, task_id="t", queue="q")

    assert retried.follows is Follows.RETRY and quiet.follows is Follows.QUIET


def test_the_log_observer_writes_the_attempt_line_and_a_new_letters_line_with_ids_only(
    caplog: pytest.LogCaptureFixture,
) -> None:
    observers.install([LogObserver()])
    event = AttemptSettled(
        happened=Happened.DEAD,
        task_id="t",
        queue="actonce.attempts",
        tenant_id="acme",
        workspace_id="ws",
        run_id="fir_1",
        rule="demo:work",
        attempt=3,
        status="dead",
        reason="timeout",
        writes={"made": 1, "already": 2},
        letter=LETTER,
    )

    with caplog.at_level(logging.INFO, logger="actonce.attempt"):
        observers.announce(event)

    lines = [record.getMessage() for record in caplog.records]
    assert lines[0].startswith("attempt run_id=fir_1 tenant_id=acme workspace_id=ws rule=demo:work")
    assert "outcome=dead status=dead reason=timeout made=1 already=2 refused=0" in lines[0]
    assert (
        lines[1] == "dead letter dl_1 run=fir_1 rule=demo:work reason=attempts_exhausted attempts=3"
    )


def test_the_default_observers_are_the_log_lines() -> None:
    assert [type(o) for o in observers.default_observers()] == [LogObserver]
