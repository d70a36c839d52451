"""HyperNode names are stable and valid: derived from identities, not from order or indexes."""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

import pytest
from aggregator_fabric import ibnetdiscover_dump

from agent.cluster_model import load_model, parse_model
from agent.common.report import NodeReport
from agent.model_probe import report_for
from aggregator.pipeline import ClusterInputs, Pipeline
from aggregator.render import as_list, domain_name
from aggregator.sources import ibnetdiscover

MODELS = Path(__file__).parent.parent / "models"
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


def _names(reports: dict[str, NodeReport], dump: str | None = None) -> dict[str, frozenset[str]]:
    """HyperNode name -> its Node members (direct)."""
    fabric = ibnetdiscover.parse(dump) if dump else None
    desired = Pipeline().compute(ClusterInputs(reports=reports, fabric=fabric), now=0)
    return {
        o["metadata"]["name"]: frozenset(
            m["selector"]["exactMatch"]["name"] for m in o["spec"]["members"] if m["type"] == "Node"
        )
        for o in desired.hypernodes
    }


@pytest.mark.parametrize("model_name", ["mixed-depth", "rail-8", "irregular"])
def test_shuffled_input_gives_the_same_objects(model_name: str) -> None:
    model = load_model(str(MODELS / f"{model_name}.yaml"))
    nodes = model.nodes()
    dump = ibnetdiscover_dump(model)
    first = Pipeline().compute(
        ClusterInputs(reports={n: report_for(model, n) for n in nodes}, fabric=ibnetdiscover.parse(dump)),
        now=0,
    )
    random.Random(7).shuffle(nodes)
    lines = dump.split("\n\n")
    random.Random(7).shuffle(lines)  # blocks of the dump in another order
    second = Pipeline().compute(
        ClusterInputs(
            reports={n: report_for(model, n) for n in nodes}, fabric=ibnetdiscover.parse("\n\n".join(lines))
        ),
        now=0,
    )
    assert json.dumps(first.hypernodes, sort_keys=True) == json.dumps(second.hypernodes, sort_keys=True)


def test_a_node_joining_keeps_every_existing_name() -> None:
    model = load_model(str(MODELS / "mixed-depth.yaml"))
    dump = ibnetdiscover_dump(model)
    everyone = {n: report_for(model, n) for n in model.nodes()}
    before = _names({n: r for n, r in everyone.items() if n != "hgx08"}, dump)
    after = _names(everyone, dump)
    assert set(before) == set(after)
    changed = {name for name in after if after[name] != before[name]}
    assert changed == {"leaf-leaf-hgx2"} and "hgx08" in after["leaf-leaf-hgx2"]


def test_a_node_on_a_new_leaf_adds_one_hypernode_and_renames_nothing() -> None:
    switches = {"spine1": {"switches": ["leaf1", "leaf2", "leaf3"]}}
    blocks = [{"switch": "leaf1", "nodes": ["a1"]}, {"switch": "leaf2", "nodes": ["b1"]}]
    base = {"switches": switches, "blocks": blocks}
    grown = {"switches": switches, "blocks": [*blocks, {"switch": "leaf3", "nodes": ["c1"]}]}
    small, large = parse_model(base), parse_model(grown)
    before = _names({n: report_for(small, n) for n in small.nodes()}, ibnetdiscover_dump(small))
    after = _names({n: report_for(large, n) for n in large.nodes()}, ibnetdiscover_dump(large))
    assert set(after) - set(before) == {"leaf-leaf3"}
    assert set(before) <= set(after)


@pytest.mark.parametrize(
    ("kind", "identity"),
    [
        ("leaf", ("leaf1",)),
        ("leaf", ("Leaf_1.rack-7",)),
        ("leaf", tuple(f"su12-rail{r}-leaf" for r in range(8))),
        ("spine", ("x" * 80,)),
        ("nvlink", ("6f1d3c2e-8a4b-4f5e-9c1d-2b7a5e3f4c10/32767",)),
        ("core", ("zone=eu-west-1a", "example.com/block=b12")),
        ("leaf", ("MF0;ib5:SX6036/U1",)),
    ],
)
def test_names_are_dns1123_labels(kind: str, identity: tuple[str, ...]) -> None:
    name = domain_name(kind, identity)
    assert DNS_LABEL.match(name) and len(name) <= 63, name
    assert name.startswith(kind + "-")


def test_identities_that_clean_up_alike_get_different_names() -> None:
    assert domain_name("leaf", ("Leaf_1",)) != domain_name("leaf", ("leaf-1",))
    assert domain_name("leaf", ("leaf-1",)) == "leaf-leaf-1"  # already valid: used as is
    assert domain_name("leaf", ("a", "b")) != domain_name("leaf", ("a", "c"))


@pytest.mark.apiserver
def test_rendered_list_passes_a_server_side_dry_run(apiserver, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    model = load_model(str(MODELS / "mixed-depth.yaml"))
    desired = Pipeline().compute(
        ClusterInputs(
            reports={n: report_for(model, n) for n in model.nodes()},
            fabric=ibnetdiscover.parse(ibnetdiscover_dump(model)),
        ),
        now=1_700_000_000,
    )
    document = json.dumps(as_list(desired.hypernodes))
    proc = apiserver.kubectl(
        "apply", "--dry-run=server", "-o", "name", "-f", "-", input=document, check=False
    )
    assert proc.returncode == 0, proc.stderr
    assert sorted(proc.stdout.split()) == sorted(
        f"hypernode.topology.volcano.sh/{o['metadata']['name']}" for o in desired.hypernodes
    )
