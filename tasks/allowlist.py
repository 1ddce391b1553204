"""Allowlists: what each rule may do in artifactr, with relayr's fields and meaning.

artifactr checks a rule's writes against the kinds' write policies and the threads' modes, but not
where a rule acts, which threads it makes or whether it starts turns. The allowlist is that limit,
and its default is the most restrictive: proposals and notices, in the chain's threads.
"""

import re
from collections.abc import Mapping
from typing import Final, Literal

from pydantic import BaseModel, ConfigDict


class Allowlist(BaseModel):
    """What a rule may do in artifactr; by default proposals and notices in its chain's threads."""

    model_config = ConfigDict(frozen=True)

    direct: frozenset[str] = frozenset()
    """The artifact kinds the rule creates, edits and archives directly rather than by proposal.
    artifactr's write policy and the thread's mode still apply on top."""

    threads: Literal["chain", "any"] = "chain"
    """Where the rule may act: `chain`, the threads of the events that made it fire and those it
    creates, or `any` thread of the workspace."""

    create_threads: bool = False
    """Whether the rule may create threads."""

    turns: bool = False
    """Whether the rule may send messages that start an agent turn, rather than only notices."""


class Allowlists:
    """Each rule's allowlist: its own name first, then its namespace's `ns:*`, then the default.

    Args:
        by_key: Allowlists by rule name (`"chat:deploys"`) or whole namespace (`"chat:*"`).
            relayr's `Allowlist` instances are accepted and read field by field.

    Raises:
        ValueError: If a key is neither a rule's name nor a namespace's, or names reflexr's own
            namespace.
    """

    def __init__(self, by_key: Mapping[str, BaseModel] | None = None) -> None:
        self._by_key: dict[str, Allowlist] = {}
        for key, allowlist in (by_key or {}).items():
            if not _KEY.fullmatch(key) or key.startswith("reflexr:"):
                raise ValueError(
                    f"an allowlist's key is a rule's name, as 'chat:deploys', or a whole "
                    f"namespace's, as 'chat:*', and not reflexr's: not {key!r}"
                )
            self._by_key[key] = Allowlist.model_validate(allowlist.model_dump())

    def of(self, rule: str) -> Allowlist:
        """Return the allowlist that applies to `rule`."""
        if rule in self._by_key:
            return self._by_key[rule]
        namespace = f"{rule.partition(':')[0]}:*"
        return self._by_key.get(namespace, DEFAULT)


DEFAULT: Final = Allowlist()
"""The allowlist of a rule that has none: the most restrictive."""

_KEY: Final = re.compile(r"[a-z][a-z0-9_]*:(\*|[a-z0-9][a-z0-9._-]*)")
"""An allowlist's key: a rule's name, as reflexr names rules, or a whole namespace's."""
