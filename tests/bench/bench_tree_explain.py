"""What explaining an empty or partial tree costs the controller per reconcile (aggregator.tree.explain).

    python tests/bench/bench_tree_explain.py --nodes 100000

Prints milliseconds for: an empty tree of N nodes whose reports heard no LLDP neighbour (first
explanation, then again with every report object unchanged), a tree holding every node, one node
left out, and a reconcile in which nothing changed (the Narrator keeps its last explanation).
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import time
from pathlib import Path

from agent.cluster_model import load_model
from agent.common.report import node_topology_object
from agent.model_probe import report_for
from aggregator.tree.explain import Narrator

MODEL = Path(__file__).parent.parent / "models" / "small-tree.yaml"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=100_000)
    count = parser.parse_args().nodes
    logging.disable(logging.WARNING)  # the narrator's log lines are not what is measured
    deaf = node_topology_object(dataclasses.replace(report_for(load_model(str(MODEL)), "node01"), lldp=()))
    objects = {f"n{i:06d}": {**deaf, "metadata": {**deaf["metadata"], "name": f"n{i:06d}"}} for i in range(count)}
    nodes = set(objects)
    narrator = Narrator(fabric_sources=())

    def timed(label: str, **kwargs: object) -> None:
        start = time.perf_counter()
        narrator.observe(nodes=nodes, topologies=objects, **kwargs)  # type: ignore[arg-type]
        print(f"{label}: {(time.perf_counter() - start) * 1000:.2f} ms")

    empty: dict[str, str] = {}
    timed(f"empty tree, {count} nodes, first", placed=empty, hypernodes=0)
    timed(f"empty tree, {count} nodes, again (nothing announced as changed: None)", placed=empty, hypernodes=0)
    timed(f"empty tree, {count} nodes, a reconcile where nothing changed", placed=empty, hypernodes=0, changed=())
    placed = dict.fromkeys(objects, "leaf")
    timed(f"every node placed, {count} nodes", placed=placed, hypernodes=5)
    del placed["n000001"]
    timed(f"one node left out, {count} nodes", placed=placed, hypernodes=5)


if __name__ == "__main__":
    main()
