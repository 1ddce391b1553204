"""Which appended entries can change what a workspace's rules decide, so the dispatcher evaluates
only when one of those is appended, and only the rules that hear it.

Every attempt appends its run's facts (`reflexr:run_started`, then `run_succeeded`, ...) and
every firing a `reflexr:rule_fired`: each moves the workspace's head, and evaluating because of
them cost the dispatcher a whole evaluation each time for nothing, since no rule listened. A
rule's filter says which event types can pass it (reflexr's `admitted`); the pool's own facts
that no code rule admits are *quiet*. A rule that can admit any type, or waits for an absence
(whose deadline any entry's time can pass), makes nothing quiet.

The same holds rule by rule (`Listeners`): reflexr evaluates every rule of a workspace, in two
transactions each, whatever was appended, and a rule whose filter no new entry can pass decides
nothing from them. Leaving it out defers its reading of those entries to its next evaluation,
which reads them in the same order: what it fires is the same.

The code rules are all there is to know: a `Definition` gives reflexr no `StoredRules`, so
reflexr hides any stored rule a workspace holds, and the pool never evaluates one.
"""

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Final

from reflexr.core import (
    AbsencePattern,
    Rule,
    RuleErrored,
    RuleFired,
    RunCancelled,
    RunDeadLettered,
    RunProgressed,
    RunRequeued,
    RunRetrying,
    RunSkipped,
    RunStarted,
    RunSucceeded,
)
from reflexr.core.conditions import admitted

OWN_FACTS: Final[frozenset[str]] = frozenset(
    kind.event_type
    for kind in (
        RuleFired,
        RuleErrored,
        RunStarted,
        RunProgressed,
        RunRetrying,
        RunSucceeded,
        RunDeadLettered,
        RunCancelled,
        RunRequeued,
        RunSkipped,
    )
)
"""The facts reflexr appends as it evaluates and as runs are attempted."""


@dataclass(frozen=True)
class Listeners:
    """Which enabled rules an appended entry may concern, by the entry's type.

    A disabled rule is in none of these: reflexr holds its cursor until it is enabled again.
    """

    every: frozenset[str]
    """Every enabled rule's name."""

    always: frozenset[str]
    """The rules any entry may concern: they admit any type, or wait for an absence."""

    by_type: Mapping[str, frozenset[str]]
    """The other rules, by each type their filter admits."""

    @classmethod
    def of(cls, rules: Iterable[Rule]) -> "Listeners":
        """Return the listeners among `rules`."""
        every: set[str] = set()
        always: set[str] = set()
        by_type: dict[str, set[str]] = {}
        for rule in rules:
            if not rule.enabled:
                continue
            every.add(rule.name)
            types = admitted(rule.when.filter)
            if types is None or isinstance(rule.when.pattern, AbsencePattern):
                always.add(rule.name)
                continue
            for kind in types:
                by_type.setdefault(kind, set()).add(rule.name)
        return cls(
            every=frozenset(every),
            always=frozenset(always),
            by_type={kind: frozenset(names) for kind, names in by_type.items()},
        )

    @property
    def listened(self) -> frozenset[str]:
        """The types some rule other than `always` admits."""
        return frozenset(self.by_type)

    @property
    def quiet(self) -> frozenset[str]:
        """The types in `OWN_FACTS` that no rule can act on: appending them alone needs no
        evaluation. Empty if a rule admits any type or watches for an absence."""
        return frozenset() if self.always else OWN_FACTS - self.listened

    def hearing(self, types: Iterable[str]) -> frozenset[str]:
        """Return the rules an entry of one of `types` may concern, `always` included."""
        heard = set(self.always)
        for kind in types:
            heard.update(self.by_type.get(kind, ()))
        return frozenset(heard)
