"""One handle per attempt, for the whole process: keyed by the attempt, not by an object.

relayr 0.1.1 caches a run's handle per `Reaction` and per `Outbound`, so two `Outbound`s (or a
second `Reaction`) in one attempt each count identical writes from zero, and the second write gets
the first's id and is silently taken as done. Here the key is the attempt itself: tenant,
workspace, run id and epoch (reflexr's fence, +1 on every claim). Any `acting()` call of the
attempt, through any `Outbound` of the process, gets the same handle; the next attempt, a new
epoch, gets a fresh one.

A handle lives as long as a `Reaction` of its attempt does, and no longer: the registry holds it
weakly by key, and each `Reaction` holds it through a weak-keyed map, so a finished attempt's
handle goes with its `Reaction`s. A handle must therefore hold its reactions only weakly.
"""

import weakref
from collections.abc import Callable
from typing import Any, NamedTuple, Protocol

from reflexr.workspace import Reaction


class AttemptKey(NamedTuple):
    """Which attempt a handle belongs to."""

    tenant_id: str
    workspace_id: str
    run_id: str
    epoch: int

    @classmethod
    def of(cls, reaction: Reaction[Any]) -> "AttemptKey":
        """Return the key of the attempt a reaction belongs to."""
        workspace = reaction.workspace
        run = reaction.run
        return cls(workspace.tenant_id, workspace.workspace_id, run.id, run.epoch)


class Handle(Protocol):
    """What the registry needs of a handle: its attempt, and to be told of each reaction."""

    @property
    def attempt(self) -> AttemptKey:
        """The attempt the handle acts for."""
        ...

    def adopt(self, reaction: Reaction[Any]) -> None:
        """Count `reaction` as one of the attempt's, without keeping it alive."""
        ...


class Handles:
    """The live handles of a process's attempts, by attempt.

    Not thread-safe: like reflexr's executor, it belongs to one event loop's thread.
    """

    def __init__(self) -> None:
        self._by_key: weakref.WeakValueDictionary[AttemptKey, Handle] = (
            weakref.WeakValueDictionary()
        )
        self._by_reaction: weakref.WeakKeyDictionary[Reaction[Any], Handle] = (
            weakref.WeakKeyDictionary()
        )

    def get_or_make(self, reaction: Reaction[Any], make: Callable[[AttemptKey], Handle]) -> Handle:
        """Return the attempt's handle, made with `make` by the first caller of the attempt."""
        key = AttemptKey.of(reaction)
        handle = self._by_reaction.get(reaction)
        if handle is not None and handle.attempt == key:
            return handle
        handle = self._by_key.get(key)
        if handle is None:
            handle = make(key)
            self._by_key[key] = handle
        handle.adopt(reaction)
        self._by_reaction[reaction] = handle
        return handle

    def __len__(self) -> int:
        """How many attempts have a live handle."""
        return len(self._by_key)


HANDLES = Handles()
"""The process's handles: every `Outbound` of the process shares them."""
