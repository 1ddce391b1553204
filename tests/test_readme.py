"""The README's configuration table names every `ACTONCE_*` variable the code reads.

The list is derived, not kept by hand: every field of `Settings` (each read as `ACTONCE_<NAME>`),
the variables `worker.settings.OTHER_VARIABLES` knows, and every `ACTONCE_*` name written in the
code and the Makefile (the lab's, the tests' and the benches' own). A variable added anywhere
without a row fails here, naming it.
"""

import re
from pathlib import Path
from typing import Final

from actonce.worker.settings import OTHER_VARIABLES, Settings

ROOT: Final = Path(__file__).resolve().parent.parent
SOURCES: Final = ("worker", "tasks", "demo", "bench", "lab", "tests")
NAME: Final = re.compile(r"\bACTONCE_[A-Z0-9_]*[A-Z0-9]\b")


def _configuration_section() -> str:
    readme = (ROOT / "README.md").read_text()
    start = readme.index("## Configuration")
    return readme[start : readme.index("\n## ", start + 1)]


NOT_READ: Final = {"ACTONCE_CONCURENCY", "ACTONCE_DATABSE_URL", "ACTONCE_SETTINGS"}
"""Names in the code that no code reads: misspellings the tests set on purpose to see the
warning, and the label a settings error uses when no variable is to blame."""


def _variables_the_code_reads() -> set[str]:
    names = {f"ACTONCE_{field.upper()}" for field in Settings.model_fields} | set(OTHER_VARIABLES)
    files = [path for folder in SOURCES for path in (ROOT / folder).rglob("*.py")]
    for path in [*files, ROOT / "Makefile"]:
        names |= set(NAME.findall(path.read_text()))
    return names - NOT_READ


def test_every_variable_the_code_reads_is_in_the_configuration_table() -> None:
    section = _configuration_section()

    missing = sorted(name for name in _variables_the_code_reads() if f"`{name}`" not in section)

    assert not missing, f"the README's configuration table lacks {missing}"


def test_the_derived_list_is_not_empty_and_holds_the_newcomers_variables() -> None:
    names = _variables_the_code_reads()

    assert {"ACTONCE_TURN_WAIT_S", "ACTONCE_DEMO_RUNS", "ACTONCE_SENTRY_ENVIRONMENT"} <= names
    assert {"ACTONCE_RESULT_BACKEND_URL", "ACTONCE_EXIT_WHEN_SETTLED"} <= names
    assert "ACTONCE_TEST_POSTGRES_SERVER" in names


ROW: Final = re.compile(r"^\| (`ACTONCE_[A-Z0-9_]+`(?: / `[A-Z0-9_]+`)*) \| ([^|]+) \|", re.M)


def test_the_configuration_tables_defaults_are_the_settings_defaults() -> None:
    checked = 0
    for names, defaults in ROW.findall(_configuration_section()):
        fields = [n.strip("`").removeprefix("ACTONCE_").lower() for n in names.split(" / ")]
        values = defaults.strip().split(" / ")
        if not all(re.fullmatch(r"`[^`]+`", v) for v in values):
            continue  # "unset", "likewise, ...": said in words
        for field, value in zip(fields, values, strict=False):
            if field not in Settings.model_fields:
                continue  # SENTRY_DSN and the tests' own variables
            default = Settings.model_fields[field].get_default(call_default_factory=True)
            written = value.strip("`")
            if isinstance(default, bool):
                assert written == str(default).lower(), field
            elif isinstance(default, int | float):
                assert float(written) == default, f"ACTONCE_{field.upper()}: {written}"
            else:
                assert written == str(default), f"ACTONCE_{field.upper()}: {written}"
            checked += 1

    assert checked >= 25, checked


def test_flowers_auth_variables_are_documented() -> None:
    section = _configuration_section()

    assert "`FLOWER_BASIC_AUTH`" in section and "`FLOWER_UNAUTHENTICATED_API`" in section
