"""This node's row of the probe plan, read from its own NodeTopology (`status.probePlan`, written
by the aggregator: agent.common.measure_rows).

Why its own object and nothing else: every agent listing the HyperNodes and reading its peers'
reports each round is reads that grow with the square of the cluster, and a `list` grant on
HyperNodes the agent needs for nothing else. Its own NodeTopology it already reads and writes;
one GET a round (every `--measure-interval`, 300 s by default) is all measuring costs the API
server per node."""

from __future__ import annotations

from agent.common.adapters.kube import NODETOPOLOGIES, KubeClient
from agent.common.api_error import ApiError
from agent.common.measure_rows import PlanRow, from_wire


def own_row(kube: KubeClient, node: str) -> PlanRow | None:
    """The published row (None: no report yet, or the aggregator has not planned this node);
    ApiError when the API server cannot be read, measure_rows.RowError for a malformed row."""
    try:
        obj = kube.get(NODETOPOLOGIES, node)
    except ApiError as exc:
        if exc.not_found:
            return None
        raise
    return from_wire((obj.get("status") or {}).get("probePlan"))
