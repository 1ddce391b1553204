"""Derived ids are relayr-ai 0.1.1's, pinned to literal values: an upgrade that changes them fails.

`tasks.ids` reaches relayr's derivation through its private names (pyproject pins relayr-ai
exactly). The literals below were computed by relayr 0.1.1; `write_key` spells which parts of a
write make its key, for the outbound, `explain` and the chaos harness alike. The end-to-end check
that the pool's writes get the ids relayr's own `RunActions` gives is `test_checkpoints`.
"""

import pytest

from actonce.tasks import ids

RUN = "fir_pin"


@pytest.mark.parametrize(
    ("segment", "write", "occurrence", "expected"),
    [
        (0, ids.write_key("notice", "thr_pin", "Deploy 42 failed."), 0, "2a203e6508b9b3a4"),
        (1, ids.write_key("notice", "thr_pin", "Deploy 42 failed."), 1, "c2691b834901cf38"),
        (0, ids.write_key("send", "thr_pin", "Summarise."), 0, "1974e581f4fa50e1"),
        (0, ids.write_key("create", "pin_kind", {"entries": {"a": "1"}}), 0, "c60c02f8a0383b2a"),
        (2, ids.write_key("edit", "art_pin", "/entries/k"), 0, "0a26357b82f383db"),
        (0, ids.write_key("archive", "art_pin"), 0, "98df2b606e9c0485"),
        (0, ids.write_key("thread", "Postmortem"), 0, "cf9593dc758c3265"),
    ],
)
def test_a_writes_digest_is_relayr_0_1_1s(
    segment: int, write: ids.WriteKey, occurrence: int, expected: str
) -> None:
    assert ids.write_digest(RUN, segment, write.op, write.key, occurrence) == expected


def test_a_content_digest_is_relayr_0_1_1s() -> None:
    digest = "f75424216cde4b4cfc4dd2937e01e20edecff165f089b9094442d0e7bf0f5f60"

    assert ids.content_digest("Deploy 42 failed.") == digest
    assert ids.write_key("notice", "thr_pin", "Deploy 42 failed.").key == ("thr_pin", digest)


def test_the_key_of_a_create_does_not_depend_on_the_datas_key_order() -> None:
    one = ids.write_key("create", "pin_kind", {"a": "1", "b": "2"})
    other = ids.write_key("create", "pin_kind", {"b": "2", "a": "1"})

    assert one == other
