"""The modelled cluster the README's tree and docs/hypernode-tree.png show: a 3-tier fat-tree of 16
nodes (tests/models/fat-tree-3tier.yaml) whose agents report through `probe --model`, with two
faults: h006's RDMA port is down and h011's agent has not reported.

    python tests/kits/operator_view_example.py DIR          # writes DIR/h001.yaml ... (no h011)
    hypertopo-aggregator render --reports DIR --model tests/models/fat-tree-3tier.yaml | \\
        hypertopo-aggregator tree --from -
    hypertopo-aggregator render --reports DIR --model tests/models/fat-tree-3tier.yaml --format dot | \\
        dot -Tpng -o docs/hypernode-tree.png
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import yaml

from agent.cluster_model import load_model
from agent.common.report import ComponentHealth, Health, NodeReport, node_topology_object
from agent.model_probe import report_for

MODEL_FILE = Path(__file__).resolve().parent.parent / "models" / "fat-tree-3tier.yaml"
FAILED_NODE, SILENT_NODE = "h006", "h011"
FAILED_RDMA = "mlx5_2 port 1 DOWN (carrier lost)"


def reports() -> list[NodeReport]:
    model = load_model(str(MODEL_FILE))
    out = []
    for node in model.nodes():
        if node == SILENT_NODE:
            continue
        report = report_for(model, node)
        if node == FAILED_NODE:
            health = {**report.health, "rdma": ComponentHealth(Health.FAILED, FAILED_RDMA)}
            report = dataclasses.replace(report, health=health)
        out.append(report)
    return out


def write(folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for report in reports():
        (folder / f"{report.node_name}.yaml").write_text(yaml.safe_dump(node_topology_object(report)))


def render_args(folder: Path) -> list[str]:
    return ["render", "--reports", str(folder), "--model", str(MODEL_FILE)]


if __name__ == "__main__":
    write(Path(sys.argv[1]))
