"""`render` reads and writes YAML through libyaml where PyYAML has it, and the pure-Python
loader and dumper where it does not, with the same result.

Reading 72 saved reports took 3 of `render`'s 5 seconds in PyYAML's pure-Python scanner (see
the commit for the figures and the command that measures them)."""

from __future__ import annotations

import importlib
import io
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from agent import cluster_model
from agent.cluster_model import load_model
from agent.common import yaml_block, yaml_codec
from agent.common.report import node_topology_object
from agent.model_probe import report_for
from aggregator import cli

MODEL_FILE = Path(__file__).parent.parent / "models" / "nvl72-racks.yaml"
MODEL = load_model(str(MODEL_FILE))


def _reports(tmp_path: Path) -> Path:
    folder = tmp_path / "reports"
    folder.mkdir()
    for node in MODEL.nodes()[:12]:
        (folder / f"{node}.yaml").write_text(yaml.safe_dump(node_topology_object(report_for(MODEL, node))))
    return folder


def _render(args: list[str], capsys: pytest.CaptureFixture[str]) -> Any:
    assert cli.main(["render", *args]) == 0
    loader = yaml.SafeLoader(capsys.readouterr().out)  # not through yaml.load: see yaml_calls
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()


@pytest.fixture
def yaml_calls(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """Names of the PyYAML Loader/Dumper classes every yaml.load/load_all/dump call used (a subclass
    of the project's, such as yaml_codec.Loader, by the PyYAML class it extends), and `yaml_block`
    for each document yaml_codec read line by line instead (plain block YAML, before libyaml)."""
    calls: list[str] = []
    real_load, real_load_all, real_dump = yaml.load, yaml.load_all, yaml.dump

    def load(stream: Any, Loader: Any) -> Any:
        calls.append(_pyyaml_class(Loader))
        return real_load(stream, Loader=Loader)

    def load_all(stream: Any, Loader: Any) -> Any:
        calls.append(_pyyaml_class(Loader))
        return real_load_all(stream, Loader=Loader)

    def dump(data: Any, stream: Any = None, Dumper: Any = yaml.Dumper, **kw: Any) -> Any:
        calls.append(_pyyaml_class(Dumper))
        return real_dump(data, stream, Dumper=Dumper, **kw)

    real_block = yaml_block.document

    def block(text: str, plain: Any) -> Any:
        value = real_block(text, plain)
        if value is not yaml_block.NOT_PLAIN:
            calls.append("yaml_block")
        return value

    monkeypatch.setattr(yaml, "load", load)
    monkeypatch.setattr(yaml, "load_all", load_all)
    monkeypatch.setattr(yaml, "dump", dump)
    monkeypatch.setattr(yaml_block, "document", block)
    yield calls


def _pyyaml_class(cls: type) -> str:
    return next(c.__name__ for c in cls.__mro__ if c.__module__.startswith("yaml."))


def test_render_reads_reports_and_models_and_prints_through_libyaml(
    tmp_path: Path, yaml_calls: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert yaml.__with_libyaml__, "PyYAML without libyaml: install a wheel built with it"
    document = _render(["--reports", str(_reports(tmp_path)), "--model", str(MODEL_FILE)], capsys)
    assert document["kind"] == "List" and document["items"]
    assert set(yaml_calls) == {"yaml_block", "CSafeLoader", "CSafeDumper"}  # never the pure-Python loader
    assert yaml_calls.count("yaml_block") == 12  # every report file, read line by line
    assert yaml_calls.count("CSafeLoader") == 1  # the model (flow style: libyaml's)


def test_json_reports_are_read_as_json(
    tmp_path: Path, yaml_calls: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "json"
    folder.mkdir()
    items = [node_topology_object(report_for(MODEL, n)) for n in MODEL.nodes()[:4]]
    (folder / "all.json").write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": items}))
    document = _render(["--reports", str(folder), "--format", "json"], capsys)
    assert sum(o["status"]["nodeCount"] for o in document["items"] if o["spec"]["tier"] == 1) == 4
    assert yaml_calls == []


def test_without_libyaml_the_pure_python_loader_and_dumper_give_the_same(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = _reports(tmp_path)
    fast = _render(["--reports", str(folder)], capsys)
    monkeypatch.delattr(yaml, "CSafeLoader", raising=False)
    monkeypatch.delattr(yaml, "CSafeDumper", raising=False)
    try:
        importlib.reload(yaml_codec)
        assert yaml_codec.SafeLoader is yaml.SafeLoader and yaml_codec.SafeDumper is yaml.SafeDumper
        slow = _render(["--reports", str(folder)], capsys)
        out = io.StringIO()
        yaml_codec.dump({"b": 1, "a": [1, 2]}, out, sort_keys=False)
        assert out.getvalue() == "b: 1\na:\n- 1\n- 2\n"
        assert cluster_model.load_model(str(MODEL_FILE)) == MODEL
    finally:
        monkeypatch.undo()
        importlib.reload(yaml_codec)
    for document in (fast, slow):
        for item in document["items"]:
            for condition in item["status"].get("conditions", []):
                condition.pop("lastTransitionTime")
    assert fast == slow
    assert yaml_codec.SafeLoader is getattr(yaml, "CSafeLoader", yaml.SafeLoader)
