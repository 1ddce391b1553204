"""The lifecycle's table decides every end, and its reasons are every code an operator meets.

In memory: every way a delivery can end has one fate; the reasons are unique, each with a meaning;
the codes artifactr's refusals give are members; and a dead run's letter names
`attempts_exhausted` exactly when its last failure was one reflexr retries.
"""

import artifactr.core as a
import pytest
from worlds import a_run

from actonce.tasks.errors import Refused, refusal
from actonce.tasks.lifecycle import (
    FATES,
    RETRIED_REFUSALS,
    Follows,
    Happened,
    Reason,
    letter_reason,
    store_outage_retry_s,
    turn_busy_retry_s,
    worker_lost_retry_s,
)
from actonce.tasks.turn_task import HAPPENED


def test_every_way_a_delivery_ends_has_one_fate_and_a_line_that_says_it() -> None:
    assert set(FATES) == set(Happened)
    for happened, fate in FATES.items():
        line = fate.describe()
        assert line and "\n" not in line, happened
        if fate.follows is Follows.RETRY:
            assert fate.when, f"{happened}: a retry says when"


def test_reasons_are_unique_codes_each_with_a_one_line_meaning() -> None:
    codes = [reason.value for reason in Reason]

    assert len(codes) == len(set(codes))
    for reason in Reason:
        assert reason.value.isidentifier() and reason.value == reason.value.lower(), reason
        assert reason.meaning.endswith(".") and "\n" not in reason.meaning, reason


def test_every_artifactr_rejection_code_is_a_reason_and_only_three_are_retried() -> None:
    for rejection in (a.NotFound, a.ValidationFailed, a.PatchFailed, a.InvalidState):
        assert rejection.code in {reason.value for reason in Reason}, rejection
    assert {reason.value for reason in RETRIED_REFUSALS} == {
        "not_found",
        "validation_failed",
        "patch_failed",
    }
    assert {r for r in Reason if r.retried} >= RETRIED_REFUSALS


@pytest.mark.parametrize(
    "rejection",
    [a.NotFound("artifact", "art_1"), a.ValidationFailed("m", []), a.PatchFailed("m")],
    ids=lambda rejection: rejection.code,
)
def test_a_retried_refusal_is_relayrs_refused_and_not_permanent(rejection: a.Rejection) -> None:
    failure = refusal(rejection)

    assert isinstance(failure, Refused)
    assert failure.reason == rejection.code and not failure.permanent


def test_any_other_refusal_is_permanent_under_its_own_code() -> None:
    failure = refusal(a.InvalidState("m"))

    assert failure.reason == Reason.INVALID_STATE and failure.permanent


@pytest.mark.parametrize(
    ("reason", "letter"),
    [
        (None, Reason.ATTEMPTS_EXHAUSTED),
        ("version_conflict", Reason.ATTEMPTS_EXHAUSTED),
        ("timeout", Reason.ATTEMPTS_EXHAUSTED),
        ("abandoned", Reason.ATTEMPTS_EXHAUSTED),
        ("not_found", Reason.ATTEMPTS_EXHAUSTED),
        ("not_allowed", Reason.NOT_ALLOWED),
        ("forbidden", Reason.FORBIDDEN),
        ("a_rules_own_code", "a_rules_own_code"),
    ],
)
def test_a_dead_runs_letter_says_attempts_exhausted_only_after_retried_failures(
    reason: str | None, letter: str
) -> None:
    assert letter_reason(a_run("dead", attempts=3, reason=reason)) == letter


def test_every_outcome_of_a_turn_is_in_the_table() -> None:
    assert set(HAPPENED.values()) <= set(FATES)
    assert FATES[HAPPENED["spent"]].reason is Reason.TURN_NOT_TAKEN


def test_the_delays_grow_and_stop_where_the_table_says() -> None:
    assert [store_outage_retry_s(n) for n in range(7)] == [1, 2, 4, 8, 16, 30, 30]
    assert worker_lost_retry_s(30.0) == 31
    assert [turn_busy_retry_s(2.0, n, 10.0) for n in range(4)] == [2.0, 4.0, 8.0, 10.0]
