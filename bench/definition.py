"""The rules the figures run: `bench:act` (a notice and keyed edits) and `chaos:act` (3 writes).

`ACTONCE_APP=bench.definition:app`. The actions reach artifactr only through
`reaction.deps.outbound.acting(reaction)`, so the same functions run on the pool (actonce's
`Outbound`) and in relayr-ai's in-process reactor (relayr's own `relayr.outbound.Outbound`).
"""

import os
from collections.abc import Sequence
from datetime import timedelta
from typing import Any, ClassVar, Final

import artifactr
from artifactr import ArtifactWorkspace, Session
from artifactr.agent import function_model
from pydantic import Field
from pydantic_ai import Agent
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    TextPart,
    UserPromptPart,
)
from pydantic_ai.models.function import AgentInfo
from reflexr import RetryPolicy, Rule, on, run
from reflexr.core import Event
from reflexr.workspace import Action, Reaction, RunFailure

from actonce.tasks import Allowlist, Outbound
from actonce.worker.definition import Definition

THREAD_ID = "thr_bench"
"""The thread both rules post their notices in."""

LEDGER_ID = "art_bench_ledger"
"""The direct artifact `bench:act` edits: one keyed entry per write."""

BOARD_ID = "art_chaos_board"
"""The direct artifact `chaos:act` edits and the chaos harness's competing writer edits too."""


class BenchEvent(Event, abstract=True, event_namespace="bench"):
    """The figures' own events."""


class BenchRequested(BenchEvent, name="bench.requested"):
    """One benchmark run: a notice, then `writes - 1` keyed edits of a ledger.

    `ledger` names the ledger: the shared one by default, where runs edit one artifact and meet
    version conflicts; the bench's headline workload gives each run a ledger of its own.
    """

    key: str
    writes: int = 2
    ledger: str = LEDGER_ID


class ChaosRequested(BenchEvent, name="chaos.requested"):
    """One chaos run: a create, a keyed edit, a notice; how to misbehave is in the event.

    `fail_after` (1-3) makes attempt 1 raise after that many writes; `die` makes every attempt
    end with a permanent failure after all three writes (dead-lettered at once); `send` makes
    the run also send a message to its own thread (`send_thread`), which asks for a turn.
    """

    key: str
    fail_after: int = 0
    die: bool = False
    send: bool = False


class Ledger(artifactr.Artifact, name="bench_ledger"):
    """Keyed entries, edited directly."""

    write_policy: ClassVar[artifactr.WritePolicy] = "direct"
    entries: dict[str, str] = Field(default_factory=dict)


class Board(artifactr.Artifact, name="chaos_board"):
    """The runs' keyed entries, and the competing writer's noise."""

    write_policy: ClassVar[artifactr.WritePolicy] = "direct"
    entries: dict[str, str] = Field(default_factory=dict)
    noise: dict[str, str] = Field(default_factory=dict)


class Receipt(artifactr.Artifact, name="chaos_receipt"):
    """One per chaos run, created by it."""

    write_policy: ClassVar[artifactr.WritePolicy] = "direct"
    key: str


def notice_text(key: str) -> str:
    """What a run posts: its content is part of its derived id."""
    return f"done {key}"


def send_text(key: str) -> str:
    """What a sending run sends: the key in brackets, so a model call names its send."""
    return f"summarise [{key}]"


def send_thread(key: str) -> str:
    """The thread a sending run sends in, its own: a turn takes one thread's messages at once."""
    return f"thr_send_{key}"


MODEL_CALLS_FILE: Final = "BENCH_MODEL_CALLS_FILE"
"""The variable naming the file each turn's model call appends its prompt to, one line each."""


def _reply(messages: list[ModelMessage], _: AgentInfo) -> ModelResponse:
    """The chaos turn agent's model: notes the call (across processes), answers at once."""
    last = messages[-1]
    prompt = " ".join(
        str(part.content)
        for part in (last.parts if isinstance(last, ModelRequest) else ())
        if isinstance(part, UserPromptPart)
    )
    if path := os.environ.get(MODEL_CALLS_FILE):
        with open(path, "a") as calls:
            calls.write(prompt.replace("\n", " ") + "\n")
    return ModelResponse(parts=[TextPart("noted")])


def turn_agent() -> Agent[Session[None], str]:
    """The agent that takes the send threads' turns, on pydantic-ai's function model."""
    return Agent(
        function_model(_reply), deps_type=Session[None], capabilities=[ArtifactWorkspace(types=[])]
    )


def board_value(key: str) -> str:
    """What `chaos:act` sets at `/entries/<key>`."""
    return f"v-{key}"


async def act(reaction: Reaction[Any]) -> dict[str, str]:
    """`bench:act`: one notice, then `writes - 1` keyed edits of the ledger."""
    event = reaction.events[0].event
    assert isinstance(event, BenchRequested)
    acting = reaction.deps.outbound.acting(reaction)
    notice = await acting.notice(notice_text(event.key), thread_id=THREAD_ID)
    for i in range(event.writes - 1):
        await acting.edit(event.ledger, f"/entries/{event.key}-{i}", reaction.run_id)
    return {"notice": notice}


class Designed(RuntimeError):
    """The failure the chaos harness asks an attempt for."""


async def chaos(reaction: Reaction[Any]) -> dict[str, str]:
    """`chaos:act`: create a receipt, edit the board at the run's key, post a notice."""
    event = reaction.events[0].event
    assert isinstance(event, ChaosRequested)
    acting = reaction.deps.outbound.acting(reaction)
    first = reaction.attempt == 1

    def fault(after: int) -> None:
        if first and event.fail_after == after:
            raise Designed(f"attempt 1 fails after write {after} (by design)")

    receipt = await acting.create(Receipt(key=event.key))
    fault(1)
    await acting.edit(BOARD_ID, f"/entries/{event.key}", board_value(event.key))
    fault(2)
    notice = await acting.notice(notice_text(event.key), thread_id=THREAD_ID)
    if event.send:
        await acting.send(send_text(event.key), thread_id=send_thread(event.key))
    fault(3)
    if event.die:
        raise RunFailure("designed to die", reason="designed_death", permanent=True)
    return {"key": event.key, "receipt": receipt, "notice": notice}


ACTIONS: dict[str, Action[Any]] = {"bench-act": act, "chaos-act": chaos}
"""The figures' actions by name; they need nothing from the process but `deps.outbound`."""


def actions(_: Outbound) -> dict[str, Action[Any]]:
    """The figures' actions by name."""
    return dict(ACTIONS)


RULES = [
    Rule(
        name="bench:act",
        when=on(BenchRequested),
        then=run("bench-act"),
        retry=RetryPolicy(max_attempts=3, backoff=timedelta(milliseconds=200)),
        timeout=timedelta(seconds=60),
        ordering="none",
    ),
    Rule(
        name="chaos:act",
        when=on(ChaosRequested),
        then=run("chaos-act"),
        # Enough attempts for a designed failure, kills and conflicts to hit one run together.
        retry=RetryPolicy(max_attempts=12, backoff=timedelta(milliseconds=200)),
        timeout=timedelta(seconds=60),
        ordering="none",
    ),
]

DIRECT = frozenset({"bench_ledger", "chaos_board", "chaos_receipt"})
"""The kinds both rules write directly rather than by proposal."""

app = Definition(
    rules=RULES,
    actions=actions,
    events=[BenchRequested, ChaosRequested],
    artifact_types=[Ledger, Board, Receipt],
    allowlists={
        "bench:*": Allowlist(direct=DIRECT, threads="any"),
        "chaos:*": Allowlist(direct=DIRECT, threads="any", turns=True),
    },
    turn_agent=turn_agent,
)
"""The figures' definition: `ACTONCE_APP=bench.definition:app`."""


def own_ledger(key: str) -> str:
    """The id of the ledger that run `key` alone edits, in the conflict-free workload."""
    return f"art_ledger_{key}"


async def prepare(
    artifactr_workspaces: artifactr.Workspaces,
    tenant: str,
    workspace: str,
    *,
    own_ledgers: Sequence[str] = (),
) -> None:
    """Create the thread, the shared ledger, the board, and a ledger for each of `own_ledgers`
    (run keys: see `own_ledger`), that the rules act on."""
    import contextlib

    import artifactr.core as a

    opened = await artifactr_workspaces.open(
        tenant, workspace, actor=a.UserActor(id="bench", name="Bench")
    )
    with contextlib.suppress(a.InvalidState):
        await opened.commit(a.CreateThread(thread_id=THREAD_ID, title="bench"))
    artifacts: list[tuple[artifactr.Artifact, str]] = [(Ledger(), LEDGER_ID), (Board(), BOARD_ID)]
    artifacts += [(Ledger(), own_ledger(key)) for key in own_ledgers]
    for artifact, artifact_id in artifacts:
        with contextlib.suppress(a.InvalidState):
            await opened.commit(a.create_artifact(artifact, artifact_id=artifact_id))
