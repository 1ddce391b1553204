"""Counting what an artifactr workspace holds, by id, from its whole log: each should be once.

This is how "exactly once" is checked, from artifactr itself rather than from what actonce says
it did.
"""

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import artifactr


@dataclass(frozen=True)
class Census:
    """What an artifactr workspace holds, counted from its log: each id should appear once."""

    messages: Counter[str] = field(default_factory=Counter)
    """`message_posted` events by message id (notices and messages alike)."""

    artifacts: Counter[str] = field(default_factory=Counter)
    """`artifact_created` events by artifact id."""

    proposals: Counter[str] = field(default_factory=Counter)
    """`proposal_created` events by proposal id."""

    changes: Counter[str] = field(default_factory=Counter)
    """`artifact_changed` events (applied edits) by artifact id."""

    edits: Counter[tuple[str, str]] = field(default_factory=Counter)
    """Applied edits by (artifact id, JSON Pointer) of each operation they applied."""

    def duplicates(self) -> dict[str, list[object]]:
        """Return the ids made more than once, by kind; empty when every write landed once."""
        found: dict[str, list[object]] = {}
        for kind in ("messages", "artifacts", "proposals", "edits"):
            counter: Counter[Any] = getattr(self, kind)
            twice = sorted(key for key, count in counter.items() if count > 1)
            if twice:
                found[kind] = twice
        return found


async def artifactr_census(workspace: artifactr.Workspace) -> Census:
    """Return the census of an opened artifactr workspace, read from its whole log."""
    census = Census()
    for envelope in await workspace.read():
        event: Any = envelope.event
        kind = getattr(event, "type", None)
        if kind == "message_posted":
            census.messages[event.message_id] += 1
        elif kind == "artifact_created":
            census.artifacts[event.artifact_id] += 1
        elif kind == "proposal_created":
            census.proposals[event.proposal_id] += 1
        elif kind == "artifact_changed":
            census.changes[event.artifact_id] += 1
            for pointer in _operations(event.patch):
                census.edits[(event.artifact_id, pointer)] += 1
    return census


# ─── how ──────────────────────────────────────────────────────────────────────


def _operations(patch: Any) -> list[str]:
    # A JSON Patch names the pointer of each operation; a text edit changes the artifact's body.
    operations = getattr(patch, "ops", None)
    if operations is None:
        return [f"<{getattr(patch, 'kind', 'edit')}>"]
    return [str(operation.get("path")) for operation in operations]
