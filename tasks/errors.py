"""How a run's writes fail: relayr's `Refused` and `NotAllowed`, reflexr's `RunFailure`.

The tree, as an action sees it::

    reflexr RunFailure(message, reason, permanent)
    ├── Refused      artifactr's not_found, validation_failed, patch_failed: retryable;
    │                an agent's tools hand it back to the model
    ├── NotAllowed   the rule's allowlist refused it: reason not_allowed, permanent
    └── (plain)      invalid_state, forbidden and every other refusal: permanent;
                     version_conflict after the re-reads: retryable

`Refused` and `NotAllowed` are relayr's own classes, so relayr's agent tools and any
`except relayr.outbound.Refused` catch what actonce raises.
"""

import contextlib
from collections.abc import Awaitable

import artifactr.core as a
from reflexr.workspace import RunFailure
from relayr.outbound import NotAllowed, Refused

from actonce.tasks.lifecycle import RETRIED_REFUSALS

__all__ = ["NotAllowed", "Refused", "found", "refusal"]


def refusal(rejection: a.Rejection) -> RunFailure:
    """Return the failure an artifactr rejection means for the run; chain it with `from`.

    `InvalidState` reaches here only once the caller has found that it is not a used derived id.
    """
    if rejection.code not in RETRIED_REFUSALS:
        return RunFailure(rejection.message, reason=rejection.code, permanent=True)
    return Refused(rejection)


async def found(read: Awaitable[object]) -> bool:
    """Await an artifactr read; return whether it found what it reads (False on `NotFound`)."""
    with contextlib.suppress(a.NotFound):
        await read
        return True
    return False
