"""The demo definition: a `WorkRequested` event fires `demo:work`, whose run makes every kind of
write, and a message in a thread fires `demo:chat`, whose run answers in that thread.

`WorkRequested` says how its run should misbehave, so the pool's retries and dead letters can be
watched: `fail_first` fails attempt 1 after all its writes (a retry must write nothing new),
`refuse_first` makes attempt 1 edit an artifact that does not exist (Refused → retried), `die`
makes every attempt try what its allowlist forbids (NotAllowed → dead-lettered at once), and
`flaky` fails every attempt (the attempts run out → dead-lettered). Two knobs serve the pool's
tests: `slow_s` makes attempt 1 sleep after its first write (the notice), so a worker can be
killed in the middle of it, and `needs` names an artifact whose absence makes every attempt fail
permanently after the notice (`missing_prerequisite`): create it, replay the dead letter, and
the run succeeds without posting its notice twice.
"""

import asyncio
from datetime import timedelta
from typing import Any, ClassVar

import artifactr
from artifactr import ArtifactWorkspace, Session
from artifactr.agent import function_model
from pydantic_ai import Agent
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart
from pydantic_ai.models.function import AgentInfo
from reflexr import F, RetryPolicy, Rule, on, run
from reflexr.core import Event
from reflexr.workspace import Action, Reaction, RunFailure
from relayr.events import MessagePosted

from actonce.tasks import Allowlist, Outbound, Refused, RunActions
from actonce.worker.definition import Definition, Deps

TIMELINE_ID = "art_demo_timeline"
"""The timeline every run logs its key in (direct, keyed by the event's key)."""

RUNBOOK_ID = "art_demo_runbook"
"""The runbook every run proposes a step for (by proposal, keyed by the event's key)."""

THREAD_ID = "thr_demo"
"""The thread runs post their notices in."""

PREREQUISITE_ID = "art_demo_prerequisite"
"""The artifact the demo's one dead run needs (`needs`): `python -m demo --fix WORKSPACE`
creates it, after which `actonce dead replay` settles the run."""


class DemoEvent(Event, abstract=True, event_namespace="demo"):
    """The demo's own events."""


class WorkRequested(DemoEvent, name="work.requested"):
    """Someone asks for a piece of work, named by `key`."""

    key: str
    thread_id: str = THREAD_ID
    fail_first: bool = False
    refuse_first: bool = False
    die: bool = False
    flaky: bool = False
    slow_s: float = 0.0
    ask: bool = False
    needs: str | None = None


class Timeline(artifactr.Artifact, name="demo_timeline"):
    """A direct-write log, one entry per key."""

    write_policy: ClassVar[artifactr.WritePolicy] = "direct"
    entries: dict[str, str] = {}


class Runbook(artifactr.Artifact, name="demo_runbook"):
    """Steps people review: a rule's changes to it are proposals."""

    write_policy: ClassVar[artifactr.WritePolicy] = "propose"
    steps: dict[str, str] = {}


class Receipt(artifactr.Artifact, name="demo_receipt"):
    """One per piece of work: created by its run."""

    write_policy: ClassVar[artifactr.WritePolicy] = "direct"
    key: str
    done_by: str


async def work(reaction: Reaction[Deps]) -> dict[str, str]:
    """Log the work: a notice, a receipt, a keyed timeline entry and a proposed runbook step."""
    event = reaction.events[0].event
    assert isinstance(event, WorkRequested)
    acting = reaction.deps.outbound.acting(reaction)
    if event.die:
        await acting.create_thread(f"escalation {event.key}")  # not allowed: dead at once
    if event.refuse_first and reaction.attempt == 1:
        await acting.edit("art_missing", f"/entries/{event.key}", "x")  # Refused: not_found
    notice = await acting.notice(f"Working on {event.key}.", thread_id=event.thread_id)
    if event.ask:  # a message that asks the thread's assistant for a turn, taken by turn workers
        await acting.send(f"Please summarise {event.key}.", thread_id=event.thread_id)
    if event.slow_s and reaction.attempt == 1:
        await asyncio.sleep(event.slow_s)  # a window to kill the worker in, after a write
    if event.needs is not None:
        await _require(acting, event.needs)
    receipt = await acting.create(Receipt(key=event.key, done_by=reaction.run.rule))
    await acting.edit(TIMELINE_ID, f"/entries/{event.key}", f"done by {reaction.run_id}")
    await acting.edit(RUNBOOK_ID, f"/steps/{event.key}", f"check {event.key}")
    if event.flaky or (event.fail_first and reaction.attempt == 1):
        raise RuntimeError(f"attempt {reaction.attempt} failed after its writes (by design)")
    return {"notice": notice, "receipt": receipt}


async def _require(acting: RunActions, artifact_id: str) -> None:
    """Fail the run permanently unless `artifact_id` exists: a cause an operator can fix."""
    try:
        await acting.read(artifact_id)
    except Refused as missing:
        raise RunFailure(
            f"{artifact_id} does not exist yet: create it, then replay this run",
            reason="missing_prerequisite",
            permanent=True,
        ) from missing


async def chat(reaction: Reaction[Deps]) -> dict[str, str]:
    """Answer a message in its own thread with a notice."""
    event = reaction.events[0].event
    assert isinstance(event, MessagePosted)
    acting = reaction.deps.outbound.acting(reaction)
    notice = await acting.notice(f"Noted: {len(event.content)} characters from you.")
    return {"notice": notice}


def assistant_reply(messages: list[ModelMessage], _: AgentInfo) -> ModelResponse:
    """The demo assistant's model: a scripted reply, so turns need no network or key."""
    return ModelResponse(parts=[TextPart(f"Summary #{len(messages)}: noted.")])


def turn_agent() -> Agent[Session[None], str]:
    """Build the agent that takes the demo thread's turns, in turn workers."""
    return Agent(
        function_model(assistant_reply),  # streams, as the Runner needs
        deps_type=Session[None],
        capabilities=[ArtifactWorkspace(types=[Timeline, Runbook, Receipt])],
    )


def actions(_: Outbound) -> dict[str, Action[Any]]:
    """The demo's actions by name."""
    return {"demo-work": work, "demo-chat": chat}


RULES = [
    Rule(
        name="demo:work",
        when=on(WorkRequested),
        then=run("demo-work"),
        retry=RetryPolicy(max_attempts=3, backoff=timedelta(milliseconds=500)),
        timeout=timedelta(seconds=60),
        ordering="none",
    ),
    Rule(
        name="demo:chat",
        when=on(MessagePosted).where(F.kind.eq("message")),
        then=run("demo-chat"),
        retry=RetryPolicy(max_attempts=3, backoff=timedelta(milliseconds=500)),
        timeout=timedelta(seconds=60),
        ordering="none",
    ),
]

app = Definition(
    rules=RULES,
    actions=actions,
    events=[WorkRequested],
    artifact_types=[Timeline, Runbook, Receipt],
    turn_agent=turn_agent,
    allowlists={
        "demo:work": Allowlist(
            direct=frozenset({"demo_timeline", "demo_receipt"}), threads="any", turns=True
        ),
        "demo:chat": Allowlist(),
    },
)
"""The demo definition: `ACTONCE_APP=demo.definition:app`."""
