"""`hypertopo-aggregator measured` from saved HyperNodes and NodeTopology reports: the operator's
view of the measured fabric, and one-line errors for bad input."""

from __future__ import annotations

import yaml
from test_aggregator_measured import DOMAINS, LEAF

from agent.common.report import ComponentHealth, Health, Measurement, NodeReport, node_topology_object
from agent.measure_plan import plan
from aggregator.cli import main


def hypernode(name: str, tier: int, children: tuple[str, ...]) -> dict:
    kind = "Node" if tier == 1 else "HyperNode"
    members = [{"type": kind, "selector": {"exactMatch": {"name": c}}} for c in children]
    return {"apiVersion": "topology.volcano.sh/v1alpha1", "kind": "HyperNode", "metadata": {"name": name},
            "spec": {"tier": tier, "members": members}}  # fmt: skip


def write_cluster(tmp_path, rtt) -> tuple[str, str]:
    hn = tmp_path / "hypernodes.yaml"
    hn.write_text(yaml.safe_dump_all([hypernode(d.name, d.tier, d.children) for d in DOMAINS]))
    reports = tmp_path / "reports"
    reports.mkdir()
    for node, probes in plan(DOMAINS).items():
        ms = tuple(Measurement(p.peer, rtt(node, p.peer), rtt(node, p.peer), 0.0, 20, "2026-11-25T18:00:00Z")
                   for p in probes)  # fmt: skip
        report = NodeReport(
            node, {"host": ComponentHealth(Health.OK)}, measurements=ms, probe_address="10.0.0.1"
        )
        (reports / f"{node}.yaml").write_text(yaml.safe_dump(node_topology_object(report)))
    return str(hn), str(reports)


def test_measured_prints_the_tier_profile_per_domain_figures_findings_and_leaf_groups(tmp_path, capsys):
    def rtt(a: str, b: str) -> int:
        slow = 90 if "a3" in (a, b) else 0
        return (10 if LEAF[a] == LEAF[b] else 100) + slow

    hn, reports = write_cluster(tmp_path, rtt)
    assert main(["measured", "--hypernodes", hn, "--reports", reports]) == 0
    out = capsys.readouterr().out
    assert "  tier 1: 10 us\n  tier 2: 100 us\n" in out
    assert "  spine (tier 2): 100 us (" in out
    assert "FabricDegraded a3 [slow-in-leaf]: " in out
    assert "leaf groups from latency alone:" in out and "a1, a2, a4" in out


def test_measured_with_an_unreadable_hypernode_file_says_so_in_one_line(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("kind: [unclosed\n")
    assert main(["measured", "--hypernodes", str(bad), "--reports", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("hypertopo-aggregator measured: ") and str(bad) in err and err.count("\n") == 1
