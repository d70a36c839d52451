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

from agent.common import yaml_codec
from agent.common.input_limits import InputLimitError, check_tree, clean_name, scalar_text, short

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
MAX_NODES = 1_000_000  # nodes one model may name, all blocks together: a model is a test fabric
_BOUND = re.compile(r"[0-9]{1,9}", re.A)  # a range's bound: ASCII digits (never Unicode ones), at most 9


def _ranges(body: str, pattern: str) -> list[tuple[int, int, int]]:
    """A bracket's ranges as (low, high, zero-padded width), checked but not yet expanded."""
    out = []
    for part in body.split(","):
        part = part.strip()
        if not part:
            raise ModelError(f"empty range in hostlist {pattern[:80]!r}")
        low, dash, high = part.partition("-")
        high = high if dash else low
        if not (_BOUND.fullmatch(low) and _BOUND.fullmatch(high)) or int(low) > int(high):
            raise ModelError(f"bad range {part[:40]!r} in hostlist {pattern[:80]!r}")
        out.append((int(low), int(high), len(low) if low.startswith("0") and dash else 0))
    return out


def expand_hostlist(pattern: str, limit: int = MAX_NODES) -> list[str]:
    """`n[1-3,7]` -> n1 n2 n3 n7; zero padding kept (`n[01-02]`); several brackets multiply. More
    than `limit` names is a ModelError, told before any name is made (`n[1-100000000]`)."""
    pieces = _BRACKET.split(pattern)
    if any("[" in p or "]" in p for p in pieces):
        raise ModelError(f"unbalanced or nested brackets in hostlist {pattern[:80]!r}")
    # pieces alternate: literal, range body, literal, range body, ..., literal
    ranges = [_ranges(piece, pattern) for piece in pieces[1::2]]
    count = 1
    for found in ranges:
        count *= sum(high - low + 1 for low, high, _ in found)
        if count > limit:
            raise ModelError(f"hostlist {pattern[:80]!r} names more than {limit} nodes")
    choices: list[list[str]] = [[piece] for piece in pieces]
    for index, found in enumerate(ranges):
        choices[2 * index + 1] = [str(i).zfill(width) for low, high, width in found for i in range(low, high + 1)]
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
    if not isinstance(value, list) or not all(isinstance(v, (str, int)) and not isinstance(v, bool) for v in value):
        raise ModelError(f"{where} must be a list of names")
    return [_name(v, where) for v in value]


def _text(value: Any, where: str) -> str:
    """A string or a number as text; anything else (a list, a map, null, a bool) is a ModelError."""
    text = scalar_text(value)
    if text is None:
        raise ModelError(f"{where}: expected a name or a number, got {type(value).__name__}")
    return text


def _name(value: Any, where: str) -> str:
    """A switch or node name: text without control characters, at most a DNS name long (the same
    rule every fabric source applies, so a model cannot name `leaf1` twice as `leaf1\\n`)."""
    text = _text(value, where)
    if clean_name(text) != text:
        raise ModelError(f"{where}: {short(text)} is not a usable name (blanks around it, a control character, or too long)")
    return text


def parse_model(data: Any) -> ClusterModel:
    """Validates a loaded model document and returns the typed model."""
    if not isinstance(data, Mapping):
        raise ModelError("model must be a mapping with 'switches' and 'blocks'")
    try:
        check_tree(data, "model", max_items=4 * MAX_NODES, shared=True)  # YAML aliases: yaml_codec refuses them
    except InputLimitError as exc:
        raise ModelError(str(exc)) from None
    raw_switches = data.get("switches") or {}
    if not isinstance(raw_switches, Mapping):
        raise ModelError("'switches' must map switch IDs to {switches: [child IDs]}")
    parents: dict[str, str] = {}
    names: set[str] = set()
    for key, body in raw_switches.items():
        sw = _name(key, "switches")
        names.add(sw)
        children = (body or {}).get("switches", []) if isinstance(body, Mapping) else None
        if children is None:
            raise ModelError(f"switch {sw!r}: expected {{switches: [...]}}")
        for child in _as_str_list(children, f"switch {sw!r} children"):
            if child in parents and parents[child] != sw:
                raise ModelError(f"switch {child!r} has two parents: {parents[child]!r} and {sw!r}")
            parents[child] = sw
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
    named = 0
    for i, raw in enumerate(raw_blocks):
        if not isinstance(raw, Mapping) or "switch" not in raw:
            raise ModelError(f"block {i}: needs 'switch' and 'nodes'")
        nodes: list[str] = []
        for pat in _as_str_list(raw.get("nodes", []), f"block {i} nodes"):
            found = expand_hostlist(pat)  # names from a checked pattern and digits
            named += len(found)
            if named > MAX_NODES:
                raise ModelError(f"block {i} nodes: the model names more than {MAX_NODES} nodes")
            nodes.extend(found)
        annotations = raw.get("annotations") or {}
        if not isinstance(annotations, Mapping):
            raise ModelError(f"block {i}: annotations must be a mapping")
        switch = _name(raw["switch"], f"block {i} switch")
        names.add(switch)
        blocks.append(Block(switch, tuple(nodes),
                            {_name(k, f"block {i} annotations"): _text(v, f"block {i} annotations.{k}")
                             for k, v in annotations.items()}))  # fmt: skip
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
    except (yaml.YAMLError, ValueError) as exc:  # ValueError: not UTF-8
        raise ModelError(f"model {path} is not valid YAML: {' '.join(str(exc).split())[:300]}") from exc
    try:
        return parse_model(data)
    except ModelError as exc:
        raise ModelError(f"{path}: {exc}") from exc
