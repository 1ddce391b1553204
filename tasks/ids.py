"""Derived write ids: which write gets which id, the same on every attempt of its run.

relayr-ai derives a write's id inside its `RunActions` from the run, the run's checkpoint count at
the write (its segment), the op, the write's key parts and how many identical writes the attempt
made before. actonce derives the same ids by calling relayr's derivation (never a copy of it), so
a run begun in process under relayr finishes in the pool without writing twice (ADR-0019). What
relayr does not offer is here: the prefixes, and `write_key`, the one place that says which parts
of a write make its key, used by the outbound, `explain` and the chaos harness alike.

The derivation is reached through relayr's private names, which is why `pyproject.toml` pins
relayr-ai exactly and `tests/tasks/test_ids.py` pins ids to literal values.
"""

from collections import Counter
from types import SimpleNamespace
from typing import Final, Literal, NamedTuple, cast

from pydantic import JsonValue
from relayr.outbound import RunActions
from relayr.outbound.actions import _canonical

ARTIFACT: Final = "art_"
"""The prefix of a created artifact's id."""

PROPOSAL: Final = "prp_"
"""The prefix of a proposal's id: a create's (its artifact's digest), an edit's, an archive's."""

MESSAGE: Final = "msg_"
"""The prefix of a notice's or a sent message's id; the two share artifactr's id space."""

THREAD: Final = "thr_"
"""The prefix of a created thread's id."""

type Op = Literal["create", "edit", "archive", "notice", "send", "thread"]
"""What a write is, as its id is derived."""


class WriteKey(NamedTuple):
    """What a write's id is derived from, besides the run, the segment and the occurrence."""

    op: Op
    key: tuple[str, ...]


def write_key(op: Op, subject: str, detail: JsonValue = None) -> WriteKey:
    """Return the key of a write, as relayr derives its id.

    Args:
        op: What the write is.
        subject: A create's kind, an edit's or archive's artifact id, a notice's or send's
            thread id, a thread's title.
        detail: A create's data, an edit's JSON Pointer path, a notice's or send's text; none
            for an archive or a thread.
    """
    if op in ("create", "notice", "send"):
        return WriteKey(op, (subject, content_digest(detail)))
    if op == "edit":
        return WriteKey(op, (subject, str(detail)))
    return WriteKey(op, (subject,))


def write_digest(run_id: str, segment: int, op: str, key: tuple[str, ...], occurrence: int) -> str:
    """Return the digest a write's ids are made from (the id after its prefix), by relayr.

    The same inputs give the same digest in every process and on every attempt; the attempt
    number is deliberately not an input.

    Args:
        run_id: The run's id (`fir_…`), unique within its workspace.
        segment: The run's checkpoint count when the write is made.
        op: What the write is (see `Op`).
        key: What identifies the write within the op: `write_key(...).key`.
        occurrence: How many identical writes (same segment, op and key) the attempt made before.
    """
    # relayr's `_derive` reads only the run (id and checkpoints) and its count of earlier
    # identical writes, so a stand-in holding those three facts gets relayr's own digest.
    stand_in = SimpleNamespace(
        _reaction=SimpleNamespace(run=SimpleNamespace(id=run_id, checkpoints=segment)),
        _made=_EarlierWrites(occurrence),
    )
    return RunActions._derive(cast(RunActions, stand_in), op, *key)


def content_digest(value: JsonValue) -> str:
    """Return relayr's digest of JSON data (a created artifact's, a message's text), equal for
    equal data."""
    return _canonical(value)


class _EarlierWrites(Counter[object]):
    """A count of earlier identical writes that answers `occurrence` for the one write asked."""

    def __init__(self, occurrence: int) -> None:
        super().__init__()
        self._occurrence = occurrence

    def __missing__(self, key: object) -> int:
        return self._occurrence
