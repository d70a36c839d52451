"""The simulator replays traces over a model and reports sane figures; the CLI drives it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from agent.cluster_model import parse_model
from aggregator.placement.cli import main
from aggregator.placement.core.topology import build
from aggregator.placement.sim.policies import POLICIES, policy
from aggregator.placement.sim.simulate import Simulation, model_hypernodes, node_capacity
from aggregator.placement.sim.trace import TraceError, parse_trace, synthetic

# core > spine1 (leaf1: n1-n4 in NVLink domain a, leaf2: n5-n8), spine2 (leaf3: n9-n12, leaf4: n13-n16)
MODEL = {
    "switches": {"core": {"switches": ["spine1", "spine2"]}, "spine1": {"switches": ["leaf1", "leaf2"]},
                 "spine2": {"switches": ["leaf3", "leaf4"]}},
    "blocks": [{"switch": "leaf1", "nodes": ["n[1-2]"], "annotations": {"accelerator.topology.test/domain": "a"}},
               {"switch": "leaf1", "nodes": ["n[3-4]"]},
               {"switch": "leaf2", "nodes": ["n[5-8]"]}, {"switch": "leaf3", "nodes": ["n[9-12]"]},
               {"switch": "leaf4", "nodes": ["n[13-16]"]}],
}
FIELDS = {"jobs", "completed", "unplaced", "decisions", "decision_latency_ms", "lowest_feasible_tier_share",
          "mean_lca_tier", "mean_leaves_per_gang", "gpu_utilisation", "queueing_delay_s", "evictions"}


def _simulate(trace_doc: dict, name: str = "hypertopo") -> dict:
    model = parse_model(MODEL)
    topology = build(model_hypernodes(model))
    return Simulation(topology, node_capacity(model.nodes()), parse_trace(trace_doc), policy(name)).run()


def test_model_becomes_nested_hypernodes() -> None:
    topology = build(model_hypernodes(parse_model(MODEL)))
    # NVLink domain a (n1, n2) < leaf1 (n1-n4) < spine1 (n1-n8) < core (n1-n16)
    assert topology.tier_names == {1: "nvlink", 2: "leaf", 3: "spine", 4: "core"}
    nvlink, *above = topology.chains[topology.node_leaf["n1"]]
    assert nvlink.startswith("nvlink-") and above == ["leaf-leaf1", "spine-spine1", "core-core"]
    assert topology.nodes_of(nvlink) == ["n1", "n2"]
    assert topology.node_leaf["n5"] == "leaf-leaf2" and topology.domains["leaf-leaf2"].tier == 2
    assert not topology.problems


def _without_times(objs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """HyperNodes as JSON would give them, minus the conditions' transition times (the clock)."""
    out = json.loads(json.dumps(objs))
    for obj in out:
        for condition in (obj.get("status") or {}).get("conditions") or []:
            condition.pop("lastTransitionTime", None)
    return out


def test_the_simulator_places_on_the_hypernodes_render_writes_for_the_same_model(tmp_path: Path) -> None:
    path = tmp_path / "model.yaml"
    path.write_text(yaml.safe_dump(MODEL), encoding="utf-8")
    rendered = subprocess.run([sys.executable, "-m", "aggregator", "render", "--model", str(path), "--format", "json"],
                              capture_output=True, text=True, check=True, cwd=Path(__file__).resolve().parents[2])
    items = json.loads(rendered.stdout)["items"]
    assert len(items) == 8  # core, 2 spines, 4 leaves, NVLink domain a
    assert _without_times(model_hypernodes(parse_model(MODEL))) == _without_times(items)


def test_a_hand_written_trace_gives_exact_figures() -> None:
    # 16 nodes x 8 GPUs = 128 GPUs. big: 8 pods x 8 GPUs for 100 s from t=0 -> fits spine1 (8 nodes) exactly.
    # small: 4 pods arriving at t=10 -> leaf3 (4 nodes). late: 16 pods at t=20 needs the whole cluster,
    # waits for big (ends 100) and small (ends 60) -> starts at 100, waits 80 s, ends 150.
    result = _simulate({"jobs": [
        {"name": "big", "arrival": 0, "pods": 8, "gpus_per_pod": 8, "duration": 100},
        {"name": "small", "arrival": 10, "pods": 4, "gpus_per_pod": 8, "duration": 50},
        {"name": "late", "arrival": 20, "pods": 16, "gpus_per_pod": 8, "duration": 50},
    ]})
    assert set(result) >= FIELDS
    assert (result["completed"], result["unplaced"], result["evictions"]) == (3, 0, 0)
    assert result["makespan_s"] == 150
    assert result["queueing_delay_s"]["p99"] == 80
    # LCA tiers: big -> spine1 (3), small -> leaf3 (2), late -> core (4): mean 3
    assert result["mean_lca_tier"] == 3
    assert result["lowest_feasible_tier_share"] == 1.0
    # GPU-seconds: 64*100 + 32*50 + 128*50 = 14400 over 128 GPUs x 150 s = 19200 -> 0.75
    assert result["gpu_utilisation"] == 0.75


def test_fabric_faults_follow_the_gang_annotation() -> None:
    jobs = [{"name": "pods", "arrival": 0, "pods": 4, "gpus_per_pod": 8, "duration": 100,
             "on_fabric_fault": "restart-pods"},
            {"name": "gang", "arrival": 0, "pods": 4, "gpus_per_pod": 8, "duration": 100,
             "on_fabric_fault": "restart-gang"},
            {"name": "stay", "arrival": 0, "pods": 4, "gpus_per_pod": 8, "duration": 100, "on_fabric_fault": "none"}]
    # the three gangs fill leaf1..leaf3 one each (fewest leaves, names break ties); then one node of
    # each fails: restart-pods evicts 1 pod, restart-gang 4, none 0 -> 5 evictions.
    placed = _simulate({"jobs": jobs})
    assert placed["evictions"] == 0
    failures = [{"at": 10, "node": n} for n in ("n1", "n5", "n9")]
    result = _simulate({"jobs": jobs, "failures": failures})
    assert result["evictions"] == 5
    assert result["completed"] == 3


def test_a_link_failure_takes_its_hypernode_out() -> None:
    jobs = [{"name": "j", "arrival": 0, "pods": 4, "gpus_per_pod": 8, "duration": 100}]
    # leaf1 is down from t=0: the 4-pod gang cannot use n1-n4 and lands in leaf2 instead.
    result = _simulate({"jobs": jobs, "failures": [{"at": 0, "hypernode": "leaf-leaf1", "duration": 50}]})
    assert result["completed"] == 1 and result["mean_lca_tier"] == 2


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_every_policy_replays_a_synthetic_trace(name: str) -> None:
    model = parse_model(MODEL)
    trace = synthetic(model.nodes(), 60, seed=3)
    result = Simulation(build(model_hypernodes(model)), node_capacity(model.nodes()), trace,
                        policy(name)).run()
    assert result["completed"] + result["unplaced"] <= 60 and result["completed"] > 0
    assert 0 < result["gpu_utilisation"] <= 1
    assert 0 <= result["lowest_feasible_tier_share"] <= 1
    assert 1 <= result["mean_lca_tier"] <= 5 and result["mean_leaves_per_gang"] >= 1
    assert result["decision_latency_ms"]["p50"] <= result["decision_latency_ms"]["p99"]


def test_topology_aware_placement_beats_first_fit_on_the_same_trace() -> None:
    model = parse_model(MODEL)
    topology = build(model_hypernodes(model))
    trace = synthetic(model.nodes(), 200, seed=5)
    ours = Simulation(topology, node_capacity(model.nodes()), trace, policy("hypertopo")).run()
    blind = Simulation(topology, node_capacity(model.nodes()), trace, policy("first-fit")).run()
    assert ours["lowest_feasible_tier_share"] >= 0.99
    assert ours["lowest_feasible_tier_share"] > blind["lowest_feasible_tier_share"]


def test_synthetic_traces_are_seeded() -> None:
    nodes = [f"n{i}" for i in range(64)]
    assert synthetic(nodes, 30, seed=1) == synthetic(nodes, 30, seed=1)
    assert synthetic(nodes, 30, seed=1) != synthetic(nodes, 30, seed=2)


@pytest.mark.parametrize(("doc", "error"), [
    ({"jobs": [{"pods": 2}]}, "missing 'duration'"),
    ({"jobs": [{"pods": 2, "duration": 1, "mode": "maybe"}]}, "mode hard|soft"),
    ({"jobs": [{"pods": 1, "duration": 1, "on_fabric_fault": "panic"}]}, "on_fabric_fault"),
    ({"jobs": [], "failures": [{"at": 1}]}, "exactly one of"),
    ({"jobs": [{"name": "a", "pods": 1, "duration": 1}, {"name": "a", "pods": 1, "duration": 1}]}, "unique"),
])
def test_bad_traces_say_why(doc: dict, error: str) -> None:
    with pytest.raises(TraceError, match=error):
        parse_trace(doc)


def test_cli_simulate_synthetic(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model = tmp_path / "model.yaml"
    model.write_text(yaml.safe_dump(MODEL))
    assert main(["simulate", "--model", str(model), "--synthetic", "50", "--seed", "2"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert set(result) >= FIELDS and result["jobs"] == 50 and result["policy"] == "hypertopo"
    assert result["nodes"] == 16 and result["hypernodes"] == 8


def test_cli_simulate_job_file_and_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model = tmp_path / "model.yaml"
    model.write_text(yaml.safe_dump(MODEL))
    jobs = tmp_path / "jobs.json"
    jobs.write_text(json.dumps([{"name": "j", "pods": 2, "gpus_per_pod": 4, "duration": 10}]))
    assert main(["simulate", "--model", str(model), "--jobs", str(jobs), "--policy", "first-fit"]) == 0
    assert json.loads(capsys.readouterr().out)["completed"] == 1
    assert main(["simulate", "--model", str(tmp_path / "absent.yaml"), "--synthetic", "5"]) == 1  # input (issue 13)
    assert "cannot read model" in capsys.readouterr().err
