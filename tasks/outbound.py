"""The outbound handle: relayr-ai's `Outbound` and `RunActions`, made safe for a worker pool.

An action written for relayr runs unchanged: `Outbound.acting(reaction)` gives an attempt relayr's
`RunActions` (create, edit, archive, notice, create_thread, send, read), with relayr's derived ids
and cause records, acting as relayr's rule actor. What a pool needs on top, and only that, is here:

- One handle per attempt, keyed by tenant, workspace, run and epoch (`tasks.handles`) and shared
  by every `Outbound` of the process, so two of them, or two `Reaction`s of one attempt, share
  the count that tells identical writes apart. A finished attempt's handle and reactions are
  freed (relayr's `Outbound` keeps every one it made).
- An edit names one key: a path that appends (`/-`) or is no JSON Pointer is refused before
  anything is read or written. An edit whose value is held already counts as done.
- With a `TurnDesk`, `send` records a durable turn request before its message (`tasks.turns`).
- Each write is tallied in `WRITES` (made, already, refused, conflicts) for the attempt's log.
- A notice or edit that artifactr's commands cannot even hold (an empty text) is `Refused`
  (validation_failed), not pydantic's error escaping the tools.
"""

import contextlib
import contextvars
import weakref
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final, cast, override

import artifactr
import artifactr.agent
import artifactr.core as a
import jsonpatch
import relayr.outbound
from opentelemetry import trace
from pydantic import JsonValue, ValidationError
from reflexr.core import Run
from reflexr.workspace import Reaction, RunFailure
from relayr.ledger import Ledger
from relayr.outbound import Allowlist, NotAllowed, Refused, rule_actor

from actonce.tasks import ids
from actonce.tasks.errors import found, refusal
from actonce.tasks.handles import HANDLES, AttemptKey
from actonce.tasks.lifecycle import Reason
from actonce.tasks.tracing import tracer
from actonce.tasks.turns import TurnRequest, TurnRequests, send_once

__all__ = ["EDIT_TRIES", "WRITES", "Outbound", "RunActions", "TurnDesk", "rule_actor"]

EDIT_TRIES: Final = 3
"""How often an edit reads its artifact again after a version conflict, within one attempt."""

WRITES: Final[contextvars.ContextVar[Counter[str] | None]] = contextvars.ContextVar(
    "actonce_writes", default=None
)
"""Where the current attempt tallies its writes: `made`, `already` (done before), `refused` and
`conflicts`.

Set by whoever runs the attempt (the pool's task, for its log line); the executor's child tasks
copy the context, so they tally into the same counter. Unset, nothing is tallied.
"""

DEFAULT_ALLOWLIST: Final = Allowlist()
"""The allowlist of a rule that has none, its own or its namespace's: the most restrictive."""


@dataclass(frozen=True)
class TurnDesk:
    """Where a pool keeps the turns rules ask for: the durable requests, and who takes them."""

    requests: TurnRequests
    """The requests, kept until artifactr's Runner has taken each message."""

    announce: Callable[[TurnRequest], Awaitable[None]]
    """Hands a request to a turn worker (the pool enqueues its turn task); may fail: swept."""


class Outbound(relayr.outbound.Outbound):
    """Lets the runs of rules act in artifactr, each within its rule's allowlist.

    Build one per process with the same allowlists as the app, and give it to the actions as their
    dependency or to agents through relayr's `ArtifactrCapability`. More than one in a process is
    safe: an attempt's handle is shared by all of them.

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
            names reflexr's own namespace (relayr checks).
    """

    def __init__(
        self,
        artifactr_workspaces: artifactr.Workspaces,
        ledger: Ledger,
        *,
        allowlists: Mapping[str, Allowlist] | None = None,
        runner: artifactr.agent.Runner[Any] | None = None,
        turns: TurnDesk | None = None,
    ) -> None:
        super().__init__(artifactr_workspaces, ledger, allowlists=allowlists, runner=runner)
        self.artifactr = artifactr_workspaces
        self.ledger = ledger
        self.allowlists: Mapping[str, Allowlist] = dict(allowlists or {})
        self.runner = runner
        self.turns = turns

    def allowlist_of(self, rule: str) -> Allowlist:
        """Return the allowlist that applies to `rule`: its own, else its namespace's."""
        for key in (rule, f"{rule.partition(':')[0]}:*"):
            if key in self.allowlists:
                return self.allowlists[key]
        return DEFAULT_ALLOWLIST

    @override
    def acting(self, reaction: Reaction[Any]) -> "RunActions":
        """Return what this attempt of a run may do in artifactr: one handle for the attempt.

        Raises:
            ValueError: If another `Outbound` made the attempt's handle with another allowlist
                for the rule, or over other artifactr workspaces or another ledger: the
                process's configuration disagrees with itself, and the writes of one of them
                would land where the other says.
        """
        rule = reaction.run.rule
        allowlist = self.allowlist_of(rule)
        handle = HANDLES.get_or_make(
            reaction, lambda attempt: RunActions(attempt, reaction, self, allowlist)
        )
        if not isinstance(handle, RunActions):
            raise TypeError(f"the handle of {handle.attempt} is no RunActions: {handle!r}")
        if handle.allowlist != allowlist:
            raise ValueError(
                f"two Outbounds give rule {rule} different allowlists in one attempt: build "
                f"every Outbound of a process with the same allowlists"
            )
        first = handle.outbound
        if first.artifactr is not self.artifactr or first.ledger is not self.ledger:
            raise ValueError(
                f"two Outbounds over different artifactr workspaces or ledgers act for one "
                f"attempt of {rule}: build every Outbound of a process over the same "
                f"`artifactr.Workspaces` and ledger objects"
            )
        return handle


class _Attempt:
    """What relayr's handle reads of its reaction, for every reaction of one attempt at once.

    relayr's `RunActions` keeps the one `Reaction` it was made for and reads only its `run`. A
    shared handle instead follows every reaction of its attempt, weakly, and answers the run as
    the one furthest on sees it: a checkpoint through any of them starts the next id segment.
    """

    def __init__(self, reaction: Reaction[Any]) -> None:
        self._first: Run = reaction.run
        self._reactions: weakref.WeakSet[Reaction[Any]] = weakref.WeakSet()

    def adopt(self, reaction: Reaction[Any]) -> None:
        self._reactions.add(reaction)

    @property
    def run(self) -> Run:
        runs = [reaction.run for reaction in self._reactions]
        return max(runs, key=lambda run: run.checkpoints, default=self._first)


class RunActions(relayr.outbound.RunActions):
    """What one attempt of a run does in artifactr: relayr's handle, shared by the attempt.

    Get it with `Outbound.acting`. A write without a thread goes to the chain's first thread: that
    of the first event with one that made the rule fire, or else the first thread the run created.
    """

    def __init__(
        self, attempt: AttemptKey, reaction: Reaction[Any], outbound: Outbound, allowlist: Allowlist
    ) -> None:
        super().__init__(reaction, outbound.artifactr, outbound.ledger, allowlist, outbound.runner)
        self._attempt = attempt
        self.allowlist = allowlist
        self.outbound = outbound
        """The `Outbound` that made this handle: its stores are the ones the attempt writes to."""
        # relayr's handle holds its reaction strongly; this one is reached from the weak-keyed
        # registry's values, so a strong hold would keep every finished attempt alive.
        self._view = _Attempt(reaction)
        self._reaction = cast(Reaction[Any], self._view)

    @property
    def attempt(self) -> AttemptKey:
        """The attempt this handle acts for."""
        return self._attempt

    def adopt(self, reaction: Reaction[Any]) -> None:
        """Count `reaction` as one of this attempt's, whose checkpoints start new segments."""
        self._view.adopt(reaction)

    @override
    async def notice(self, content: str, *, thread_id: a.ThreadId | None = None) -> a.MessageId:
        """Post a notice (relayr's): for people, starting and steering no turn.

        Raises:
            NotAllowed: If there is no thread to post in, or it is outside the chain and the rule
                may act only in it.
            Refused: If artifactr finds the notice invalid (empty, or holding a NUL).
        """
        with _validated():
            return await super().notice(content, thread_id=thread_id)

    @override
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

        A proposal (id `prp_`) unless the allowlist lets the rule edit the artifact's kind; ids
        and causes as relayr's. Nothing is committed when the artifact already holds the value
        there. A version conflict reads the artifact again, up to `EDIT_TRIES` times in all.

        Raises:
            Refused: With reason `patch_failed` if `path` appends (`/-`) or does not apply; with
                `not_found` if the artifact is missing.
            RunFailure: Retryable (`version_conflict`) if the artifact changed under every
                re-read; permanent (`invalid_state`) if it is archived.
            NotAllowed: If `thread_id` is outside the chain and the rule may act only in it.
        """
        _require_key(path)
        thread = self._where(thread_id)
        proposal_id = ids.PROPOSAL + self._derived(ids.write_key("edit", artifact_id, path))
        ops = ({"op": "add", "path": path, "value": value},)

        async def proposed(workspace: artifactr.Workspace) -> bool:
            return await found(workspace.proposal(proposal_id))

        tries = 0
        while tries < EDIT_TRIES:
            tries += 1
            current = await self._read(artifact_id)
            if current.archived:
                raise _archived(artifact_id)
            if _held(current.data.to_json(), path, value):
                _tally("already")
                return
            version = current.version
            with _validated():
                change = a.EditArtifact(
                    patch=a.JsonPatch(ops=ops),
                    artifact_id=artifact_id,
                    base_version=version,
                    proposal_id=proposal_id,
                    thread_id=thread,
                    summary=summary,
                )
            made = f"{self._actor.client_id}/{artifact_id}@{version + 1}"
            await self._caused(("proposal", proposal_id), ("edit", made))
            command = self._proposed(change, current.data.kind, proposal_id, rationale)
            try:
                await self._write(command, proposed)
                return
            except a.VersionConflict:
                pass
        raise RunFailure(
            f"artifact {artifact_id} kept changing: {EDIT_TRIES} version conflicts in one attempt",
            reason=Reason.VERSION_CONFLICT,
        )

    @override
    async def send(self, content: str, *, thread_id: a.ThreadId | None = None) -> a.MessageId:
        """Send a message that starts the thread's next agent turn, if the allowlist lets it.

        With the `Outbound`'s `turns`, the request for the turn is recorded before the message
        is committed, and turn workers take it until artifactr's Runner has taken the message: no
        stop between commit and ask loses it. With only a `runner`, it is relayr's send.

        Returns:
            The message's id, `msg_` and a digest of the run, the thread and the text (another id
            than a notice of the same text).

        Raises:
            NotAllowed: If the rule may not start turns, the `Outbound` can start none, or there
                is no thread to send in.
        """
        desk = self.outbound.turns
        if desk is None:
            return await super().send(content, thread_id=thread_id)
        rule = self._run.rule
        if not self.allowlist.turns:
            raise NotAllowed(f"{rule} may not start turns; post a notice")
        thread = self._thread(thread_id)
        message_id = ids.MESSAGE + self._derived(ids.write_key("send", thread, content))
        workspace = await self._open()
        await self._caused(("message", message_id))
        if not content:
            raise Refused(a.ValidationFailed("a message needs some text", []))
        request = TurnRequest(
            tenant_id=self.attempt.tenant_id,
            workspace_id=self.attempt.workspace_id,
            thread_id=thread,
            message_id=message_id,
            rule=rule,
            requested_at=datetime.now(UTC),
        )
        try:
            await send_once(
                workspace=workspace,
                requests=desk.requests,
                request=request,
                content=content,
                announce=desk.announce,
            )
        except a.Rejection as rejection:
            raise refusal(rejection) from rejection
        return message_id

    # ─── how ──────────────────────────────────────────────────────────────────

    @property
    def _run(self) -> Run:
        return self._view.run

    def _derived(self, write: ids.WriteKey) -> str:
        """Return the digest of the next such write, by relayr's derivation, counting it."""
        return self._derive(write.op, *write.key)

    @override
    async def _write(
        self, command: a.Command, done: Callable[[artifactr.Workspace], Awaitable[bool]]
    ) -> None:
        """Commit `command` and tally it; a refusal that says its derived id is used is done.

        Raises:
            VersionConflict: For an edit or archive based on a version no longer current.
            RunFailure: If artifactr refuses it otherwise.
        """
        target = await self._open()
        with tracer.start_as_current_span(
            "actonce.write",
            attributes={WRITE_COMMAND: type(command).__name__, WRITE_ID: _claimed_id(command)},
            record_exception=False,
            set_status_on_exception=False,
        ) as span:
            try:
                await target.commit(command)
            except a.VersionConflict:
                _tally("conflicts", span)
                raise
            except a.Rejection as rejection:
                used = isinstance(rejection, a.InvalidState) and await done(target)
                _tally("already" if used else "refused", span)
                if not used:
                    raise refusal(rejection) from rejection
            else:
                _tally("made", span)


def _held(data: JsonValue, path: str, value: JsonValue) -> bool:
    """Whether `data` holds `value` at the JSON Pointer `path`: a JSON Patch `test` passes."""
    try:
        jsonpatch.apply_patch(data, [{"op": "test", "path": path, "value": value}], in_place=True)
    except (jsonpatch.JsonPatchException, jsonpatch.JsonPointerException):
        return False
    return True


def _require_key(path: str) -> None:
    """Refuse an edit whose path names no entry: the whole document, or an append (`-`)."""
    if not path.startswith("/"):
        message = (
            f"an edit sets one value at a JSON Pointer such as '/entries/deploy-42', not {path!r}"
        )
    elif path.rpartition("/")[2] == "-":
        message = (
            f"an edit may not append ({path!r}): a retried append would append again; name the "
            f"entry instead, as '/entries/<key>'"
        )
    else:
        return
    raise Refused(a.PatchFailed(message))


def _archived(artifact_id: str) -> RunFailure:
    """An edit of an archived artifact: permanent, as artifactr would refuse it every time."""
    return RunFailure(f"{artifact_id} is archived", reason=Reason.INVALID_STATE, permanent=True)


def _tally(what: str, span: trace.Span | None = None) -> None:
    if (writes := WRITES.get()) is not None:
        writes[what] += 1
    if span is not None:
        span.set_attribute(WRITE_OUTCOME, what)


def _claimed_id(command: a.Command) -> str:
    """The derived id a write claims: its proposal's, its message's, its artifact's or its
    thread's, the first it has."""
    for field in ("proposal_id", "message_id", "artifact_id", "thread_id"):
        if isinstance(claimed := getattr(command, field, None), str):
            return claimed
    return "-"


WRITE_COMMAND: Final = "actonce.write.command"
WRITE_ID: Final = "actonce.write.id"
WRITE_OUTCOME: Final = "actonce.write.outcome"
"""The attributes of a write's span: artifactr's command, the derived id it claims, and whether
it was `made`, found `already` done, `refused`, or met a version conflict (`conflicts`)."""


@contextlib.contextmanager
def _validated() -> Iterator[None]:
    """Turn artifactr's construction-time validation (pydantic's) into a `Refused`."""
    try:
        yield
    except ValidationError as invalid:
        reason = invalid.errors()[0]["msg"]
        failed = a.ValidationFailed(f"artifactr would refuse this write: {reason}", [])
        raise Refused(failed) from invalid
