"""A definition whose writes and failures carry the text they were given: the leak test's probe.

`ACTONCE_APP=bench.leaky:app`. One rule, `leaky:probe`, runs on a `ProbeRequested` whose
`marker` is a string the leak test then looks for everywhere data could leave the database. Every
run creates a thread and a notebook holding the marker, posts a notice and makes a keyed edit
with it, then ends as `ending` says:

- `succeed`: it succeeds;
- `patch_failed`: an edit under a key that does not exist, which artifactr refuses with a
  `PatchFailed` whose text quotes the notebook's data (the marker): retried, then dead-lettered
  (`attempts_exhausted`);
- `raise`: a `RuntimeError` whose message holds the marker: retried, then dead-lettered;
- `permanent`: a permanent `RunFailure` whose message holds the marker: dead-lettered at once.

A second rule, `leaky:ask`, runs on an `AskRequested`: it opens a thread and sends its
assistant `marker` (`send`), so a turn worker takes the turn. The turn agent's model answers with
`reply_marker(marker)`, a string found nowhere else, and ends as the event's `turn` says:

- `reply`: it answers, and the reply is posted;
- `raise`: the model raises an error whose message holds both markers: artifactr records the
  turn `failed`, the message taken;
- `refuse`: it answers, but the agent records nothing (its `ArtifactWorkspace` run hook steps
  aside for this message), so the message is never taken: with `ACTONCE_TURN_MAX_ASKS=1` the
  request is dead-lettered `turn_not_taken` at its first ask.

The demo's definition stays as it is; this one exists to be looked for.
"""

import re
from datetime import timedelta
from typing import Any, ClassVar, Literal

import artifactr
from artifactr import ArtifactWorkspace, Session
from artifactr.agent import function_model
from pydantic import Field
from pydantic_ai import Agent
from pydantic_ai.messages import ModelMessage, ModelRequest, ModelResponse, TextPart, UserPromptPart
from pydantic_ai.models.function import AgentInfo
from reflexr import RetryPolicy, Rule, on, run
from reflexr.core import Event
from reflexr.workspace import Action, Reaction, RunFailure

from actonce.tasks import Allowlist, Outbound
from actonce.worker.definition import Definition, Deps

type Ending = Literal["succeed", "patch_failed", "raise", "permanent"]

type TurnEnding = Literal["reply", "raise", "refuse"]

_ASKED = re.compile(r"\b(reply|raise|refuse) (\S+)")
"""What a sent message says: how its turn ends, then the marker."""


class ProbeEvent(Event, abstract=True, event_namespace="leaky"):
    """The probe's own events."""


class ProbeRequested(ProbeEvent, name="probe.requested"):
    """A run whose writes and failure carry `marker`, ending as `ending` says."""

    key: str
    marker: str
    ending: Ending = "succeed"


class Notebook(artifactr.Artifact, name="leaky_notebook"):
    """Keyed entries, edited directly: the marker is written into it."""

    write_policy: ClassVar[artifactr.WritePolicy] = "direct"
    entries: dict[str, str] = Field(default_factory=dict)


async def probe(reaction: Reaction[Deps]) -> dict[str, str]:
    """Write the marker in a notice, a created notebook and a keyed edit; then end as asked."""
    event = reaction.events[0].event
    assert isinstance(event, ProbeRequested)
    acting = reaction.deps.outbound.acting(reaction)
    thread = await acting.create_thread(f"probe {event.key} {event.marker}")
    notice = await acting.notice(f"notice {event.marker}", thread_id=thread)
    notebook = await acting.create(Notebook(entries={"created": f"created {event.marker}"}))
    await acting.edit(notebook, f"/entries/{event.key}", f"edited {event.marker}")
    if event.ending == "patch_failed":
        # The parent key is missing: artifactr's PatchFailed quotes the entries it looked in.
        await acting.edit(notebook, f"/entries/missing-{event.key}/deeper", "x")
    elif event.ending == "raise":
        raise RuntimeError(f"the action failed on {event.marker}")
    elif event.ending == "permanent":
        raise RunFailure(f"gave up on {event.marker}", reason="probe_refused", permanent=True)
    return {"notice": notice, "notebook": notebook}


class AskRequested(ProbeEvent, name="ask.requested"):
    """A run that sends a thread's assistant `marker`, whose turn ends as `turn` says."""

    key: str
    marker: str
    turn: TurnEnding = "reply"


def reply_marker(marker: str) -> str:
    """Return what the assistant answers to a message holding `marker`: the marker reversed, so
    neither holds the other, and a search for one never finds it in the other."""
    return "REPLY" + marker[::-1]


async def ask(reaction: Reaction[Deps]) -> dict[str, str]:
    """Open a thread and send its assistant the marker; return how the turn should end, and the
    thread's and message's ids."""
    event = reaction.events[0].event
    assert isinstance(event, AskRequested)
    acting = reaction.deps.outbound.acting(reaction)
    thread = await acting.create_thread(f"ask {event.key}")
    message = await acting.send(f"{event.turn} {event.marker}", thread_id=thread)
    return {"turn": event.turn, "thread": thread, "message": message}


def _asked(messages: list[ModelMessage]) -> tuple[str, str]:
    """How the turn should end and the marker, from the messages the turn was prompted with."""
    said = " ".join(
        part.content
        for message in messages
        if isinstance(message, ModelRequest)
        for part in message.parts
        if isinstance(part, UserPromptPart) and isinstance(part.content, str)
    )
    found = _ASKED.findall(said)
    assert found, "the turn was prompted with no message of the ask rule's"
    turn, marker = found[-1]
    return turn, marker


def _endings(texts: list[str]) -> list[str]:
    """How the turns the ask rule's messages among `texts` ask for should end."""
    return [turn for text in texts for turn, _ in _ASKED.findall(text)]


def assistant_reply(messages: list[ModelMessage], _: AgentInfo) -> ModelResponse:
    """The assistant's model: the reply marker, or an error holding both markers."""
    turn, marker = _asked(messages)
    if turn == "raise":
        raise RuntimeError(f"the model failed on {marker}: {reply_marker(marker)}")
    return ModelResponse(parts=[TextPart(f"the answer is {reply_marker(marker)}")])


class _RefusingWorkspace(ArtifactWorkspace):
    """The capability, stepping aside for a `refuse` message: its turn runs the model and records
    nothing, so the message is never taken."""

    async def wrap_run(self, ctx: Any, *, handler: Any) -> Any:
        prompt = ctx.prompt if isinstance(ctx.prompt, list) else [ctx.prompt]
        if _endings([text for text in prompt if isinstance(text, str)]) == ["refuse"]:
            return await handler()
        return await super().wrap_run(ctx, handler=handler)


def turn_agent() -> Agent[Session[None], str]:
    """Build the agent that takes the ask rule's turns, in turn workers."""
    return Agent(
        function_model(assistant_reply),
        deps_type=Session[None],
        capabilities=[_RefusingWorkspace(types=[Notebook])],
    )


def actions(_: Outbound) -> dict[str, Action[Any]]:
    """The probe's actions by name."""
    return {"leaky-probe": probe, "leaky-ask": ask}


app = Definition(
    rules=[
        Rule(
            name="leaky:probe",
            when=on(ProbeRequested),
            then=run("leaky-probe"),
            retry=RetryPolicy(max_attempts=2, backoff=timedelta(milliseconds=200)),
            timeout=timedelta(seconds=30),
            ordering="none",
        ),
        Rule(
            name="leaky:ask",
            when=on(AskRequested),
            then=run("leaky-ask"),
            retry=RetryPolicy(max_attempts=2, backoff=timedelta(milliseconds=200)),
            timeout=timedelta(seconds=30),
            ordering="none",
        ),
    ],
    actions=actions,
    events=[ProbeRequested, AskRequested],
    artifact_types=[Notebook],
    turn_agent=turn_agent,
    allowlists={
        "leaky:probe": Allowlist(
            direct=frozenset({"leaky_notebook"}), threads="any", create_threads=True
        ),
        "leaky:ask": Allowlist(threads="any", create_threads=True, turns=True),
    },
)
"""The probe's definition: `ACTONCE_APP=bench.leaky:app`."""
