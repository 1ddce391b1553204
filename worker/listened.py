"""Which appended entries can change what a workspace's rules decide, so the dispatcher evaluates
only when one of those is appended.

Every attempt appends its run's facts (`reflexr:run_started`, then `run_succeeded`, ...) and
every firing a `reflexr:rule_fired`: each moves the workspace's head, and evaluating because of
them cost the dispatcher tens of milliseconds a time for nothing, since no rule listened. A
rule's filter says which event types can pass it (reflexr's `admitted`); the pool's own facts
that no code rule admits are *quiet*. A rule that can admit any type, or waits for an absence
(whose deadline any entry's time can pass), makes nothing quiet.

The code rules are all there is to know: a `Definition` gives reflexr no `StoredRules`, so
reflexr hides any stored rule a workspace holds, and the pool never evaluates one.
"""

from collections.abc import Iterable
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


def quiet_types(rules: Iterable[Rule]) -> frozenset[str]:
    """Return the types in `OWN_FACTS` that none of `rules` can act on: appending them alone
    needs no evaluation. Empty if a rule admits any type or watches for an absence."""
    listened: set[str] = set()
    for rule in rules:
        if isinstance(rule.when.pattern, AbsencePattern):
            return frozenset()
        types = admitted(rule.when.filter)
        if types is None:
            return frozenset()
        listened.update(types)
    return OWN_FACTS - listened
