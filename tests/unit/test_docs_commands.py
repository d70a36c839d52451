"""Every command line the README and docs/*.md show runs as written (issue 28.1).

Docs drift: a flag is renamed, a bench script moves, and the page still shows the old line. Here
every shell line of a fenced block (and every inline code span that starts with one of the three
programs) is read as the shell would split it, and each command in it is checked against what
exists now: `hypertopo-agent`, `hypertopo-aggregator` and `hypertopo-scheduler` (also as
`python -m agent.cli` ...) against their real argparse parsers, built in-process (the subcommand
exists, every option named is one that subcommand's `--help` lists); `python tests/....py` against
the script's own `add_argument` calls (read from its source, not run); `make X` against the
Makefile's targets; and every repository path on the line (`tests/...`, `daemonset/...`, ...)
must exist.

docs/configuration.md's tables, one per command, are generated from the same parsers
(`python tests/unit/test_docs_commands.py` prints them); the test holds each table to its parser's
options and defaults, so a new flag fails here until it is documented."""

from __future__ import annotations

import argparse
import ast
import functools
import importlib.util
import re
import shlex
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PROGRAMS = ("hypertopo-agent", "hypertopo-aggregator", "hypertopo-scheduler")
MODULES = {"agent.cli": "hypertopo-agent", "aggregator.cli": "hypertopo-aggregator",
           "aggregator.placement.cli": "hypertopo-scheduler"}  # fmt: skip
SHELL_FENCES = ("", "sh", "shell", "bash", "console")
INLINE_COMMANDS = {*PROGRAMS, "python", "python3", "pytest", "make", "cd"}  # an inline span starting so is a command
REPO_PATH = re.compile(r"^(?:tests|agent|aggregator|daemonset|charts|docs|requirements|crds|\.ci)/")
CONFIG = REPO / "docs" / "configuration.md"


@functools.cache
def parsers() -> dict[str, argparse.ArgumentParser]:
    """Each program's real parser, with `run` loaded (the controller's and the scheduler's flags)."""
    from agent.cli import build_parser
    from aggregator.cli import parser as aggregator_parser
    from aggregator.placement.cli import parser as scheduler_parser

    return {"hypertopo-agent": build_parser(), "hypertopo-aggregator": aggregator_parser(["run"]),
            "hypertopo-scheduler": scheduler_parser(load_run=True)}  # fmt: skip


def subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def doc_files() -> list[Path]:
    return [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def shell_lines(text: str) -> Iterator[str]:
    """The lines of shell fences (continuations joined) and inline spans that are commands."""
    for fence in re.finditer(r"^```([a-z]*)\n(.*?)^```", text, re.S | re.M):
        if fence.group(1) in SHELL_FENCES:
            yield from re.sub(r"\\\n\s*", " ", fence.group(2)).splitlines()
    prose = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    for span in re.findall(r"`([^`\n]*(?:\n[^`\n]*)?)`", prose):
        span = " ".join(span.split())
        if _unwrapped(span.split(" "))[:1] and _unwrapped(span.split(" "))[0] in INLINE_COMMANDS:
            yield span


def commands(line: str) -> Iterator[list[str]]:
    """The words of each command of a shell line (split at pipes, `&&`, `;`), prompt and comment off."""
    line = re.sub(r"^\s*\$ ", "", line)
    lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    try:
        words = list(lexer)
    except ValueError:  # an unbalanced quote in a line of output, not a command
        return
    current: list[str] = []
    for word in words:
        if word and set(word) <= set("|&;()<>"):
            if current:
                yield current
            current = []
        else:
            current.append(word)
    if current:
        yield current


def _unwrapped(words: list[str]) -> list[str]:
    """`words` past environment settings and wrappers (`sudo`, `nice -n 10`, `PYTHONPATH=x`)."""
    while words:
        if re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", words[0]) or words[0] in ("sudo", "exec", "env"):
            words = words[1:]
        elif words[0] == "nice":
            words = words[3:] if words[1:2] == ["-n"] else words[1:]
        elif words[0] == "timeout":
            words = words[2:]
        else:
            return words
    return words


def _values(action: argparse.Action) -> int | None:
    """How many words an option takes after it (None: all up to the next option)."""
    if action.nargs in ("+", "*"):
        return None
    if action.nargs == "?":
        return 0
    return action.nargs if isinstance(action.nargs, int) else 1


def _is_option(word: str) -> bool:
    return word.startswith("-") and len(word) > 1 and not re.match(r"^-\d", word)


def program_problems(program: str, words: list[str]) -> list[str]:
    """What in `program words...` the program's parser does not know."""
    parser, name, problems = parsers()[program], program, []
    skip: int | None = 0
    chosen = False
    for raw in words:
        word = raw.strip("[]")
        if _is_option(word):
            flag = word.split("=", 1)[0]
            action = parser._option_string_actions.get(flag)
            if action is None:
                problems.append(f"{name}: no option {flag}")
                skip = 0
            else:
                skip = 0 if "=" in word else _values(action)
        elif skip is None or (skip and skip > 0):
            skip = None if skip is None else skip - 1
        elif not chosen and (choices := subcommands(parser)):
            if word not in choices:
                problems.append(f"{name}: no subcommand {word!r} (has {', '.join(choices)})")
                return problems
            parser, name, chosen = choices[word], f"{name} {word}", True
    return problems


@functools.cache
def script_flags(path: Path) -> frozenset[str]:
    """The option strings a script's own `add_argument` calls define (read, not imported)."""
    flags = {"-h", "--help"}
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "add_argument":
            flags.update(arg.value for arg in node.args if isinstance(arg, ast.Constant) and isinstance(arg.value, str)
                         and arg.value.startswith("-"))  # fmt: skip
    return frozenset(flags)


def python_problems(words: list[str], cwd: Path) -> list[str]:
    """`python [-u] tests/x.py --flags` or `python -m module ...`."""
    rest = words[1:]
    while rest and rest[0] in ("-u", "-B", "-O", "-X"):
        rest = rest[2:] if rest[0] == "-X" else rest[1:]
    if not rest:
        return []
    if rest[0] == "-m":
        module = rest[1] if len(rest) > 1 else ""
        if module in MODULES:
            return program_problems(MODULES[module], rest[2:])
        if module in ("pytest", "pip", "venv", "json.tool"):
            return []
        return [] if importlib.util.find_spec(module) else [f"python -m {module}: no such module"]
    script = cwd / rest[0]
    if not rest[0].endswith(".py"):
        return []
    if not script.is_file():
        return [f"python {rest[0]}: no such script"]
    known = script_flags(script)
    return [f"python {rest[0]}: no option {w.split('=', 1)[0]}" for w in rest[1:]
            if _is_option(w.strip("[]")) and w.strip("[]").split("=", 1)[0] not in known]  # fmt: skip


def make_problems(words: list[str]) -> list[str]:
    targets = set(re.findall(r"^([A-Za-z][\w-]*):", (REPO / "Makefile").read_text(encoding="utf-8"), re.M))
    return [f"make {word}: no such target" for word in words[1:] if not word.startswith("-") and word not in targets]


def path_problems(words: list[str], cwd: Path) -> list[str]:
    found = []
    for word in words:
        path = word.strip("[]").split("=", 1)[-1].rstrip(",.:")
        if REPO_PATH.match(path) and "*" not in path and not (cwd / path).exists() and not (REPO / path).exists():
            found.append(f"no such path {path}")
    return found


def line_problems(line: str) -> list[str]:
    """Everything on one shell line that does not exist (empty: the line runs as written)."""
    problems: list[str] = []
    cwd = REPO
    for raw in commands(line):
        words = _unwrapped(raw)
        if not words:
            continue
        problems += path_problems(words, cwd)
        head = words[0].rsplit("/", 1)[-1]
        if words[0] == "cd" and len(words) > 1:
            cwd = cwd / words[1]
        elif head in PROGRAMS:
            problems += program_problems(head, words[1:])
        elif re.fullmatch(r"python(3(\.\d+)?)?", head):
            problems += python_problems(words, cwd)
        elif head == "make":
            problems += make_problems(words)
    return problems


def test_every_command_line_in_the_readme_and_docs_names_what_exists() -> None:
    checked, problems = 0, []
    for path in doc_files():
        for line in shell_lines(path.read_text(encoding="utf-8")):
            checked += 1
            problems += [f"{path.relative_to(REPO)}: {line.strip()[:100]}: {p}" for p in line_problems(line)]
    assert checked > 50, checked
    assert problems == []


def test_a_made_up_flag_a_missing_subcommand_or_script_and_a_missing_path_are_found() -> None:
    assert line_problems("hypertopo-agent run --node-name n1 --interval 30") == []
    assert line_problems("hypertopo-agent run --no-such-flag 3") == ["hypertopo-agent run: no option --no-such-flag"]
    assert line_problems("hypertopo-aggregator --log-format json render --reports DIR --no-such=1") == [
        "hypertopo-aggregator render: no option --no-such"]
    assert line_problems("hypertopo-scheduler simulate --synthetic 2 | hypertopo-scheduler plan") == [
        "hypertopo-scheduler: no subcommand 'plan' (has run, simulate)"]
    assert line_problems("hypertopo-aggregator render --model tests/models/no-such.yaml") == [
        "no such path tests/models/no-such.yaml"]
    assert line_problems("nice -n 10 python tests/bench/bench_memory.py --inprocess 5000 --old-max 1") == []
    assert line_problems("python tests/bench/bench_memory.py --made-up") == ["python tests/bench/bench_memory.py: no option --made-up"]
    assert line_problems("cd tests && python bench_no_such.py") == ["python bench_no_such.py: no such script"]
    assert line_problems("python -m agent.cli probe --made-up") == ["hypertopo-agent probe: no option --made-up"]
    assert line_problems("sudo make demo && make no-such-target") == ["make no-such-target: no such target"]
    assert line_problems("kubectl apply -k daemonset/no-such/  # comment tests/no/such") == [
        "no such path daemonset/no-such/"]


def slug(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def link_problems(path: Path) -> list[str]:
    """Relative links of a page whose file, or heading, does not exist."""
    problems = []
    shown = path.relative_to(REPO) if path.is_relative_to(REPO) else path.name
    text = re.sub(r"^```.*?^```", "", path.read_text(encoding="utf-8"), flags=re.S | re.M)
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"^[a-z]+:", target):
            continue
        file, _, fragment = target.partition("#")
        linked = (path.parent / file).resolve() if file else path
        if not linked.exists():
            problems.append(f"{shown}: no such file {file}")
        elif fragment and linked.suffix == ".md":
            headings = re.findall(r"^#+ (.*)$", linked.read_text(encoding="utf-8"), re.M)
            if fragment not in {slug(h) for h in headings}:
                problems.append(f"{shown}: no heading #{fragment} in {file or path.name}")
    return problems


def test_every_link_between_the_pages_reaches_a_file_and_heading_that_exist(tmp_path: Path) -> None:
    assert [p for page in doc_files() for p in link_problems(page)] == []
    page = tmp_path / "page.md"
    page.write_text("# Title\n\n[ok](#title), [gone](#no-such), [file](no-such.md)\n")
    assert link_problems(page) == ["page.md: no heading #no-such in page.md", "page.md: no such file no-such.md"]


def _default(action: argparse.Action) -> str:
    value = action.default
    if isinstance(action, (argparse._StoreTrueAction,)) or value is False:
        return "off"
    if value is None or value == [] or value == argparse.SUPPRESS:
        return ""
    if isinstance(value, (list, tuple)):
        return " ".join(str(v) for v in value)
    return str(value)


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def command_parsers() -> Iterator[tuple[str, argparse.ArgumentParser]]:
    for program, parser in parsers().items():
        yield program, parser
        for name, sub in subcommands(parser).items():
            yield f"{program} {name}", sub


def option_rows(parser: argparse.ArgumentParser) -> list[tuple[str, str, str]]:
    """(flag with its metavar, default, meaning) of each documented option, as `--help` has them."""
    formatter = parser._get_formatter()
    rows = []
    for action in parser._actions:
        if not action.option_strings or action.help == argparse.SUPPRESS or isinstance(action, argparse._HelpAction):
            continue
        metavar = "" if _values(action) == 0 else f" {formatter._metavar_formatter(action, action.dest.upper())(1)[0]}"
        flag = ", ".join(action.option_strings) + metavar
        rows.append((flag, _default(action), formatter._expand_help(action) if action.help else ""))
    return rows


def tables() -> str:
    """docs/configuration.md's tables, one per command."""
    out = []
    for command, parser in command_parsers():
        out += [f"### `{command}`", "", "| flag | default | meaning |", "| --- | --- | --- |"]
        out += [f"| `{_cell(flag)}` | {f'`{_cell(default)}`' if default else ''} | {_cell(meaning)} |"
                for flag, default, meaning in option_rows(parser)]  # fmt: skip
        out.append("")
    return "\n".join(out)


def documented(text: str, command: str) -> dict[str, str]:
    """flag -> default cell of the table under `### `command`` in docs/configuration.md."""
    section = text.split(f"### `{command}`\n", 1)[1].split("\n#", 1)[0]
    rows = {}
    for line in section.splitlines():
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line.strip())[1:-1]]
        if len(cells) == 3 and cells[0].startswith("`-"):
            for flag in cells[0].strip("`").split(" ", 1)[0].split(","):
                rows[flag.strip()] = cells[1].strip("`")
    return rows


def test_the_configuration_page_has_one_table_per_command_with_every_option_and_its_default() -> None:
    text = CONFIG.read_text(encoding="utf-8")
    missing, wrong = [], []
    for command, parser in command_parsers():
        assert f"### `{command}`\n" in text, f"docs/configuration.md has no table for {command}"
        table = documented(text, command)
        for flag, default, _meaning in option_rows(parser):
            for option in flag.split(" ", 1)[0].split(","):
                option = option.strip()
                if option not in table:
                    missing.append(f"{command} {option}")
                elif table[option] != _cell(default):
                    wrong.append(f"{command} {option}: documented {table[option]!r}, parser {_cell(default)!r}")
        known = {o for f, _, _ in option_rows(parser) for o in f.split(" ", 1)[0].replace(",", " ").split()}
        wrong += [f"{command} {flag}: documented, not an option" for flag in table if flag not in known]
    assert (missing, wrong) == ([], []), "print the tables with `python tests/unit/test_docs_commands.py`"


def main(write: Callable[[str], object] = sys.stdout.write) -> None:
    write(tables())


if __name__ == "__main__":
    main()
