"""Mutated NodeTopology reports never give a traceback, and never hide the valid ones (issue 13).

The reports are the ones agents publish: `probe --model` for every node of a modelled 3-tier
tree (small-tree), and a real probe of the HGX H100 fixture sysfs tree. Hypothesis mutates one report at a
random field path (a wrong type such as a map field holding a bool, a missing field, a duplicated
list item or a duplicated report, a huge number, a huge or non-ASCII string) and feeds the set to
`hypertopo-aggregator render` and to the live aggregator's report parsing (PipelineFeed). Neither
may raise; every node whose report was left alone is still a member of a HyperNode; `--strict`
refuses a report it cannot read with exit code 1 and one line naming the file and the field.
"""

from __future__ import annotations

import copy
import io
import json
import sys
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path
from typing import Any, NamedTuple

import pytest
import yaml
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from agent.cli import main as agent_main
from agent.cluster_model import load_model
from agent.common.report import node_topology_object
from agent.model_probe import report_for
from aggregator.cli import main as aggregator_main
from aggregator.live.feed import PipelineFeed, StaticSources
from aggregator.pipeline import Pipeline

REPO = Path(__file__).resolve().parents[2]
MODEL = load_model(str(REPO / "tests" / "models" / "small-tree.yaml"))
HGX_SYSFS = REPO / "tests" / "fixtures" / "sysfs" / "hgx-h100-ib"

ODD_VALUES = st.one_of(
    st.booleans(),
    st.none(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=20),
    st.text(alphabet="ñ✓\U0001d518\u202e\x00 ", min_size=2000, max_size=3000),
    st.lists(st.integers(), max_size=3),
    st.dictionaries(st.text(max_size=5), st.integers(), max_size=3),
)


def _probe_fixture_tree() -> dict[str, Any]:
    out = io.StringIO()
    with redirect_stdout(out), redirect_stderr(io.StringIO()):
        code = agent_main(
            ["probe", "--sysfs", str(HGX_SYSFS), "--nvml", "fake:hgx-h100", "--node-name", "hgx-1", "--format", "json"]
        )
    assert code == 0
    obj: dict[str, Any] = json.loads(out.getvalue())
    return obj


BASE = [node_topology_object(report_for(MODEL, node)) for node in MODEL.nodes()] + [_probe_fixture_tree()]
# The nodes a valid set of reports puts into HyperNodes (the HGX fixture has no switch neighbours).
PLACED = {obj["metadata"]["name"] for obj in BASE[:-1]}


class Case(NamedTuple):
    objects: list[dict[str, Any]]
    index: int  # of the mutated report
    what: str

    def __repr__(self) -> str:  # the mutation, not 200 kB of reports
        return f"Case(report {self.index}: {self.what[:300]})"


@st.composite
def mutated_sets(draw: st.DrawFn, *, spec_only: bool = False) -> Case:
    """The report set with one report mutated at one field path (under `spec` only: what the API
    server lets through, as it checks apiVersion, kind and metadata itself)."""
    objects = copy.deepcopy(BASE)
    index = draw(st.integers(0, len(objects) - 1))
    container: Any = objects[index]["spec"] if spec_only else objects[index]
    path = ".spec" if spec_only else ""
    while True:  # walk down to a random field
        keys = list(container) if isinstance(container, dict) else list(range(len(container)))
        if not keys:
            break
        key = draw(st.sampled_from(keys))
        value = container[key]
        if not isinstance(value, (dict, list)) or not value or draw(st.booleans()):
            break
        container, path = value, f"{path}.{key}"
    if not keys:
        return Case(objects, index, f"{path}: empty, left alone")
    operation = draw(st.sampled_from(["replace", "delete", "duplicate", "twin"]))
    if operation == "replace":
        container[key] = draw(ODD_VALUES)
    elif operation == "delete":
        del container[key]
    elif operation == "duplicate" and isinstance(container, list):
        container.append(copy.deepcopy(container[key]))
    elif operation == "twin":  # the same node reported twice, the later copy broken
        twin = copy.deepcopy(objects[index])
        twin["spec"] = draw(ODD_VALUES)
        objects.append(twin)
    return Case(objects, index, f"{operation} {path}.{key} -> {str(container.get(key) if isinstance(container, dict) else '')[:80]!r}")


def _write(objects: list[dict[str, Any]], folder: Path) -> Path:
    """`folder` (emptied first: hypothesis reuses one tmp_path) holding one report file per object."""
    folder.mkdir(parents=True, exist_ok=True)
    for old in folder.iterdir():
        old.unlink()
    for i, obj in enumerate(objects):
        (folder / f"{i:03d}.json").write_text(json.dumps(obj))  # JSON: as fast to write as to read
    return folder


def _render(folder: Path, *extra: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = aggregator_main(["render", "--reports", str(folder), *extra])
    return code, out.getvalue(), err.getvalue()


def _members(document: dict[str, Any]) -> set[str]:
    return {
        member["selector"]["exactMatch"]["name"]
        for item in document["items"]
        for member in item["spec"]["members"]
        if member["type"] == "Node"
    }


def _mutated_name(index: int) -> str:
    """The node whose report was mutated (named before the mutation: its name may be the field)."""
    name: str = BASE[index]["metadata"]["name"]
    return name


def test_the_unmutated_reports_place_every_modelled_node(tmp_path: Path) -> None:
    code, out, err = _render(_write(BASE, tmp_path), "--strict")
    assert code == 0, err
    assert _members(yaml.safe_load(out)) == PLACED


SETTINGS = settings(
    max_examples=60,
    deadline=None,
    phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.shrink],  # no slow "explain" tracing
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


@SETTINGS
@given(case=mutated_sets())
def test_render_skips_a_mutated_report_and_renders_the_rest(tmp_path: Path, case: Any) -> None:
    objects, index, what = case
    code, out, err = _render(_write(objects, tmp_path / "reports"))
    assert code == 0, (what, err)
    assert "Traceback" not in err, what
    untouched = PLACED - {_mutated_name(index)}
    assert untouched <= _members(yaml.safe_load(out)), what
    assert all(len(line) < 1500 for line in err.splitlines()), what  # long values are cut


@SETTINGS
@given(case=mutated_sets())
def test_strict_render_refuses_an_unreadable_report_in_one_line(tmp_path: Path, case: Any) -> None:
    objects, _, what = case
    folder = _write(objects, tmp_path / "reports")
    code, _out, err = _render(folder, "--strict")
    assert code in (0, 1), (what, err)
    assert "Traceback" not in err, what
    if code == 1:
        lines = err.strip().splitlines()
        assert len(lines) == 1 and str(folder) in lines[0] and "NodeTopology" in lines[0], (what, err)


@SETTINGS
@given(case=mutated_sets(spec_only=True))
def test_the_live_feed_ignores_a_mutated_report_and_places_the_rest(case: Any) -> None:
    objects, index, what = case
    feed = PipelineFeed(Pipeline(), StaticSources())
    topologies: dict[str, Any] = {}
    for i, obj in enumerate(objects):  # the informer's view: one object per name, the later wins
        metadata = obj.get("metadata")
        name = metadata.get("name") if isinstance(metadata, dict) else None
        topologies[str(name) if name is not None else f"nameless-{i}"] = obj
    desired = feed.compute(topologies, {}, None, now=1000.0)
    members = {m for hn in desired.hypernodes for m in _hypernode_members(hn)}
    assert PLACED - {_mutated_name(index)} <= members, what


def _hypernode_members(hypernode: Any) -> set[str]:
    spec = hypernode["spec"] if isinstance(hypernode, dict) else hypernode.spec
    members = spec["members"] if isinstance(spec, dict) else spec.members
    return {m["selector"]["exactMatch"]["name"] for m in members if m["type"] == "Node"}


@pytest.mark.parametrize(
    ("spec_patch", "field"),
    [
        ({"health": True}, "spec.health"),  # a map field holding a bool
        ({"lldp": [{"interface": "eth0"}]}, "spec.lldp[0].chassisId"),
        ({"host": {"hostname": "h", "kernel": "k", "cpus": "many", "memoryBytes": 1}}, "spec.host.cpus"),
    ],
)
def test_strict_render_names_the_file_and_the_field_path(tmp_path: Path, spec_patch: dict[str, Any], field: str) -> None:
    broken = copy.deepcopy(BASE[0])
    broken["spec"].update(spec_patch)
    code, out, err = _render(_write([broken, *BASE[1:]], tmp_path), "--strict")
    assert code == 1 and out == ""
    assert err.count("\n") == 1 and "000.json" in err and field in err, err
    code, out, err = _render(tmp_path)
    assert code == 0 and _members(yaml.safe_load(out)) == PLACED - {BASE[0]["metadata"]["name"]}
    assert "000.json" in err and field in err and "skipped" in err


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
