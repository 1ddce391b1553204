"""Explain a run: each write it made or would make in artifactr, its id, and whether it exists.

Nothing is re-run: an action cannot be run "dry" safely. The writes are read back instead. A
run's writes are those in artifactr's log by its rule's actor (`reflexr:<rule>`, see
`tasks.outbound.rule_actor`) whose derived id this run makes: for each one the id is recomputed
with `tasks.ids` from what the log says the write is (a notice's thread and text, a created
artifact's kind and data, an edit's artifact and path, a thread's title) over the run's segments
(0 to its checkpoint count) and occurrences, so the explanation also says in which segment, and
as which occurrence, the run made it. A direct edit carries no id in the log; its own key in
relayr's cause ledger (`reflexr:<rule>/<artifact>@<version>`) and its proposal id's say it was
this run's. Causes the ledger recorded for the run whose write is not in the log are writes the
run set out to make and did not (yet): listed as missing.

Only ids, ops, artifact ids, paths and thread ids are printed, never message content or data.
"""

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Final

import artifactr
import artifactr.core as a
import reflexr.workspace as rw
from reflexr.core import Run
from reflexr.workspace import WorkspaceRef
from relayr.ledger import Ledger, WorkspaceKey
from relayr.sql.tables import CauseRow
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine

from actonce.tasks import ids
from actonce.tasks.errors import found
from actonce.tasks.outbound import rule_actor

LOG_PAGE: Final = 1000
"""How many envelopes of artifactr's log are read at once."""


@dataclass(frozen=True)
class Write:
    """One write of a run into artifactr, as the log and the ledger tell it."""

    op: str
    """What it is: `notice`, `send`, `create`, `edit`, `archive` or `thread`; for a write known
    only from the ledger, its kind there: `message`, `create` or `proposal`."""

    id: str
    """Its derived id: `msg_`, `art_` (a direct create), `prp_` (a proposal, or the id a direct
    edit derives) or `thr_`."""

    exists: bool
    """Whether artifactr has it: the message, artifact, proposal or thread, or the direct edit's
    change in the log."""

    about: str
    """What it acts on, never content: a thread id, an artifact id and path, a kind."""

    segment: int | None = None
    """The run's checkpoint count when it was made; None when known only from the ledger."""

    occurrence: int | None = None
    """How many identical writes the attempt made before it in its segment; None likewise."""


@dataclass(frozen=True)
class Explanation:
    """A run and its writes."""

    ref: WorkspaceRef
    """The run's workspace."""

    run: Run
    """The run, as reflexr has it."""

    writes: tuple[Write, ...]
    """Its writes, in the log's order, then those known only from the ledger."""

    def lines(self) -> list[str]:
        """Return what `actonce explain` prints: a line per write, then a summary."""
        out = [f"{'op':<8} {'id':<21} {'exists':<6}  about"]
        for write in self.writes:
            where = (
                ""
                if write.segment is None
                else f"  (segment {write.segment}, occurrence {write.occurrence})"
            )
            exists = "yes" if write.exists else "no"
            out.append(f"{write.op:<8} {write.id:<21} {exists:<6}  {write.about}{where}")
        out.append(summary(self))
        return out


async def explain_run(
    reflexr: rw.Workspaces,
    artifactr_workspaces: artifactr.Workspaces,
    ledger: Ledger,
    ref: WorkspaceRef,
    run_id: str,
    *,
    relayr_engine: AsyncEngine | None = None,
) -> Explanation:
    """Return each write the run made or set out to make, with its derived id and whether it exists.

    Args:
        reflexr: reflexr's workspaces, where the run is.
        artifactr_workspaces: artifactr's workspaces, whose log is read as the rule's actor.
        ledger: relayr's cause ledger, which says whose a direct edit is.
        ref: The run's tenant and workspace.
        run_id: The run's id, `fir_…`.
        relayr_engine: The engine of relayr's SQL ledger; with it, causes recorded for the run
            whose writes are missing from the log are listed too.

    Raises:
        LookupError: If there is no such run.
    """
    run = await reflexr.storage.run(ref, run_id)
    if run is None:
        raise LookupError(f"no run {run_id} in {ref.tenant_id}/{ref.workspace_id}")
    actor = rule_actor(run.rule)
    workspace = await artifactr_workspaces.open(ref.tenant_id, ref.workspace_id, actor=actor)
    key = WorkspaceKey(ref.tenant_id, ref.workspace_id)
    made = [
        candidate
        for envelope in await _log(workspace)
        if getattr(envelope.actor, "client_id", None) == actor.client_id
        and (candidate := candidate_of(envelope.event)) is not None
    ]
    counts = Counter((c.op, c.key) for c in made)
    writes: list[Write] = []
    claimed: set[str] = set()
    for candidate in made:
        found = await _ours(candidate, run, counts[(candidate.op, candidate.key)], ledger, key)
        if found is None or found[0] in claimed:
            continue
        write_id, segment, occurrence = found
        claimed.add(write_id)
        exists = await _exists(workspace, write_id, candidate)
        writes.append(Write(candidate.op, write_id, exists, candidate.about, segment, occurrence))
    if relayr_engine is not None:
        recorded = await recorded_causes(relayr_engine, key, run.id)
        for kind, cause_key in unmade(recorded, claimed):
            exists = await _exists(workspace, cause_key, None)
            writes.append(Write(_LEDGER_OPS[kind], cause_key, exists, f"recorded as a {kind}"))
    return Explanation(ref, run, tuple(writes))


# ─── pure parts ───────────────────────────────────────────────────────────────


@dataclass(frozen=True)
class Candidate:
    """A write by a rule's actor in the log, keyed as `tasks.outbound` derives its id."""

    op: str
    """The op its id is derived with."""

    key: tuple[str, ...]
    """The key parts its id is derived from."""

    prefix: str
    """The prefix of the id to show: `msg_`, `art_`, `prp_` or `thr_`."""

    logged_id: str | None
    """The id the log holds; None for a direct edit or archive, which carry none."""

    about: str
    """What it acts on, never content."""

    change: str | None = None
    """For a direct edit or archive, its key in relayr's ledger, without the actor:
    `<artifact>@<version>`."""


def candidate_of(event: a.Event) -> Candidate | None:
    """Return what a logged write is, keyed for its derived id; None for what runs do not make."""
    match event:
        case a.MessagePosted(message_id=message_id, thread_id=thread, content=content, kind=kind):
            write = ids.write_key("notice" if kind == "notice" else "send", thread, content)
            return Candidate(*write, ids.MESSAGE, message_id, thread)
        case a.ArtifactCreated(proposal_id=None, artifact_id=artifact_id, kind=kind, data=data):
            write = ids.write_key("create", kind, data)
            return Candidate(*write, ids.ARTIFACT, artifact_id, f"{kind} {artifact_id}")
        case a.ProposalCreated(proposal_id=proposal_id, change=change):
            return _proposed(proposal_id, change)
        case a.ArtifactChanged(
            proposal_id=None, artifact_id=artifact_id, patch=patch, version=version
        ):
            path = _keyed_path(patch)
            if path is None:
                return None
            about = f"{artifact_id} {path} (direct)"
            version_key = f"{artifact_id}@{version}"
            write = ids.write_key("edit", artifact_id, path)
            return Candidate(*write, ids.PROPOSAL, None, about, version_key)
        case a.ArtifactArchived(proposal_id=None, artifact_id=artifact_id, version=version):
            about = f"{artifact_id} (direct)"
            version_key = f"{artifact_id}@{version}"
            write = ids.write_key("archive", artifact_id)
            return Candidate(*write, ids.PROPOSAL, None, about, version_key)
        case a.ThreadCreated(thread_id=thread_id, title=title):
            return Candidate(*ids.write_key("thread", title), ids.THREAD, thread_id, thread_id)
        case _:
            return None


def locate(
    run_id: str, segments: int, op: str, key: tuple[str, ...], occurrences: int, digest: str
) -> tuple[int, int] | None:
    """Return the segment and occurrence in which the run derives `digest`, or None.

    Args:
        run_id: The run's id.
        segments: How many segments to try: the run's checkpoint count plus one.
        op: The write's op.
        key: The write's key parts.
        occurrences: How many occurrences to try in each segment.
        digest: The digest an id holds after its prefix.
    """
    for segment, occurrence in derivations(segments, occurrences):
        if ids.write_digest(run_id, segment, op, key, occurrence) == digest:
            return segment, occurrence
    return None


def derivations(segments: int, occurrences: int) -> Iterable[tuple[int, int]]:
    """Every (segment, occurrence) a run with `segments` segments may derive an id at."""
    for segment in range(segments):
        for occurrence in range(occurrences):
            yield segment, occurrence


def unmade(recorded: Sequence[tuple[str, str]], made: set[str]) -> list[tuple[str, str]]:
    """Return the causes recorded for a run whose writes are not among `made`, one per write.

    A create records its proposal and its artifact under one digest, and an edit its proposal
    and the version it makes: one write each. Edits' versions are left out (their proposal
    stands for them), and so is a create's proposal when its artifact is listed.
    """
    digests = {write_id[len(ids.PROPOSAL) :] for write_id in made}
    artifacts = {key[len(ids.ARTIFACT) :] for kind, key in recorded if kind == "artifact"}
    out: list[tuple[str, str]] = []
    for kind, key in recorded:
        digest = key.split("_", 1)[-1]
        if kind not in _LEDGER_OPS or key in made or digest in digests:
            continue
        if kind == "proposal" and digest in artifacts:
            continue
        out.append((kind, key))
    return out


def summary(explanation: Explanation) -> str:
    """Return the summary line: how many writes exist and are missing, and where the run is."""
    writes = explanation.writes
    missing = sum(not write.exists for write in writes)
    run = explanation.run
    return (
        f"{len(writes)} write(s): {len(writes) - missing} exist, {missing} missing; run {run.id} "
        f"of {run.rule} in {explanation.ref.tenant_id}/{explanation.ref.workspace_id} is "
        f"{run.status} after {run.attempts} attempt(s) and {run.checkpoints} checkpoint(s)"
    )


# ─── how ──────────────────────────────────────────────────────────────────────


async def recorded_causes(
    engine: AsyncEngine, key: WorkspaceKey, run_id: str
) -> list[tuple[str, str]]:
    """Return the (kind, key) of every cause relayr's SQL ledger recorded for a run, in order."""
    query = (
        select(CauseRow.kind, CauseRow.key)
        .where(
            CauseRow.tenant_id == key.tenant_id,
            CauseRow.workspace_id == key.workspace_id,
            CauseRow.run_id == run_id,
        )
        .order_by(CauseRow.recorded_at, CauseRow.kind, CauseRow.key)
    )
    async with engine.connect() as connection:
        rows = await connection.execute(query)
        return [(kind, cause_key) for kind, cause_key in rows]


async def _ours(
    candidate: Candidate, run: Run, count: int, ledger: Ledger, key: WorkspaceKey
) -> tuple[str, int, int] | None:
    """The candidate's id, segment and occurrence if this run made it; else None."""
    segments = run.checkpoints + 1
    if candidate.logged_id is not None:
        digest = candidate.logged_id.split("_", 1)[-1]
        found = locate(run.id, segments, candidate.op, candidate.key, count, digest)
        return None if found is None else (candidate.logged_id, *found)
    # A direct edit or archive: its change's cause says whose it is, its proposal's which.
    if candidate.op == "edit":
        changed_by = f"{rule_actor(run.rule).client_id}/{candidate.change}"
        change = await ledger.cause(key, "edit", changed_by)
        if change is None or change.run_id != run.id:
            return None
    for segment, occurrence in derivations(segments, count):
        digest = ids.write_digest(run.id, segment, candidate.op, candidate.key, occurrence)
        proposal = await ledger.cause(key, "proposal", f"{ids.PROPOSAL}{digest}")
        if proposal is not None and proposal.run_id == run.id:
            return f"{ids.PROPOSAL}{digest}", segment, occurrence
    return None


async def _exists(workspace: artifactr.Workspace, write_id: str, made: Candidate | None) -> bool:
    """Whether artifactr has the write: a direct change is in the log, the rest are read back."""
    if made is not None and made.logged_id is None:
        return True
    if made is not None and made.prefix == ids.MESSAGE:
        return True  # read from the log: artifactr refuses its id from now on
    read: Any
    if write_id.startswith(ids.ARTIFACT):
        read = workspace.artifact(write_id)
    elif write_id.startswith(ids.PROPOSAL):
        read = workspace.proposal(write_id)
    elif write_id.startswith(ids.THREAD):
        read = workspace.thread(write_id)
    else:
        return False  # a message missing from the log was never posted
    return await found(read)


async def _log(workspace: artifactr.Workspace) -> list[a.Envelope]:
    """The whole log, read a page at a time."""
    envelopes: list[a.Envelope] = []
    while page := await workspace.read(
        after_seq=envelopes[-1].seq if envelopes else 0, limit=LOG_PAGE
    ):
        envelopes.extend(page)
    return envelopes


def _proposed(proposal_id: str, change: Any) -> Candidate | None:
    match change:
        case a.CreateArtifact(kind=kind, data=data):
            write = ids.write_key("create", kind, data)
            return Candidate(*write, ids.PROPOSAL, proposal_id, f"{kind} (proposed)")
        case a.EditArtifact(artifact_id=artifact_id, patch=patch):
            path = _keyed_path(patch)
            if path is None:
                return None
            about = f"{artifact_id} {path} (proposed)"
            write = ids.write_key("edit", artifact_id, path)
            return Candidate(*write, ids.PROPOSAL, proposal_id, about)
        case a.ArchiveArtifact(artifact_id=artifact_id):
            about = f"{artifact_id} (proposed archive)"
            write = ids.write_key("archive", artifact_id)
            return Candidate(*write, ids.PROPOSAL, proposal_id, about)
        case _:
            return None


def _keyed_path(patch: Any) -> str | None:
    """The path of a keyed edit: a patch of one `add`, as runs make; None for another patch."""
    ops: Any = getattr(patch, "ops", ())
    if len(ops) != 1 or ops[0].get("op") != "add":
        return None
    path = ops[0].get("path")
    return path if isinstance(path, str) else None


_LEDGER_OPS: Final[dict[str, str]] = {
    "message": "message",
    "artifact": "create",
    "proposal": "proposal",
}
"""The ledger's kinds a write is listed under when only the ledger knows it, and their op."""
