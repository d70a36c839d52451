"""The node report: what one agent knows about its node, as plain frozen dataclasses.

This module is the contract between the agent (which fills it), the NodeTopology object (its wire
form, `spec` of `hypertopo.io/v1alpha1` NodeTopology) and the aggregator (which reads it back).
It holds stable facts and health states only. Counters that change on every probe are kept on the
dataclasses in fields marked `metric_only` so the metrics exporter can read them, but they never
reach the wire form, so an unchanged node serialises to an unchanged object (zero API writes).

Wire form rules: field names become lowerCamelCase; `None` and metric-only fields are omitted;
tuples become lists; enums become their string values.

The classes are slotted: the aggregator keeps every node's parsed report (aggregator.live.slim), ~50
instances per node, and a slotted instance is a third smaller than one with a dict.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar, get_args, get_origin, get_type_hints

from agent.common.input_limits import short

SCHEMA_VERSION = 1
API_GROUP = "hypertopo.io"
API_VERSION = "v1alpha1"
KIND = "NodeTopology"
PLURAL = "nodetopologies"

METRIC_ONLY: Mapping[str, Any] = {"metric_only": True}


class Health(enum.StrEnum):
    """Per-component health. `absent` means no such hardware: a quiet, normal result. `unused`
    means hardware that is there but was never put to use (an HCA port never cabled since boot):
    as quiet as `absent`, never an alert."""

    OK = "ok"
    DEGRADED = "degraded"
    FAILED = "failed"
    ABSENT = "absent"
    UNUSED = "unused"


@dataclass(frozen=True, slots=True)
class ComponentHealth:
    state: Health
    reason: str = ""


T = TypeVar("T")


@dataclass(frozen=True)
class ProbeResult(Generic[T]):
    """What every probe returns: a value (None when absent or failed) and its health.

    A probe never raises for bad input or missing hardware; it says so here."""

    value: T | None
    health: ComponentHealth

    @classmethod
    def absent(cls, reason: str) -> ProbeResult[T]:
        return cls(None, ComponentHealth(Health.ABSENT, reason))

    @classmethod
    def failed(cls, reason: str) -> ProbeResult[T]:
        return cls(None, ComponentHealth(Health.FAILED, reason))


# --- host -------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class HostInfo:
    hostname: str
    kernel: str
    cpus: int
    memory_bytes: int


# --- NVLink / NVML ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class NvLink:
    link: int
    state: str  # "up" | "down"
    version: int | None = None
    remote_type: str | None = None  # "gpu" | "nvswitch" | "unknown"
    remote_pci_bus_id: str | None = None
    error_counters: Mapping[str, int] = field(default_factory=dict, metadata=METRIC_ONLY)


@dataclass(frozen=True, slots=True)
class GpuFabric:
    """Multi-node NVLink fabric membership (NVML GPU fabric info): the clique a GPU belongs to."""

    cluster_uuid: str
    clique_id: int
    state: str  # "not-supported" | "not-started" | "in-progress" | "completed"
    status: str  # "success" or the NVML error name
    # nvmlGpuFabricInfoV_t.healthMask (2-bit fields, agent.probes.nvlink_health decodes them into
    # findings); None from drivers/bindings without the versioned call
    health_mask: int | None = field(default=None, compare=False, metadata=METRIC_ONLY)


@dataclass(frozen=True, slots=True)
class Gpu:
    index: int
    uuid: str
    name: str
    pci_bus_id: str
    numa_node: int | None = None
    nvlinks: tuple[NvLink, ...] = ()
    fabric: GpuFabric | None = None
    nics: tuple[str, ...] = ()  # RDMA devices closest on the PCIe hierarchy
    health: ComponentHealth = ComponentHealth(Health.OK)
    uncorrected_ecc: int | None = field(default=None, metadata=METRIC_ONLY)
    xid_events: Mapping[int, int] = field(default_factory=dict, metadata=METRIC_ONLY)


@dataclass(frozen=True, slots=True)
class NvLinkDomain:
    """The node-level multi-node NVLink domain: the clique shared by this node's GPUs."""

    cluster_uuid: str
    clique_id: int
    state: str


@dataclass(frozen=True, slots=True)
class NvmlReport:
    driver_version: str
    gpus: tuple[Gpu, ...]
    domain: NvLinkDomain | None = None


# --- RDMA ---------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RdmaPort:
    port: int
    state: str  # "ACTIVE", "DOWN", "INIT", "ARMED" (sysfs text without the number)
    phys_state: str  # "LinkUp", "Disabled", "Polling", ...
    rate_gbps: float | None
    link_layer: str  # "InfiniBand" | "Ethernet"
    lid: int | None = None
    sm_lid: int | None = None
    netdev: str | None = None
    gids: tuple[str, ...] = ()
    counters: Mapping[str, int] = field(default_factory=dict, metadata=METRIC_ONLY)
    # ok (ACTIVE), failed (in use and not ACTIVE) or unused (never cabled since boot); None: not
    # judged (the raw sysfs reading, before agent.probes.rdma.judge)
    health: Health | None = None


@dataclass(frozen=True, slots=True)
class RdmaDevice:
    name: str
    node_guid: str | None = None
    sys_image_guid: str | None = None
    node_desc: str | None = None
    firmware: str | None = None
    pci_address: str | None = None
    numa_node: int | None = None
    ports: tuple[RdmaPort, ...] = ()


# --- interfaces and LLDP -----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Interface:
    name: str
    mac: str | None
    oper_state: str  # "up" | "down" | "unknown" | ...
    mtu: int | None = None
    speed_mbps: int | None = None
    pci_address: str | None = None
    bond_master: str | None = None
    kind: str | None = None  # "physical" | "bond" | "vlan" | "veth" | ...


@dataclass(frozen=True, slots=True)
class LldpNeighbour:
    interface: str
    chassis_id: str
    port_id: str
    ttl: int
    chassis_id_subtype: str | None = None
    port_id_subtype: str | None = None
    port_description: str | None = None
    system_name: str | None = None
    system_description: str | None = None
    management_addresses: tuple[str, ...] = ()
    # enabled system capabilities (802.1AB 8.5.8, lldpd's names: "Bridge", "Router", "Station",
    # ...); a neighbour that enables neither Bridge nor Router is not a switch. None when unknown:
    # no System Capabilities TLV (optional; some switches send none), or an older agent's report
    capabilities: tuple[str, ...] | None = None


# --- grey failures -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Finding:
    """One grey-failure finding: what was measured against what limit over which window.

    A finding is a health state, not a counter: `value` is the figure measured when the finding
    started or last changed severity (agent.probes.grey.latch keeps it), so a port whose error rate
    wanders between 12/min and 14/min serialises to the same object every cycle and the node
    causes no API write; the live figure is in the metrics."""

    component: str  # the health component it rolls up into: "rdma" | "net" | "nvml" | "pcie"
    subject: str  # e.g. "mlx5_0/1", "eth0", "gpu0/nvlink3", "gpu0 0000:3b:00.0"
    kind: str  # "error-rate" | "link-training" | "flapping" | "pcie-link" | "nvlink-errors" | "fabric-health"
    severity: Health  # Health.DEGRADED or Health.FAILED
    value: str  # measured, with unit, e.g. "12/min", "200 Gb/s"
    threshold: str  # e.g. "> 10/min", "400 Gb/s"
    window_s: int  # 0 when instantaneous
    reason: str  # one human line

    @property
    def key(self) -> tuple[str, str, str]:
        """What identifies a finding from one cycle to the next (value and severity may change)."""
        return (self.component, self.subject, self.kind)


# --- measured fabric ----------------------------------------------------------------------------

MAX_MEASUREMENTS = 64  # peers in spec.measurements: the probe plan asks for about ten (agent.measure_plan)


@dataclass(frozen=True, slots=True)
class Measurement:
    """Round trips from this node to one peer over the fabric (agent.probes.fabric_rtt).

    Like a finding, a measurement is latched: the figures and `when` are those of the round that
    last moved beyond the band, so a steady link serialises to the same object every cycle and
    causes no API write; the live figures are in the metrics."""

    peer: str  # the peer's node name
    p50_us: int  # median round-trip time, microseconds
    p99_us: int
    loss_percent: float  # of the probes sent in the round
    sent: int  # probes in the round
    when: str  # RFC 3339, UTC: the round these figures are from
    transport: str = "udp"  # "udp" | "rdma"
    bandwidth_mbps: int | None = None  # a short burst, when measured


# --- the whole report --------------------------------------------------------------------------

COMPONENTS = ("nvml", "rdma", "net", "lldp", "host", "pcie")


@dataclass(frozen=True, slots=True)
class Summary:
    """Counts an operator wants at a glance (the NodeTopology printer columns)."""

    gpus: int
    nvlink_domain: str
    rdma_ports_up: int
    lldp_neighbours: int
    health: str


@dataclass(frozen=True, slots=True)
class NodeReport:
    node_name: str
    health: Mapping[str, ComponentHealth]
    host: HostInfo | None = None
    nvml: NvmlReport | None = None
    rdma: tuple[RdmaDevice, ...] = ()
    interfaces: tuple[Interface, ...] = ()
    lldp: tuple[LldpNeighbour, ...] = ()
    findings: tuple[Finding, ...] = ()
    measurements: tuple[Measurement, ...] = field(default=(), metadata={"max_items": MAX_MEASUREMENTS})
    # the fabric address this node's probe responder answers on (set with --measure-fabric): the
    # peers probe it, and the responders of all nodes answer only the addresses published here
    probe_address: str | None = None
    schema_version: int = SCHEMA_VERSION

    def overall_health(self) -> Health:
        """Worst component state, where `absent` counts as fine."""
        states = {h.state for h in self.health.values()}
        for worst in (Health.FAILED, Health.DEGRADED):
            if worst in states:
                return worst
        return Health.OK

    def summary(self) -> Summary:
        gpus = self.nvml.gpus if self.nvml else ()
        domain = self.nvml.domain if self.nvml else None
        return Summary(
            gpus=len(gpus),
            nvlink_domain=f"{domain.cluster_uuid}/{domain.clique_id}" if domain else "",
            rdma_ports_up=sum(1 for d in self.rdma for p in d.ports if p.state == "ACTIVE"),
            lldp_neighbours=len(self.lldp),
            health=self.overall_health().value,
        )


# --- wire form ----------------------------------------------------------------------------------


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part.capitalize() for part in rest)


def to_wire(value: Any) -> Any:
    """Dataclass tree -> JSON-ready dict (camelCase keys, no None, no metric-only fields)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        out: dict[str, Any] = {}
        for f in dataclasses.fields(value):
            if f.metadata.get("metric_only"):
                continue
            item = getattr(value, f.name)
            if item is None:
                continue
            out[_camel(f.name)] = to_wire(item)
        return out
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, Mapping):
        return {str(k): to_wire(v) for k, v in value.items()}
    if isinstance(value, (tuple, list)):
        return [to_wire(v) for v in value]
    return value


def report_spec(report: NodeReport) -> dict[str, Any]:
    """The `spec` of the NodeTopology object for this report (includes the summary)."""
    spec: dict[str, Any] = to_wire(report)
    spec["summary"] = to_wire(report.summary())
    return spec


def node_topology_object(report: NodeReport) -> dict[str, Any]:
    """The whole NodeTopology object as the agent applies it."""
    return {
        "apiVersion": f"{API_GROUP}/{API_VERSION}",
        "kind": KIND,
        "metadata": {"name": report.node_name},
        "spec": report_spec(report),
    }


@functools.cache
def _type_hints(cls: type) -> dict[str, Any]:
    """A dataclass's resolved field types, once per class (resolving them is most of a read)."""
    return get_type_hints(cls)


class WireError(ValueError):
    """A NodeTopology spec field of the wrong shape, named by its path (`spec.rdma[0].ports`), so a
    bad report is refused in one line instead of failing later, deep in the aggregator."""


_KINDS = {str: "a string", int: "an integer", float: "a number", bool: "true or false"}


def _primitive(cls: type, data: Any, path: str) -> Any:
    if cls is float and isinstance(data, int) and not isinstance(data, bool):
        return float(data)
    if cls in _KINDS and (not isinstance(data, cls) or (cls is not bool and isinstance(data, bool))):
        raise WireError(f"{path}: expected {_KINDS[cls]}, got {type(data).__name__} {short(data)}")
    return data


@functools.cache
def _wire_fields(cls: type) -> tuple[tuple[str, str, Any, bool, bool], ...]:
    """(name, wire key, type, required, optional) of each field a dataclass reads from the wire,
    once per class: dataclasses.fields, the camelCase key and typing's introspection, redone for
    every object, were half of reading a report."""
    hints = _type_hints(cls)
    return tuple(
        (
            f.name,
            _camel(f.name),
            hints[f.name],
            f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING,
            type(None) in get_args(hints[f.name]),
        )
        for f in dataclasses.fields(cls)
        if not f.metadata.get("metric_only")
    )


Reader = Callable[[Any, str], Any]  # (wire value, its path for errors) -> the value read


@functools.cache
def _reader(cls: Any) -> Reader:
    """The reader of values of the field type `cls` (dataclass, enum, primitive, tuple, mapping or
    optional), built once per type with the readers of its parts: working out how to read a type
    (typing's introspection, a cache lookup that hashes the type) on every value was most of it."""
    origin = get_origin(cls)
    if origin is None and isinstance(cls, type):
        if dataclasses.is_dataclass(cls):
            return _dataclass_reader(cls)
        return _enum_reader(cls) if issubclass(cls, enum.Enum) else _primitive_reader(cls)
    args = get_args(cls)
    if origin is tuple:
        return _tuple_reader(_reader(args[0]))
    if origin in (Mapping, dict) or str(origin).endswith("Mapping"):
        return _mapping_reader(_reader(args[0]), _reader(args[1]))
    inner = _reader(_optional_of(cls))
    return lambda data, path: None if data is None else inner(data, path)


def _optional_of(cls: Any) -> Any:
    """X of Optional[X] / X | None (the first type the union names but None)."""
    return next(a for a in get_args(cls) if a is not type(None))


def _primitive_reader(cls: type) -> Reader:
    if cls not in _KINDS:
        return functools.partial(_primitive, cls)

    def read(data: Any, path: str) -> Any:
        return data if data.__class__ is cls else _primitive(cls, data, path)  # exactly cls: nothing to check

    return read


def _enum_reader(cls: Any) -> Reader:
    members = {member.value: member for member in cls}

    def read(data: Any, path: str) -> Any:
        try:
            return members[data]  # the lookup Enum(value) makes first
        except (KeyError, TypeError):
            pass
        try:
            return cls(data)
        except (ValueError, TypeError):
            known = ", ".join(str(m.value) for m in cls)
            raise WireError(f"{path}: {short(data)} is not one of {known}") from None

    return read


def _tuple_reader(item: Reader) -> Reader:
    def read(data: Any, path: str) -> Any:
        if not isinstance(data, (list, tuple)):
            raise WireError(f"{path}: expected a list, got {type(data).__name__}")
        return tuple([item(v, f"{path}[{i}]") for i, v in enumerate(data)])

    return read


def _mapping_reader(key: Reader, value: Reader) -> Reader:
    def read(data: Any, path: str) -> Any:
        if data.__class__ is not dict and not isinstance(data, Mapping):  # a dict needs no ABC check
            raise WireError(f"{path}: expected a map, got {type(data).__name__}")
        return {key(k, f"{path} key"): value(v, f"{path}.{k}") for k, v in data.items()}

    return read


_ABSENT = object()


def _dataclass_reader(cls: Any) -> Reader:
    plan: list[tuple[str, str, Reader, bool]] = []  # (name, wire key, reader, None allowed) per wire field
    missing: dict[str, bool] = {}  # wire key -> whether its absence is an error

    def read(data: Any, path: str) -> Any:
        if data.__class__ is not dict and not isinstance(data, Mapping):  # a dict needs no ABC check
            raise WireError(f"{path}: expected an object, got {type(data).__name__}")
        if not plan:  # built on first use, so a dataclass may name itself among its field types
            _plan_fields(cls, plan, missing)
        kwargs: dict[str, Any] = {}
        for name, key, field_reader, optional in plan:
            item = data.get(key, _ABSENT)
            if item is None and optional:  # what the Optional reader would say, one call fewer
                kwargs[name] = None
            elif item is not _ABSENT:
                kwargs[name] = field_reader(item, f"{path}.{key}")
            elif key in missing:
                if missing[key]:
                    raise WireError(f"{path}.{key}: missing")
                kwargs[name] = None  # required but optional (Interface.mac): None was omitted
        return cls(**kwargs)

    return read


def _plan_fields(cls: Any, plan: list[tuple[str, str, Reader, bool]], missing: dict[str, bool]) -> None:
    for name, key, hint, required, optional in _wire_fields(cls):
        plan.append((name, key, _reader(_optional_of(hint) if optional else hint), optional))
        if required:
            missing[key] = not optional


def _from_wire(cls: Any, data: Any, path: str = "spec") -> Any:
    return _reader(cls)(data, path)


def report_from_spec(spec: Mapping[str, Any]) -> NodeReport:
    """Reads a NodeTopology `spec` back into a NodeReport (the aggregator's view).

    Unknown keys (from a newer agent) are ignored; `summary` is derived, so it is dropped."""
    report: NodeReport = _from_wire(NodeReport, dict(spec))
    return report
