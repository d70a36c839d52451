"""Generates the NodeTopology CRD from the report dataclasses, so the schema the API server
enforces can never drift from what the agent writes and the aggregator reads.

`python -m agent.common.crd_schema > crds/nodetopologies.hypertopo.io.yaml` regenerates the file; a test
fails when the committed file differs from the generated one.
"""

from __future__ import annotations

import dataclasses
import enum
import sys
import types
from collections.abc import Mapping
from typing import Any, Union, get_args, get_origin, get_type_hints

import yaml

from agent.common import report

_DESCRIPTIONS = {
    "NodeReport": "What the hypertopo agent observed on this node: stable facts and health, no counters.",
    "health": "Health (of the node: per component nvml, rdma, net, lldp, host, pcie): ok, degraded, failed, "
    "absent, or unused (hardware never put to use, such as an HCA port never cabled since boot).",
    "findings": "Grey-failure findings (error rates, links trained below capability, flapping, PCIe links "
    "below their maximum, NVLink errors, fabric health bits): component, subject, kind, severity, the value "
    "measured when the finding started or changed severity, the threshold and the window in seconds.",
    "nvml": "GPUs, NVLink links and multi-node NVLink fabric membership from NVML.",
    "rdma": "RDMA devices (InfiniBand / RoCE HCAs) and their ports from /sys/class/infiniband.",
    "interfaces": "Network interfaces from netlink.",
    "lldp": "LLDP neighbours seen on this node's interfaces (the switch port each NIC is cabled to).",
    "measurements": "Measured fabric (opt-in agent flag --measure-fabric): round trips to a few peers chosen by "
    "the probe plan, p50/p99 in microseconds, loss, when, the transport that measured them (udp, or rdma: "
    "perftest's ib_write_lat, whose half round trips are doubled) and, from the last bandwidth run, Mbit/s; "
    "latched, rewritten only when a figure moves beyond its band.",
    "probeAddress": "The fabric address this node's probe responder answers on (--measure-fabric); responders "
    "answer only the addresses the NodeTopology objects publish here.",
    "summary": "Counts shown by kubectl get ntopo.",
    "schemaVersion": "Version of this report layout; bumped on incompatible changes.",
}


def _is_optional(hint: Any) -> tuple[bool, Any]:
    if get_origin(hint) in (Union, types.UnionType):
        args = [a for a in get_args(hint) if a is not type(None)]
        if len(args) == 1 and len(get_args(hint)) == 2:
            return True, args[0]
    return False, hint


def schema_for(hint: Any) -> dict[str, Any]:
    """OpenAPI v3 schema for one type hint of the report dataclasses."""
    _, hint = _is_optional(hint)
    origin = get_origin(hint)
    if origin is tuple:
        return {"type": "array", "items": schema_for(get_args(hint)[0])}
    if origin is not None and (origin is dict or issubclass(origin, Mapping)):
        return {"type": "object", "additionalProperties": schema_for(get_args(hint)[1])}
    if dataclasses.is_dataclass(hint):
        return _object_schema(hint)
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return {"type": "string", "enum": [m.value for m in hint]}
    simple = {
        int: {"type": "integer"},
        float: {"type": "number"},
        str: {"type": "string"},
        bool: {"type": "boolean"},
    }
    if hint in simple:
        return dict(simple[hint])
    raise TypeError(f"no schema for {hint!r}")


def _object_schema(cls: Any) -> dict[str, Any]:
    hints = get_type_hints(cls)
    props: dict[str, Any] = {}
    required: list[str] = []
    for f in dataclasses.fields(cls):
        if f.metadata.get("metric_only"):
            continue
        key = report._camel(f.name)
        props[key] = schema_for(hints[f.name])
        if "max_items" in f.metadata:
            props[key]["maxItems"] = f.metadata["max_items"]
        if key in _DESCRIPTIONS:
            props[key]["description"] = _DESCRIPTIONS[key]
        optional, _ = _is_optional(hints[f.name])
        has_default = f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING
        if not optional and not has_default:
            required.append(key)
    out: dict[str, Any] = {"type": "object", "properties": props}
    if required:
        out["required"] = required
    return out


def _probe_plan() -> dict[str, Any]:
    """`status.probePlan`: this node's row of the fabric probe plan (agent.common.measure_rows)."""
    def text() -> dict[str, Any]:  # a fresh dict each use: YAML would write repeats as anchors
        return {"type": "string", "maxLength": 253}

    return {
        "type": "object",
        "description": "This node's row of the fabric probe plan, written by the aggregator (--measured-fabric) and "
        "read by this node's agent (--measure-fabric): the peers to probe and the addresses whose probes to answer.",
        "properties": {
            "tree": {"type": "string", "maxLength": 64},
            "digest": {"type": "string", "maxLength": 64},
            "peers": {"type": "array", "maxItems": 64, "items": {
                "type": "object", "required": ["node", "address"], "properties": {"node": text(), "address": text()}}},
            "probers": {"type": "array", "maxItems": 256, "items": text()},
        },
    }


def crd() -> dict[str, Any]:
    spec = schema_for(report.NodeReport)
    spec["description"] = _DESCRIPTIONS["NodeReport"]
    spec["properties"]["summary"] = schema_for(report.Summary) | {"description": _DESCRIPTIONS["summary"]}
    column = [
        ("GPUs", "integer", ".spec.summary.gpus", "GPUs seen through NVML"),
        ("NVLink-Domain", "string", ".spec.summary.nvlinkDomain", "multi-node NVLink cluster/clique"),
        ("RDMA-Up", "integer", ".spec.summary.rdmaPortsUp", "RDMA ports ACTIVE"),
        ("LLDP", "integer", ".spec.summary.lldpNeighbours", "LLDP neighbours"),
        ("Health", "string", ".spec.summary.health", "worst component health"),
    ]
    status = {
        "type": "object",
        "description": "Written by consumers (the aggregator) through the status subresource.",
        "properties": {
            "conditions": {
                "type": "array",
                "x-kubernetes-list-type": "map",
                "x-kubernetes-list-map-keys": ["type"],
                "items": {
                    "type": "object",
                    "required": ["type", "status", "lastTransitionTime", "reason", "message"],
                    "properties": {
                        "type": {"type": "string", "maxLength": 316},
                        "status": {"type": "string", "enum": ["True", "False", "Unknown"]},
                        "reason": {"type": "string", "maxLength": 1024},
                        "message": {"type": "string", "maxLength": 32768},
                        "lastTransitionTime": {"type": "string", "format": "date-time"},
                        "observedGeneration": {"type": "integer", "format": "int64", "minimum": 0},
                    },
                },
            },
            "probePlan": _probe_plan(),
        },
    }
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{report.PLURAL}.{report.API_GROUP}"},
        "spec": {
            "group": report.API_GROUP,
            "scope": "Cluster",
            "names": {
                "kind": report.KIND,
                "listKind": f"{report.KIND}List",
                "plural": report.PLURAL,
                "singular": report.KIND.lower(),
                "shortNames": ["ntopo"],
            },
            "versions": [
                {
                    "name": report.API_VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": [
                        {"name": n, "type": t, "jsonPath": p, "description": d} for n, t, p, d in column
                    ]
                    + [{"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}],
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "description": "One node's topology report, named after the node and written by its agent.",
                            "properties": {
                                "apiVersion": {"type": "string"},
                                "kind": {"type": "string"},
                                "metadata": {"type": "object"},
                                "spec": spec,
                                "status": status,
                            },
                        }
                    },
                }
            ],
        },
    }


def render() -> str:
    header = "# Generated by `python -m agent.common.crd_schema` from agent/common/report.py; do not edit by hand.\n"
    return header + yaml.safe_dump(crd(), sort_keys=False, width=120)


if __name__ == "__main__":
    sys.stdout.write(render())
