"""Feeding the demo: the artifacts and thread its runs act on, and `WorkRequested` events.

Used by the demo (`make run`), the pool's tests and the figures, so they all drive the same
rules the same way.
"""

import contextlib

import artifactr
import artifactr.core as a
from reflexr.core import SourceActor

from demo.definition import (
    PREREQUISITE_ID,
    RUNBOOK_ID,
    THREAD_ID,
    TIMELINE_ID,
    Receipt,
    Runbook,
    Timeline,
    WorkRequested,
)

PEOPLE = a.UserActor(id="demo-operator", name="Demo operator")
"""Who sets the demo's workspace up in artifactr."""

FEED = SourceActor(name="demo-feed")
"""Who publishes the demo's events in reflexr."""


async def prepare(
    artifactr_workspaces: artifactr.Workspaces, tenant_id: str, workspace_id: str
) -> None:
    """Create the demo's thread, timeline and runbook in a workspace, if they are not there."""
    workspace = await artifactr_workspaces.open(tenant_id, workspace_id, actor=PEOPLE)
    for command in (
        a.CreateThread(thread_id=THREAD_ID, title="demo"),
        a.create_artifact(Timeline(), artifact_id=TIMELINE_ID),
        a.create_artifact(Runbook(), artifact_id=RUNBOOK_ID),
    ):
        with contextlib.suppress(a.InvalidState):  # made by an earlier feed
            await workspace.commit(command)


async def request_work(
    reflexr_workspaces: object, tenant_id: str, workspace_id: str, event: WorkRequested
) -> None:
    """Publish one `WorkRequested`, with an id derived from its key so a re-feed adds nothing."""
    workspace = await reflexr_workspaces.open(tenant_id, workspace_id, actor=FEED)  # type: ignore[attr-defined]
    await workspace.publish(event, id=f"evt_work_{event.key}")


async def create_prerequisite(
    artifactr_workspaces: artifactr.Workspaces, tenant_id: str, workspace_id: str
) -> bool:
    """Create the artifact the demo's dead run needs, as an operator fixing its cause; return
    False when it was there already."""
    workspace = await artifactr_workspaces.open(tenant_id, workspace_id, actor=PEOPLE)
    try:
        await workspace.commit(
            a.create_artifact(
                Receipt(key="prerequisite", done_by="operator"), artifact_id=PREREQUISITE_ID
            )
        )
    except a.InvalidState:
        return False
    return True
