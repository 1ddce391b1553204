"""The docs site's generated parts, built from the source every time MkDocs builds the site.

MkDocs loads this file as a hook (`hooks:` in mkdocs.yml). A hand-written page holds a marker,
`<!-- generated: NAME -->`, on a line of its own where a generated table goes; the API reference
pages are generated whole. `tests/test_docs.py` calls the same functions, so what the tests check
is what the site shows.

The tables have one source each: the settings table is `Settings` itself (each field's variable,
default, bounds and docstring), and the reasons page is `actonce.tasks.lifecycle` (`Reason`,
`Happened` and `FATES`). A field without a docstring, or a variable of `OTHER_VARIABLES` this
file does not describe, stops the build with a line that says which.
"""

import ast
import importlib
import inspect
import itertools
import re
import textwrap
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import Enum
from types import ModuleType
from typing import Any, Final, Literal, TypeAliasType, get_args, get_origin

import annotated_types
from jinja2 import Environment
from mkdocs.config.defaults import MkDocsConfig
from mkdocs.exceptions import PluginError
from mkdocs.structure.files import File, Files
from mkdocs.structure.pages import Page
from pydantic import AliasChoices
from pydantic.fields import FieldInfo

from actonce.worker.settings import OTHER_VARIABLES, Settings

MARKER: Final = re.compile(r"^<!-- generated: ([a-z-]+) -->$", re.MULTILINE)
"""Where a hand-written page takes a generated part, by name."""

LIFECYCLE: Final = "actonce.tasks.lifecycle"
"""The module the reasons page is generated from."""

OTHER_MEANINGS: Final[Mapping[str, tuple[str, str]]] = {
    "ACTONCE_TEST_POSTGRES_SERVER": (
        "`postgresql://postgres@127.0.0.1:5432/postgres` when it answers, else an embedded one",
        "`make test`, `make bench` and `make chaos` only: the PostgreSQL server they create "
        "databases on, as a URL of its `postgres` database",
    ),
    "ACTONCE_TEST_POSTGRES_URL": (
        "a fresh database",
        "`tests/tasks/test_turns.py` only: one database for its PostgreSQL case",
    ),
}
"""The default and meaning of each variable of `OTHER_VARIABLES`: they are not settings, so no
field's docstring says them."""


class SourceMissing(RuntimeError):
    """Raised when a generated part cannot be made from its source; the message says why."""


# ─── configuration ────────────────────────────────────────────────────────────


@dataclass(frozen=True)
class SettingRow:
    """One row of the settings table, as generated from one field of `Settings`."""

    field: str
    """The field's name in `Settings`."""

    variables: tuple[str, ...]
    """The variables it is read from, `ACTONCE_<FIELD>` first."""

    default: str
    """Its default as the table shows it: in backticks, or `unset`."""

    allowed: str
    """Its choices or bounds, or an empty string when any value of its type goes."""

    meaning: str
    """Its docstring, on one line, without the variable's name it starts with."""


def settings_rows() -> list[SettingRow]:
    """Return a row for every field of `Settings`, in the order the class declares them.

    Raises:
        SourceMissing: If a field has no docstring.
    """
    docstrings = attribute_docstrings(Settings)
    rows = []
    for name, field in Settings.model_fields.items():
        if name not in docstrings:
            raise SourceMissing(
                f"Settings.{name} has no docstring: the configuration page is generated from "
                f"the docstrings in worker/settings.py; write one below the field"
            )
        variables = _variables(name, field)
        rows.append(
            SettingRow(
                field=name,
                variables=variables,
                default=shown_default(field.get_default(call_default_factory=True)),
                allowed=_allowed(field),
                meaning=_meaning(docstrings[name], variables),
            )
        )
    return rows


def settings_table() -> str:
    """Return the settings table in Markdown: variable, default, allowed values, meaning."""
    lines = ["| variable | default | allowed | meaning |", "|---|---|---|---|"]
    for row in settings_rows():
        names = " / ".join(f"`{name}`" for name in row.variables)
        lines.append(f"| {names} | {row.default} | {row.allowed} | {_cell(row.meaning)} |")
    return "\n".join(lines)


def other_variables_table() -> str:
    """Return the table of the `ACTONCE_*` variables that are not settings (`OTHER_VARIABLES`).

    Raises:
        SourceMissing: If `OTHER_VARIABLES` holds a variable `OTHER_MEANINGS` does not describe.
    """
    undescribed = sorted(OTHER_VARIABLES - set(OTHER_MEANINGS))
    if undescribed:
        raise SourceMissing(
            f"worker.settings.OTHER_VARIABLES holds {undescribed}, which docs/hooks.py's "
            f"OTHER_MEANINGS does not describe: add a default and a meaning for each"
        )
    lines = ["| variable | default | meaning |", "|---|---|---|"]
    for name in sorted(OTHER_VARIABLES):
        default, meaning = OTHER_MEANINGS[name]
        lines.append(f"| `{name}` | {_cell(default)} | {_cell(meaning)} |")
    return "\n".join(lines)


def shown_default(value: object) -> str:
    """Return a default as the settings table shows it."""
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, float):
        return f"`{int(value)}`" if value.is_integer() else f"`{value!r}`"
    if isinstance(value, Enum):
        return f"`{value.value}`"
    return f"`{value}`"


def _variables(name: str, field: FieldInfo) -> tuple[str, ...]:
    # `AliasChoices` also lists the field's own name, for keyword arguments: only the variables.
    names = [f"ACTONCE_{name.upper()}"]
    alias = field.validation_alias
    if isinstance(alias, AliasChoices):
        for choice in alias.choices:
            if isinstance(choice, str) and choice.isupper() and choice not in names:
                names.append(choice)
    return tuple(names)


def _allowed(field: FieldInfo) -> str:
    annotation: Any = field.annotation
    if isinstance(annotation, TypeAliasType):
        annotation = annotation.__value__
    if get_origin(annotation) is Literal:
        return ", ".join(f"`{choice}`" for choice in get_args(annotation))
    if annotation is bool:
        return "`true`, `false`"
    bounds = []
    for limit in field.metadata:
        if isinstance(limit, annotated_types.Gt):
            bounds.append(f"> {limit.gt}")
        elif isinstance(limit, annotated_types.Ge):
            bounds.append(f"≥ {limit.ge}")
        elif isinstance(limit, annotated_types.Lt):
            bounds.append(f"< {limit.lt}")
        elif isinstance(limit, annotated_types.Le):
            bounds.append(f"≤ {limit.le}")
    return ", ".join(bounds)


_LEAD: Final = re.compile(r"^`(?P<name>[A-Z0-9_]+)`(?: \((?P<aside>[^)]*)\))?: ?")
_ALIAS_ASIDE: Final = re.compile(r"^or `(?P<name>[A-Z0-9_]+)`$")


def _meaning(docstring: str, variables: tuple[str, ...]) -> str:
    """Return a field's docstring without the variable's name it starts with.

    The docstrings in worker/settings.py start by naming their variable, which the table's first
    column already shows. An aside in brackets after it stays, at the end, unless it only names
    an alias the first column shows too.
    """
    lead = _LEAD.match(docstring)
    if lead is None or lead["name"] != variables[0]:
        return docstring
    meaning = docstring[lead.end() :]
    aside = lead["aside"]
    if aside is None:
        return meaning
    alias = _ALIAS_ASIDE.match(aside)
    if alias is not None and alias["name"] in variables:
        return meaning
    stem, period, _ = meaning.rpartition(".") if meaning.endswith(".") else (meaning, "", "")
    return f"{stem} ({aside}){period}"


# ─── reasons ──────────────────────────────────────────────────────────────────


def lifecycle() -> ModuleType:
    """Import `actonce.tasks.lifecycle`, the one source of the reasons page.

    Raises:
        SourceMissing: If the module does not exist in this checkout.
    """
    try:
        return importlib.import_module(LIFECYCLE)
    except ModuleNotFoundError as missing:
        if missing.name != LIFECYCLE:
            raise
        raise SourceMissing(
            f"docs/reasons.md is generated from {LIFECYCLE} (tasks/lifecycle.py), which this "
            f"checkout does not have: the reasons page cannot be built without it"
        ) from missing


def reasons_table() -> str:
    """Return the table of every `Reason`: its code, its meaning and whether reflexr retries it.

    Raises:
        SourceMissing: If the module is missing, or a reason's meaning is not one line.
    """
    reasons: Any = lifecycle().Reason
    retried = all(isinstance(getattr(reason, "retried", None), bool) for reason in reasons)
    lines = (
        ["| reason | meaning | attempt retried |", "|---|---|---|"]
        if retried
        else ["| reason | meaning |", "|---|---|"]
    )
    for reason in reasons:
        meaning = getattr(reason, "meaning", None)
        if not isinstance(meaning, str) or not meaning.strip() or "\n" in meaning.strip():
            raise SourceMissing(
                f"{LIFECYCLE}.Reason.{reason.name} has no one-line meaning: the reasons page "
                f"shows each reason's `meaning`"
            )
        row = f"| `{reason.value}` | {_cell(meaning.strip())} |"
        lines.append(row + (f" {'yes' if reason.retried else 'no'} |" if retried else ""))
    return "\n".join(lines)


def fates_table() -> str:
    """Return the table of `FATES`: each way a delivery can end, and what follows it.

    Raises:
        SourceMissing: If the module is missing, or a fate does not describe itself in one line.
    """
    module = lifecycle()
    described = attribute_docstrings(module.Happened)
    lines = ["| what happened | what follows |", "|---|---|"]
    for happened, fate in module.FATES.items():
        follows = fate.describe()
        if not isinstance(follows, str) or "\n" in follows.strip():
            raise SourceMissing(
                f"{LIFECYCLE}.FATES[{happened!r}].describe() did not return one line: {follows!r}"
            )
        what = f"`{happened.value}`"
        if happened.name in described:
            what += f": {described[happened.name]}"
        lines.append(f"| {_cell(what)} | {_cell(follows.strip())} |")
    return "\n".join(lines)


# ─── API reference ────────────────────────────────────────────────────────────


@dataclass(frozen=True)
class ReferencePage:
    """An API reference page, generated whole: mkdocstrings renders each object from source."""

    path: str
    """Where the page goes, under docs/."""

    title: str
    """The page's title."""

    intro: str
    """What the page covers and how to import it."""

    objects: tuple[str, ...]
    """The objects it renders, by their full dotted path."""

    def markdown(self) -> str:
        """Return the page's Markdown: its title, its intro and a block per object."""
        blocks = "\n\n".join(f"::: {name}" for name in self.objects)
        return f"# {self.title}\n\n{self.intro}\n\n{blocks}\n"


REFERENCE: Final = (
    ReferencePage(
        path="reference/outbound.md",
        title="Outbound and RunActions",
        intro=(
            "The act-once handle an application builds and its actions use: "
            "`from actonce import Outbound, RunActions` (or `from actonce.tasks import ...`). "
            "Both subclass relayr-ai's own; see [Concepts](../concepts.md#the-act-once-handle)."
        ),
        objects=("actonce.tasks.outbound.Outbound", "actonce.tasks.outbound.RunActions"),
    ),
    ReferencePage(
        path="reference/definition.md",
        title="Definition",
        intro=(
            "What an application runs on the pool, named by `ACTONCE_APP=module:attribute`: "
            "`from actonce.worker.definition import Definition`. See "
            "[Getting started](../getting-started.md#a-minimal-application)."
        ),
        objects=("actonce.worker.definition.Definition",),
    ),
    ReferencePage(
        path="reference/settings.md",
        title="Settings",
        intro=(
            "The pool's settings, read from the environment once. Every field is the variable "
            "`ACTONCE_<FIELD>`; the [Configuration](../configuration.md) page lists them."
        ),
        objects=("actonce.worker.settings.Settings",),
    ),
)
"""The API reference pages, generated at build time."""


# ─── shared ───────────────────────────────────────────────────────────────────


def metrics_table() -> str:
    """Return the table of actonce's metrics, from the registry the pool records them by."""
    from actonce.worker.observers.metrics import METRICS

    lines = ["| metric | kind | unit | what it measures | attributes |", "|---|---|---|---|---|"]
    for metric in METRICS.values():
        kept = ", ".join(f"`{name}`" for name in sorted(metric.attributes))
        lines.append(
            f"| `{metric.name}` | {metric.instrument} | `{metric.unit}` | "
            f"{_cell(metric.description)} | {kept or '-'} |"
        )
    return "\n".join(lines)


GENERATED: Final[Mapping[str, Callable[[], str]]] = {
    "settings": settings_table,
    "other-variables": other_variables_table,
    "fates": fates_table,
    "reasons": reasons_table,
    "metrics": metrics_table,
}
"""Each generated part a page may take, by the name its marker gives."""


def attribute_docstrings(cls: type) -> dict[str, str]:
    """Return the docstring under each attribute of `cls`, by name, each on one line.

    Attribute docstrings are not kept at run time: they are read from the class's source, as
    griffe reads them for the API pages.
    """
    source = textwrap.dedent(inspect.getsource(cls))
    body = next(n for n in ast.parse(source).body if isinstance(n, ast.ClassDef)).body
    found = {}
    for node, after in itertools.pairwise(body):
        if not (
            isinstance(after, ast.Expr)
            and isinstance(after.value, ast.Constant)
            and isinstance(after.value.value, str)
        ):
            continue
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            found[node.target.id] = " ".join(inspect.cleandoc(after.value.value).split())
        elif (
            isinstance(node, ast.Assign)
            and len(node.targets) == 1
            and isinstance(node.targets[0], ast.Name)
        ):
            found[node.targets[0].id] = " ".join(inspect.cleandoc(after.value.value).split())
    return found


def generated_part(name: str) -> str:
    """Return the generated part a marker names.

    Raises:
        SourceMissing: If no part has that name, or its source cannot give it.
    """
    if name not in GENERATED:
        raise SourceMissing(f"no generated part is called {name!r}; there are {sorted(GENERATED)}")
    return GENERATED[name]()


def fill(markdown: str) -> tuple[str, set[str]]:
    """Return `markdown` with each marker replaced by its generated part, and the parts used."""
    used: set[str] = set()

    def part(marker: re.Match[str]) -> str:
        used.add(marker[1])
        return generated_part(marker[1])

    return MARKER.sub(part, markdown), used


def _cell(text: str) -> str:
    """Return `text` safe in a Markdown table cell."""
    return text.replace("|", "\\|")


# ─── MkDocs hooks ─────────────────────────────────────────────────────────────

_USED: Final[set[str]] = set()
"""The generated parts the pages of the current build took."""


def on_pre_build(config: MkDocsConfig) -> None:
    _USED.clear()


def on_files(files: Files, config: MkDocsConfig) -> Files:
    for page in REFERENCE:
        files.append(File.generated(config, page.path, content=page.markdown()))
    return files


def on_page_markdown(markdown: str, page: Page, config: MkDocsConfig, files: Files) -> str:
    try:
        filled, used = fill(markdown)
    except SourceMissing as missing:
        raise PluginError(f"{page.file.src_uri}: {missing}") from missing
    _USED.update(used)
    return filled


def on_env(env: Environment, config: MkDocsConfig, files: Files) -> Environment:
    # A page that lost its marker would drop a table without a word: every part has a place.
    unused = sorted(set(GENERATED) - _USED)
    if unused:
        raise PluginError(f"no page takes the generated parts {unused}: add their markers")
    return env
