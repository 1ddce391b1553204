"""What follows an attempt, a turn or a refused message: one table, and every reason seen.

An attempt message, a turn message and a message the intake refuses each end in one of a few
ways. What happened (`Happened`) decides what follows (`Fate`) through `FATES`, the one table:
the task ends SUCCESS, ends quietly having changed nothing, is delivered again after a delay, or
is dead-lettered with a `Reason` and ends FAILURE. The attempt task, the turn task, the intake,
the dispatcher's sweep and the `actonce dead` commands all read it; nothing else decides.

`Reason` is every code an operator can meet: on a dead letter, in `actonce dead list`, in a
task's FAILURE, on a run's failure in a log line. A run that failed permanently is dead-lettered
with its own failure's reason, so a rule's own `RunFailure(reason=..., permanent=True)` code passes
through too; every code actonce, relayr, reflexr or artifactr gives is a member here.

The delays are here too, each as a function of what it depends on: a rule's `RetryPolicy` times
its own retries in reflexr and nowhere else.
"""

from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Final, Self

from reflexr.core import Run


class Reason(StrEnum):
    """A code that says why a job was given up, a message refused, or a run's attempt failed.

    Each member's `meaning` is one line for an operator; `retried` says whether reflexr retries a
    run's attempt that failed with it (under the rule's `RetryPolicy`), so that a run left dead
    with such a reason ran out of attempts.
    """

    meaning: str
    retried: bool

    def __new__(cls, code: str, meaning: str, retried: bool = False) -> Self:
        member = str.__new__(cls, code)
        member._value_ = code
        member.meaning = meaning
        member.retried = retried
        return member

    # Dead letters that actonce writes of its own.
    ATTEMPTS_EXHAUSTED = (
        "attempts_exhausted",
        "The run's attempts failed with retryable reasons until its rule's RetryPolicy ran out.",
    )
    MALFORMED_MESSAGE = (
        "malformed_message",
        "The message is not a well-formed Celery message, or its arguments name no attempt.",
    )
    UNKNOWN_RUN = (
        "unknown_run",
        "A well-formed attempt message names a run that does not exist in its workspace.",
    )
    UNKNOWN_TASK = (
        "unknown_task",
        "The message names a task that is not actonce's task for the queue it came from.",
    )
    OVERSIZED = (
        "oversized",
        "The message's bytes exceed ACTONCE_MAX_MESSAGE_BYTES.",
    )
    INVALID_ID = (
        "invalid_id",
        "The message's task id, or an id among its arguments, is not an id.",
    )
    UNSUPPORTED_CONTENT = (
        "unsupported_content",
        "The body is not JSON in UTF-8 (pickle, YAML, msgpack...), or it is compressed.",
    )
    ETA_OUT_OF_RANGE = (
        "eta_out_of_range",
        "The message's eta lies further ahead than any retry actonce makes.",
    )
    TURN_NOT_TAKEN = (
        "turn_not_taken",
        "A sent message's turn request spent its budget of asks; the message is still untaken.",
    )
    UNEXPECTED_ERROR = (
        "unexpected_error",
        "An error no branch expected escaped a task: its type is in the FAILURE, its traceback "
        "in the worker's log; the dispatcher's sweep sends the run again.",
    )
    # A run's failures that reflexr retries.
    NOT_FOUND = (
        "not_found",
        "artifactr: what a write names does not exist (yet).",
        True,
    )
    VALIDATION_FAILED = (
        "validation_failed",
        "artifactr: the written content does not fit its schema.",
        True,
    )
    PATCH_FAILED = (
        "patch_failed",
        "artifactr: a JSON patch does not apply to the artifact as it stands.",
        True,
    )
    VERSION_CONFLICT = (
        "version_conflict",
        "artifactr: a keyed edit met a newer version on each of its re-reads.",
        True,
    )
    TIMEOUT = (
        "timeout",
        "reflexr: the action ran past its rule's timeout.",
        True,
    )
    ABANDONED = (
        "abandoned",
        "reflexr: an attempt stopped without an outcome (a killed child, a soft time limit).",
        True,
    )
    # A run's failures that are permanent: its dead letter carries the code itself.
    NOT_ALLOWED = (
        "not_allowed",
        "relayr: the rule's Allowlist does not allow the write.",
    )
    FORBIDDEN = (
        "forbidden",
        "artifactr: the rule's actor may not do what it asked.",
    )
    INVALID_STATE = (
        "invalid_state",
        "artifactr: the write does not fit the artifact's state, and no attempt made it.",
    )
    UNSUPPORTED_PROTOCOL = (
        "unsupported_protocol",
        "artifactr: the workspace does not speak what the write asks.",
    )
    UNKNOWN_ACTION = (
        "unknown_action",
        "reflexr: the rule names an action the definition does not have.",
    )
    INVALID_PARAMS = (
        "invalid_params",
        "reflexr: the rule's parameters do not fit its action.",
    )


RETRIED_REFUSALS: Final = frozenset(
    {Reason.NOT_FOUND, Reason.VALIDATION_FAILED, Reason.PATCH_FAILED}
)
"""artifactr's refusals a run can do otherwise about: relayr's `Refused`, retried, or handed to
an agent's model; every other refusal is a permanent failure."""


def letter_reason(run: Run) -> Reason | str:
    """Return the reason of the dead letter of `run`, which reflexr left dead.

    A run whose last failure reflexr retries (or that has none) ran out of attempts:
    `attempts_exhausted`. A permanent failure gives its own code, a rule's own included.
    """
    if run.reason is None or run.reason in _RETRIED:
        return Reason.ATTEMPTS_EXHAUSTED
    return run.reason


_RETRIED: Final = frozenset(reason.value for reason in Reason if reason.retried)


class Happened(StrEnum):
    """What one delivery of a message ended with, as the table `FATES` knows it."""

    SUCCEEDED = "succeeded"
    """The attempt ran the run's action to success."""
    NOT_CLAIMED = "not_claimed"
    """A duplicate delivery, or a run held elsewhere, finished, cancelled, skipped or not first in
    its scope: reflexr declined the claim."""
    RETRYING = "retrying"
    """The attempt failed with a retryable reason and the rule's RetryPolicy set the next one."""
    NOT_DUE = "not_due"
    """The run is pending but not due yet."""
    DEAD = "dead"
    """The attempt left the run dead: a permanent failure, or its attempts ran out."""
    MALFORMED = "malformed"
    """The task's arguments name no attempt, or are too large."""
    UNKNOWN_RUN = "unknown_run"
    """The arguments are well formed and name no run."""
    STORE_OUTAGE = "store_outage"
    """A store's connection went away during the delivery."""
    SOFT_LIMIT = "soft_limit"
    """Celery's soft time limit stopped the delivery."""
    WORKER_LOST = "worker_lost"
    """The child running the delivery died (SIGKILL, out of memory)."""
    UNEXPECTED = "unexpected"
    """An error no branch expected escaped the task."""
    TURN_TAKEN = "taken"
    """The Runner took the sent message."""
    TURN_NOT_TAKEN = "not_taken"
    """The turn this ask ran ended without taking the message; the budget has asks left."""
    TURN_BUSY = "busy"
    """A turn holds the thread, here or elsewhere."""
    TURN_PENDING = "pending"
    """The message is not committed yet: the attempt that commits it announces it."""
    TURN_NOT_DUE_YET = "turn_not_due"
    """Another delivery asked lately: its own retry asks when the back-off is over."""
    TURN_BUDGET_SPENT = "spent"
    """The request's budget of asks is spent and the message is still untaken."""
    UNKNOWN_TURN = "unknown_turn"
    """A turn message names no recorded turn request."""
    REFUSED = "refused"
    """The intake refused the message before Celery read it."""


class Follows(StrEnum):
    """What a delivery's end makes of its message."""

    SUCCESS = "success"
    """The task ends SUCCESS."""
    QUIET = "quiet"
    """The task ends SUCCESS having changed nothing: a duplicate, or nothing to do yet."""
    RETRY = "retry"
    """The task ends RETRY: the message is delivered again when its delay is over."""
    DEAD_LETTER = "dead_letter"
    """A dead letter is kept (once, whichever delivery writes it), then the task ends FAILURE
    naming its reason; a refused message never reaches a task."""
    FAILURE = "failure"
    """The task ends FAILURE with no letter: the dispatcher's sweep sends the run again."""


@dataclass(frozen=True)
class Fate:
    """What follows one way a delivery can end."""

    follows: Follows
    """What becomes of the message."""

    when: str = ""
    """For a retry, when it is delivered again; for any other end, what else follows; in words."""

    reason: Reason | None = None
    """For a dead letter of a fixed reason, that reason; None when `reason_of` names it."""

    reason_of: str = ""
    """For a dead letter whose reason varies, where it comes from, in words."""

    def describe(self) -> str:
        """Return the fate as one line: what follows, its reason or its delay."""
        if self.follows is Follows.RETRY:
            return f"retry: {self.when}"
        if self.follows is Follows.DEAD_LETTER:
            reason = f"`{self.reason}`" if self.reason else self.reason_of
            return f"dead letter with {reason}; " + (self.when or "then FAILURE")
        if self.follows is Follows.FAILURE:
            return "FAILURE, no letter: " + (self.when or "nothing to replay")
        return {Follows.SUCCESS: "SUCCESS", Follows.QUIET: "SUCCESS, nothing changed"}[
            self.follows
        ] + (f": {self.when}" if self.when else "")


SOFT_LIMIT_RETRY_S: Final = 1
"""How long a task stopped at its soft time limit waits before its next delivery, in seconds."""

OUTAGE_RETRY_MAX_S: Final = 30
"""The longest wait between two tries of a task whose store was away; it doubles up to it."""

TURN_MAX_BACKOFF_S: Final = 300.0
"""The longest a turn waits between two asks, however many came before; never longer than a
retry may wait (`ACTONCE_MAX_RETRY_DELAY_S`), or the intake would refuse the retry."""

FATES: Final[dict[Happened, Fate]] = {
    Happened.SUCCEEDED: Fate(Follows.SUCCESS),
    Happened.NOT_CLAIMED: Fate(Follows.QUIET, "another delivery has or had the run"),
    Happened.RETRYING: Fate(Follows.RETRY, "at the time the rule's RetryPolicy set in reflexr"),
    Happened.NOT_DUE: Fate(Follows.RETRY, "at the run's due time"),
    Happened.DEAD: Fate(
        Follows.DEAD_LETTER,
        reason_of="the run's permanent failure's reason, or `attempts_exhausted`",
    ),
    Happened.MALFORMED: Fate(Follows.DEAD_LETTER, reason=Reason.MALFORMED_MESSAGE),
    Happened.UNKNOWN_RUN: Fate(Follows.DEAD_LETTER, reason=Reason.UNKNOWN_RUN),
    Happened.STORE_OUTAGE: Fate(
        Follows.RETRY, f"after 1 s, doubling to {OUTAGE_RETRY_MAX_S} s, for as long as it lasts"
    ),
    Happened.SOFT_LIMIT: Fate(
        Follows.RETRY,
        f"after {SOFT_LIMIT_RETRY_S} s; the next claim records the attempt `abandoned`",
    ),
    Happened.WORKER_LOST: Fate(
        Follows.RETRY, "once the run's lease has lapsed (ACTONCE_LEASE_TTL_S + 1 s)"
    ),
    Happened.UNEXPECTED: Fate(Follows.FAILURE, "the sweep sends the run again"),
    Happened.TURN_TAKEN: Fate(Follows.SUCCESS),
    Happened.TURN_NOT_TAKEN: Fate(
        Follows.RETRY, "when the ask's back-off is over (ACTONCE_TURN_BACKOFF_S, doubling)"
    ),
    Happened.TURN_BUSY: Fate(
        Follows.RETRY,
        f"after ACTONCE_TURN_BACKOFF_S, doubling per retry, at most {TURN_MAX_BACKOFF_S:.0f} s",
    ),
    Happened.TURN_PENDING: Fate(Follows.QUIET, "the attempt that commits the message announces it"),
    Happened.TURN_NOT_DUE_YET: Fate(Follows.QUIET, "the delivery that asked retries"),
    Happened.TURN_BUDGET_SPENT: Fate(Follows.DEAD_LETTER, reason=Reason.TURN_NOT_TAKEN),
    Happened.UNKNOWN_TURN: Fate(Follows.FAILURE, "no request to ask for"),
    Happened.REFUSED: Fate(
        Follows.DEAD_LETTER,
        "the message is acknowledged and never reaches a task",
        reason_of="the intake's reason",
    ),
}
"""What follows each way a delivery can end: the one table."""


@dataclass(frozen=True)
class Settlement:
    """How an attempt's delivery ends, decided from the run as reflexr left it."""

    happened: Happened
    """Which way the delivery ended."""

    eta: datetime | None = None
    """When to deliver the run again, for `retrying` and `not_due`."""

    @property
    def fate(self) -> Fate:
        """What follows, from `FATES`."""
        return FATES[self.happened]


def settle(run: Run, *, finished: bool, now: datetime) -> Settlement:
    """Return how an attempt's delivery ends for `run`, read back after the attempt.

    Args:
        run: The run as reflexr left it.
        finished: Whether this delivery's attempt ran to an outcome (reflexr's `execute` → 1).
        now: The current time, on the clock reflexr uses.
    """
    if run.status == "succeeded":
        return Settlement(Happened.SUCCEEDED if finished else Happened.NOT_CLAIMED)
    if run.status == "dead":
        return Settlement(Happened.DEAD)
    if run.status in ("retrying", "pending"):
        if run.next_attempt_at > now:
            due = Happened.RETRYING if run.status == "retrying" else Happened.NOT_DUE
            return Settlement(due, eta=run.next_attempt_at)
        # Due, yet declined: another run of its scope goes first. The dispatcher sends it
        # when it is first; retrying now would spin.
        return Settlement(Happened.NOT_CLAIMED)
    return Settlement(Happened.NOT_CLAIMED)  # running elsewhere, cancelled or skipped


def store_outage_retry_s(retries: int) -> int:
    """How long the `retries`-th try of a task whose store was away waits: 1, 2, 4, … 30 s."""
    return int(min(OUTAGE_RETRY_MAX_S, 2 ** min(retries, 5)))


def worker_lost_retry_s(lease_ttl_s: float) -> int:
    """How long a message whose child died waits before its redelivery: past the run's lease, so
    the next claim finds the lease lapsed and records the attempt `abandoned`."""
    return int(lease_ttl_s) + 1


def turn_busy_retry_s(backoff_s: float, retries: int, longest_s: float) -> float:
    """How long a turn whose thread is busy waits: `backoff_s` doubled per retry of this
    delivery, at most `longest_s`; the budget of asks is not spent on a busy thread."""
    return min(longest_s, backoff_s * 2.0**retries)


def turn_longest_wait_s(max_retry_delay_s: float) -> float:
    """The longest a turn task waits before it asks again: its retry must not be refused."""
    return min(TURN_MAX_BACKOFF_S, max_retry_delay_s)


def turn_pending_look_s(backoff_s: float, waited_s: float) -> float:
    """When the sweep looks again at a request whose message is not committed: after as long as
    it has waited so far (at least one back-off, at most `TURN_MAX_BACKOFF_S`), so a lost message
    costs a read every few minutes and no turn."""
    return min(TURN_MAX_BACKOFF_S, max(backoff_s, waited_s))
