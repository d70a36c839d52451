"""Every multi-value option of every hypertopo command appends when repeated (issue 21.5).

argparse's default for `nargs='+'` keeps only the last occurrence, so `--ibnetdiscover A
--ibnetdiscover B` used to read B alone, silently. The parsers are built by
`agent.common.command_line.CommandParser`, which makes every such option accumulate; the walk below covers
every parser of every command, so an option added later (a new source's `add_arguments`) is held to
the same rule.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path

import pytest

from agent import cli as agent_cli
from agent.common.command_line import REPEATED, CommandParser, parser_actions
from aggregator import cli as aggregator_cli
from aggregator.live import controller
from aggregator.placement import cli as scheduler_cli
from aggregator.placement.live import scheduler
from aggregator.sources.labels import LabelLevels

PARSERS: dict[str, Callable[[], argparse.ArgumentParser]] = {
    "hypertopo-agent": agent_cli.build_parser,
    "hypertopo-aggregator": lambda: aggregator_cli.parser(["run"]),  # `run` loads the controller's options
    "hypertopo-aggregator run (module)": controller.build_parser,
    "hypertopo-scheduler": lambda: scheduler_cli.parser(load_run=True),
    "hypertopo-scheduler run (module)": scheduler.build_parser,
}


def _multi_value(action: argparse.Action) -> bool:
    return bool(action.option_strings) and (
        action.nargs in (argparse.ONE_OR_MORE, argparse.ZERO_OR_MORE)
        or isinstance(action, argparse._AppendAction)  # append and extend
    )


def _occurrence(action: argparse.Action, word: str) -> object:
    """What argparse hands an action for one occurrence carrying `word`."""
    return [word] if action.nargs in (argparse.ONE_OR_MORE, argparse.ZERO_OR_MORE) else word


def _multi_value_options() -> list[tuple[str, argparse.ArgumentParser, argparse.Action]]:
    return [
        (command, parser, action)
        for command, build in PARSERS.items()
        for parser, action in parser_actions(build())
        if _multi_value(action)
    ]


def test_the_walk_finds_the_options_the_issue_names() -> None:
    """The walk is no check that cannot fail: it must see the options known to be multi-value."""
    seen = {(parser.prog, action.option_strings[0]) for _, parser, action in _multi_value_options()}
    for prog, option in [
        ("hypertopo-aggregator render", "--ibnetdiscover"),
        ("hypertopo-aggregator render", "--reports"),
        ("hypertopo-aggregator render", "--nodes"),
        ("hypertopo-aggregator render", "--switch-lldp"),
        ("hypertopo-aggregator render", "--node-labels"),
        ("hypertopo-aggregator render", "--label-levels"),
        ("hypertopo-aggregator run", "--ibnetdiscover"),
        ("hypertopo-aggregator run", "--switch-lldp"),
        ("hypertopo-agent probe", "--error-limit"),
        ("hypertopo-agent run", "--error-limit"),
    ]:
        assert (prog, option) in seen, f"{prog} {option} not found by the walk"


@pytest.mark.parametrize(
    ("command", "parser", "action"),
    _multi_value_options(),
    ids=lambda v: v if isinstance(v, str) else (v.option_strings[0] if isinstance(v, argparse.Action) else ""),
)
def test_every_multi_value_option_accumulates_across_repeats_and_says_so(
    command: str, parser: argparse.ArgumentParser, action: argparse.Action
) -> None:
    namespace = argparse.Namespace(**{action.dest: action.default})
    action(parser, namespace, _occurrence(action, "first"), action.option_strings[0])
    action(parser, namespace, _occurrence(action, "second"), action.option_strings[0])
    values = list(getattr(namespace, action.dest))
    assert values[-2:] == ["first", "second"], f"{command}: {action.option_strings[0]} kept {values}"
    assert action.help and REPEATED in action.help, f"{command}: {action.option_strings[0]} help"


def test_a_repeated_option_through_the_real_parser_keeps_every_value_and_replaces_its_default() -> None:
    parser = aggregator_cli.parser(["render"])
    args = parser.parse_args(
        ["render", "--reports", "a", "b", "--nodes", "n1", "--reports", "c", "--ibnetdiscover", "x",
         "--switch-lldp", "s1", "--ibnetdiscover", "y", "z", "--nodes", "n2", "--switch-lldp", "s2"]
    )  # fmt: skip
    assert args.reports == ["a", "b", "c"] and args.nodes == ["n1", "n2"]
    assert args.ibnetdiscover == ["x", "y", "z"] and args.switch_lldp == ["s1", "s2"]
    levels = parser.parse_args(["render", "--label-levels", "zone,rack", "--label-levels", "example.com/block"])
    source = LabelLevels.load(levels, live=False)
    assert source is not None and source.levels == ("zone", "rack", "example.com/block")
    probe = agent_cli.build_parser().parse_args(
        ["probe", "--error-limit", "symbol_error=60", "--error-limit", "link_downed=1:5"]
    )
    assert [name for name, _ in probe.error_limit] == ["symbol_error", "link_downed"]
    fresh = agent_cli.build_parser().parse_args(["probe"])
    assert fresh.error_limit == []  # a parse never leaks into the default of the next
    own = CommandParser(prog="t")
    own.add_argument("--items", nargs="+", default=["default"])
    assert own.parse_args(["--items", "a", "--items", "b"]).items == ["a", "b"]  # the default replaced
    assert own.parse_args([]).items == ["default"]


def test_render_reads_every_repeated_ibnetdiscover_dump(shared_data: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`--ibnetdiscover A --ibnetdiscover B` renders what `--ibnetdiscover A B` does: both fabrics."""
    first, second = (str(shared_data / "ibnetdiscover" / f"ibtopotool_{n}.topo") for n in (2, 3))

    def render(*args: str) -> dict[str, list[str]]:
        assert aggregator_cli.main(["render", *args, "--format", "json"]) == 0
        items = json.loads(capsys.readouterr().out)["items"]
        return {item["metadata"]["name"]: sorted(json.dumps(m) for m in item["spec"]["members"]) for item in items}

    repeated = render("--ibnetdiscover", first, "--ibnetdiscover", second)
    assert repeated == render("--ibnetdiscover", first, second)
    alone = [render("--ibnetdiscover", first), render("--ibnetdiscover", second)]
    assert all(one and set(one) < set(repeated) for one in alone)  # each dump adds HyperNodes of its own
