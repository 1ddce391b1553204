"""Derived write ids: the same on every attempt of a run that makes the same write.

A write's digest is made of the run's id, the run's checkpoint count at the moment of the write
(its segment), the operation, the write's key parts, and how many identical writes the attempt
made before it in that segment. The recipe and the prefixes are relayr-ai 0.1.1's, byte for byte,
so a run whose first attempt ran in process under relayr finishes in the pool without writing
twice (ADR-0019).
"""

import hashlib
import json
from typing import Final

from pydantic import JsonValue

ARTIFACT: Final = "art_"
"""The prefix of a created artifact's id."""

PROPOSAL: Final = "prp_"
"""The prefix of a proposal's id: a create's (its artifact's digest), an edit's, an archive's."""

MESSAGE: Final = "msg_"
"""The prefix of a notice's or a sent message's id; the two share artifactr's id space."""

THREAD: Final = "thr_"
"""The prefix of a created thread's id."""

DIGEST_LENGTH: Final = 16
"""How many hex characters of the SHA-256 a derived id keeps."""


def write_digest(run_id: str, segment: int, op: str, key: tuple[str, ...], occurrence: int) -> str:
    """Return the digest a write's ids are made from.

    The same inputs give the same digest in every process and on every attempt; the attempt
    number is deliberately not an input.

    Args:
        run_id: The run's id (`fir_…`), unique within its workspace.
        segment: The run's checkpoint count when the write is made.
        op: What the write is: `create`, `edit`, `archive`, `notice`, `send` or `thread`.
        key: What identifies the write within the op, such as an artifact id and a path.
        occurrence: How many identical writes (same segment, op and key) the attempt made before.
    """
    what = "\x00".join(key)
    seed = f"{run_id}\x00{segment}\x00{op}\x00{what}\x00{occurrence}"
    return hashlib.sha256(seed.encode()).hexdigest()[:DIGEST_LENGTH]


def content_digest(value: JsonValue) -> str:
    """Return the full SHA-256 hex digest of JSON data, equal for equal data.

    Keys are sorted and separators compact; a string is hashed in its JSON form, quotes included.
    """
    text = json.dumps(value, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()
