"""The fair backlog's order and the send room's queue length, in memory: what the fair dispatcher
sends next, and how many it lets wait in the attempts queue (`worker.dispatching.fair_backlog`,
`worker.dispatching.send_room`)."""

from datetime import UTC, datetime

from reflexr.core import Run
from reflexr.workspace import WorkspaceRef

from actonce.worker.dispatching.fair_backlog import FairBacklog
from actonce.worker.dispatching.send_room import SendRoom

_AT = datetime(2026, 1, 1, tzinfo=UTC)


def _due(tenant: str, workspace: str, count: int, start: int = 0) -> list[tuple[WorkspaceRef, Run]]:
    ref = WorkspaceRef(tenant, workspace)
    return [
        (
            ref,
            Run(
                id=f"fir_{tenant}_{workspace}_{i}",
                rule="r",
                scope_key="s",
                scope={},
                correlation_id="c",
                fired_seq=i + 1,
                matched=(i + 1,),
                next_attempt_at=_AT,
                created_at=_AT,
                updated_at=_AT,
            ),
        )
        for i in range(start, start + count)
    ]


def _order(backlog: FairBacklog, count: int, room: dict[str, int] | None = None) -> list[str]:
    return [f"{held.ref.tenant_id}/{held.ref.workspace_id}" for held in backlog.take(count, room)]


def test_a_quiet_tenant_newly_due_goes_after_one_run_of_a_tenant_with_a_burst() -> None:
    backlog = FairBacklog(per_tenant=1000)
    backlog.hold(_due("t_burst", "w", 1000), now=0.0)
    assert _order(backlog, 3) == ["t_burst/w"] * 3
    # A quiet tenant's run fired while 997 of the burst wait
    backlog.hold(_due("t_quiet", "w", 1), now=1.0)
    assert _order(backlog, 2) == ["t_burst/w", "t_quiet/w"]
    assert backlog.by_tenant() == {"t_burst": 996}


def test_tenants_take_turns_and_a_tenants_workspaces_take_turns_within_its_own() -> None:
    backlog = FairBacklog(per_tenant=1000)
    backlog.hold(_due("a", "w1", 4) + _due("a", "w2", 4) + _due("b", "w", 4), now=0.0)
    assert _order(backlog, 8) == [
        "a/w1",
        "b/w",
        "a/w2",
        "b/w",
        "a/w1",
        "b/w",
        "a/w2",
        "b/w",
    ]
    assert _order(backlog, 10) == ["a/w1", "a/w2", "a/w1", "a/w2"]
    assert len(backlog) == 0


def test_a_weighted_tenant_takes_its_weight_each_turn() -> None:
    backlog = FairBacklog({"big": 3}, per_tenant=1000)
    backlog.hold(_due("big", "w", 10) + _due("small", "w", 10), now=0.0)
    assert _order(backlog, 8) == ["big/w"] * 3 + ["small/w"] + ["big/w"] * 3 + ["small/w"]


def test_runs_of_a_workspace_go_oldest_first_and_a_run_held_again_keeps_its_place() -> None:
    backlog = FairBacklog(per_tenant=1000)
    first = _due("a", "w", 3)
    assert backlog.hold(first, now=0.0) == 3
    # Seen due again by a later look: held once, still first, waiting since it was first seen
    assert backlog.hold(first[:1] + _due("a", "w", 1, start=3), now=5.0) == 1
    taken = backlog.take(4)
    assert [held.run.id for held in taken] == [run.id for _, run in first] + ["fir_a_w_3"]
    assert [held.since for held in taken] == [0.0, 0.0, 0.0, 5.0]


def test_a_tenant_at_its_cap_keeps_its_runs_and_the_others_go_on() -> None:
    backlog = FairBacklog(per_tenant=1000)
    backlog.hold(_due("capped", "w", 5) + _due("free", "w", 5), now=0.0)
    assert _order(backlog, 6, room={"capped": 1, "free": 10}) == ["capped/w"] + ["free/w"] * 5
    # Nothing has room: nothing is taken, and nothing is lost
    assert _order(backlog, 6, room={"capped": 0}) == []
    assert backlog.by_tenant() == {"capped": 4}


def test_past_its_share_of_memory_a_tenants_runs_are_left_to_reflexr_and_counted() -> None:
    backlog = FairBacklog(per_tenant=10)
    assert backlog.hold(_due("a", "w", 25), now=0.0) == 10
    assert backlog.dropped == 15
    assert backlog.hold(_due("b", "w", 1), now=0.0) == 1


def test_the_queue_may_hold_what_the_children_seen_and_their_drain_need() -> None:
    room = SendRoom(per_child=2, least_children=2, top_up_s=0.025)
    # Before any worker is seen: two per child of one worker's concurrency
    assert room.room(queued=0, unacked=0, now=0.0) == 4
    room.sent(4)
    # Eight children busy while messages wait: sixteen may wait
    assert room.room(queued=4, unacked=8, now=0.1) == 12
    assert room.limit() == 16
    # The children went away: after the window, back to one worker's
    assert room.room(queued=0, unacked=0, now=100.0) == 4


def test_a_queue_drained_at_every_top_up_may_grow_to_two_top_ups_of_the_drain() -> None:
    room = SendRoom(per_child=1, least_children=1, top_up_s=0.1)
    at = 0.0
    # Workers quicker than the top-ups: each top-up finds the queue empty
    for _ in range(60):
        room.sent(room.room(queued=0, unacked=1, now=at))
        at += 0.1
    # The limit doubled each drain window (a second) from one child's: never more than the
    # workers were seen to drain, and more than the children alone allow
    assert room.limit() >= 32
