"""The world the act-once tests act in: real artifactr and reflexr workspaces, hand-built attempts.

`make_world` sets up a fresh workspace (a fresh id, so the handles of other tests never meet it): in
artifactr a thread, a board, a plan and Alice's message; in reflexr that message, bridged, which
fires `RULE`. `World` makes `Outbound`s and the `Reaction` of attempt N (the run at status running,
epoch N), as reflexr's executor would build it. `Writes` counts what rules wrote, read from
artifactr's own log.
"""

import asyncio
import uuid
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, ClassVar

import artifactr
import artifactr.agent
import artifactr.core as a
import reflexr.workspace as rw
from pydantic import Field
from reflexr import RetryPolicy, SystemActor, on, run
from reflexr.core import Envelope, Rule, Run
from reflexr.workspace import Reaction, Reactor
from relayr.events import BRIDGED, MessagePosted
from relayr.inbound import SOURCE
from relayr.ledger import InMemoryLedger, Ledger

from actonce.tasks import Allowlist, Outbound

TENANT = "acme"
RULE = "ops:log"
THREAD = "thr_incident"
RUN_ID = "fir_test"
ALICE = a.UserActor(id="alice", name="Alice")
BOARD = "art_board"
PLAN = "art_plan"


class Board(a.Artifact, name="actonce_board"):
    """A kind the rule writes directly: entries keyed by id, and a list nobody may append to."""

    entries: dict[str, str] = Field(default_factory=dict)
    items: list[str] = Field(default_factory=list)


class Plan(a.Artifact, name="actonce_plan"):
    """A kind the rule changes only by proposal."""

    write_policy: ClassVar[a.WritePolicy] = "propose"
    steps: dict[str, str] = Field(default_factory=dict)


ALLOWLIST = Allowlist(direct=frozenset({"actonce_board"}), create_threads=True)
"""The rule's allowlist in most tests: boards directly, plans by proposal, threads allowed."""


@dataclass(frozen=True)
class Writes:
    """What rules wrote into one artifactr workspace, counted from its log."""

    messages: Counter[str] = field(default_factory=Counter)
    """`message_posted` by message id."""
    artifacts: Counter[str] = field(default_factory=Counter)
    """`artifact_created` by artifact id."""
    proposals: Counter[str] = field(default_factory=Counter)
    """`proposal_created` by proposal id."""
    changes: Counter[tuple[str, str]] = field(default_factory=Counter)
    """`artifact_changed` and `artifact_archived` by artifact id and what changed."""
    threads: Counter[str] = field(default_factory=Counter)
    """`thread_created` by thread id."""

    def all(self) -> Counter[str]:
        """Every write, by what identifies it."""
        every: Counter[str] = Counter()
        for name, counts in vars(self).items():
            for key, n in counts.items():
                every[f"{name}:{key}"] += n
        return every

    def duplicated(self) -> list[str]:
        """The writes that landed more than once."""
        return [key for key, n in self.all().items() if n > 1]


async def rule_writes(workspace: artifactr.Workspace) -> Writes:
    """Count the writes of rules' actors in a workspace's log."""
    writes = Writes()
    for envelope in await workspace.read():
        if not getattr(envelope.actor, "client_id", "").startswith("reflexr:"):
            continue
        match envelope.event:
            case a.MessagePosted(message_id=message_id):
                writes.messages[message_id] += 1
            case a.ArtifactCreated(artifact_id=artifact_id):
                writes.artifacts[artifact_id] += 1
            case a.ProposalCreated(proposal_id=proposal_id):
                writes.proposals[proposal_id] += 1
            case a.ArtifactChanged(artifact_id=artifact_id, patch=patch):
                writes.changes[(artifact_id, patch.model_dump_json())] += 1
            case a.ArtifactArchived(artifact_id=artifact_id):
                writes.changes[(artifact_id, "archived")] += 1
            case a.ThreadCreated(thread_id=thread_id):
                writes.threads[thread_id] += 1
            case _:
                pass
    return writes


@dataclass
class World:
    """One workspace in both libraries, where Alice's message in `THREAD` fired `RULE`."""

    artifactr: artifactr.Workspaces
    reflexr: rw.Workspaces
    ledger: Ledger
    workspace_id: str
    people: artifactr.Workspace
    """Alice's handle on the artifactr workspace."""
    automation: rw.Workspace
    """The reflexr workspace, as the system."""
    fired_by: tuple[Envelope, ...]
    """The bridged message that made the rule fire."""
    rule: Rule

    def outbound(
        self,
        allowlist: Allowlist | None = ALLOWLIST,
        *,
        runner: artifactr.agent.Runner[Any] | None = None,
        ledger: Ledger | None = None,
    ) -> Outbound:
        """Return an `Outbound` over this world's stores, with `allowlist` for `RULE`."""
        allowlists = {} if allowlist is None else {RULE: allowlist}
        return Outbound(self.artifactr, ledger or self.ledger, allowlists=allowlists, runner=runner)

    def run(self, epoch: int = 1, *, run_id: str = RUN_ID, checkpoints: int = 0) -> Run:
        """Return the run as reflexr's executor hands it to attempt `epoch`: running, fenced."""
        now = datetime.now(UTC)
        return Run(
            id=run_id,
            rule=RULE,
            scope_key="",
            scope={},
            fired_seq=self.fired_by[0].seq,
            matched=(self.fired_by[0].seq,),
            correlation_id=self.fired_by[0].id,
            depth=2,
            next_attempt_at=now,
            created_at=now,
            updated_at=now,
            status="running",
            attempts=epoch,
            epoch=epoch,
            checkpoints=checkpoints,
        )

    def reaction(self, epoch: int = 1, **run: Any) -> Reaction[None]:
        """Return a `Reaction` of attempt `epoch` of the run."""
        return Reaction(
            workspace=self.automation,
            run=self.run(epoch, **run),
            rule=self.rule,
            events=self.fired_by,
            deps=None,
        )

    async def writes(self) -> Writes:
        """What rules wrote so far."""
        return await rule_writes(self.people)


def retried_rule(action: str = "log", *, max_attempts: int = 3) -> Rule:
    """Return `RULE`, fired by a chat message and retried soon after a failure."""
    return Rule(
        name=RULE,
        when=on(MessagePosted),
        then=run(action),
        retry=RetryPolicy(max_attempts=max_attempts, backoff=timedelta(milliseconds=5)),
        start="beginning",
    )


async def set_up_people(collab: artifactr.Workspaces, workspace_id: str) -> artifactr.Workspace:
    """Set up what people made in artifactr: a thread, a board, a plan, and Alice's message."""
    people = await collab.open(TENANT, workspace_id, actor=ALICE)
    await people.commit(a.CreateThread(thread_id=THREAD, title="Incident 42"))
    await people.create(Board(), artifact_id=BOARD)
    await people.create(Plan(), artifact_id=PLAN)
    await people.post_message(THREAD, "deploy 42 failed", message_id="msg_alice")
    return people


async def make_world(
    collab: artifactr.Workspaces, *, ledger: Ledger | None = None, rule: Rule | None = None
) -> World:
    """Set up a fresh workspace in both libraries, where Alice's message fires the rule."""
    workspace_id = f"ws_{uuid.uuid4().hex[:12]}"
    people = await set_up_people(collab, workspace_id)
    chosen = rule or Rule(name=RULE, when=on(MessagePosted), then=run("log"))
    automation = rw.Workspaces(
        rw.InMemoryStorage(), events=BRIDGED, publishers={"artifactr": [SOURCE]}, rules=[chosen]
    )
    bridge = await automation.open(TENANT, workspace_id, actor=SOURCE)
    await bridge.publish(
        MessagePosted(
            author=ALICE, thread_id=THREAD, message_id="msg_alice", content="deploy 42 failed"
        )
    )
    system = await automation.open(TENANT, workspace_id, actor=SystemActor(name="tests"))
    return World(
        artifactr=collab,
        reflexr=automation,
        ledger=ledger or InMemoryLedger(),
        workspace_id=workspace_id,
        people=people,
        automation=system,
        fired_by=tuple(await system.read()),
        rule=chosen,
    )


async def settled(reactor: Reactor[Any], world: World) -> Run:
    """Settle until the rule's one run succeeded or is dead, past its retries' backoff."""
    for _ in range(200):
        await reactor.settle()
        runs = await world.automation.runs()
        if runs and all(r.status in ("succeeded", "dead") for r in runs):
            [the_run] = runs
            return the_run
        await asyncio.sleep(0.005)
    raise TimeoutError(f"the run did not finish: {runs}")


NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
"""A fixed time for runs built in memory."""


def a_run(
    status: str,
    *,
    next_attempt_at: datetime = NOW,
    attempts: int = 1,
    reason: str | None = None,
) -> Run:
    """Return a run of `demo:work` in `status`, next due at `next_attempt_at`, built in memory
    as reflexr would leave it; `reason` is its last failure's."""
    return Run.model_validate(
        {
            "id": "fir_0123456789abcdef",
            "rule": "demo:work",
            "scope_key": "",
            "scope": {},
            "fired_seq": 1,
            "matched": (1,),
            "correlation_id": "cor_1",
            "status": status,
            "attempts": attempts,
            "reason": reason,
            "next_attempt_at": next_attempt_at,
            "created_at": NOW - timedelta(minutes=1),
            "updated_at": NOW,
        }
    )
