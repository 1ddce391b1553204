"""What one attempt of a reflexr run does, made once per write: the act-once core of actonce.

Start with `Outbound`: build one per process over the artifactr workspaces and relayr's SQL
ledger, with the app's allowlists, and give it to actions; each attempt gets its one `RunActions`
from `Outbound.acting(reaction)`. Agents get the same handle through relayr's
`ArtifactrCapability`, whose tools act through `outbound.acting`. `Allowlist`, `NotAllowed`,
`Refused`, `rule_actor` and the agent's tools are relayr's own. Nothing here imports `worker`, so
an app can use it in process.
"""

from relayr.outbound import Allowlist, ArtifactrCapability, NotAllowed, Refused, rule_actor
from relayr.outbound.tools import artifactr_tools

from actonce.tasks.outbound import Outbound, RunActions

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
