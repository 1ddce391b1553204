"""An agent's tools act once per write, whatever order or concurrency its model calls them in.

A real reflexr run: a rule fired by a bridged chat message runs `AgentAction` over a pydantic-ai
agent with `ArtifactrCapability`, its model a scripted `FunctionModel`, in a reactor, retried under
the rule's `RetryPolicy`. On attempt 1 the model calls the tools one at a time and then fails; on
attempt 2 it calls them all at once, in another order. A `Refused` goes back to the model as a
retry carrying the refusal's message; a permanent refusal ends the run dead with its reason.
"""

import json
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import artifactr
import artifactr.core as a
import pytest
from pydantic_ai import Agent
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    RetryPromptPart,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel
from reflexr.agent import AgentAction
from reflexr.workspace import Reaction, Reactor
from worlds import BOARD, PLAN, Board, Plan, World, make_world, retried_rule, settled

from actonce.tasks import ArtifactrCapability, Outbound

pytestmark = pytest.mark.anyio

CALLS: tuple[tuple[str, dict[str, Any]], ...] = (
    ("create_artifact", {"kind": "actonce_board", "data": {"entries": {"a": "1"}}}),
    ("create_artifact", {"kind": "actonce_plan", "data": {"steps": {"a": "1"}}}),
    ("edit_artifact", {"artifact_id": BOARD, "path": "/entries/deploy-42", "value": "failed"}),
    ("edit_artifact", {"artifact_id": PLAN, "path": "/steps/rollback", "value": "now"}),
    ("post_notice", {"content": "Deploy 42 failed."}),
    ("post_notice", {"content": "Deploy 42 failed."}),
    ("create_thread", {"title": "Postmortem"}),
    ("read_artifact", {"artifact_id": BOARD}),
)
"""What the agent does: one of each write, an identical notice twice, and a read."""


def _attempt(messages: list[ModelMessage]) -> int:
    """Which attempt the model is in: the prompt says it."""
    first = messages[0]
    assert isinstance(first, ModelRequest)
    return int(str(first.parts[-1].content).rsplit(" ", 1)[-1])


def _returned(messages: list[ModelMessage]) -> list[ToolReturnPart | RetryPromptPart]:
    return [
        part
        for message in messages
        if isinstance(message, ModelRequest)
        for part in message.parts
        if isinstance(part, ToolReturnPart | RetryPromptPart)
    ]


@dataclass
class Script:
    """A model that calls `CALLS` one at a time and then fails on attempt 1, and at once after."""

    seen: dict[int, list[ToolReturnPart | RetryPromptPart]] = field(default_factory=dict)

    def __call__(self, messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        attempt = _attempt(messages)
        returned = self.seen[attempt] = _returned(messages)
        if attempt == 1:
            if len(returned) < len(CALLS):
                name, args = CALLS[len(returned)]
                return ModelResponse(parts=[ToolCallPart(name, args)])
            raise RuntimeError("the model's provider went away after the tools ran")
        if not returned:
            return ModelResponse(parts=[ToolCallPart(name, args) for name, args in CALLS[::-1]])
        return ModelResponse(parts=[TextPart("Done.")])


def _reactor(world: World, outbound: Outbound, model: Any) -> Reactor[None]:
    agent = Agent(
        FunctionModel(model),
        deps_type=Reaction,
        capabilities=[ArtifactrCapability(outbound)],
        name="notes",
    )
    action = AgentAction(agent, prompt=lambda reaction: f"attempt {reaction.attempt}")
    return Reactor(world.reflexr, actions={"notes": action})


async def _world(authorize: Any = None) -> World:
    collab = artifactr.Workspaces(
        artifactr.InMemoryStorage(), types=[Board, Plan], authorize=authorize
    )
    return await make_world(collab, rule=retried_rule("notes"))


def _ids(parts: list[ToolReturnPart | RetryPromptPart]) -> Counter[str]:
    """The ids the tools returned, and the reads' versions."""
    ids: Counter[str] = Counter()
    for part in parts:
        assert isinstance(part, ToolReturnPart) and part.outcome == "success", part
        content = str(part.content)
        ids[str(json.loads(content)["version"]) if content.startswith("{") else content] += 1
    return ids


async def test_an_agent_retried_with_its_tools_in_another_order_and_at_once_writes_once() -> None:
    world = await _world()
    script = Script()

    run = await settled(_reactor(world, world.outbound(), script), world)

    assert (run.status, run.attempts) == ("succeeded", 2), run.error
    assert len(script.seen[1]) == len(script.seen[2]) == len(CALLS)
    writes = await world.writes()
    assert not writes.duplicated(), f"written twice: {writes.duplicated()}"
    assert (len(writes.artifacts), len(writes.proposals), len(writes.messages)) == (1, 2, 2)
    assert (sum(writes.changes.values()), len(writes.threads)) == (1, 1)
    assert _ids(script.seen[2]) == _ids(script.seen[1]), "the retry's tools returned other ids"


async def test_a_refused_tool_call_goes_back_to_the_model_with_the_refusals_message() -> None:
    world = await _world()
    seen: list[ToolReturnPart | RetryPromptPart] = []

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        returned = _returned(messages)
        if not returned:
            edit = {"artifact_id": "art_missing", "path": "/entries/k", "value": "v"}
            return ModelResponse(parts=[ToolCallPart("edit_artifact", edit)])
        seen.extend(returned)
        if len(returned) == 1:
            notice = {"content": "Could not find the artifact; noted here instead."}
            return ModelResponse(parts=[ToolCallPart("post_notice", notice)])
        return ModelResponse(parts=[TextPart("Done.")])

    run = await settled(_reactor(world, world.outbound(), model), world)

    assert (run.status, run.attempts) == ("succeeded", 1), run.error
    refusal = seen[0]
    retried = isinstance(refusal, RetryPromptPart) or refusal.outcome == "retried"
    assert retried, f"the refusal came back as {refusal!r}"
    assert refusal.content == "artifact art_missing does not exist"  # artifactr's NotFound
    assert len((await world.writes()).messages) == 1


async def _refuse_rules(tenant: str, workspace: str | None, actor: a.Actor, access: Any) -> bool:
    """Let people do anything, and rules only open and read."""
    rule = getattr(actor, "client_id", "").startswith("reflexr:")
    return (
        not rule or access.action == "artifactr:open" or access.action.startswith("artifactr:read")
    )


async def test_a_forbidden_tool_call_ends_the_run_dead_with_reason_forbidden() -> None:
    world = await _world(authorize=_refuse_rules)
    calls = 0

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        nonlocal calls
        calls += 1
        return ModelResponse(parts=[ToolCallPart("post_notice", {"content": "hello"})])

    run = await settled(_reactor(world, world.outbound(), model), world)

    assert (run.status, run.reason, run.attempts) == ("dead", "forbidden", 1), run.error
    assert calls == 1, "the model was handed a refusal it cannot fix"
    assert not (await world.writes()).all()
