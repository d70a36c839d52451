"""The report a node of a modelled cluster would publish: `report_for(model, node)`.

Cluster model files (agent.cluster_model) declare a fabric without hardware. To test the
aggregator end to end and to benchmark it at 100,000 nodes, every node of such a model must
publish the same kind of NodeTopology report a real agent would: GPUs with their NVLink fabric
membership, one InfiniBand HCA per leaf the node is cabled to, and an LLDP neighbour per port that
names the leaf. Everything is derived deterministically from names (node name, switch ID, domain
annotation), so the same model always gives byte-identical reports and nodes can be probed one at
a time by separate processes.

Shapes follow real machines: a block annotated with an NVLink domain is a GB200 NVL72-style rack
(4 GPUs per compute tray, multi-node NVLink fabric, clique completed); a block without one is an
HGX H100-style node (8 GPUs, single-node NVSwitch, no multi-node fabric).
"""

from __future__ import annotations

import hashlib
import uuid
import weakref
from collections.abc import Mapping
from dataclasses import dataclass

from agent.cluster_model import ClusterModel, fabric_of
from agent.common.report import (
    ComponentHealth,
    Gpu,
    GpuFabric,
    Health,
    HostInfo,
    Interface,
    LldpNeighbour,
    NodeReport,
    NvLink,
    NvLinkDomain,
    NvmlReport,
    RdmaDevice,
    RdmaPort,
)

# A fixed namespace so NVLink cluster UUIDs derived from domain names never change.
DRIVER_VERSION = "570.124.06"
NVLINKS_PER_GPU = 18  # NVLink 4/5 GPUs have 18 links, all to NVSwitches
PORT_RATE_GBPS = 400.0  # 4X NDR


class UnknownNode(KeyError):
    """The node is not in any block of the model."""


@dataclass(frozen=True)
class _Placement:
    leaves: tuple[str, ...]  # leaf switch per port, in block order
    positions: tuple[int, ...]  # 1-based position of the node in each block (its switch port)
    domain: str | None


_INDEX: dict[int, dict[str, _Placement]] = {}


def _index(model: ClusterModel) -> Mapping[str, _Placement]:
    """node -> placement, built once per model object (models are immutable)."""
    key = id(model)
    cached = _INDEX.get(key)
    if cached is not None:
        return cached
    leaves: dict[str, list[tuple[str, int]]] = {}
    domains: dict[str, str] = {}
    for block in model.blocks:
        for position, node in enumerate(block.nodes, start=1):
            leaves.setdefault(node, []).append((block.switch, position))
            if block.domain and node not in domains:
                domains[node] = block.domain
    built = {
        node: _Placement(tuple(s for s, _ in ports), tuple(p for _, p in ports), domains.get(node))
        for node, ports in leaves.items()
    }
    _INDEX[key] = built
    weakref.finalize(model, _INDEX.pop, key, None)
    return built


def _digest(*parts: str) -> bytes:
    return hashlib.sha256("\0".join(parts).encode()).digest()


def node_guid(node: str, hca: int) -> str:
    """A deterministic EUI-64 style GUID in sysfs form ("xxxx:xxxx:xxxx:xxxx")."""
    raw = bytearray(_digest("guid", node, str(hca))[:8])
    raw[0:3] = b"\xb8\x3f\xd2"  # an NVIDIA/Mellanox OUI, like real ConnectX GUIDs
    text = raw.hex()
    return ":".join(text[i : i + 4] for i in range(0, 16, 4))


def switch_mac(switch: str) -> str:
    """The chassis MAC a switch announces in LLDP (locally administered, from its ID)."""
    raw = bytearray(_digest("mac", switch)[:6])
    raw[0] = (raw[0] | 0x02) & 0xFE
    return ":".join(f"{b:02x}" for b in raw)


def _gpus(node: str, count: int, fabric: GpuFabric | None, nics: tuple[str, ...]) -> tuple[Gpu, ...]:
    links = tuple(
        NvLink(link=i, state="up", version=5, remote_type="nvswitch") for i in range(NVLINKS_PER_GPU)
    )
    gpus = []
    for index in range(count):
        gpu_uuid = uuid.UUID(bytes=_digest("gpu", node, str(index))[:16], version=4)
        gpus.append(
            Gpu(
                index=index,
                uuid=f"GPU-{gpu_uuid}",
                name="NVIDIA GB200" if fabric else "NVIDIA H100 80GB HBM3",
                pci_bus_id=f"00000000:{0x18 + 0x10 * index:02X}:00.0",
                numa_node=index * 2 // count,
                nvlinks=links,
                fabric=fabric,
                nics=(nics[index % len(nics)],) if nics else (),
            )
        )
    return tuple(gpus)


def _nvml(node: str, domain: str | None, nics: tuple[str, ...]) -> NvmlReport:
    if domain is None:
        return NvmlReport(DRIVER_VERSION, _gpus(node, 8, None, nics))
    cluster_uuid, clique_id = fabric_of(domain)
    fabric = GpuFabric(cluster_uuid, clique_id, state="completed", status="success")
    return NvmlReport(
        DRIVER_VERSION,
        _gpus(node, 4, fabric, nics),
        NvLinkDomain(cluster_uuid, clique_id, "completed"),
    )


def _hca(node: str, index: int) -> RdmaDevice:
    guid = node_guid(node, index)
    port = RdmaPort(
        port=1,
        state="ACTIVE",
        phys_state="LinkUp",
        rate_gbps=PORT_RATE_GBPS,
        link_layer="InfiniBand",
        lid=None,
        netdev=f"ib{index}",
    )
    return RdmaDevice(
        name=f"mlx5_{index}",
        node_guid=guid,
        sys_image_guid=guid,
        node_desc=f"{node} mlx5_{index}",
        firmware="28.43.1014",
        pci_address=f"0000:{0x1A + 0x10 * index:02x}:00.0",
        numa_node=None,
        ports=(port,),
    )


def _neighbour(index: int, leaf: str, position: int) -> LldpNeighbour:
    return LldpNeighbour(
        interface=f"ib{index}",
        chassis_id=switch_mac(leaf),
        port_id=f"swp{position}",
        ttl=120,
        chassis_id_subtype="mac",
        port_id_subtype="ifname",
        port_description=f"swp{position}",
        system_name=leaf,
    )


def report_for(model: ClusterModel, node: str) -> NodeReport:
    """The NodeReport `node` would publish in the modelled cluster (raises UnknownNode)."""
    placement = _index(model).get(node)
    if placement is None:
        raise UnknownNode(node)
    hcas = tuple(_hca(node, i) for i in range(len(placement.leaves)))
    nics = tuple(h.name for h in hcas)
    ok = ComponentHealth(Health.OK)
    return NodeReport(
        node_name=node,
        health={"nvml": ok, "rdma": ok, "net": ok, "lldp": ok, "host": ok},
        host=HostInfo(hostname=node, kernel="6.8.0-model", cpus=144, memory_bytes=512 * 2**30),
        nvml=_nvml(node, placement.domain, nics),
        rdma=hcas,
        interfaces=tuple(
            Interface(name=f"ib{i}", mac=None, oper_state="up", mtu=4092, kind="physical")
            for i in range(len(hcas))
        ),
        lldp=tuple(
            _neighbour(i, leaf, pos)
            for i, (leaf, pos) in enumerate(zip(placement.leaves, placement.positions, strict=True))
        ),
    )
