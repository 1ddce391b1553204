"""Definitions for the turn tests' pools: the demo's, with turn agents whose model calls are
counted across processes, and that take their messages or never do.

Each model call appends a line to the file `TURN_APPS_CALLS_FILE` names (a test's own), so a
test counts the calls every turn worker made. `never_takes` has the `ArtifactWorkspace`
capability, so workers start, but its `wrap_run` hook records nothing: every turn runs the model
and leaves the message untaken, as an agent without the capability did. `no_capability` lacks
it, and workers refuse to start. `held` counts its call, then holds the turn in the model until
the file `TURN_APPS_RELEASE_FILE` names exists, so a test can act while a turn runs. `stuck`
runs `demo:work` as the demo does up to its notice, then sleeps on at every attempt; `blocking`
blocks its thread after the notice at its first attempt, and runs as the demo after.
"""

import asyncio
import dataclasses
import os
import time
from pathlib import Path
from typing import Any

import artifactr
from artifactr import ArtifactWorkspace, Session
from artifactr.agent import function_model
from pydantic_ai import Agent
from pydantic_ai.messages import ModelMessage, ModelResponse
from pydantic_ai.models.function import AgentInfo
from reflexr.workspace import Action, Reaction

from actonce.tasks import Outbound
from actonce.worker.definition import Deps
from demo import definition as demo

CALLS_FILE = "TURN_APPS_CALLS_FILE"
"""The variable naming the file each model call appends a line to."""

RELEASE_FILE = "TURN_APPS_RELEASE_FILE"
"""The variable naming the file whose existence lets `held`'s model call answer."""

HELD_AT_MOST_S = 120.0
"""How long `held` waits for its release file before it answers anyway."""


def model_calls(path: Path) -> int:
    """How many model calls the pool's turn workers made so far."""
    return len(path.read_text().splitlines()) if path.exists() else 0


def _counted_reply(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    with open(os.environ[CALLS_FILE], "a") as calls:
        calls.write(f"{os.getpid()}\n")
    return demo.assistant_reply(messages, info)


async def _held_reply(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    # Held as a real model call is, awaiting: artifactr calls the function on the turn's loop,
    # and a blocked loop would keep the transaction that its run's watcher had just begun, and
    # with it SQLite's write lock, from every other process for the whole hold.
    reply = _counted_reply(messages, info)  # counted at once; answered once released
    release = Path(os.environ[RELEASE_FILE])
    deadline = time.monotonic() + HELD_AT_MOST_S
    # Polled: the release comes from another process, which no asyncio.Event reaches.
    while time.monotonic() < deadline and not await asyncio.to_thread(release.exists):  # noqa: ASYNC110
        await asyncio.sleep(0.05)
    return reply


class _Inert(ArtifactWorkspace):
    """The capability with its run hook gone: turns run, and nothing records that they did."""

    async def wrap_run(self, ctx: Any, *, handler: Any) -> Any:
        return await handler()


def _agent(capabilities: list[Any]) -> Agent[Session[None], str]:
    return Agent(function_model(_counted_reply), deps_type=Session[None], capabilities=capabilities)


def _types() -> list[type[artifactr.Artifact]]:
    return [demo.Timeline, demo.Runbook, demo.Receipt]


counted = dataclasses.replace(
    demo.app, turn_agent=lambda: _agent([ArtifactWorkspace(types=_types())])
)
"""The demo, its turn agent's model calls counted."""

never_takes = dataclasses.replace(demo.app, turn_agent=lambda: _agent([_Inert(types=_types())]))
"""The demo, with a turn agent that never takes its message."""

no_capability = dataclasses.replace(demo.app, turn_agent=lambda: _agent([]))
"""The demo, with a turn agent that lacks `ArtifactWorkspace`: refused at start."""

held = dataclasses.replace(
    demo.app,
    turn_agent=lambda: Agent(
        function_model(_held_reply),
        deps_type=Session[None],
        capabilities=[ArtifactWorkspace(types=_types())],
    ),
)
"""The demo, its turn agent's model call counted and held until the release file exists."""


STUCK_S = 60.0
"""How long each attempt of `stuck`'s `demo:work` sleeps after its notice: past any soft limit."""


async def _stuck_work(reaction: Reaction[Deps]) -> None:
    """Post the demo's notice, then sleep at every attempt: an action that never finishes."""
    event = reaction.events[0].event
    assert isinstance(event, demo.WorkRequested)
    acting = reaction.deps.outbound.acting(reaction)
    await acting.notice(f"Working on {event.key}.", thread_id=event.thread_id)
    await asyncio.sleep(STUCK_S)


def _stuck_actions(outbound: Outbound) -> dict[str, Action[Any]]:
    return {**demo.actions(outbound), "demo-work": _stuck_work}


stuck = dataclasses.replace(counted, actions=_stuck_actions)
"""The demo, its turn agent counted, and `demo:work` stuck after its notice at every attempt."""


async def _blocking_work(reaction: Reaction[Deps]) -> dict[str, str]:
    """At the first attempt post the demo's notice, then block the thread: no cancellation
    reaches it. Later attempts are the demo's."""
    if reaction.attempt > 1:
        return await demo.work(reaction)
    event = reaction.events[0].event
    assert isinstance(event, demo.WorkRequested)
    acting = reaction.deps.outbound.acting(reaction)
    await acting.notice(f"Working on {event.key}.", thread_id=event.thread_id)
    time.sleep(STUCK_S)  # noqa: ASYNC251 - the point: a synchronous call that holds the loop
    raise AssertionError("the hard time limit should have killed this attempt's process")


def _blocking_actions(outbound: Outbound) -> dict[str, Action[Any]]:
    return {**demo.actions(outbound), "demo-work": _blocking_work}


blocking = dataclasses.replace(counted, actions=_blocking_actions)
"""The demo, its turn agent counted, and `demo:work`'s first attempt blocking its thread."""
