"""No measured figure in product code's comments and docstrings: they say why, never how fast.

A timing, a rate, a ratio or a share measured on some machine ("2 ms of CPU an attempt", "2.1×",
"3% of a core", "13 of its 34 statements") goes stale in code: the code moves on, the machine
changes, and the comment goes on quoting the old number as if it were true. Such figures live on
the docs' benchmarks page, beside the command that measures them; a comment or docstring keeps
the reason the code is shaped so, without the number.

This test reads every comment (by `tokenize`) and every docstring, attribute docstrings included
(by `ast`), of the product code: every module under `worker/` and `tasks/`, and
`actonce/__init__.py`. It looks for the shapes measured figures take and fails naming file:line.
Figures that are not measurements stay: the defaults and limits the code sets ("1 s, doubling to
30 s", "every 30 s", "default 30 s"), protocol facts (PostgreSQL's 8,000 bytes) and counts true
by construction ("one round trip where there were four"). The cases at the end pin both sides:
lines once in the product code that must be flagged, and lines that must not.
"""

import ast
import io
import re
import tokenize
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import pytest

ROOT: Final = Path(__file__).resolve().parents[1]

_NUMBER: Final = r"(?<![\w.-])\d[\d,]*(?:\.\d+)?"
"""A written number: `2`, `0.8`, `1,114`."""

_WORD_NUMBER: Final = (
    r"(?:one|two|three|four|five|six|seven|eight|nine|ten|eleven|twelve|fifteen|twenty|thirty"
    r"|forty|fifty|hundred|thousand)"
)
"""A number spelt out, as counts in prose are."""

SHAPES: Final[dict[str, re.Pattern[str]]] = {
    name: re.compile(pattern, re.IGNORECASE)
    for name, pattern in {
        # The settings and constants count in seconds: a figure in milliseconds is a timing.
        "sub-second timing": (
            rf"\b{_NUMBER}\s*(?:ms|µs|us|ns|milliseconds?|microseconds?|nanoseconds?)\b"
        ),
        "CPU time": (
            rf"\b{_NUMBER}\s*(?:s|sec|seconds?|minutes?)\s+of\s+(?:\S+\s+){{0,2}}?CPU\b"
            r"|(?<!many )\b(?:seconds|milliseconds|minutes)\s+of\s+(?:\S+\s+){0,2}?CPU\b"
        ),
        "order of magnitude": (
            r"\b(?:tens|hundreds|thousands|dozens)\s+of\s+(?:(?:milli|micro|nano)?seconds"
            r"|statements|round trips|queries|run facts|objects)\b"
        ),
        "ratio": rf"\b{_NUMBER}\s*×|\b{_NUMBER}x\b|\b{_NUMBER}\s+times\s+(?:faster|slower)\b",
        "percentage": rf"\b{_NUMBER}\s*(?:%|percent\b)",
        "share of a core": (
            r"\b(?:half|thirds?|quarters?|fifths?|tenths?)\b(?:\s+[^\s.;:]+){0,4}?\s+(?:cores?|CPU)\b"
        ),
        "measurement": r"\bmeasured\b|\bthis machine\b",
        "percentile": (
            rf"\bp(?:50|75|90|95|99|999)\b[^.\n]{{0,20}}?{_NUMBER}"
            rf"|{_NUMBER}[^.\n]{{0,20}}?\bp(?:50|75|90|95|99|999)\b"
        ),
        "approximate figure": (
            rf"(?:\babout|\baround|\broughly|\bnearly|~)\s*{_NUMBER}|\b{_NUMBER}-odd\b"
        ),
        "count out of a count": (
            rf"\b(?:{_NUMBER}|{_WORD_NUMBER})\s+of\s+(?:its|the|their)\s+"
            rf"(?:{_NUMBER}|{_WORD_NUMBER})\b"
        ),
        "count per unit": (
            rf"\(\s*{_NUMBER}\s+per\s+\w+\s*\)"
            rf"|\b{_NUMBER}\s+(?:runs|events|attempts|messages|polls|sends)\s*/\s*s\b"
        ),
        "rate": rf"\b(?:{_NUMBER}|{_WORD_NUMBER})\s+(?:times\s+)?(?:a|per)\s+second\b",
        "observed wait": (
            rf"\b(?:waited|took|lasted|spent)\s+(?:about\s+|only\s+|over\s+|under\s+)?"
            rf"{_NUMBER}\s*(?:s|sec|seconds?|minutes?|hours?)\b"
        ),
        "observed growth": (
            rf"\b(?:became|grew to|turned into)\s+(?:{_NUMBER}|(?:a|{_WORD_NUMBER})\s+"
            rf"(?:hundred|thousand)|{_WORD_NUMBER})\b"
        ),
        "sized run": rf"\b{_NUMBER}-(?:run|event|attempt|message|workspace|round)s?\b",
    }.items()
}
"""The shapes a measured figure takes, by name: what a finding says it looks like."""


@dataclass(frozen=True)
class Prose:
    """A comment block or a docstring, and the line of the file it starts on."""

    line: int
    text: str


@dataclass(frozen=True)
class Finding:
    """A measured figure's shape found in the prose of a file."""

    line: int
    shape: str
    excerpt: str


def product_files() -> list[Path]:
    """Every module of the product code: `worker/`, `tasks/` and `actonce/__init__.py`."""
    files = [*(ROOT / "worker").rglob("*.py"), *(ROOT / "tasks").rglob("*.py")]
    return sorted([*files, ROOT / "actonce" / "__init__.py"])


def comments(source: str) -> list[Prose]:
    """The comments of `source`, those on consecutive lines joined into one block."""
    blocks: list[Prose] = []
    last = -1
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type != tokenize.COMMENT:
            continue
        row = token.start[0]
        text = token.string.removeprefix("#").strip()
        if blocks and row == last + 1:
            blocks[-1] = Prose(blocks[-1].line, f"{blocks[-1].text}\n{text}")
        else:
            blocks.append(Prose(row, text))
        last = row
    return blocks


def docstrings(source: str) -> list[Prose]:
    """Every string that stands alone as a statement in `source`: the docstrings of modules,
    classes and functions, and those that follow an attribute or a constant."""
    found: list[Prose] = []
    for node in ast.walk(ast.parse(source)):
        if (
            isinstance(node, ast.Expr)
            and isinstance(node.value, ast.Constant)
            and isinstance(node.value.value, str)
        ):
            found.append(Prose(node.lineno, node.value.value))
    return found


def findings(source: str) -> list[Finding]:
    """Each place in the comments and docstrings of `source` that has a measured figure's shape."""
    found: list[Finding] = []
    for prose in [*comments(source), *docstrings(source)]:
        for shape, pattern in SHAPES.items():
            for match in pattern.finditer(prose.text):
                line = prose.line + prose.text.count("\n", 0, match.start())
                found.append(Finding(line, shape, " ".join(match.group().split())))
    return sorted(found, key=lambda finding: finding.line)


def test_product_code_quotes_no_measured_figure() -> None:
    files = product_files()
    assert len(files) > 40, "the product code was not found"
    problems = [
        f"{path.relative_to(ROOT)}:{finding.line}: {finding.shape}: {finding.excerpt!r}"
        for path in files
        for finding in findings(path.read_text())
    ]
    assert not problems, (
        "measured figures in product code's comments or docstrings: keep the reason, move the "
        "figure to the docs' benchmarks page beside the command that measures it\n"
        + "\n".join(problems)
    )


ONCE_IN_THE_CODE: Final = [
    "the ledger is relayr's. An attempt of two writes so costs 0.8 ms less CPU in a worker "
    "(20.2 ms, not 21.0: PostgreSQL, this machine).",
    "released so costs 0.6 ms of CPU a statement, not 1.1 (PostgreSQL, this machine).",
    "every batch, milliseconds after taking it: two of the four lease statements of a dispatcher's",
    "Built once: building it, and its cache key, on every take cost a dispatcher at low load 4% "
    "of its CPU.",
    "reading them as they come cost a burst in one workspace 2 ms of CPU an attempt.",
    "Redis client per message: half the dispatcher's CPU per send (`bench.sends`).",
    "entries costs tens of milliseconds whatever their number (a transaction per rule, twice),",
    "and beat the heartbeat. At ten a second they cost an idle dispatcher 3% of a core.",
    "run is due on every poll, and reading and marking them all ten times a second cost the "
    "dispatcher a third of a core.",
    "rule to the catch-up: reading every such backlog at once, every 30 s, cost seconds of CPU,",
    "`1 / share` times as long. At low load an event's evaluation (30 to 80 ms of reflexr's CPU)",
    "burst's evaluation that waits on PostgreSQL for 13 s and uses 1.7 s of CPU kept well under "
    "half a core",
    "stretch made it do (the low-load events after a burst then waited 1.5 s).",
    "(`worker.storage.leases`): at low load each event's evaluation took and deleted it, two of "
    "its twenty statements,",
    "evaluation reads every entry past a rule's cursor, so after a burst the next event would "
    "pay for hundreds of run facts.",
    "them cost the dispatcher tens of milliseconds a time for nothing, since no rule listened.",
    "the queue (a thousand runs once became six thousand messages).",
    "announcing again each turn of a backlog that only waited for the turn worker sent 1,114 "
    "announcements for 9 lost in a 10,000-run chaos.",
    "and decoding them all, under the workspace row's lock, cost a burst of 500 runs in one "
    "scope half of a worker child's CPU per attempt (35 ms, 19 without).",
    "a head; reading on past it cost an evaluation of one event two or three more batches (13 of "
    "its 34 statements) to read those facts.",
    "- the cyclic collector walking, in each of its full collections, the 200,000-odd objects "
    "built",
    "No `pool_pre_ping`: it pings before every checkout, a round trip per transaction (11 per "
    "attempt).",
    "password, or a database number the server does not have, logged the same line for about 45 "
    "minutes",
    "its own (a lease and about 20 statements). Only appends wake a dispatcher (PostgreSQL); on",
    "evaluation of tens of milliseconds (a lease and a few transactions per rule): a quarter of "
    "a core held back events that came only four a second in different workspaces.",
    "`oversized` before anything decodes it. An attempt's envelope is about 1 KB.",
    "pays that, for a ~50 ms p50; the uvloop run was 2.1× faster.",
    "Thread CPU of one poll firing one run: 16 statements, p50 12.0 ms, measured with the bench.",
]
"""Lines once in the product code (and two from commit messages), each with a measured figure."""

LEGITIMATE: Final = [
    "How long a lease lives, in seconds (default 30 s).",
    "A store that goes away meanwhile makes the task retry, 1 s then doubling to 30 s.",
    "How long the `retries`-th try of a task whose store was away waits: 1, 2, 4, … 30 s.",
    "a stretch of quiet entries is never its reason to read them all, every 30 s, everywhere.",
    "backs off between them (1, 2, 4, 8, 16 s, then 30 s), one log line a step: 15 is about five "
    "minutes.",
    "doubled after each ask (5, 10, 20, 40 s by default).",
    "connection `ACTONCE_BROKER_MAX_RETRIES` times, 2 to 30 s apart: a worker started with a wrong",
    "The longest payload a notification carries (PostgreSQL refuses 8,000 bytes).",
    "PostgreSQL's admin shutdown, crash shutdown and cannot connect now, besides every "
    "connection exception (class 08).",
    "autocommit on PostgreSQL, one round trip where `BEGIN` and `COMMIT` made three.",
    "one transaction fewer per attempt; one round trip where there were four;",
    "How many seconds of its CPU share the dispatcher may spend at once (`CpuBudget`).",
    "It refills at `share` CPU seconds per second of wall time, up to `share * burst_s`;",
    "`1 / share` times as long, while sustained load is still held to `share` of a core.",
    "Allocations between two collections of the youngest generation (Python's default: 700).",
    "`batch_size` is how many log entries each transaction reads (reflexr's default, 500).",
    "least nine tenths of its ttl left, not all of it. Renewals come every third of the ttl.",
    "Whether at least half of the burst is in the budget at `now`: the dispatcher is not busy.",
    "What a dispatcher has done since it started, and the CPU each half of its polls took.",
    "a settling delivery takes milliseconds; one whose store went away meanwhile retries.",
    "thousands of idle workspaces would make every poll slow.",
    "Text every store keeps: lone surrogates as backslash escapes, a NUL as `\\x00`.",
    "`dl_` and the first 16 hex characters of the SHA-256 of the four parts joined by NULs.",
    "(the lease plus a second) and clock skew between the machine that sent it and this one.",
    "at least every second, never more often than `poll_interval_s`.",
    "Redis client per message, which cost the dispatcher CPU on every send (`bench.sends`).",
]
"""Lines whose figures are defaults, limits, protocol facts or counts by construction."""


def _as_comment(line: str) -> str:
    """`line` as a comment, on the source's line 1."""
    return f"x = 1  # {line}\n"


def _as_docstring(line: str) -> str:
    """`line` as the docstring of a constant, on the source's line 2."""
    quotes = '"' * 3
    return f"LIMIT = 1\n{quotes}{line}{quotes}\n"


WRITTEN: Final[dict[str, tuple[Callable[[str], str], int]]] = {
    "comment": (_as_comment, 1),
    "docstring": (_as_docstring, 2),
}
"""How a case's line is written into a source, and the line it lands on."""


@pytest.mark.parametrize("line", ONCE_IN_THE_CODE)
@pytest.mark.parametrize("written", WRITTEN)
def test_a_measured_figure_is_flagged(line: str, written: str) -> None:
    write, at = WRITTEN[written]
    found = findings(write(line))
    assert found, f"not flagged: {line!r}"
    assert {finding.line for finding in found} == {at}


@pytest.mark.parametrize("line", LEGITIMATE)
@pytest.mark.parametrize("written", WRITTEN)
def test_a_default_a_limit_or_a_fact_is_not_flagged(line: str, written: str) -> None:
    write, _ = WRITTEN[written]
    assert findings(write(line)) == []


def test_only_comments_and_docstrings_are_read() -> None:
    source = (
        '"""A module."""\n'
        "\n"
        'TEMPLATE = "took 2 ms, 3% of a core"\n'
        "\n"
        "def f() -> None:\n"
        '    """Do it."""\n'
        "    print(TEMPLATE)  # cost 0.8 ms per call\n"
        "    # and 2.1× faster than before,\n"
        "    # measured on this machine\n"
    )
    found = findings(source)
    assert {(finding.line, finding.shape) for finding in found} == {
        (7, "sub-second timing"),
        (8, "ratio"),
        (9, "measurement"),
    }
