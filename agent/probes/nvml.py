"""NVML probe: GPUs, their NVLinks, multi-node fabric clique and health, as a `NvmlReport`.

Why: a HyperNode for an NVLink domain is only true if every GPU of the node is in the same
completed fabric clique, and only healthy if its links are up and its GPUs have not fallen off the
bus. NVML knows all of this; this module turns NVML's answers (through `NvmlBackend`, so it runs
against the real library or a fake) into stable facts and health states.

Rules:
- No backend (no libnvidia-ml) or no GPUs: absent, quietly, unless NVIDIA GPUs are on the PCI bus
  (sysfs, `agent.probes.nvidia_pci`): then failed with the reason, never a GPU node that looks GPU-less.
- `NOT_SUPPORTED` means the feature is absent (no fabric info on HGX H100, no NVLinks on a PCIe
  A40): the field is left out, health is untouched.
- Any other NVML error on one call degrades that GPU with a reason naming the call and the error;
  everything else is still reported. `GPU_IS_LOST` fails the GPU.
- Critical XIDs seen recently (`xids`, from `XidWatcher.recent`) and uncorrected ECC errors degrade
  or fail the GPU, per the XID catalogue in NVIDIA's "XID Errors" document.
- A link down on a node whose NVLinks are otherwise up degrades the GPU.
- The node-level `NvLinkDomain` exists when all GPUs share one completed clique of a real cluster
  (non-zero cluster UUID); mixed cliques degrade the report.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TypeVar

from agent.common.report import (
    ComponentHealth,
    Gpu,
    GpuFabric,
    Health,
    NvLink,
    NvLinkDomain,
    NvmlReport,
    ProbeResult,
    RdmaDevice,
)
from agent.probes.nvidia_pci import unseen_by_nvml, without_nvml
from agent.probes.nvml_backend import (
    ERROR_COUNTERS,
    GPU_IS_LOST,
    NO_SUCH_LINK,
    NOT_SUPPORTED,
    DeviceHandle,
    NvmlBackend,
    NvmlError,
    RemoteType,
    XidEvent,
)
from agent.probes.nvml_xid import XID_DEGRADED, XID_FAILED, XidWatcher
from agent.probes.pci_affinity import closest_nics, sysfs_bdf

__all__ = ["LinkCache", "NvmlBackend", "NvmlError", "RemoteType", "XidEvent", "XidWatcher", "probe"]

R = TypeVar("R")
ZERO_UUID = "00000000-0000-0000-0000-000000000000"
LINK_FACTS_REFRESH_S = 300.0
_LinkFacts = tuple[int | None, RemoteType | None, str | None]  # version, remote type, remote bus id


class LinkCache:
    """What NVML says about a GPU's NVLinks that does not change while the hardware stays as it is,
    kept between cycles so a cycle asks only what can change (link state, error counters).

    Why: on an 8-GPU board with 18 links each, a cycle is over a thousand NVML calls; the link
    indices that do not exist and each up link's version and far end are about 40 % of them.
    Kept per GPU UUID (a swapped GPU is asked afresh); an up link's facts are dropped as soon as
    the link is seen not up (it may come back trained differently or cabled elsewhere), facts whose
    calls failed are never kept (the failure is reported again next cycle), and everything is asked
    again every `refresh_s` of the agent's clock, so a change no cycle saw is still picked up."""

    def __init__(self, refresh_s: float = LINK_FACTS_REFRESH_S) -> None:
        self.refresh_s = refresh_s
        self._since: float | None = None
        self.no_such_link: dict[str, set[int]] = {}  # GPU UUID -> link indices NVML said do not exist
        self.facts: dict[tuple[str, int], _LinkFacts] = {}  # (GPU UUID, link) -> facts of an up link

    def begin(self, now: float) -> None:
        """Start of a cycle: forget everything once `refresh_s` has passed since the last refresh."""
        if self._since is None or now - self._since >= self.refresh_s or now < self._since:
            self.no_such_link.clear()
            self.facts.clear()
            self._since = now


@dataclass
class _Issues:
    """Health findings for one GPU, worst state wins; reasons kept in discovery order."""

    failed: list[str] = field(default_factory=list)
    degraded: list[str] = field(default_factory=list)

    lost: bool = False

    def error(self, exc: NvmlError) -> None:
        self.lost = self.lost or exc.name == GPU_IS_LOST
        (self.failed if exc.name == GPU_IS_LOST else self.degraded).append(f"{exc.call}: {exc.name}")

    def health(self, label: str) -> ComponentHealth:
        if self.failed:
            return ComponentHealth(Health.FAILED, f"{label}: {_collapse(self.failed + self.degraded)}")
        if self.degraded:
            return ComponentHealth(Health.DEGRADED, f"{label}: {_collapse(self.degraded)}")
        return ComponentHealth(Health.OK)


def _collapse(reasons: list[str]) -> str:
    """One entry per distinct reason, in order, with a count when a call failed on many links."""
    counts = collections.Counter(reasons)
    return "; ".join(r if counts[r] == 1 else f"{r} ({counts[r]} times)" for r in dict.fromkeys(reasons))


def _call(issues: _Issues, fn: Callable[..., R], *args: object) -> R | None:
    """Runs one backend call; NOT_SUPPORTED -> None quietly, other errors -> None and an issue."""
    try:
        return fn(*args)
    except NvmlError as exc:
        if exc.name != NOT_SUPPORTED:
            issues.error(exc)
        return None


def _links(
    backend: NvmlBackend, handle: DeviceHandle, issues: _Issues, uuid: str, cache: LinkCache | None
) -> tuple[NvLink, ...]:
    links: list[NvLink] = []
    absent = cache.no_such_link.setdefault(uuid, set()) if cache is not None and uuid else None
    for link in range(backend.max_links):
        if issues.lost:  # every further call would fail the same way (and slowly)
            break
        if absent is not None and link in absent:
            continue
        try:
            up = backend.link_state(handle, link)
        except NvmlError as exc:
            if exc.name not in NO_SUCH_LINK:
                issues.error(exc)
            elif absent is not None:
                absent.add(link)
            continue
        key = (uuid, link)
        facts = cache.facts.get(key) if cache is not None and uuid and up else None
        if facts is None:
            facts = _facts(backend, handle, link, up, issues, cache if uuid else None, key)
        links.append(_link(backend, handle, link, up, facts, issues))
    return tuple(links)


def _facts(
    backend: NvmlBackend,
    handle: DeviceHandle,
    link: int,
    up: bool,
    issues: _Issues,
    cache: LinkCache | None,
    key: tuple[str, int],
) -> _LinkFacts:
    """Version and far end of a link, asked now; kept in `cache` when up and every call answered."""
    before = len(issues.failed) + len(issues.degraded)
    version = _call(issues, backend.link_version, handle, link)
    remote: RemoteType | None = None
    remote_bus: str | None = None
    if up:  # the remote end is only meaningful on an active link
        remote = _call(issues, backend.link_remote_type, handle, link)
        remote_bus = _call(issues, backend.link_remote_pci_bus_id, handle, link)
    if cache is not None:
        if up and len(issues.failed) + len(issues.degraded) == before:
            cache.facts[key] = (version, remote, remote_bus)
        else:
            cache.facts.pop(key, None)
    return version, remote, remote_bus


def _link(
    backend: NvmlBackend, handle: DeviceHandle, link: int, up: bool, facts: _LinkFacts, issues: _Issues
) -> NvLink:
    version, remote, remote_bus = facts
    counters: dict[str, int] = {}
    for counter in ERROR_COUNTERS if up else ():
        value = _call(issues, backend.link_error_counter, handle, link, counter)
        if value is not None:
            counters[counter] = value
    return NvLink(
        link=link,
        state="up" if up else "down",
        version=version,
        remote_type=remote,
        remote_pci_bus_id=remote_bus,
        error_counters=counters,
    )


def _fabric(backend: NvmlBackend, handle: DeviceHandle, issues: _Issues) -> GpuFabric | None:
    fabric = _call(issues, backend.fabric_info, handle)
    if not isinstance(fabric, GpuFabric) or fabric.state == "not-supported":
        return None
    if fabric.state != "completed":
        issues.degraded.append(f"NVLink fabric registration {fabric.state}")
    elif fabric.status != "success":
        issues.degraded.append(f"NVLink fabric registration failed: {fabric.status}")
    return fabric


def _numa(
    backend: NvmlBackend, handle: DeviceHandle, bus_id: str, sysfs: Path, issues: _Issues
) -> int | None:
    """NVML's NUMA node, else the PCI device's `numa_node` in sysfs (-1 there means none)."""
    numa = _call(issues, backend.numa_node, handle)
    if isinstance(numa, int):
        return numa
    bdf = sysfs_bdf(bus_id)
    try:
        value = int((sysfs / "bus" / "pci" / "devices" / str(bdf) / "numa_node").read_text().strip())
    except (OSError, ValueError):
        return None
    return value if value >= 0 else None


def _xid_health(xids: Mapping[int, int], issues: _Issues) -> None:
    for xid in sorted(xids):
        if xid in XID_FAILED:
            issues.failed.append(f"XID {xid} ({XID_FAILED[xid]})")
        elif xid in XID_DEGRADED:
            issues.degraded.append(f"XID {xid} ({XID_DEGRADED[xid]})")


def _gpu(
    backend: NvmlBackend, index: int, sysfs: Path, xids: Mapping[int, int], cache: LinkCache | None
) -> Gpu:
    issues = _Issues()
    _xid_health(xids, issues)
    try:
        handle = backend.handle(index)
    except NvmlError as exc:
        issues.error(exc)
        issues.failed.append("GPU not reachable")
        return Gpu(index=index, uuid="", name="", pci_bus_id="", health=issues.health(f"GPU {index}"))
    uuid = _call(issues, backend.uuid, handle) or ""
    name = _call(issues, backend.name, handle) or ""
    bus = _call(issues, backend.pci_bus_id, handle) or ""
    links = _links(backend, handle, issues, uuid, cache)
    lost = issues.lost  # a lost GPU answers nothing more: do not ask
    ecc = None if lost else _call(issues, backend.uncorrected_ecc, handle)
    if ecc:
        issues.degraded.append(f"{ecc} uncorrected ECC errors")
    numa = None if lost or not bus else _numa(backend, handle, bus, sysfs, issues)
    fabric = None if lost else _fabric(backend, handle, issues)
    label = f"GPU {index} ({bus})" if bus else f"GPU {index}"
    return Gpu(
        index=index,
        uuid=uuid,
        name=name,
        pci_bus_id=bus,
        numa_node=numa,
        nvlinks=links,
        fabric=fabric,
        health=issues.health(label),
        uncorrected_ecc=ecc,
        xid_events=dict(xids),
    )


def _with_link_expectation(gpus: list[Gpu]) -> list[Gpu]:
    """If any NVLink on the node is up, every link that exists should be up: down ones degrade."""
    if not any(link.state == "up" for gpu in gpus for link in gpu.nvlinks):
        return gpus
    out = []
    for gpu in gpus:
        down = [str(link.link) for link in gpu.nvlinks if link.state != "up"]
        if not down:
            out.append(gpu)
            continue
        label = f"GPU {gpu.index} ({gpu.pci_bus_id})"
        reason = f"NVLink {', '.join(down)} down ({len(gpu.nvlinks) - len(down)}/{len(gpu.nvlinks)} up)"
        out.append(replace(gpu, health=_worse(gpu.health, Health.DEGRADED, label, reason)))
    return out


def _worse(health: ComponentHealth, state: Health, label: str, reason: str) -> ComponentHealth:
    if health.state == Health.OK:
        return ComponentHealth(state, f"{label}: {reason}")
    return ComponentHealth(health.state, f"{health.reason}; {reason}")


def _domain(gpus: Sequence[Gpu]) -> tuple[NvLinkDomain | None, str]:
    """The node's NVLink domain and, when the GPUs disagree, the reason."""
    fabrics = [g.fabric for g in gpus]
    if not gpus or any(f is None or f.state != "completed" or f.status != "success" for f in fabrics):
        return None, ""
    cliques = sorted({(f.cluster_uuid, f.clique_id) for f in fabrics if f is not None})
    if len(cliques) > 1:
        seen = ", ".join(f"{u}/{c}" for u, c in cliques)
        return None, f"GPUs are in different NVLink cliques: {seen}"
    cluster_uuid, clique_id = cliques[0]
    if cluster_uuid == ZERO_UUID or clique_id == 0:  # single-node NVSwitch board, or a registration
        return None, ""  # the fabric manager completed without placing the GPU in a clique: no domain
    return NvLinkDomain(cluster_uuid=cluster_uuid, clique_id=clique_id, state="completed"), ""


def _overall(gpus: Sequence[Gpu], domain_problem: str) -> ComponentHealth:
    reasons = [g.health.reason for g in gpus if g.health.state != Health.OK]
    if domain_problem:
        reasons.append(domain_problem)
    if any(g.health.state == Health.FAILED for g in gpus):
        return ComponentHealth(Health.FAILED, "; ".join(reasons))
    if reasons:
        return ComponentHealth(Health.DEGRADED, "; ".join(reasons))
    return ComponentHealth(Health.OK)


def probe(
    backend: NvmlBackend | None,
    *,
    sysfs: Path,
    rdma: Sequence[RdmaDevice] = (),
    xids: Mapping[int, Mapping[int, int]] | None = None,
    cache: LinkCache | None = None,
    now: float = 0.0,
    load_error: str = "",
) -> ProbeResult[NvmlReport]:
    """GPUs, NVLinks, fabric and health from NVML; `xids` = recent XID counts per GPU index.

    `cache` (the agent keeps one, see `LinkCache`) spares the calls whose answers cannot have
    changed since an earlier cycle; `now` is the agent's clock for its refresh. `load_error` is why
    there is no backend (named in the failure when the PCI bus has NVIDIA GPUs)."""
    if backend is None:
        return without_nvml(sysfs, load_error)
    if cache is not None:
        cache.begin(now)
    try:
        return _probe(backend, sysfs, rdma, xids or {}, cache)
    except Exception as exc:  # a binding bug must not take the agent down: say so instead
        return ProbeResult.failed(f"NVML probe error: {exc!r}")


def _probe(
    backend: NvmlBackend,
    sysfs: Path,
    rdma: Sequence[RdmaDevice],
    recent: Mapping[int, Mapping[int, int]],
    cache: LinkCache | None,
) -> ProbeResult[NvmlReport]:
    try:
        count = backend.device_count()
        driver = backend.driver_version()
    except NvmlError as exc:
        return ProbeResult.failed(str(exc))
    if count == 0:
        return unseen_by_nvml(sysfs) or ProbeResult.absent("no NVIDIA GPUs")
    gpus = _with_link_expectation([_gpu(backend, i, sysfs, recent.get(i, {}), cache) for i in range(count)])
    affinity = closest_nics(sysfs, [g.pci_bus_id for g in gpus if g.pci_bus_id], rdma)
    gpus = [replace(g, nics=affinity.get(g.pci_bus_id, ())) for g in gpus]
    domain, problem = _domain(gpus)
    report = NvmlReport(driver_version=driver, gpus=tuple(gpus), domain=domain)
    return ProbeResult(report, _overall(gpus, problem))
