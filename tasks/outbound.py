"""The outbound handle: what an attempt of a rule's run does in artifactr, made once per write.

`Outbound.acting(reaction)` gives an attempt its `RunActions`: create, edit, archive, notice,
create_thread, send and read, acting as `ExternalAgentActor(client_id="reflexr:<rule>")` so that
artifactr's own write policies apply. It is relayr-ai 0.1.1's `Outbound` as a drop-in (an action
written for relayr runs unchanged), implementing relayr's ADR-0019 for a worker pool:

- Every write's ids are derived from the run, its checkpoint segment, what the write is, and how
  many identical writes the attempt made before it (`tasks.ids`), byte-identical to relayr's. A
  retried, redelivered or replayed attempt that makes the same writes, in any order, makes them
  with the same ids, and artifactr refuses each repeat durably.
- A refusal counts as done only when it says the derived id is used: a proposal or artifact that
  exists (read back), or a message or thread, whose only `InvalidState` is a used id. Any other
  `InvalidState` fails the run for good; an edit of an archived artifact is refused before it is
  tried.
- An edit sets one value at one JSON Pointer path, and is skipped when the value is there already:
  no commit, no new version. An append (`/-`) is refused before it is tried: it has no key.
- A `VersionConflict` re-reads and edits again, three times, then fails the attempt to be retried.
- Before each write the run behind it is recorded in relayr's cause ledger, with relayr's kinds and
  keys, so relayr's follower continues the run's causal chain when it bridges the write back.

One handle per attempt, truly: handles are keyed by the attempt (`tasks.handles`), so two
`Outbound`s or two `Reaction`s of one attempt share the counter that tells identical writes apart.
"""

import contextvars
import weakref
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final

import artifactr
import artifactr.agent
import artifactr.core as a
from pydantic import BaseModel, JsonValue, ValidationError
from reflexr.core import Run
from reflexr.workspace import Reaction, RunFailure
from relayr.events import ArtifactrEvent
from relayr.ledger import Cause, CauseKind, Ledger, WorkspaceKey

from actonce.tasks import ids
from actonce.tasks.allowlist import Allowlist, Allowlists
from actonce.tasks.errors import NotAllowed, Refused, kept_changing, refusal
from actonce.tasks.handles import HANDLES, AttemptKey
from actonce.tasks.turns import TurnRequest, TurnRequests, send_once

RULE_ACTOR_PREFIX: Final = "reflexr:"
"""The prefix of a rule's actor's `client_id` in artifactr: `reflexr:<rule>`, as relayr's."""

EDIT_TRIES: Final = 3
"""How many times an edit or archive re-reads its artifact after a version conflict, per attempt."""

WRITES: Final[contextvars.ContextVar[Counter[str] | None]] = contextvars.ContextVar(
    "actonce_writes", default=None
)
"""Where the current attempt tallies its writes: `made`, `already` (done before) and `refused`.

Set by whoever runs the attempt (the pool's task, for its log line); the executor's child tasks
copy the context, so they tally into the same counter. Unset, nothing is tallied.
"""

type _Done = Callable[[artifactr.Workspace], Awaitable[bool]]
"""Whether a refused write's derived id is used: an earlier attempt made the write."""


@dataclass(frozen=True)
class TurnDesk:
    """Where a pool keeps the turns rules ask for: the durable requests, and who takes them."""

    requests: TurnRequests
    """The requests, kept until artifactr's Runner has taken each message."""

    announce: Callable[[TurnRequest], Awaitable[None]]
    """Hands a request to a turn worker (the pool enqueues its turn task); may fail: swept."""


def rule_actor(rule: str) -> a.ExternalAgentActor:
    """Return who a rule's runs act as in artifactr: an external agent of its own, for no person."""
    return a.ExternalAgentActor(client_id=f"{RULE_ACTOR_PREFIX}{rule}", name=rule)


class Outbound:
    """Lets the runs of rules act in artifactr, each within its rule's allowlist.

    Build one per process with the same allowlists as the app, and give it to the actions as their
    dependency or to agents through `ArtifactrCapability`. More than one in a process is safe: an
    attempt's handle is shared by all of them.

    Args:
        artifactr_workspaces: The workspaces runs act in, with the same tenant and id as the run's.
        ledger: Where the run behind each write is recorded; a SQL ledger shared with the follower.
        allowlists: Each rule's allowlist by name, or by a whole namespace's as ``"chat:*"``.
        runner: Starts the turns that rules allowed to `send` ask for, in this process.
        turns: Keeps the turns that rules allowed to `send` ask for durable, for turn workers to
            take (the pool's way: see `tasks.turns`); preferred over `runner` when both are
            given. Without either, no rule may send.

    Raises:
        ValueError: If a key of ``allowlists`` is neither a rule's nor a namespace's name, or
            names reflexr's own namespace.
    """

    def __init__(
        self,
        artifactr_workspaces: artifactr.Workspaces,
        ledger: Ledger,
        *,
        allowlists: Mapping[str, BaseModel] | None = None,
        runner: artifactr.agent.Runner[Any] | None = None,
        turns: TurnDesk | None = None,
    ) -> None:
        self.artifactr = artifactr_workspaces
        self.ledger = ledger
        self.allowlists = Allowlists(allowlists)
        self.runner = runner
        self.turns = turns

    def acting(self, reaction: Reaction[Any]) -> "RunActions":
        """Return what this attempt of a run may do in artifactr: one handle for the attempt.

        Raises:
            ValueError: If another `Outbound` made the attempt's handle with another allowlist
                for the rule, or over other artifactr workspaces or another ledger: the
                process's configuration disagrees with itself, and the writes of one of them
                would land where the other says.
        """
        allowlist = self.allowlists.of(reaction.run.rule)
        handle = HANDLES.get_or_make(
            reaction, lambda key: RunActions(key, reaction, self, allowlist)
        )
        if handle.allowlist != allowlist:
            raise ValueError(
                f"two Outbounds give rule {reaction.run.rule} different allowlists in one "
                f"attempt: build every Outbound of a process with the same allowlists"
            )
        made_by = handle.outbound
        if made_by.artifactr is not self.artifactr or made_by.ledger is not self.ledger:
            raise ValueError(
                f"two Outbounds over different artifactr workspaces or ledgers act for one "
                f"attempt of {reaction.run.rule}: build every Outbound of a process over the "
                f"same `artifactr.Workspaces` and ledger objects"
            )
        return handle


class RunActions:
    """What one attempt of a run does in artifactr. Get it with `Outbound.acting`.

    A write without a thread goes to the chain's first thread: that of the first event with one
    that made the rule fire, or else the first thread the run created.
    """

    def __init__(
        self, attempt: AttemptKey, reaction: Reaction[Any], outbound: Outbound, allowlist: Allowlist
    ) -> None:
        self.attempt = attempt
        self.allowlist = allowlist
        self._run: Run = reaction.run
        self._reactions: weakref.WeakSet[Reaction[Any]] = weakref.WeakSet()
        self.outbound = outbound
        """The `Outbound` that made this handle: its stores are the ones the attempt writes to."""
        self._key = WorkspaceKey(attempt.tenant_id, attempt.workspace_id)
        self._actor = rule_actor(reaction.run.rule)
        self._workspace: artifactr.Workspace | None = None
        self._made: Counter[tuple[int, str, str]] = Counter()
        self._threads: dict[str, None] = dict.fromkeys(
            envelope.event.thread_id
            for envelope in reaction.events
            if isinstance(envelope.event, ArtifactrEvent) and envelope.event.thread_id
        )

    def adopt(self, reaction: Reaction[Any]) -> None:
        """Count `reaction` as one of this attempt's, whose checkpoints start new segments."""
        self._reactions.add(reaction)

    # ─── what a run does ──────────────────────────────────────────────────────

    async def create(
        self,
        artifact: a.Artifact,
        *,
        thread_id: a.ThreadId | None = None,
        rationale: str | None = None,
    ) -> a.ArtifactId:
        """Create an artifact, by proposal unless the allowlist lets the rule create its kind.

        Returns:
            The artifact's id, `art_` and a digest of the run, the kind and the data; a proposal
            made instead has the id `prp_` and the same digest.

        Raises:
            Refused: If artifactr finds the artifact invalid, or its kind unknown.
            NotAllowed: If `thread_id` is outside the chain and the rule may act only in it.
        """
        thread = self._where(thread_id)
        made = self._derive("create", artifact.kind, ids.content_digest(artifact.to_json()))
        artifact_id, proposal_id = f"{ids.ARTIFACT}{made}", f"{ids.PROPOSAL}{made}"
        create = _command(
            lambda: a.create_artifact(artifact, artifact_id=artifact_id, thread_id=thread)
        ).model_copy(update={"proposal_id": proposal_id})

        async def done(workspace: artifactr.Workspace) -> bool:
            return await _exists(workspace.proposal(proposal_id)) or await _exists(
                workspace.artifact(artifact_id)
            )

        await self._caused(("proposal", proposal_id), ("artifact", artifact_id))
        await self._write(self._proposed(create, artifact.kind, proposal_id, rationale), done)
        return artifact_id

    async def edit(
        self,
        artifact_id: a.ArtifactId,
        path: str,
        value: JsonValue,
        *,
        summary: str | None = None,
        thread_id: a.ThreadId | None = None,
        rationale: str | None = None,
    ) -> None:
        """Set the value at the JSON Pointer `path` of an artifact: a keyed edit.

        It is a proposal (id `prp_` and a digest of the run, the artifact and the path) unless the
        allowlist lets the rule edit the artifact's kind. It is skipped, with no commit and no new
        version, when the artifact already holds the value there; it is re-read and made again,
        within the attempt, when the artifact changed meanwhile. A direct edit retried after
        someone else changed the value sets the run's value again (ADR-0019's consequence).

        Raises:
            Refused: With reason `patch_failed` if `path` appends (`/-`) or does not apply; with
                `not_found` if the artifact is missing.
            RunFailure: Retryable (`version_conflict`) if the artifact changed under every
                re-read; permanent (`invalid_state`) if it is archived.
            NotAllowed: If `thread_id` is outside the chain and the rule may act only in it.
        """
        _check_keyed(path)
        thread = self._where(thread_id)
        proposal_id = f"{ids.PROPOSAL}{self._derive('edit', artifact_id, path)}"
        patch = a.JsonPatch(ops=({"op": "add", "path": path, "value": value},))

        async def done(workspace: artifactr.Workspace) -> bool:
            return await _exists(workspace.proposal(proposal_id))

        for _ in range(EDIT_TRIES):
            current = await self._read(artifact_id)
            if current.archived:
                raise _archived(artifact_id)
            if _holds(current.data.to_json(), path, value):
                _tally("already")
                return
            edit = _command(
                lambda current=current: a.EditArtifact(  # type: ignore[misc]
                    artifact_id=artifact_id,
                    base_version=current.version,
                    patch=patch,
                    summary=summary,
                    thread_id=thread,
                    proposal_id=proposal_id,
                )
            )
            edited = f"{self._actor.client_id}/{artifact_id}@{current.version + 1}"
            await self._caused(("proposal", proposal_id), ("edit", edited))
            try:
                await self._write(
                    self._proposed(edit, current.data.kind, proposal_id, rationale), done
                )
            except a.VersionConflict:
                continue
            return
        raise kept_changing(artifact_id, EDIT_TRIES)

    async def archive(
        self,
        artifact_id: a.ArtifactId,
        *,
        thread_id: a.ThreadId | None = None,
        rationale: str | None = None,
    ) -> None:
        """Archive an artifact, by proposal unless the allowlist lets the rule edit its kind.

        Skipped when the artifact is archived already; re-read and made again on a version
        conflict, as `edit` is.

        Raises:
            Refused: If the artifact is missing.
            RunFailure: Retryable (`version_conflict`) if the artifact kept changing.
        """
        thread = self._where(thread_id)
        proposal_id = f"{ids.PROPOSAL}{self._derive('archive', artifact_id)}"

        async def done(workspace: artifactr.Workspace) -> bool:
            return await _exists(workspace.proposal(proposal_id))

        await self._caused(("proposal", proposal_id))
        for _ in range(EDIT_TRIES):
            current = await self._read(artifact_id)
            if current.archived:
                return
            archive = a.ArchiveArtifact(
                artifact_id=artifact_id,
                base_version=current.version,
                thread_id=thread,
                proposal_id=proposal_id,
            )
            try:
                await self._write(
                    self._proposed(archive, current.data.kind, proposal_id, rationale), done
                )
            except a.VersionConflict:
                continue
            return
        raise kept_changing(artifact_id, EDIT_TRIES)

    async def notice(self, content: str, *, thread_id: a.ThreadId | None = None) -> a.MessageId:
        """Post a notice: for people, starting and steering no turn (ADR-0007, artifactr ADR-0051).

        Args:
            content: What it says.
            thread_id: Where; by default the chain's first thread.

        Returns:
            The notice's id, `msg_` and a digest of the run, the thread and the text.

        Raises:
            NotAllowed: If there is no thread to post in, or it is outside the chain and the rule
                may act only in it.
            Refused: If artifactr finds the notice invalid (empty, or holding a NUL).
        """
        thread = self._thread(thread_id)
        message_id = f"{ids.MESSAGE}{self._derive('notice', thread, ids.content_digest(content))}"
        notice = _command(
            lambda: a.PostMessage(
                thread_id=thread, content=content, message_id=message_id, kind="notice"
            )
        )
        await self._caused(("message", message_id))
        await self._write(notice, _used)
        return message_id

    async def create_thread(self, title: str = "") -> a.ThreadId:
        """Create a thread, if the allowlist lets the rule, and count it in the chain from then on.

        Returns:
            The thread's id, `thr_` and a digest of the run and the title.

        Raises:
            NotAllowed: If the rule may not create threads.
        """
        if not self.allowlist.create_threads:
            raise NotAllowed(f"{self._rule} may not create threads")
        thread_id = f"{ids.THREAD}{self._derive('thread', title)}"
        await self._write(a.CreateThread(thread_id=thread_id, title=title), _used)
        self._threads[thread_id] = None
        return thread_id

    async def send(self, content: str, *, thread_id: a.ThreadId | None = None) -> a.MessageId:
        """Send a message that starts the thread's next agent turn, if the allowlist lets it.

        With the `Outbound`'s `turns`, the request for the turn is recorded before the message
        is committed, and turn workers take it until artifactr's Runner has taken the message: no
        stop between commit and ask loses it. With only a `runner`, the message is committed
        through it and a retry that finds the id used asks again (relayr's way).

        Returns:
            The message's id, `msg_` and a digest of the run, the thread and the text (another id
            than a notice of the same text).

        Raises:
            NotAllowed: If the rule may not start turns, the `Outbound` has no runner, or there is
                no thread to send in.
        """
        runner, desk = self.outbound.runner, self.outbound.turns
        if not self.allowlist.turns or (runner is None and desk is None):
            raise NotAllowed(f"{self._rule} may not start turns; post a notice")
        thread = self._thread(thread_id)
        message_id = f"{ids.MESSAGE}{self._derive('send', thread, ids.content_digest(content))}"
        workspace = await self._open()
        await self._caused(("message", message_id))
        if desk is not None:
            request = TurnRequest(
                tenant_id=self.attempt.tenant_id,
                workspace_id=self.attempt.workspace_id,
                thread_id=thread,
                message_id=message_id,
                rule=self._rule,
                requested_at=datetime.now(UTC),
            )
            try:
                await send_once(
                    workspace=workspace,
                    requests=desk.requests,
                    request=request,
                    content=_checked_content(content),
                    announce=desk.announce,
                )
            except a.Rejection as rejection:
                raise refusal(rejection) from rejection
            return message_id
        assert runner is not None
        try:
            try:
                await runner.send(workspace, thread, content, message_id=message_id)
            except a.InvalidState:
                # A used id: an earlier attempt sent it and may have stopped before asking.
                await runner.ask(workspace, thread)
        except a.Rejection as rejection:
            raise refusal(rejection) from rejection
        return message_id

    async def read(self, artifact_id: a.ArtifactId) -> a.Versioned[a.Artifact]:
        """Return an artifact's current version, as the rule's actor reads it.

        Raises:
            Refused: If there is no such artifact (or its type is not imported here).
        """
        return await self._read(artifact_id)

    # ─── how ──────────────────────────────────────────────────────────────────

    @property
    def _rule(self) -> str:
        return self._run.rule

    def _segment(self) -> int:
        """The run's checkpoint count now: the most any of the attempt's reactions has seen."""
        return max((r.run.checkpoints for r in self._reactions), default=self._run.checkpoints)

    def _derive(self, op: str, *key: str) -> str:
        """Return the digest of the next write of `op` on `key`, counting it as made."""
        segment = self._segment()
        made = (segment, op, "\x00".join(key))
        occurrence = self._made[made]
        self._made[made] += 1
        return ids.write_digest(self._run.id, segment, op, key, occurrence)

    def _thread(self, thread_id: a.ThreadId | None) -> a.ThreadId:
        """The thread a message goes to: the one named, or the chain's first."""
        chosen = self._where(thread_id)
        if chosen is None:
            raise NotAllowed(f"{self._rule} has no thread to act in; name or create one")
        return chosen

    def _where(self, thread_id: a.ThreadId | None) -> a.ThreadId | None:
        """The thread a write is made from, if any: the one named, or the chain's first."""
        chosen = thread_id or next(iter(self._threads), None)
        in_chain = chosen is None or chosen in self._threads
        if not in_chain and self.allowlist.threads == "chain":
            raise NotAllowed(f"{self._rule} may act only in its chain's threads, not {chosen}")
        return chosen

    def _proposed(
        self,
        change: a.CreateArtifact | a.EditArtifact | a.ArchiveArtifact,
        kind: str,
        proposal_id: a.ProposalId,
        rationale: str | None,
    ) -> a.Command:
        if kind in self.allowlist.direct:
            return change
        return a.ProposeChange(proposal_id=proposal_id, change=change, rationale=rationale)

    async def _open(self) -> artifactr.Workspace:
        if self._workspace is None:
            self._workspace = await self.outbound.artifactr.open(*self._key, actor=self._actor)
        return self._workspace

    async def _read(self, artifact_id: a.ArtifactId) -> a.Versioned[a.Artifact]:
        workspace = await self._open()
        try:
            return await workspace.artifact(artifact_id)
        except a.Rejection as rejection:
            raise refusal(rejection) from rejection

    async def _write(self, command: a.Command, done: _Done) -> None:
        """Commit a command; one refused because its derived id is used is done.

        Raises:
            VersionConflict: If an edit's artifact changed since it was read.
            RunFailure: If artifactr refuses it otherwise.
        """
        workspace = await self._open()
        try:
            await workspace.commit(command)
        except a.InvalidState as invalid:
            if not await done(workspace):
                _tally("refused")
                raise refusal(invalid) from invalid
            _tally("already")
        except a.VersionConflict:
            _tally("conflicts")
            raise
        except a.Rejection as rejection:
            _tally("refused")
            raise refusal(rejection) from rejection
        else:
            _tally("made")

    async def _caused(self, *writes: tuple[CauseKind, str]) -> None:
        """Record the run behind writes it is about to make, by what the follower finds them by.

        Recorded before the write, so the follower never bridges a write it cannot trace; a cause
        whose write then fails is harmless (the ledger keeps the first record of a key).
        """
        causation = self._run.causation
        cause = Cause(
            correlation_id=self._run.correlation_id,
            firing_id=causation.firing_id,
            run_id=causation.run_id,
            depth=causation.depth,
        )
        for kind, key in writes:
            await self.outbound.ledger.record_cause(self._key, kind, key, cause)


def _checked_content(content: str) -> str:
    if not content:
        raise Refused("a message needs some text", reason="validation_failed")
    return content


def _tally(what: str) -> None:
    if (writes := WRITES.get()) is not None:
        writes[what] += 1


def _check_keyed(path: str) -> None:
    """Refuse an edit whose path names no entry: the whole document, or an append (`-`)."""
    if not path.startswith("/"):
        raise Refused(
            f"an edit sets one value at a JSON Pointer such as '/entries/deploy-42', not {path!r}",
            reason="patch_failed",
        )
    if path.rsplit("/", 1)[-1] == "-":
        raise Refused(
            f"an edit may not append ({path!r}): a retried append would append again; name the "
            f"entry instead, as '/entries/<key>'",
            reason="patch_failed",
        )


def _archived(artifact_id: str) -> RunFailure:
    return RunFailure(f"artifact {artifact_id} is archived", reason="invalid_state", permanent=True)


def _command[C: BaseModel](build: Callable[[], C]) -> C:
    """Build a command, turning artifactr's construction-time validation into a `Refused`."""
    try:
        return build()
    except ValidationError as invalid:
        raise Refused(
            f"artifactr would refuse this write: {invalid.errors()[0]['msg']}",
            reason="validation_failed",
        ) from invalid


def _holds(data: dict[str, JsonValue], path: str, value: JsonValue) -> bool:
    """Whether the data holds `value` at `path`."""
    test = a.JsonPatch(ops=({"op": "test", "path": path, "value": value},))
    try:
        a.apply_patch(data, test)
    except a.PatchFailed:
        return False
    return True


async def _exists(read: Awaitable[object]) -> bool:
    try:
        await read
    except a.NotFound:
        return False
    return True


async def _used(_: artifactr.Workspace) -> bool:
    """Done, for a message or a thread: artifactr's only `InvalidState` for them is a used id."""
    return True
