"""What one attempt of a reflexr run does, made once per write: the act-once core of actonce.

Start with `Outbound`: build one per process over the artifactr workspaces and relayr's SQL
ledger, with the app's allowlists, and give it to actions; each attempt gets its one `RunActions`
from `Outbound.acting(reaction)`. Agents get the same handle through `ArtifactrCapability`.
Nothing here imports `worker`, so an app can use it in process.
"""

from actonce.tasks.allowlist import Allowlist
from actonce.tasks.errors import NotAllowed, Refused
from actonce.tasks.outbound import Outbound, RunActions, rule_actor
from actonce.tasks.tools import ArtifactrCapability, artifactr_tools

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
