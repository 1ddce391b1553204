"""The README is a short front door, and the docs site holds the rest, built from one source each.

`docs/hooks.py` generates the configuration table from `Settings` and the reasons page from
`actonce.tasks.lifecycle` when MkDocs builds the site; these tests call the same functions, so
what they check is what the site shows. The list of `ACTONCE_*` variables is derived, not kept by
hand: every field of `Settings` (each read as `ACTONCE_<NAME>`), the variables
`worker.settings.OTHER_VARIABLES` knows, and every `ACTONCE_*` name written in the code and the
Makefile (the lab's, the tests' and the benches' own). A variable added anywhere without a word
in the docs fails here, naming it. Last, the site is built as `make docs-build` builds it.
"""

import functools
import importlib
import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Final

import pytest

from actonce.worker.settings import OTHER_VARIABLES, Settings

ROOT: Final = Path(__file__).resolve().parent.parent
DOCS: Final = ROOT / "docs"
README: Final = ROOT / "README.md"
SOURCES: Final = ("worker", "tasks", "demo", "bench", "lab", "tests")
NAME: Final = re.compile(r"\bACTONCE_[A-Z0-9_]*[A-Z0-9]\b")
README_MAX_LINES: Final = 300

NOT_READ: Final = {"ACTONCE_CONCURENCY", "ACTONCE_DATABSE_URL", "ACTONCE_SETTINGS"}
"""Names in the code that no code reads: misspellings the tests set on purpose to see the
warning, and the label a settings error uses when no variable is to blame."""


@functools.cache
def _hooks() -> ModuleType:
    """The docs' hook module, loaded from its file as MkDocs loads it."""
    spec = importlib.util.spec_from_file_location("actonce_docs_hooks", DOCS / "hooks.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _pages() -> dict[Path, str]:
    """Every hand-written page of the site, with its markers filled as the build fills them."""
    return {path: _hooks().fill(path.read_text())[0] for path in sorted(DOCS.rglob("*.md"))}


# ─── the README ───────────────────────────────────────────────────────────────


def test_the_readme_is_a_short_front_door() -> None:
    lines = README.read_text().splitlines()

    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines"
    for needed in ("make run", "make test", "actonce migrate", "actonce dispatch"):
        assert needed in README.read_text(), needed
    assert "actonce worker" in README.read_text() and "Outbound" in README.read_text()


def test_the_readmes_links_into_the_docs_lead_to_pages() -> None:
    links = re.findall(r"\]\((docs/[^)#\s]+)(?:#[^)]*)?\)", README.read_text())

    assert links, "the README links to no docs page"
    missing = sorted({link for link in links if not (ROOT / link).is_file()})
    assert not missing, f"the README links to pages that do not exist: {missing}"


def _commits() -> list[str]:
    try:
        listed = subprocess.run(
            ["git", "log", "--all", "--format=%H"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
            timeout=60,
        )
    except (OSError, subprocess.CalledProcessError) as no_history:
        pytest.skip(f"no git history to read commits from: {no_history}")
    return listed.stdout.split()


HEX_RUN: Final = re.compile(r"\b[0-9a-f]{7,40}\b")
"""A run of hex digits as long as a commit's abbreviated or full hash."""


def _commits_named(text: str, commits: list[str]) -> list[str]:
    # A hex run only counts when a real commit starts with it: words like "deadbeef" or a digest
    # in an example are not commits.
    return sorted({run for run in HEX_RUN.findall(text) if any(c.startswith(run) for c in commits)})


def test_the_readme_and_the_docs_name_no_commit() -> None:
    commits = _commits()
    assert commits
    # The check itself finds a commit, abbreviated or whole, so an empty answer means something.
    assert _commits_named(f"as of {commits[0][:7]}, or {commits[0]}.", commits)

    named = {
        str(path.relative_to(ROOT)): found
        for path in [README, *sorted(DOCS.rglob("*.md"))]
        if (found := _commits_named(path.read_text(), commits))
    }

    assert not named, f"pages that name commits: {named}"


MEASURED: Final = re.compile(
    r"\b\d+(?:\.\d+)?(?:[–-]\d+(?:\.\d+)?)? (?:attempts/s|ms of CPU|ms per (?:attempt|event))"
)
"""A measured figure: attempts per second, or milliseconds of CPU per attempt or event."""


def test_measured_figures_live_on_the_benchmarks_page_only() -> None:
    elsewhere = {
        str(path.relative_to(ROOT)): MEASURED.findall(path.read_text())
        for path in [README, *sorted(DOCS.rglob("*.md"))]
        if path.name != "benchmarks.md"
    }

    assert MEASURED.findall((DOCS / "benchmarks.md").read_text())
    assert not {page: found for page, found in elsewhere.items() if found}


# ─── configuration ────────────────────────────────────────────────────────────


def _variables_the_code_reads() -> set[str]:
    names = {f"ACTONCE_{field.upper()}" for field in Settings.model_fields} | set(OTHER_VARIABLES)
    files = [path for folder in SOURCES for path in (ROOT / folder).rglob("*.py")]
    for path in [*files, ROOT / "Makefile"]:
        names |= set(NAME.findall(path.read_text()))
    return names - NOT_READ


def test_every_variable_the_code_reads_is_documented() -> None:
    documentation = "\n".join(_pages().values())

    missing = sorted(n for n in _variables_the_code_reads() if f"`{n}`" not in documentation)

    assert not missing, f"the docs do not name {missing}"


def test_every_setting_and_other_variable_is_in_the_configuration_page() -> None:
    page = _pages()[DOCS / "configuration.md"]

    missing = sorted(
        name
        for name in {f"ACTONCE_{field.upper()}" for field in Settings.model_fields}
        | set(OTHER_VARIABLES)
        if f"`{name}`" not in page
    )

    assert not missing, f"the configuration page lacks {missing}"
    assert "`REDIS_URL`" in page and "`SENTRY_DSN`" in page


def test_the_derived_list_is_not_empty_and_holds_the_newcomers_variables() -> None:
    names = _variables_the_code_reads()

    assert {"ACTONCE_TURN_WAIT_S", "ACTONCE_DEMO_RUNS", "ACTONCE_SENTRY_ENVIRONMENT"} <= names
    assert {"ACTONCE_RESULT_BACKEND_URL", "ACTONCE_EXIT_WHEN_SETTLED"} <= names
    assert "ACTONCE_TEST_POSTGRES_SERVER" in names


ROW: Final = re.compile(r"^\| (`ACTONCE_[A-Z0-9_]+`(?: / `[A-Z0-9_]+`)*) \| ([^|]+) \|", re.M)


def test_the_generated_tables_defaults_are_the_settings_defaults() -> None:
    rows = ROW.findall(_hooks().settings_table())

    assert len(rows) == len(Settings.model_fields)
    for names, shown in rows:
        field = names.split(" / ")[0].strip("`").removeprefix("ACTONCE_").lower()
        default = Settings.model_fields[field].get_default(call_default_factory=True)
        shown = shown.strip()
        if default is None:
            assert shown == "unset", field
            continue
        assert re.fullmatch(r"`[^`]+`", shown), f"{field}: {shown}"
        written = shown.strip("`")
        if isinstance(default, bool):
            assert written == str(default).lower(), field
        elif isinstance(default, int | float):
            assert float(written) == default, f"ACTONCE_{field.upper()}: {written}"
        else:
            assert written == str(default), f"ACTONCE_{field.upper()}: {written}"


def test_each_setting_row_carries_its_docstring_and_its_aliases() -> None:
    rows = {row.field: row for row in _hooks().settings_rows()}

    assert list(rows) == list(Settings.model_fields)
    for row in rows.values():
        assert row.meaning and not row.meaning.startswith("`ACTONCE_"), row
    assert rows["broker_url"].variables == ("ACTONCE_BROKER_URL", "REDIS_URL")
    assert rows["sentry_dsn"].variables == ("ACTONCE_SENTRY_DSN", "SENTRY_DSN")
    assert rows["pool"].allowed == "`prefork`, `threads`"
    assert rows["concurrency"].allowed == "≥ 1"
    assert "Sentry's environment tag" in rows["sentry_environment"].meaning


def test_a_setting_without_a_docstring_stops_the_build(monkeypatch: pytest.MonkeyPatch) -> None:
    hooks = _hooks()
    monkeypatch.setattr(hooks, "attribute_docstrings", lambda _cls: {})

    with pytest.raises(hooks.SourceMissing, match=r"Settings\.app has no docstring"):
        hooks.settings_rows()


def test_flowers_auth_variables_are_documented() -> None:
    page = (DOCS / "configuration.md").read_text()

    assert "`FLOWER_BASIC_AUTH`" in page and "`FLOWER_UNAUTHENTICATED_API`" in page


# ─── reasons and the generated parts ──────────────────────────────────────────


def test_every_generated_part_has_one_place() -> None:
    markers = [m for page in DOCS.rglob("*.md") for m in _hooks().MARKER.findall(page.read_text())]

    assert sorted(markers) == sorted(_hooks().GENERATED)


def test_the_reasons_page_lists_every_reason_and_every_fate() -> None:
    lifecycle = _hooks().lifecycle()
    page = _pages()[DOCS / "reasons.md"]

    missing = [reason.value for reason in lifecycle.Reason if f"| `{reason.value}` |" not in page]
    assert not missing, f"the reasons page lacks {missing}"
    for happened, fate in lifecycle.FATES.items():
        assert f"`{happened.value}`" in page and fate.describe().strip() in page, happened


def test_a_missing_lifecycle_module_stops_the_build_in_one_line(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    hooks = _hooks()
    monkeypatch.setattr(hooks, "LIFECYCLE", "actonce.tasks.no_such_module")

    with pytest.raises(hooks.SourceMissing, match="which this checkout does not have"):
        hooks.reasons_table()


def test_the_api_pages_name_objects_that_exist() -> None:
    for page in _hooks().REFERENCE:
        for name in page.objects:
            module, _, attribute = name.rpartition(".")
            assert hasattr(importlib.import_module(module), attribute), name


# ─── the build ────────────────────────────────────────────────────────────────


def test_the_site_builds_with_no_warning(tmp_path: Path) -> None:
    site = tmp_path / "site"
    # As `make docs-build` runs it; the theme's end-of-life notice is news, not a warning.
    built = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=ROOT,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        capture_output=True,
        text=True,
        timeout=300,
    )

    assert built.returncode == 0, built.stdout + built.stderr
    assert "WARNING" not in built.stderr, built.stderr
    assert "ACTONCE_TURN_GRACE_S" in (site / "configuration" / "index.html").read_text()
    assert "attempts_exhausted" in (site / "reasons" / "index.html").read_text()
    assert "acting" in (site / "reference" / "outbound" / "index.html").read_text()
