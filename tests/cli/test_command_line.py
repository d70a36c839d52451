"""Every command answers `--version` and writes JSON log lines with `--log-format json` (issue 13)."""

from __future__ import annotations

import json
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

from agent.common.command_line import InputError, one_line, summarise

REPO = Path(__file__).resolve().parents[2]
HGX_SYSFS = REPO / "tests" / "fixtures" / "sysfs" / "hgx-h100-ib"
COMMANDS = {"hypertopo-agent": "agent", "hypertopo-aggregator": "aggregator"}


def _run(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False, cwd=REPO)


def _module(prog: str) -> list[str]:
    if prog == "hypertopo-scheduler":
        return [sys.executable, "-c", "import sys; from aggregator.placement.cli import main; sys.exit(main())"]
    return [sys.executable, "-m", COMMANDS[prog]]


@pytest.mark.parametrize("prog", ["hypertopo-agent", "hypertopo-aggregator", "hypertopo-scheduler"])
def test_version_names_the_package_version_and_the_git_commit(prog: str) -> None:
    proc = _run(*_module(prog), "--version")
    assert proc.returncode == 0, proc.stderr
    git = _run("git", "describe", "--always", "--dirty", "--tags") if (REPO / ".git").exists() else None
    described = f" (git {git.stdout.strip()})" if git and git.returncode == 0 else ""  # a tarball: no git
    assert proc.stdout.strip() == f"{prog} {metadata.version('hypertopo')}{described}"


def test_agent_logs_one_json_object_per_line() -> None:
    proc = _run(*_module("hypertopo-agent"), "--log-format", "json", "probe", "--sysfs", str(HGX_SYSFS),
                "--nvml", "fake:hgx-h100", "--node-name", "n1")
    assert proc.returncode == 0, proc.stderr
    lines = [json.loads(line) for line in proc.stderr.splitlines()]
    assert lines and all({"time", "level", "logger", "message"} <= set(entry) for entry in lines)
    assert any(entry["level"] == "info" and entry["logger"] == "hypertopo-agent" for entry in lines)


def test_render_warnings_are_json_lines_after_the_subcommand_too(tmp_path: Path) -> None:
    (tmp_path / "broken.yaml").write_text("kind: NodeTopology\nmetadata: {name: n1}\nspec: {health: true}\n")
    proc = _run(*_module("hypertopo-aggregator"), "render", "--reports", str(tmp_path), "--log-format", "json")
    assert proc.returncode == 0, proc.stderr
    entries = [json.loads(line) for line in proc.stderr.splitlines() if line.startswith("{")]
    skipped = [e for e in entries if e["level"] == "warning" and "broken.yaml" in e["message"]]
    assert skipped and "spec.health: expected a map, got bool" in skipped[0]["message"]


def test_scheduler_accepts_log_format_json_before_the_subcommand(tmp_path: Path) -> None:
    model = REPO / "tests" / "models" / "small-tree.yaml"
    proc = _run(*_module("hypertopo-scheduler"), "--log-format", "json", "simulate", "--model", str(model),
                "--synthetic", "3")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["policy"] == "hypertopo"
    assert all(line.startswith("{") for line in proc.stderr.splitlines())


def test_bad_usage_is_exit_2_and_a_missing_input_file_exit_1_for_every_command(tmp_path: Path) -> None:
    missing = str(tmp_path / "absent.yaml")
    usage = [("hypertopo-agent", ["probe", "--format", "xml"]), ("hypertopo-aggregator", ["render", "--bogus"]),
             ("hypertopo-scheduler", ["simulate", "--synthetic", "x", "--model", missing])]
    for prog, args in usage:
        proc = _run(*_module(prog), *args)
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, (prog, proc.stderr)
    inputs = [("hypertopo-agent", ["probe", "--model", missing, "--node", "n"]),
              ("hypertopo-aggregator", ["render", "--model", missing]),
              ("hypertopo-scheduler", ["simulate", "--synthetic", "3", "--model", missing])]
    for prog, args in inputs:
        proc = _run(*_module(prog), *args)
        assert proc.returncode == 1, (prog, proc.stderr)
        assert proc.stderr.count("\n") == 1 and missing in proc.stderr, (prog, proc.stderr)


def test_a_long_list_is_summarised_by_count_and_first_names() -> None:
    names = [f"switch-{i:04d}-with-a-long-generated-name" for i in range(300)]
    text = summarise(names)
    assert text.startswith("300: switch-0000-with-a-long-generated-name, ") and text.endswith(" and 295 more")
    assert len(text) < 400 and summarise(["a", "b"]) == "2: a, b"
    assert len(summarise(["x" * 5000])) < 100


def test_a_multi_line_message_becomes_one_cut_line() -> None:
    assert one_line("while parsing\n  in line 2\n") == "while parsing in line 2"
    assert one_line("y" * 1000, width=10) == "y" * 10 + "… (990 more characters)"
    assert str(InputError("f.yaml", "expected a map, got bool", "spec.health")) == (
        "f.yaml: spec.health: expected a map, got bool"
    )


def test_render_summarises_hundreds_of_dropped_domains_and_uncabled_nodes_in_one_line_each(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from aggregator.cli import _warn_tree

    dropped = [(f"leaf:ib-switch-{i:04d} (Mellanox QM8700, 40 ports)", "partly overlaps spine:s1; kept spine:s1")
               for i in range(300)]
    uncabled = {f"gpu-node-{i:04d}": ("leaf-a", "leaf-b") for i in range(200)}
    _warn_tree(dropped, uncabled)
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 2 and all(len(line) < 800 for line in lines)
    assert "dropped domains that partly overlap a kept one, 300: leaf:ib-switch-0000" in lines[0]
    assert lines[0].endswith(" and 295 more") and lines[1].endswith(" and 195 more")
    assert "gpu-node-0000 (not to leaf-a, leaf-b)" in lines[1]
