"""How a run's writes fail: reflexr's `RunFailure`, with artifactr's codes as reasons.

The tree, as an action sees it::

    reflexr RunFailure(message, reason, permanent)
    ├── Refused      artifactr's not_found, validation_failed, patch_failed: retryable;
    │                an agent's tools hand it back to the model
    ├── NotAllowed   the rule's allowlist refused it: reason not_allowed, permanent
    └── (plain)      invalid_state, forbidden and every other refusal: permanent;
                     version_conflict after the re-reads: retryable

`Refused` and `NotAllowed` subclass relayr's classes of the same names, so code written against
relayr (an `except relayr.outbound.Refused`, relayr's own agent tools) catches them unchanged.
"""

from typing import Final

import artifactr.core as a
from reflexr.workspace import RunFailure
from relayr.outbound import NotAllowed as _RelayrNotAllowed
from relayr.outbound import Refused as _RelayrRefused

RETRYABLE_CODES: Final = frozenset({"not_found", "validation_failed", "patch_failed"})
"""The refusals a run can do otherwise about: `Refused`, retried, or handed to the model."""


class Refused(_RelayrRefused):
    """artifactr refused a write as invalid, or about something missing.

    An agent's tools hand it back to the model, which can do otherwise; from a function action it
    fails the attempt, which is retried under the rule's policy. Its reason is artifactr's code:
    `not_found`, `validation_failed` or `patch_failed`.
    """

    def __init__(self, message: str, *, reason: str) -> None:
        RunFailure.__init__(self, message, reason=reason, permanent=False)


class NotAllowed(_RelayrNotAllowed):
    """The rule's allowlist does not allow what its run tried. Permanent: a retry tries again."""

    def __init__(self, message: str) -> None:
        RunFailure.__init__(self, message, reason="not_allowed", permanent=True)


def refusal(rejection: a.Rejection) -> RunFailure:
    """Return the failure an artifactr rejection means for the run; chain it with `from`.

    `InvalidState` reaches here only once the caller has found that it is not a used derived id.
    """
    if rejection.code in RETRYABLE_CODES:
        return Refused(rejection.message, reason=rejection.code)
    return RunFailure(rejection.message, reason=rejection.code, permanent=True)


def kept_changing(artifact_id: str, tries: int) -> RunFailure:
    """Return the retryable failure of an edit whose artifact changed under every re-read."""
    return RunFailure(
        f"artifact {artifact_id} kept changing: {tries} version conflicts in one attempt",
        reason="version_conflict",
    )
