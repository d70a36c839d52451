"""Without agents, the dump's hosts must find their nodes: names that differ by a DNS domain or
need a pattern are matched by option, a mismatch is said with counts (never an empty render in
silence), and a fabric dumped per rail or per plane is read from several files."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from aggregator_fabric import ibnetdiscover_dump

from agent.cluster_model import load_model
from agent.model_probe import report_for
from aggregator.pipeline import ClusterInputs, Pipeline
from aggregator.sources import ibnetdiscover
from aggregator.sources.ibnetdiscover import HostNames

MODELS = Path(__file__).parent.parent / "models"
SMALL = load_model(str(MODELS / "small-tree.yaml"))  # node01..node08 under leaf1, leaf2, spine1
RAIL = load_model(str(MODELS / "rail-8.yaml"))
DOMAIN = "dc1.example.com"


def _aggregator(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "aggregator", *args], capture_output=True, text=True, timeout=120, check=False
    )


def _node_list(names: list[str]) -> dict[str, Any]:
    """`kubectl get nodes -o yaml` for these names (Ready)."""
    items = [
        {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": name},
            "status": {"conditions": [{"type": "Ready", "status": "True"}]},
        }
        for name in names
    ]
    return {"apiVersion": "v1", "kind": "List", "items": items}


def _files(tmp_path: Path, *, fqdn_nodes: bool, fqdn_dump: bool) -> tuple[Path, Path]:
    nodes = tmp_path / "nodes.yaml"
    names = [f"{n}.{DOMAIN}" if fqdn_nodes else n for n in SMALL.nodes()]
    nodes.write_text(yaml.safe_dump(_node_list(names)))
    dump = tmp_path / "fabric.topo"
    describe = (lambda n, h: f"{n}.{DOMAIN} mlx5_{h}") if fqdn_dump else None
    dump.write_text(ibnetdiscover_dump(SMALL, ca_description=describe))
    return nodes, dump


def _summary(stdout: str) -> list[tuple[str, int]]:
    return sorted((o["spec"]["tierName"], o["status"]["nodeCount"]) for o in json.loads(stdout)["items"])


TREE = [("leaf", 4), ("leaf", 4), ("spine", 8)]


def test_fully_qualified_node_names_and_short_dump_hosts_are_said_not_rendered_empty(tmp_path: Path) -> None:
    nodes, dump = _files(tmp_path, fqdn_nodes=True, fqdn_dump=False)
    proc = _aggregator("render", "--nodes", str(nodes), "--ibnetdiscover", str(dump), "--format", "json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["items"] == []
    assert "8 of 8 hosts in the fabric dump match no node (e.g. node01, node02, node03" in proc.stderr
    assert f"8 of 8 nodes match no host in the fabric dump (e.g. node01.{DOMAIN}" in proc.stderr
    assert "--strip-domain" in proc.stderr and "no HyperNodes" in proc.stderr


@pytest.mark.parametrize(("fqdn_nodes", "fqdn_dump"), [(True, False), (False, True)])
@pytest.mark.parametrize("strip", [["--strip-domain"], ["--strip-domain", DOMAIN]])
def test_strip_domain_matches_names_that_differ_by_a_domain(
    tmp_path: Path, fqdn_nodes: bool, fqdn_dump: bool, strip: list[str]
) -> None:
    nodes, dump = _files(tmp_path, fqdn_nodes=fqdn_nodes, fqdn_dump=fqdn_dump)
    proc = _aggregator(
        "render", "--nodes", str(nodes), "--ibnetdiscover", str(dump), "--format", "json", *strip
    )
    assert proc.returncode == 0, proc.stderr
    assert _summary(proc.stdout) == TREE
    members = {
        m["selector"]["exactMatch"]["name"]
        for o in json.loads(proc.stdout)["items"]
        for m in o["spec"]["members"]
        if m["type"] == "Node"
    }
    assert members == {f"{n}.{DOMAIN}" if fqdn_nodes else n for n in SMALL.nodes()}  # the Node names
    assert "warning" not in proc.stderr


def test_a_regex_reads_the_host_out_of_any_description(tmp_path: Path) -> None:
    nodes, _ = _files(tmp_path, fqdn_nodes=False, fqdn_dump=False)
    dump = tmp_path / "odd.topo"
    dump.write_text(ibnetdiscover_dump(SMALL, ca_description=lambda n, h: f"ConnectX-7 port {h} of hpc-{n}"))
    plain = _aggregator("render", "--nodes", str(nodes), "--ibnetdiscover", str(dump), "--format", "json")
    assert json.loads(plain.stdout)["items"] == [] and "8 of 8 nodes match no host" in plain.stderr
    regex = r"of hpc-(?P<node>\S+)$"
    proc = _aggregator(
        "render",
        "--nodes",
        str(nodes),
        "--ibnetdiscover",
        str(dump),
        "--dump-host-regex",
        regex,
        "--format",
        "json",
    )
    assert proc.returncode == 0, proc.stderr
    assert _summary(proc.stdout) == TREE and "warning" not in proc.stderr


def test_a_bad_regex_is_refused_with_exit_code_2(tmp_path: Path) -> None:
    _, dump = _files(tmp_path, fqdn_nodes=False, fqdn_dump=False)
    proc = _aggregator("render", "--ibnetdiscover", str(dump), "--dump-host-regex", "(unclosed")
    assert proc.returncode == 2 and "--dump-host-regex" in proc.stderr


def test_partial_matches_are_counted() -> None:
    """Two nodes the dump does not know, and two dump hosts no node is called: both counted."""
    fabric = ibnetdiscover.parse(ibnetdiscover_dump(SMALL))
    names = [*SMALL.nodes()[2:], "gpu-a", "gpu-b"]
    desired = Pipeline().compute(
        ClusterInputs(reports={}, node_ready=dict.fromkeys(names, True), fabric=fabric), now=0
    )
    assert desired.warnings == (
        "ibnetdiscover: 2 of 8 hosts in the fabric dump match no node (e.g. node01, node02; nodes are "
        "named like gpu-a, gpu-b): see --strip-domain and --dump-host-regex",
        "ibnetdiscover: 2 of 8 nodes match no host in the fabric dump (e.g. gpu-a, gpu-b)",
    )


def test_hosts_matched_by_their_hca_guids_need_no_name() -> None:
    """Reports carry HCA GUIDs: a dump whose HCAs name no host still places every node, quietly."""
    fabric = ibnetdiscover.parse(ibnetdiscover_dump(SMALL, host_descriptions=False))
    reports = {n: report_for(SMALL, n) for n in SMALL.nodes()}
    desired = Pipeline().compute(ClusterInputs(reports=reports, fabric=fabric), now=0)
    assert desired.warnings == () and len(desired.hypernodes) == 3


def test_host_names_compare_keys() -> None:
    assert HostNames().key("Node01") == "node01"
    assert HostNames(domain=".").key(f"node01.{DOMAIN}") == "node01"
    assert HostNames(domain=DOMAIN).key(f"node01.{DOMAIN}") == "node01"
    assert HostNames(domain=DOMAIN).key("node01.dc2.example.com") == "node01.dc2.example.com"
    assert HostNames(pattern=r"^(\S+) HCA").host_of("gpu7 HCA-2") == "gpu7"
    assert HostNames(pattern=r"^gpu\d+").host_of("GPU7 mlx5_0") is None  # searched as given
    assert HostNames().host_of("MT4129 ConnectX-7") is None


# --- one dump per rail ---------------------------------------------------------------------------


def test_one_dump_per_rail_gives_the_tree_of_one_dump_of_all_rails(tmp_path: Path) -> None:
    paths = []
    for rail in range(1, 9):
        switches = {f"rail{rail}-spine", f"su1-rail{rail}", f"su2-rail{rail}"}
        path = tmp_path / f"rail{rail}.topo"
        path.write_text(ibnetdiscover_dump(RAIL, only=switches))
        paths.append(str(path))
    whole = tmp_path / "all.topo"
    whole.write_text(ibnetdiscover_dump(RAIL))
    split = _aggregator("render", "--ibnetdiscover", *paths, "--format", "json")
    assert split.returncode == 0, split.stderr
    one = _aggregator("render", "--ibnetdiscover", str(whole), "--format", "json")
    assert _summary(split.stdout) == _summary(one.stdout) == [("leaf", 4), ("leaf", 4), ("spine", 8)]
    names = sorted(o["metadata"]["name"] for o in json.loads(split.stdout)["items"])
    assert names == sorted(o["metadata"]["name"] for o in json.loads(one.stdout)["items"])


def test_merged_dumps_keep_every_switch_and_link() -> None:
    first = ibnetdiscover.parse(ibnetdiscover_dump(RAIL, only={"rail1-spine", "su1-rail1", "su2-rail1"}))
    second = ibnetdiscover.parse(ibnetdiscover_dump(RAIL, only={"rail2-spine", "su1-rail2", "su2-rail2"}))
    merged = ibnetdiscover.merge([first, second])
    assert len(merged.switches()) == 6 and len(merged.links) == len(first.links) + len(second.links)
    assert len(merged.cas()) == len(first.cas()) + len(second.cas()) == 16
