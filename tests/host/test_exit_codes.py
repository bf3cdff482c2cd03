"""Exit codes: errors.py is the one table; docs/troubleshooting.md and the README show it, every command's
--help and the docs name only codes from it, with the meaning it gives them (a partial fleet result is 5)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from edgedeploy import errors
from edgedeploy.cli.main import app

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "troubleshooting.md"

# words that name one code's meaning when they follow the number ("5 some failed", "2 partial")
MEANT = [
    (re.compile(r"\b(some|partial)\b"), errors.EXIT_PARTIAL),
    (re.compile(r"\bnone\b"), errors.EXIT_FAILED),
    (re.compile(r"\b(ctrl-c|interrupted)\b"), errors.EXIT_INTERRUPTED),
    (re.compile(r"\b(internal|a bug)\b"), errors.EXIT_INTERNAL),
    (re.compile(r"^(all|every)\b"), errors.EXIT_OK),
]
_EXIT = re.compile(r"\bexit(?:s|s with| with| code| codes)?\b:?\s*(.*?)(?:\.\s|\.$|\)\s*$|$)", re.I)
_TRIPLE = re.compile(r"\b(\d+) ?/ ?(\d+) ?/ ?(\d+)\b")
_NUMBER = re.compile(r"\b(\d+)\b((?:(?!\b\d+\b)[^,;(])*)")


def exit_claims(text: str) -> Iterator[tuple[int, str]]:
    """(code, the words after it) for every number in a sentence part that starts with exit/exits, e.g.
    "exit 0 when all answered, 5 when some did, 1 when none did" gives (0, "when all answered"), ..."""
    for m in _EXIT.finditer(text):
        clause = m.group(1)
        triple = _TRIPLE.search(clause)
        if triple:  # "0 / 5 / 1" after a fleet command: all, some, none
            yield from zip(map(int, triple.groups()), ("all", "some", "none"), strict=True)
            clause = clause[: triple.start()] + clause[triple.end() :]
        for number, words in _NUMBER.findall(clause):
            if len(number) <= 3:
                yield int(number), words.strip().lower()


def meaning_of(words: str) -> int | None:
    words = re.sub(r"^(when|if|on|for|as)\s+", "", words)
    for pattern, code in MEANT:
        if pattern.search(words):
            return code
    return None


def wrong_claims(text: str, known: set[int] | None = None) -> list[str]:
    """Codes not in `known` (None: any number), codes whose words give them another code's meaning."""
    bad = []
    for code, words in exit_claims(text):
        if known is not None and code not in known:
            bad.append(f"exit {code} ({words!r}) is no exit code of edgedeploy")
        elif (meant := meaning_of(words)) is not None and meant != code:
            bad.append(f"exit {code} {words!r}: that is {meant} ({errors.DOCUMENTED_EXIT_CODES[meant]})")
    return bad


def test_the_checker_finds_what_issue_35_saw() -> None:
    known = set(errors.DOCUMENTED_EXIT_CODES)
    assert wrong_claims("Exit 0 all ok, 2 partial, 1 failed.", known) == [
        "exit 2 'partial': that is 5 (" + errors.DOCUMENTED_EXIT_CODES[5] + ")"
    ]
    assert wrong_claims("exit 0 when all answered, 2 when some failed, 1 when none did.", known)
    assert wrong_claims("(exit 0 nothing failed, 1 a check failed; `--group`: 0 / 2 / 1 as the fleet commands)", known)
    assert wrong_claims("one line and exit 9", known) == ["exit 9 ('') is no exit code of edgedeploy"]
    ok = "Exit 0 when every device is ok, 5 when some are (partial), 1 when none is; a dry run exits 0."
    assert list(exit_claims(ok)) == [(0, "when every device is ok"), (5, "when some are"), (1, "when none is"), (0, "")]
    assert not wrong_claims(ok, known)


def test_the_documented_table_is_the_one_in_errors_py() -> None:
    """Each EXIT_* constant has one meaning (DOCUMENTED_EXIT_CODES); docs/troubleshooting.md's table is made of
    exactly those rows, and the README names every code."""
    constants = {v for k, v in vars(errors).items() if k.startswith("EXIT_")}
    assert constants == set(errors.DOCUMENTED_EXIT_CODES) and len(constants) >= 8
    section = DOC.read_text(encoding="utf-8").split("## Exit codes", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| (\d+) \| (.+) \|$", section, flags=re.M)
    assert [(int(c), m) for c, m in rows] == sorted(errors.DOCUMENTED_EXIT_CODES.items())
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert all(re.search(rf"\b{v} ", readme) for v in constants if v), readme
    assert errors.fleet_exit_code(2, 2) == errors.EXIT_OK
    assert errors.fleet_exit_code(1, 2) == errors.EXIT_PARTIAL
    assert errors.fleet_exit_code(0, 2) == errors.EXIT_FAILED


def _commands() -> list[tuple[list[str], Any]]:
    def walk(c: Any, path: list[str]) -> Iterator[tuple[list[str], Any]]:
        if hasattr(c, "commands"):
            for name, sub in sorted(c.commands.items()):
                yield from walk(sub, [*path, name])
        else:
            yield path, c

    return list(walk(typer.main.get_command(app), []))


COMMANDS = _commands()
# the commands that act on several devices and end with errors.fleet_exit_code: 0 all, 5 some, 1 none
FLEET = {"rollout", "status", "verify", "rollback", "keys install"}


def _help(path: list[str]) -> str:
    r = CliRunner().invoke(app, [*path, "--help"], env={"COLUMNS": "220", "NO_COLOR": "1", "TERM": "dumb"})
    assert r.exit_code == 0, r.output
    flat = re.sub(r"[│╭╮╰╯─]", " ", r.output)  # rich's boxes
    return re.sub(r"\s+", " ", flat)


def test_fleet_commands_are_the_ones_with_a_group() -> None:
    grouped = {" ".join(p) for p, c in COMMANDS if any(param.name == "group" for param in c.params)}
    assert grouped <= FLEET and FLEET <= {" ".join(p) for p, _ in COMMANDS}


@pytest.mark.parametrize("path", [p for p, _ in COMMANDS], ids=[" ".join(p) for p, _ in COMMANDS])
def test_help_names_exit_codes_as_the_code_returns_them(path: list[str]) -> None:
    text = _help(path)
    assert not wrong_claims(text, set(errors.DOCUMENTED_EXIT_CODES)), text
    if " ".join(path) in FLEET:
        claimed = {code: meaning_of(words) for code, words in exit_claims(text)}
        assert claimed.get(errors.EXIT_PARTIAL) == errors.EXIT_PARTIAL, f"say 5 for a partial result: {text}"


@pytest.mark.parametrize(("path", "command"), COMMANDS, ids=[" ".join(p) for p, _ in COMMANDS])
def test_help_shows_every_bracket_it_was_given(path: list[str], command: Any) -> None:
    """Rich reads [word] as markup and drops it ("default: fleet.toml's )"): texts escape it as \\[word]."""
    texts = [command.help or "", *(getattr(p, "help", None) or "" for p in command.params)]
    shown = _help(path)
    for text in texts:
        for bracket in re.findall(r"(?<!\\)\[[A-Za-z_][\w.-]*\]", text):
            assert bracket in shown, f"{bracket} of {text!r} is not in the help: escape it as \\{bracket}"


DOCS = sorted([REPO / "README.md", *(REPO / "docs").glob("*.md")])


@pytest.mark.parametrize("doc", DOCS, ids=[d.name for d in DOCS])
def test_docs_give_a_partial_fleet_result_exit_5(doc: Path) -> None:
    """The docs name the agent's exit codes too (1-14), so only meanings are checked here: a partial
    result, none, Ctrl-C and the like must carry the host's code for them."""
    bad = []
    for n, line in enumerate(doc.read_text(encoding="utf-8").splitlines(), 1):
        bad += [f"{doc.name}:{n}: {b}" for b in wrong_claims(line)]
    assert not bad, "\n".join(bad)
