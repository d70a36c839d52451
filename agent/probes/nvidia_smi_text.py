"""Parsers for `nvidia-smi -q` and `nvidia-smi topo -m` text.

Why: the agent reads NVML directly, but nvidia-smi output is what operators paste into bug reports
and what public captures of real machines exist as. Parsing it lets tests check the NVML fake
against real machines (product names, bus id format, fabric section, NVLink counts) and gives a
diagnostic path (`nvidia-smi -q > file`) when NVML answers look wrong.

`nvidia-smi -q` is an indented outline: four spaces per level, `Key<pad>: value` leaves, bare
`Key` section headers, top-level `GPU <bus id>` sections, and `N/A` for unsupported values.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Union

Tree = dict[str, Union[str, "Tree"]]

_LEAF = re.compile(r"^(?P<key>[^:]*?)\s+:\s?(?P<value>.*)$")
_GPU_SECTION = re.compile(r"^GPU ([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7])$")


@dataclass(frozen=True)
class SmiFabric:
    state: str | None  # "Completed", "In Progress", ...; None for N/A
    status: str | None
    clique_id: int | None
    cluster_uuid: str | None


@dataclass(frozen=True)
class SmiGpu:
    bus_id: str
    product_name: str | None
    uuid: str | None
    minor_number: int | None
    fabric: SmiFabric | None


@dataclass(frozen=True)
class SmiLog:
    driver_version: str | None
    cuda_version: str | None
    attached_gpus: int | None
    gpus: tuple[SmiGpu, ...]


def outline(text: str) -> Tree:
    """The `-q` outline as nested dicts (a repeated key keeps its first value)."""
    root: Tree = {}
    stack: list[tuple[int, Tree]] = [(-1, root)]
    for raw in text.splitlines():
        if not raw.strip() or raw.lstrip().startswith("="):
            continue
        indent = len(raw) - len(raw.lstrip(" "))
        line = raw.strip()
        while stack[-1][0] >= indent:
            stack.pop()
        parent = stack[-1][1]
        leaf = _LEAF.match(line)
        if leaf:
            parent.setdefault(leaf["key"].strip(), leaf["value"].strip())
        else:
            child: Tree = {}
            parent.setdefault(line, child)
            stack.append((indent, child))
    return root


def _get(tree: Tree, *path: str) -> str | None:
    node: str | Tree = tree
    for key in path:
        if not isinstance(node, dict) or key not in node:
            return None
        node = node[key]
    if not isinstance(node, str) or node == "N/A":
        return None
    return node


def _int(value: str | None) -> int | None:
    return int(value) if value is not None and value.isdigit() else None


def _fabric(section: Tree) -> SmiFabric | None:
    if not isinstance(section.get("Fabric"), dict):
        return None
    return SmiFabric(
        state=_get(section, "Fabric", "State"),
        status=_get(section, "Fabric", "Status"),
        clique_id=_int(_get(section, "Fabric", "CliqueId")),
        cluster_uuid=_get(section, "Fabric", "ClusterUUID"),
    )


def parse_query(text: str) -> SmiLog:
    """`nvidia-smi -q` -> driver, CUDA version and per-GPU identity and fabric section."""
    tree = outline(text)
    gpus = []
    for key, section in tree.items():
        match = _GPU_SECTION.match(key)
        if match is None or not isinstance(section, dict):
            continue
        gpus.append(
            SmiGpu(
                bus_id=_get(section, "PCI", "Bus Id") or match.group(1),
                product_name=_get(section, "Product Name"),
                uuid=_get(section, "GPU UUID"),
                minor_number=_int(_get(section, "Minor Number")),
                fabric=_fabric(section),
            )
        )
    return SmiLog(
        driver_version=_get(tree, "Driver Version"),
        cuda_version=_get(tree, "CUDA Version"),
        attached_gpus=_int(_get(tree, "Attached GPUs")),
        gpus=tuple(gpus),
    )


def parse_topo_matrix(text: str) -> dict[tuple[str, str], str]:
    """`nvidia-smi topo -m` -> {(row, column): cell} for the device columns (GPU0, NIC0, ...).

    Cells are `X`, `NV<n>` (n bonded NVLinks), `PIX`, `PXB`, `PHB`, `NODE`, `SYS`; the affinity
    columns that follow the device columns are left out."""
    lines = [ln for ln in text.splitlines() if ln.strip()]
    if not lines:
        return {}
    columns = [c for c in lines[0].split() if re.match(r"^(GPU|NIC|mlx)\w*\d$", c)]
    cells: dict[tuple[str, str], str] = {}
    for line in lines[1:]:
        fields = line.split()
        if not fields or fields[0] not in columns:
            continue
        for column, cell in zip(columns, fields[1 : 1 + len(columns)], strict=False):
            cells[(fields[0], column)] = cell
    return cells
