"""Cluster model files: a declared fabric (switch tree + node blocks) used to drive the agent's
`probe --model`, the aggregator's `--model` source and the benchmarks without real hardware.

Format (see DESIGN.md):

    switches:
      spine1: {switches: [leaf1, leaf2]}      # each switch has at most one parent
    blocks:
      - switch: leaf1
        nodes: ["n[1-18]"]                      # hostlist syntax
        annotations: {accelerator.topology.test/domain: nvl72-a}

A node listed under several blocks is cabled to several leaves (a rail-optimised fabric).
"""

from __future__ import annotations

import hashlib
import itertools
import re
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import yaml

from agent import yaml_codec

DOMAIN_ANNOTATION = "accelerator.topology.test/domain"


FABRIC_NAMESPACE = uuid.UUID("6f1d3c2e-8a4b-4f5e-9c1d-2b7a5e3f4c10")


def fabric_of(domain: str) -> tuple[str, int]:
    """NVLink (cluster UUID, clique ID) of a modelled NVLink domain name. Here, next to the model,
    because both sides derive it: the fake agent's reports (agent.model_probe) and the
    aggregator's model source (aggregator.sources.model), so model and reports agree."""
    cluster_uuid = str(uuid.uuid5(FABRIC_NAMESPACE, domain))
    digest = hashlib.sha256("\0".join(("clique", domain)).encode()).digest()
    clique_id = int.from_bytes(digest[:2], "big") % 0x7FFF + 1
    return cluster_uuid, clique_id


class ModelError(ValueError):
    """A model file that cannot be used, with the reason."""


_BRACKET = re.compile(r"\[([^\]]*)\]")


def _expand_range_list(body: str, pattern: str) -> list[str]:
    values: list[str] = []
    for part in body.split(","):
        part = part.strip()
        if not part:
            raise ModelError(f"empty range in hostlist {pattern!r}")
        if "-" in part:
            low, _, high = part.partition("-")
            if not (low.isdigit() and high.isdigit()) or int(low) > int(high):
                raise ModelError(f"bad range {part!r} in hostlist {pattern!r}")
            width = len(low) if low.startswith("0") else 0
            values.extend(str(i).zfill(width) for i in range(int(low), int(high) + 1))
        elif part.isdigit():
            values.append(part)
        else:
            raise ModelError(f"bad range {part!r} in hostlist {pattern!r}")
    return values


def expand_hostlist(pattern: str) -> list[str]:
    """`n[1-3,7]` -> n1 n2 n3 n7; zero padding kept (`n[01-02]`); several brackets multiply."""
    pieces = _BRACKET.split(pattern)
    if any("[" in p or "]" in p for p in pieces):
        raise ModelError(f"unbalanced or nested brackets in hostlist {pattern!r}")
    # pieces alternate: literal, range body, literal, range body, ..., literal
    choices: list[list[str]] = []
    for i, piece in enumerate(pieces):
        choices.append(_expand_range_list(piece, pattern) if i % 2 else [piece])
    return ["".join(combo) for combo in itertools.product(*choices)]


@dataclass(frozen=True)
class Block:
    switch: str
    nodes: tuple[str, ...]
    annotations: Mapping[str, str] = field(default_factory=dict)

    @property
    def domain(self) -> str | None:
        return self.annotations.get(DOMAIN_ANNOTATION)


@dataclass(frozen=True)
class ClusterModel:
    parents: Mapping[str, str]  # switch -> its parent switch
    switches: tuple[str, ...]  # every switch ID, sorted
    blocks: tuple[Block, ...]

    def nodes(self) -> list[str]:
        seen: dict[str, None] = {}
        for block in self.blocks:
            for node in block.nodes:
                seen.setdefault(node, None)
        return list(seen)

    def leaves_of(self, node: str) -> list[str]:
        return [b.switch for b in self.blocks if node in b.nodes]

    def domain_of(self, node: str) -> str | None:
        for block in self.blocks:
            if node in block.nodes and block.domain:
                return block.domain
        return None

    def ancestors(self, switch: str) -> list[str]:
        """The chain of parents above a switch, nearest first."""
        chain: list[str] = []
        while switch in self.parents:
            switch = self.parents[switch]
            chain.append(switch)
        return chain


def _as_str_list(value: Any, where: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, (str, int)) for v in value):
        raise ModelError(f"{where} must be a list of names")
    return [str(v) for v in value]


def parse_model(data: Any) -> ClusterModel:
    """Validates a loaded model document and returns the typed model."""
    if not isinstance(data, Mapping):
        raise ModelError("model must be a mapping with 'switches' and 'blocks'")
    raw_switches = data.get("switches") or {}
    if not isinstance(raw_switches, Mapping):
        raise ModelError("'switches' must map switch IDs to {switches: [child IDs]}")
    parents: dict[str, str] = {}
    names: set[str] = set()
    for sw, body in raw_switches.items():
        names.add(str(sw))
        children = (body or {}).get("switches", []) if isinstance(body, Mapping) else None
        if children is None:
            raise ModelError(f"switch {sw!r}: expected {{switches: [...]}}")
        for child in _as_str_list(children, f"switch {sw!r} children"):
            if child in parents and parents[child] != str(sw):
                raise ModelError(f"switch {child!r} has two parents: {parents[child]!r} and {sw!r}")
            parents[child] = str(sw)
            names.add(child)
    blocks = _parse_blocks(data.get("blocks") or [], names)
    model = ClusterModel(parents=parents, switches=tuple(sorted(names)), blocks=tuple(blocks))
    for sw in model.switches:
        _check_acyclic(model.parents, sw)
    return model


def _parse_blocks(raw_blocks: Any, names: set[str]) -> list[Block]:
    if not isinstance(raw_blocks, list):
        raise ModelError("'blocks' must be a list")
    blocks: list[Block] = []
    for i, raw in enumerate(raw_blocks):
        if not isinstance(raw, Mapping) or "switch" not in raw:
            raise ModelError(f"block {i}: needs 'switch' and 'nodes'")
        nodes = [
            n for pat in _as_str_list(raw.get("nodes", []), f"block {i} nodes") for n in expand_hostlist(pat)
        ]
        annotations = raw.get("annotations") or {}
        if not isinstance(annotations, Mapping):
            raise ModelError(f"block {i}: annotations must be a mapping")
        names.add(str(raw["switch"]))
        blocks.append(
            Block(str(raw["switch"]), tuple(nodes), {str(k): str(v) for k, v in annotations.items()})
        )
    return blocks


def _check_acyclic(parents: Mapping[str, str], start: str) -> None:
    seen = {start}
    node = start
    while node in parents:
        node = parents[node]
        if node in seen:
            raise ModelError(f"switch hierarchy has a cycle through {node!r}")
        seen.add(node)


def load_model(path: str) -> ClusterModel:
    try:
        with open(path, encoding="utf-8") as handle:
            data = yaml_codec.load(handle)
    except OSError as exc:
        raise ModelError(f"cannot read model {path}: {exc.strerror}") from exc
    except yaml.YAMLError as exc:
        raise ModelError(f"model {path} is not valid YAML: {exc}") from exc
    try:
        return parse_model(data)
    except ModelError as exc:
        raise ModelError(f"{path}: {exc}") from exc
