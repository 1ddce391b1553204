"""The one seam that watches the lifecycle: every settled delivery is announced once, to observers.

An attempt's delivery that settles, a turn's delivery that settles, a message the intake refuses
and a dead run the dispatcher's sweep letters are each announced once, as an event of ids, the
rule, what happened, what follows, the reason and timings, never content. An `Observer` overrides
the hooks it needs, as a Dramatiq middleware does; the log line and Sentry are observers, and a
new counter is a new observer, not a new path through the tasks and the process.

Observers run in order, in the process and thread that settled the delivery, after its stores
were written and before the task returns: an observer must be quick, and one that raises is logged
and skipped, never breaking the delivery it watches. The log line observes from the start
(`default_observers`); a pool process installs its own list when it starts.
"""

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Final

from actonce.tasks.lifecycle import FATES, Follows, Happened, Reason

log = logging.getLogger("actonce.observers")


@dataclass(frozen=True, kw_only=True)
class Letter:
    """The dead letter a settlement added: its id and what names it, never its text."""

    id: str
    """The letter's id, `dl_…`."""

    reason: Reason | str
    """Why the job was given up."""

    tenant_id: str | None = None
    workspace_id: str | None = None
    run_id: str | None = None
    """The run given up, for a run's letter."""

    message_id: str | None = None
    """The message whose turn was given up, for a turn's letter."""

    rule: str | None = None
    """The rule whose run or message it was."""

    attempts: int | None = None
    """How many attempts the run made, or asks the turn request spent."""


@dataclass(frozen=True, kw_only=True)
class AttemptSettled:
    """One delivery of an attempt message ended: what happened and what follows."""

    happened: Happened
    task_id: str | None
    queue: str | None
    tenant_id: str | None = None
    workspace_id: str | None = None
    run_id: str | None = None
    """The run the message names; None for a message that names none."""

    rule: str | None = None
    attempt: int | None = None
    """The run's attempts so far, this one included."""

    status: str | None = None
    """The run's status as this delivery left it."""

    reason: str | None = None
    """The run's last failure's reason, or the reason a message was refused."""

    writes: Mapping[str, int] = field(default_factory=dict)
    """This attempt's writes: `made`, `already` (refused as already done), `refused`,
    `conflicts`."""

    duration_s: float = 0.0
    retry_at: datetime | None = None
    """When the message is delivered again, for a retry at a time reflexr set."""

    settled_after_s: float | None = None
    """For a delivery that finished its run (succeeded or dead), how long after the run's firing:
    the wait in reflexr and Redis, retries included."""

    letter: Letter | None = None
    """The dead letter this delivery added; None when it added none (or another had)."""

    @property
    def follows(self) -> Follows:
        """What follows, from the lifecycle's table."""
        return FATES[self.happened].follows


@dataclass(frozen=True, kw_only=True)
class TurnSettled:
    """One delivery of a turn message ended: what the ask found and what follows."""

    happened: Happened
    outcome: str
    """`take_turn`'s own word for it (`taken`, `not_taken`, `busy`, `pending`, `not_due`,
    `spent`)."""

    task_id: str | None
    tenant_id: str
    workspace_id: str
    message_id: str
    asks: int
    """Asks the request has spent so far."""

    rule: str | None = None
    duration_s: float = 0.0
    letter: Letter | None = None

    @property
    def follows(self) -> Follows:
        """What follows, from the lifecycle's table."""
        return FATES[self.happened].follows


@dataclass(frozen=True, kw_only=True)
class MessageRefused:
    """The intake refused a message before Celery read it, or Celery could not take it."""

    reason: Reason | str
    queue: str
    task_id: str | None
    letter: Letter | None = None
    """The letter kept for it; None when one was already kept."""


@dataclass(frozen=True, kw_only=True)
class RunLettered:
    """The dispatcher's sweep wrote the letter of a dead run that no delivery settled."""

    letter: Letter


type Event = AttemptSettled | TurnSettled | MessageRefused | RunLettered


class Observer:
    """Something told of every settled delivery; each hook does nothing unless overridden."""

    def attempt_settled(self, event: AttemptSettled) -> None:
        """Called once per attempt delivery that settled, retries and quiet ends included."""

    def turn_settled(self, event: TurnSettled) -> None:
        """Called once per turn delivery that settled."""

    def message_refused(self, event: MessageRefused) -> None:
        """Called once per message refused at the intake, whether or not its letter is new."""

    def run_lettered(self, event: RunLettered) -> None:
        """Called once per dead run the sweep wrote a letter for."""


class LogObserver(Observer):
    """The log lines of the lifecycle: one per settled delivery, one per new dead letter."""

    def attempt_settled(self, event: AttemptSettled) -> None:
        """Log an attempt that ran (`attempt run_id=… outcome=…`) and a letter it added."""
        if event.run_id is not None and event.rule is not None:
            fields = {
                "run_id": event.run_id,
                "tenant_id": event.tenant_id,
                "workspace_id": event.workspace_id,
                "rule": event.rule,
                "attempt": event.attempt,
                "outcome": event.happened.value,
                "status": event.status,
                "reason": event.reason,
                **{kind: event.writes.get(kind, 0) for kind in WRITE_KINDS},
                "duration_ms": round(event.duration_s * 1000, 1),
            }
            _attempts.info("attempt %s", " ".join(f"{k}={v}" for k, v in fields.items()))
        letter = event.letter
        if letter is None:
            return
        if letter.run_id is not None:
            _lettered_run(letter)
        else:
            # Ids and the code only: why it was refused may quote the body (`dead show --detail`).
            _attempts.warning(
                "dead letter %s reason=%s task=%s", letter.id, letter.reason, event.task_id
            )

    def turn_settled(self, event: TurnSettled) -> None:
        """Log a turn's ask (`turn message_id=… outcome=… asks=…`) and a letter it added; a
        delivery that ended before it read its request logged why where it ended."""
        if event.rule is not None:
            _turns.info(
                "turn message_id=%s outcome=%s asks=%s",
                event.message_id,
                event.outcome,
                event.asks,
            )
        letter = event.letter
        if letter is not None:
            _attempts.warning(
                "dead letter %s message=%s rule=%s reason=%s asks=%s",
                letter.id,
                letter.message_id,
                letter.rule,
                letter.reason,
                letter.attempts,
            )
            _turns.warning(
                "turn message_id=%s given up after %s asks: dead letter %s",
                event.message_id,
                event.asks,
                letter.reason,
            )

    def message_refused(self, event: MessageRefused) -> None:
        """Log a refused message's new letter: its id, reason, queue and task id."""
        if event.letter is not None:
            # Ids and the code only: why it was refused may quote the sender's text (`--detail`).
            _consumer.warning(
                "dead letter %s reason=%s queue=%s task=%s",
                event.letter.id,
                event.reason,
                event.queue,
                event.task_id,
            )

    def run_lettered(self, event: RunLettered) -> None:
        """Log the letter of a dead run the sweep found, and why the sweep wrote it."""
        letter = event.letter
        _lettered_run(letter)
        _dispatcher.warning(
            "dead run without a letter: run=%s rule=%s reason=%s; no delivery settled it "
            "(its worker and its message were lost), the sweep wrote its letter",
            letter.run_id,
            letter.rule,
            letter.reason,
        )


def _lettered_run(letter: Letter) -> None:
    _attempts.warning(
        "dead letter %s run=%s rule=%s reason=%s attempts=%s",
        letter.id,
        letter.run_id,
        letter.rule,
        letter.reason,
        letter.attempts,
    )


WRITE_KINDS: Final = ("made", "already", "refused", "conflicts")
"""How an attempt's writes are counted: made, refused as already done (a derived id in use),
refused by artifactr, and version conflicts re-read."""

_attempts = logging.getLogger("actonce.attempt")
_turns = logging.getLogger("actonce.turns")
_consumer = logging.getLogger("actonce.consumer")
_dispatcher = logging.getLogger("actonce.dispatcher")


def default_observers() -> tuple[Observer, ...]:
    """The observers every process starts with: the log lines."""
    return (LogObserver(),)


_observers: tuple[Observer, ...] = default_observers()


def install(observers: Iterable[Observer]) -> None:
    """Make `observers` this process's, in order, in place of those before."""
    global _observers
    _observers = tuple(observers)


def installed() -> tuple[Observer, ...]:
    """Return this process's observers, in order."""
    return _observers


def announce(event: Event) -> None:
    """Tell every observer of `event`, in order; an observer that raises is logged and skipped."""
    for observer in _observers:
        try:
            match event:
                case AttemptSettled():
                    observer.attempt_settled(event)
                case TurnSettled():
                    observer.turn_settled(event)
                case MessageRefused():
                    observer.message_refused(event)
                case RunLettered():
                    observer.run_lettered(event)
        except Exception:
            log.exception("observer %s failed on %s", type(observer).__name__, type(event).__name__)
