"""YAML with more brackets open at once than yaml_codec.MAX_FLOW_DEPTH in one document is refused in
one line naming the line, before any parser reads it (issue 22.4): libyaml would go 1,000 deep,
its scanner walking every open level at every token. Brackets are counted as characters, per
document, whatever YAML makes of them."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from agent.cluster_model import ModelError, load_model
from agent.common import yaml_codec
from agent.common.command_line import InputError
from aggregator.object_files import read_objects

DEEP = yaml_codec.MAX_FLOW_DEPTH + 1


def _no_parser(*_: object, **__: object) -> object:
    raise AssertionError("a YAML parser ran on text the depth count refuses")


@pytest.mark.parametrize(
    ("opener", "closer"),
    [("[", "]"), ('{"a": ', "}"), ("[", ""), ("[x, ", "]")],
    ids=["list", "map", "open", "items"],
)
def test_brackets_nested_past_the_bound_are_refused_naming_the_line_before_any_parser_reads_them(
    monkeypatch: pytest.MonkeyPatch, opener: str, closer: str
) -> None:
    text = "kind: NodeTopology\nspec:\n  nodeName: n1\n  x: " + opener * 50_000 + "1" + closer * 50_000 + "\n"
    for parser in ("load", "load_all", "parse"):
        monkeypatch.setattr(yaml_codec.yaml, parser, _no_parser)
    monkeypatch.setattr(yaml_codec.yaml_block, "document", _no_parser)
    for source in (text, text.encode()):
        with pytest.raises(yaml_codec.YamlLimitError) as caught:
            yaml_codec.load_all(source)
        assert str(caught.value) == "line 4: more than 128 brackets ([ or {) open at once: nested too deep"
        with pytest.raises(yaml_codec.YamlLimitError, match=r"^line 4: more than 128 brackets"):
            yaml_codec.load(source)


def test_flow_collections_as_deep_as_the_bound_are_read_as_before() -> None:
    text = "a: " + "[" * yaml_codec.MAX_FLOW_DEPTH + "1" + "]" * yaml_codec.MAX_FLOW_DEPTH
    value = yaml_codec.load(text)
    assert value == yaml.load(text, Loader=yaml.SafeLoader)
    value = value["a"]
    for _ in range(yaml_codec.MAX_FLOW_DEPTH):
        value = value[0]
    assert value == 1
    siblings = "a: [" + ", ".join(["[[x]]"] * 5000) + "]"  # 15,000 brackets, 3 open at once
    assert len(yaml_codec.load(siblings)["a"]) == 5000


def test_brackets_count_per_document_and_quoted_ones_count_too() -> None:
    stream = "".join(
        f"---\nname: n{i}\nnote: '['\n" for i in range(DEEP)
    )  # a stray `[` in each of 129 reports
    assert [doc["note"] for doc in yaml_codec.load_all(stream)] == ["["] * DEEP
    one = "notes:\n" + "".join(f"- '['  # {i}\n" for i in range(DEEP))  # 129 in one document: refused
    with pytest.raises(yaml_codec.YamlLimitError, match=rf"^line {DEEP + 1}: more than 128 brackets"):
        yaml_codec.load(one)
    closed = "notes:\n" + "- ['[', ']']\n" * DEEP  # closed ones count for nothing
    assert len(yaml_codec.load(closed)["notes"]) == DEEP


def test_a_report_file_nested_too_deep_is_one_line_naming_the_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "node01.yaml"
    path.write_text(
        "apiVersion: v1\nkind: NodeTopology\nspec: " + "{a: " * 60_000 + "1" + "}" * 60_000 + "\n"
    )
    with pytest.raises(InputError) as caught:
        read_objects(path, "NodeTopology")
    assert str(caught.value) == (
        f"{path}: cannot read: line 3: more than 128 brackets ([ or {{) open at once: nested too deep"
    )


def test_a_model_nested_too_deep_is_refused_naming_the_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "model.yaml"
    path.write_text("switches:\n  spine1: {switches: " + "[" * DEEP + "leaf1" + "]" * DEEP + "}\n")
    with pytest.raises(ModelError, match=rf"^model {path} is not valid YAML: line 2: more than 128 brackets"):
        load_model(str(path))
