"""`settle` maps each verdict reflexr leaves on a run onto how the Celery task ends.

One test per branch, on runs built in memory (no Celery, no stores): a finished success
succeeds, a success someone else made is not ours, a dead run dead-letters, a retrying run is
retried at reflexr's time, a pending run not yet due waits for its time, a due run declined for
its scope and a run held, cancelled or skipped elsewhere end quietly.
"""

from datetime import timedelta

import pytest
from worlds import NOW, a_run

from actonce.tasks.lifecycle import settle


def test_a_run_this_attempt_finished_as_succeeded_succeeds() -> None:
    settlement = settle(a_run("succeeded"), finished=True, now=NOW)

    assert settlement.happened == "succeeded"
    assert settlement.eta is None


def test_a_run_another_delivery_finished_is_not_claimed_by_this_one() -> None:
    settlement = settle(a_run("succeeded"), finished=False, now=NOW)

    assert settlement.happened == "not_claimed", "a duplicate delivery must not report success"


@pytest.mark.parametrize("finished", [True, False])
def test_a_dead_run_is_dead_lettered_whoever_delivered_it(finished: bool) -> None:
    settlement = settle(a_run("dead", attempts=3), finished=finished, now=NOW)

    assert settlement.happened == "dead"
    assert settlement.eta is None


def test_a_retrying_run_is_retried_at_the_time_reflexr_set() -> None:
    later = NOW + timedelta(seconds=2)

    settlement = settle(a_run("retrying", next_attempt_at=later), finished=True, now=NOW)

    assert settlement.happened == "retrying"
    assert settlement.eta == later, "the rule's RetryPolicy, through reflexr, sets the delay"


def test_a_pending_run_not_yet_due_waits_for_its_time_instead_of_being_dropped() -> None:
    later = NOW + timedelta(seconds=30)

    settlement = settle(a_run("pending", next_attempt_at=later), finished=False, now=NOW)

    assert settlement.happened == "not_due"
    assert settlement.eta == later


@pytest.mark.parametrize("status", ["pending", "retrying"])
def test_a_due_run_declined_for_its_scope_is_left_to_the_dispatcher(status: str) -> None:
    settlement = settle(a_run(status, next_attempt_at=NOW), finished=False, now=NOW)

    assert settlement.happened == "not_claimed", "retrying a due, declined run at once would spin"
    assert settlement.eta is None


@pytest.mark.parametrize("status", ["running", "cancelled", "skipped"])
def test_a_run_held_elsewhere_cancelled_or_skipped_ends_quietly(status: str) -> None:
    settlement = settle(a_run(status), finished=False, now=NOW)

    assert settlement.happened == "not_claimed"
    assert settlement.eta is None
