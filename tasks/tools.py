"""The agent's tools: the six writes and reads of `RunActions`, for a pydantic-ai agent.

Each tool acts through `outbound.acting(ctx.deps)`, the attempt's one handle, so an agent's writes
are made once however often its run is retried, and whatever order, or concurrency, its model
calls them in on the retry. A `Refused` or `NotAllowed` goes back to the model as a retry prompt
with the refusal's message (it may do otherwise); any other failure is not the model's to fix and
ends the attempt, as reflexr records it.
"""

import json
from dataclasses import dataclass, field
from typing import Any, Final, override

import artifactr.core as a
from pydantic import JsonValue
from pydantic_ai import FunctionToolset, ModelRetry, RunContext
from pydantic_ai.capabilities import AbstractCapability
from reflexr.workspace import Reaction

from actonce.tasks.errors import NotAllowed, Refused
from actonce.tasks.outbound import Outbound

TOOL_RETRIES: Final = 3
"""How many refusals of one tool the model is handed back before the attempt fails."""

INSTRUCTIONS: Final = (
    "You act in the chat workspace as this rule's own participant. Your changes to artifacts are "
    "proposals for people to review, unless your rule may make them directly. An edit sets one "
    "value at one key (a JSON Pointer such as /entries/<key>); it cannot append to a list, so "
    "name each entry. Post a notice to tell people something: it starts no conversation with "
    "the assistant."
)
"""What the agent is told about acting through these tools."""

# Tools annotate their context as RunContext[...] literally: pydantic-ai finds context-taking
# tools by that annotation, and an alias would hide it.


def artifactr_tools(outbound: Outbound) -> FunctionToolset[Reaction[Any]]:
    """Return the tools for acting in artifactr through `outbound`'s handle of each attempt."""
    toolset = FunctionToolset[Reaction[Any]](max_retries=TOOL_RETRIES)

    @toolset.tool
    async def read_artifact(ctx: RunContext[Reaction[Any]], artifact_id: str) -> str:
        """Read an artifact's current version: its kind, version and data, as JSON.

        Args:
            artifact_id: The artifact, as `art_...`.
        """
        try:
            current = await outbound.acting(ctx.deps).read(artifact_id)
        except Refused as refused:
            raise ModelRetry(str(refused)) from refused
        data = current.data.to_json()
        return json.dumps({"kind": current.data.kind, "version": current.version, "data": data})

    @toolset.tool
    async def create_artifact(
        ctx: RunContext[Reaction[Any]],
        kind: str,
        data: dict[str, JsonValue],
        thread_id: str | None = None,
        rationale: str | None = None,
    ) -> str:
        """Create an artifact, as a proposal unless your rule may create its kind directly.

        Creating the same kind with the same data again in this run makes no second artifact.

        Args:
            kind: The artifact's kind.
            data: Its data.
            thread_id: The thread it is made from; by default the one that fired the rule.
            rationale: Why, for the people who review the proposal.
        """
        try:
            artifact = a.load_artifact(kind, data)
            acting = outbound.acting(ctx.deps)
            return await acting.create(artifact, thread_id=thread_id, rationale=rationale)
        except (NotAllowed, Refused, a.NotFound, a.ValidationFailed) as refused:
            raise ModelRetry(str(refused)) from refused

    @toolset.tool
    async def edit_artifact(
        ctx: RunContext[Reaction[Any]],
        artifact_id: str,
        path: str,
        value: JsonValue,
        summary: str | None = None,
        thread_id: str | None = None,
        rationale: str | None = None,
    ) -> str:
        """Set one value at one key of an artifact, as a proposal unless your rule may edit it.

        The edit is keyed: `path` names the entry, and setting a value that is already there
        changes nothing. Appending to a list (a path ending in `/-`) is refused: name the entry.

        Args:
            artifact_id: The artifact, as `art_...`.
            path: Where, as a JSON Pointer naming the entry, such as `/entries/deploy-42`.
            value: The value to set there.
            summary: What the change does.
            thread_id: The thread it is made from; by default the one that fired the rule.
            rationale: Why, for the people who review the proposal.
        """
        try:
            acting = outbound.acting(ctx.deps)
            await acting.edit(
                artifact_id,
                path,
                value,
                summary=summary,
                thread_id=thread_id,
                rationale=rationale,
            )
        except (NotAllowed, Refused) as refused:
            raise ModelRetry(str(refused)) from refused
        return "Done."

    @toolset.tool
    async def post_notice(
        ctx: RunContext[Reaction[Any]], content: str, thread_id: str | None = None
    ) -> str:
        """Post a notice in a thread, for people: it starts no turn of the assistant.

        Args:
            content: What it says.
            thread_id: Where; by default the thread that fired the rule.
        """
        try:
            return await outbound.acting(ctx.deps).notice(content, thread_id=thread_id)
        except (NotAllowed, Refused) as refused:
            raise ModelRetry(str(refused)) from refused

    @toolset.tool
    async def create_thread(ctx: RunContext[Reaction[Any]], title: str) -> str:
        """Create a thread, if your rule may, and return its id.

        Args:
            title: Its title.
        """
        try:
            return await outbound.acting(ctx.deps).create_thread(title)
        except (NotAllowed, Refused) as refused:
            raise ModelRetry(str(refused)) from refused

    @toolset.tool
    async def send_message(
        ctx: RunContext[Reaction[Any]], content: str, thread_id: str | None = None
    ) -> str:
        """Send a message that starts the assistant's next turn in a thread, if your rule may.

        Args:
            content: What it says.
            thread_id: Where; by default the thread that fired the rule.
        """
        try:
            return await outbound.acting(ctx.deps).send(content, thread_id=thread_id)
        except (NotAllowed, Refused) as refused:
            raise ModelRetry(str(refused)) from refused

    return toolset


@dataclass
class ArtifactrCapability(AbstractCapability[Reaction[Any]]):
    """Give a rule's agent the tools to read and write artifactr through the attempt's handle.

    Add it to an agent whose `deps_type` is reflexr's `Reaction`, wrapped in reflexr's
    `AgentAction`. Build it with the process's `Outbound`; any other `Outbound` of the process
    would share the handle too.

    Args:
        outbound: The adapter the tools act through.
    """

    outbound: Outbound
    _toolset: FunctionToolset[Reaction[Any]] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._toolset = artifactr_tools(self.outbound)

    @override
    def get_toolset(self) -> FunctionToolset[Reaction[Any]]:
        """Return the tools for acting in artifactr."""
        return self._toolset

    @override
    def get_instructions(self) -> str:
        """Return the instructions: how the agent's writes reach people, and the keyed-edit rule."""
        return INSTRUCTIONS
