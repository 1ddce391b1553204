"""actonce: a Celery worker pool that runs reflexr runs' attempts, each write into artifactr once.

Two halves, one import name: `actonce.tasks` is what one attempt does (the attempt and turn
tasks, `Outbound` and `RunActions` built on relayr's), and `actonce.worker` is the process side
(the Celery app, settings, the dispatcher, dead letters, the `actonce` command). The act-once
surface an app needs in process is re-exported here: `from actonce import Outbound, Allowlist`.
"""

from actonce.tasks import (
    Allowlist,
    ArtifactrCapability,
    NotAllowed,
    Outbound,
    Refused,
    RunActions,
    artifactr_tools,
    rule_actor,
)

__all__ = [
    "Allowlist",
    "ArtifactrCapability",
    "NotAllowed",
    "Outbound",
    "Refused",
    "RunActions",
    "artifactr_tools",
    "rule_actor",
]
