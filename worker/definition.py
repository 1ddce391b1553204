"""The application definition: what the app and every worker must build identically.

reflexr cancels a run claimed by a process that does not know its rule, artifactr cannot read an
artifact whose type was not imported, and an allowlist decides which command a write sends. So
the event types, rules, actions, artifact types and allowlists live in one importable object,
named by `ACTONCE_APP=module:attribute`, that the dispatcher, every worker and the app load.
"""

import importlib
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import artifactr
import reflexr.workspace as rw
from artifactr import ArtifactWorkspace
from reflexr.core import Event, Rule
from reflexr.workspace import Action

from actonce.tasks import Allowlist
from actonce.tasks.observers import Observer
from actonce.tasks.outbound import Outbound


@dataclass(frozen=True)
class Deps:
    """The deps relayr-style actions expect: `reaction.deps.outbound.acting(reaction)`."""

    outbound: Outbound
    """The process's `Outbound`."""


def _default_deps(outbound: Outbound) -> Deps:
    return Deps(outbound=outbound)


@dataclass(frozen=True)
class Definition:
    """What an application runs on the pool; load it with `load_definition`.

    Args:
        rules: The code rules, named `namespace:name`.
        actions: Builds the actions by name from the process's `Outbound`, so an agent's
            `ArtifactrCapability` is made with it; a plain mapping may be given as
            `lambda _: {...}`.
        events: The app's own event types; relayr's bridged `artifactr:*` types are added.
        artifact_types: The artifact types runs create, edit and read.
        allowlists: Each rule's allowlist, by rule name or `namespace:*`.
        deps: Builds the actions' deps from the process's `Outbound`; by default `Deps`.
        emitted: Event types runs emit, as reflexr's `emitted`.
        max_depth: reflexr's causal chain limit.
        reflexr_authorize: reflexr's `authorize` hook, or None.
        artifactr_authorize: artifactr's `authorize` hook, or None.
        turn_agent: Builds the pydantic-ai agent that takes threads' turns, for turn workers;
            None when no rule may start turns. The agent must have artifactr's
            `ArtifactWorkspace` capability, which artifactr's `Runner` needs to record that a
            turn took its message (`check_turn_agent`; a worker refuses to start without it).
        observers: The application's own observers of the lifecycle
            (`actonce.tasks.observers.Observer`), told of every settled attempt, turn and
            refused message after the pool's log line and Sentry, in every pool process that
            settles them (each prefork child, the worker's intake, the dispatcher's sweep). An
            observer runs inside the delivery it watches, so it must be quick; one that raises is
            logged and skipped.
    """

    rules: Sequence[Rule]
    actions: Callable[[Outbound], Mapping[str, Action[Any]]]
    events: Sequence[type[Event]] = ()
    artifact_types: Sequence[type[artifactr.Artifact]] = ()
    allowlists: Mapping[str, Allowlist] = field(default_factory=dict)
    deps: Callable[[Outbound], object] = _default_deps
    emitted: Sequence[type[Event]] = ()
    max_depth: int = 8
    reflexr_authorize: rw.Authorize | None = None
    artifactr_authorize: Any = None
    turn_agent: Callable[[], Any] | None = None
    observers: Sequence[Observer] = ()

    @property
    def rule_names(self) -> frozenset[str]:
        """The names of the rules this definition knows."""
        return frozenset(rule.name for rule in self.rules)


class DefinitionError(RuntimeError):
    """Raised when the application definition cannot be loaded or does not fit the stores."""


def check_retry_delays(definition: Definition, max_retry_delay_s: float, ref: str) -> None:
    """Refuse a definition with a rule whose retries may wait longer than `max_retry_delay_s`.

    A retry is the attempt's message again, due at the run's next attempt, and the intake
    refuses a message due further ahead than `ACTONCE_MAX_RETRY_DELAY_S` (plus the lease): such
    a rule's late retries would be dead-lettered `eta_out_of_range`, each reported, and left to
    the dispatcher's sweep. A rule's longest wait is its policy's delay before its last attempt.

    Raises:
        DefinitionError: Naming each such rule and its longest wait, and the two ways out.
    """
    longest = {
        rule.name: rule.retry.delay(rule.retry.max_attempts - 1).total_seconds()
        for rule in definition.rules
        if rule.retry.max_attempts > 1
    }
    over = sorted((name, s) for name, s in longest.items() if s > max_retry_delay_s)
    if over:
        rules = ", ".join(f"{name} waits up to {s:g}s" for name, s in over)
        raise DefinitionError(
            f"rules of {ref} wait longer between attempts than ACTONCE_MAX_RETRY_DELAY_S "
            f"({max_retry_delay_s:g}s) lets a retry wait: {rules}; shorten their RetryPolicy, "
            f"or raise ACTONCE_MAX_RETRY_DELAY_S (and ACTONCE_VISIBILITY_TIMEOUT_S past "
            f"ACTONCE_TIME_LIMIT_S plus it)"
        )


def cut_short_by_the_soft_limit(
    definition: Definition, *, soft_time_limit_s: float, turn_wait_s: float
) -> list[str]:
    """Say what Celery's soft time limit would stop before its own limit: each rule whose
    `timeout` is not below it, and the turn wait if that is not.

    Not refused: the soft limit still stops such an attempt, recorded abandoned instead of timed
    out, and retried under the rule's policy; the limits the configuration page describes are meant
    to come first.
    """
    said = [
        f"rule {rule.name}'s timeout ({rule.timeout.total_seconds():g}s) is not below "
        f"ACTONCE_SOFT_TIME_LIMIT_S ({soft_time_limit_s:g}s): the soft limit stops its attempts "
        f"first, recorded abandoned rather than timed out"
        for rule in definition.rules
        if rule.timeout is not None and rule.timeout.total_seconds() >= soft_time_limit_s
    ]
    if definition.turn_agent is not None and turn_wait_s >= soft_time_limit_s:
        said.append(
            f"ACTONCE_TURN_WAIT_S ({turn_wait_s:g}s) is not below ACTONCE_SOFT_TIME_LIMIT_S "
            f"({soft_time_limit_s:g}s): the soft limit stops a turn before its wait ends"
        )
    return said


def check_turn_agent(definition: Definition, ref: str) -> None:
    """Refuse a definition whose turn agent cannot take messages: it lacks `ArtifactWorkspace`.

    artifactr's `Runner` runs any pydantic-ai agent, but only the `ArtifactWorkspace`
    capability records a turn's start, and with it that the turn took its message: without it,
    every ask calls the model and the message stays untaken. Builds the agent once.

    Raises:
        DefinitionError: If `turn_agent` cannot be built, or its agent lacks the capability.
    """
    if definition.turn_agent is None:
        return
    try:
        agent = definition.turn_agent()
    except Exception as failure:
        raise DefinitionError(f"the turn_agent of {ref} failed to build: {failure!r}") from failure
    found: list[object] = []
    root = getattr(agent, "root_capability", None)
    if root is not None:
        root.apply(found.append)
    if not any(isinstance(capability, ArtifactWorkspace) for capability in found):
        raise DefinitionError(
            f"the turn_agent of {ref} has no artifactr.ArtifactWorkspace capability, which "
            f"artifactr's Runner needs to take messages: add "
            f"capabilities=[ArtifactWorkspace(types=[...])] to its Agent"
        )


def _import_from_working_directory() -> None:
    # An application's definition lives in its own checkout, not in site-packages: like
    # `celery -A`, look for it in the directory the process was started from.
    here = os.getcwd()
    if here not in sys.path and "" not in sys.path:
        sys.path.insert(0, here)


def load_definition(ref: str) -> Definition:
    """Import and return the definition `ref` names, as `module:attribute`.

    Raises:
        DefinitionError: If `ref` is malformed, the module does not import, the attribute is
            missing, or it is not a `Definition`; the message says which, and how to fix it.
    """
    module_name, sep, attribute = ref.partition(":")
    if not sep or not module_name or not attribute:
        raise DefinitionError(
            f"ACTONCE_APP must name a definition as 'module:attribute', such as "
            f"'demo.definition:app', not {ref!r}"
        )
    _import_from_working_directory()
    try:
        module = importlib.import_module(module_name)
    except Exception as failure:
        raise DefinitionError(
            f"cannot import {module_name!r} for ACTONCE_APP={ref!r}: {failure!r}"
        ) from failure
    definition = getattr(module, attribute, None)
    if definition is None:
        raise DefinitionError(f"module {module_name!r} has no {attribute!r} (ACTONCE_APP={ref!r})")
    if not isinstance(definition, Definition):
        raise DefinitionError(
            f"ACTONCE_APP={ref!r} is a {type(definition).__name__}, not a worker.Definition"
        )
    return definition
