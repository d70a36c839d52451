"""Test helpers: generated Clos fabrics, their perturbations, and what a render keeps through them.

A `Fabric` is switches, switch-to-switch cables and host cables (host, HCA index, leaf), with an
NVLink domain per host where it has one. The families are the shapes real clusters are cabled in
(2-, 3- and 4-tier Clos with a core group per spine plane, rail-optimised units, dual planes,
NVL72 racks on leaves, leaves and racks on the cores). Perturbations return a new `Fabric` and what
they touch (switches, hosts); `render` turns one into HyperNodes through the pipeline, from an
ibnetdiscover dump of the whole fabric (every host a CA in it) and NodeTopology reports of only the
hosts that are Nodes, carrying their NVLink clique but no LLDP (the dump is the cabling source, so
a host cable removed from it is gone). `Snapshot` reads a render back as what the properties
compare: each HyperNode's tier, tierName, identity switches and node set, and the roots.
"""

from __future__ import annotations

import dataclasses
import random
from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from aggregator_fabric import ca_guid, nodes_below, switch_guid

from agent.cluster_model import ClusterModel, parse_model
from agent.model_probe import report_for
from aggregator.pipeline import ClusterInputs, Pipeline
from aggregator.sources import ibnetdiscover

NOW = 1_700_000_000
IDENTITY = "hypertopo.io/domain-identity"
DOMAIN = "accelerator.topology.test/domain"

Cable = tuple[str, str]  # switch, switch (sorted)
HostCable = tuple[str, int, str]  # host, HCA index, leaf


@dataclass(frozen=True)
class Fabric:
    name: str
    switch_cables: frozenset[Cable]
    host_cables: tuple[HostCable, ...]
    nvlink: Mapping[str, str] = field(default_factory=dict)  # host -> NVLink domain
    spines: tuple[str, ...] = ()  # switches a stray leaf may hang from (the spines)
    cores: tuple[str, ...] = ()
    hcas: Mapping[str, int] = field(default_factory=dict)  # host -> HCAs, cabled or not

    @property
    def hosts(self) -> list[str]:
        return sorted(self.hcas)

    @property
    def switches(self) -> set[str]:
        return {s for c in self.switch_cables for s in c} | {leaf for _, _, leaf in self.host_cables}


def _cable(a: str, b: str) -> Cable:
    return (a, b) if a < b else (b, a)


class _Builder:
    def __init__(self, name: str) -> None:
        self.name = name
        self.cables: set[Cable] = set()
        self.hosts: list[HostCable] = []
        self.hca: dict[str, int] = defaultdict(int)
        self.nvlink: dict[str, str] = {}
        self.spines: list[str] = []
        self.cores: list[str] = []

    def link(self, a: str, b: str) -> None:
        self.cables.add(_cable(a, b))

    def host(self, host: str, leaf: str, nvlink: str | None = None) -> None:
        self.hosts.append((host, self.hca[host], leaf))
        self.hca[host] += 1
        if nvlink:
            self.nvlink[host] = nvlink

    def hosts_on(self, leaf: str, count: int, nvlink: str | None = None) -> None:
        for i in range(1, count + 1):
            self.host(f"{leaf}-h{i}", leaf, nvlink)

    def done(self) -> Fabric:
        return Fabric(
            self.name, frozenset(self.cables), tuple(self.hosts), dict(self.nvlink),
            tuple(self.spines), tuple(self.cores), dict(self.hca),
        )  # fmt: skip


def _pods(b: _Builder, prefix: str, pods: int, leaves: int, spines: int, hosts: int) -> list[list[str]]:
    """Pods of leaves each cabled to every spine of its pod; returns each pod's spines."""
    out = []
    for p in range(pods):
        pod_spines = [f"{prefix}p{p}-s{j}" for j in range(spines)]
        b.spines += pod_spines
        for i in range(leaves):
            leaf = f"{prefix}p{p}-l{i}"
            b.hosts_on(leaf, hosts)
            for s in pod_spines:
                b.link(leaf, s)
        out.append(pod_spines)
    return out


def _core_groups(
    b: _Builder, pod_spines: list[list[str]], per_group: int, prefix: str = ""
) -> list[list[str]]:
    """A core group per spine plane: spine j of every pod is cabled to every core of group j."""
    groups = [[f"{prefix}c{j}-{m}" for m in range(per_group)] for j in range(len(pod_spines[0]))]
    for spines in pod_spines:
        for j, spine in enumerate(spines):
            for core in groups[j]:
                b.link(spine, core)
    b.cores += [c for g in groups for c in g]
    return groups


def two_tier() -> Fabric:
    b = _Builder("2-tier")
    _pods(b, "", 1, 6, 3, 3)
    return b.done()


def three_tier() -> Fabric:
    b = _Builder("3-tier")
    _core_groups(b, _pods(b, "", 3, 3, 2, 2), 2)
    return b.done()


def four_tier() -> Fabric:
    """Two zones of two pods, each zone a 3-tier fabric; core m of every zone group goes up to the
    super-core group m."""
    b = _Builder("4-tier")
    zone_cores = []
    for z in range(2):
        groups = _core_groups(b, _pods(b, f"z{z}", 2, 2, 2, 2), 2, prefix=f"z{z}")
        zone_cores.append(groups)
    b.spines += b.cores
    for groups in zone_cores:
        for group in groups:
            for m, core in enumerate(group):
                for k in range(2):
                    b.link(core, f"x{m}-{k}")
    b.cores = [f"x{m}-{k}" for m in range(2) for k in range(2)]
    return b.done()


def rail_optimised() -> Fabric:
    """Scalable units whose hosts each have one HCA on the unit's leaf of every rail; each rail
    has two spines above its leaves."""
    b = _Builder("rail-optimised")
    rails, units = 4, 3
    for r in range(rails):
        spines = [f"rail{r}-s{j}" for j in range(2)]
        b.spines += spines
        for u in range(units):
            for s in spines:
                b.link(f"su{u}-rail{r}", s)
    for u in range(units):
        for i in range(1, 4):
            for r in range(rails):
                b.host(f"su{u}-n{i}", f"su{u}-rail{r}")
    return b.done()


def dual_plane() -> Fabric:
    """Two separate 2-tier planes; every host has an HCA on its leaf in each plane."""
    b = _Builder("dual-plane")
    for plane in "ab":
        spines = [f"{plane}-s{j}" for j in range(2)]
        b.spines += spines
        for i in range(4):
            for s in spines:
                b.link(f"{plane}-l{i}", s)
    for i in range(4):
        for n in range(1, 4):
            for plane in "ab":
                b.host(f"l{i}-n{n}", f"{plane}-l{i}")
    return b.done()


def nvl72_on_leaves() -> Fabric:
    """NVL72 racks (18 trays, one NVLink domain each), two racks per leaf, leaves on two spines."""
    b = _Builder("nvl72-on-leaves")
    b.spines += ["s0", "s1"]
    for leaf in range(3):
        for s in ("s0", "s1"):
            b.link(f"l{leaf}", s)
        for rack in range(2):
            for t in range(1, 19):
                b.host(f"r{leaf}{rack}-t{t:02}", f"l{leaf}", nvlink=f"rack{leaf}{rack}")
    return b.done()


def leaves_on_cores() -> Fabric:
    """A 3-tier fabric with a storage leaf cabled to one core of each group, and an NVL72 rack
    whose leaf is cabled to the cores of group 0 (Volcano's mixed-depth case)."""
    b = _Builder("leaves-on-cores")
    groups = _core_groups(b, _pods(b, "", 3, 4, 2, 1), 2)
    b.hosts_on("direct", 3)
    for group in groups:
        b.link("direct", group[0])
    for core in groups[0]:
        b.link("rack-leaf", core)
    for t in range(1, 19):
        b.host(f"gb-t{t:02}", "rack-leaf", nvlink="gbrack")
    return b.done()


FAMILIES = [two_tier, three_tier, four_tier, rail_optimised, dual_plane, nvl72_on_leaves, leaves_on_cores]


# --- perturbations -------------------------------------------------------------------------------
@dataclass(frozen=True)
class Perturbation:
    family: str  # the perturbation family, for the figures
    label: str
    fabric: Fabric
    touched_switches: frozenset[str] = frozenset()
    touched_hosts: frozenset[str] = frozenset()
    nodes: frozenset[str] | None = None  # the hosts that are Nodes (None: every host)


def without_switch(f: Fabric, s: str) -> Perturbation:
    cables = frozenset(c for c in f.switch_cables if s not in c)
    hosts = tuple(h for h in f.host_cables if h[2] != s)
    lost = frozenset(h for h, _, leaf in f.host_cables if leaf == s)
    return Perturbation("one switch removed", s, dataclasses.replace(f, switch_cables=cables, host_cables=hosts),
                        frozenset({s}), lost)  # fmt: skip


def without_cables(
    f: Fabric, family: str, cables: Iterable[Cable], host_cables: Iterable[HostCable]
) -> Perturbation:
    gone, gone_hosts = set(cables), set(host_cables)
    fabric = dataclasses.replace(
        f,
        switch_cables=f.switch_cables - gone,
        host_cables=tuple(h for h in f.host_cables if h not in gone_hosts),
    )
    label = ",".join(sorted("-".join(c) for c in gone) + sorted(f"{h}-{leaf}" for h, _, leaf in gone_hosts))
    return Perturbation(family, label, fabric, frozenset(s for c in gone for s in c),
                        frozenset(h for h, _, _ in gone_hosts))  # fmt: skip


def with_stray_leaf(f: Fabric, on: str, hosts: int) -> Perturbation:
    """A leaf hanging from one switch only: without hosts, or a management leaf whose hosts are
    on the fabric but are no Nodes. It touches nothing: every HyperNode must stay as it was."""
    leaf = f"stray-on-{on}"
    extra = tuple((f"mgmt{i}-{on}", 0, leaf) for i in range(hosts))
    fabric = dataclasses.replace(
        f,
        switch_cables=f.switch_cables | {_cable(leaf, on)},
        host_cables=f.host_cables + extra,
        hcas={**f.hcas, **{h: 1 for h, _, _ in extra}},
    )
    kind = "management leaf on one switch" if hosts else "hostless leaf on one switch"
    return Perturbation(kind, leaf, fabric, nodes=frozenset(f.hosts))


def with_node_subset(f: Fabric, rng: random.Random) -> Perturbation:
    hosts = f.hosts
    chosen = frozenset(rng.sample(hosts, max(1, len(hosts) * rng.randint(3, 8) // 10)))
    return Perturbation("random subset of hosts as Nodes", f"{len(chosen)} of {len(hosts)}", f, nodes=chosen)


def _and_a_cable(p: Perturbation, rng: random.Random) -> Perturbation:
    """The issue's case: a dead spine, and one leaf's uplink missing elsewhere."""
    cables = sorted(p.fabric.switch_cables)
    if not cables:
        return p
    q = without_cables(p.fabric, "", [rng.choice(cables)], [])
    return dataclasses.replace(
        q,
        family="a spine and a cable elsewhere removed",
        label=f"{p.label} and {q.label}",
        touched_switches=p.touched_switches | q.touched_switches,
        touched_hosts=p.touched_hosts,
    )


def perturbations(f: Fabric, seed: int, samples: int = 12) -> Iterator[Perturbation]:
    """Every perturbation family on `f`, sampled with a fixed seed where exhaustive is too slow."""
    rng = random.Random(f"{f.name}/{seed}")
    switches = sorted(f.switches)
    for s in rng.sample(switches, min(samples, len(switches))):
        yield without_switch(f, s)
    cables = sorted(f.switch_cables)
    for c in rng.sample(cables, min(samples, len(cables))):
        yield without_cables(f, "one cable removed", [c], [])
    for h in rng.sample(list(f.host_cables), min(samples // 3, len(f.host_cables))):
        yield without_cables(f, "one cable removed", [], [h])
    everything: list[Any] = [*cables, *f.host_cables]
    for _ in range(samples // 2):
        picked = rng.sample(everything, max(1, round(len(everything) * rng.uniform(0.01, 0.05))))
        yield without_cables(
            f,
            "1-5% of cables removed",
            [c for c in picked if len(c) == 2],
            [c for c in picked if len(c) == 3],
        )
    for s in rng.sample(list(f.spines), min(samples // 2, len(f.spines))):
        yield _and_a_cable(without_switch(f, s), rng)
    for on in sorted({*rng.sample(list(f.spines), min(3, len(f.spines))), *f.cores[:1]}):
        yield with_stray_leaf(f, on, 0)
        yield with_stray_leaf(f, on, 2)
    for _ in range(samples // 2):
        yield with_node_subset(f, rng)


# --- rendering ----------------------------------------------------------------------------------
def dump_text(f: Fabric) -> str:
    """The fabric as `ibnetdiscover` prints it (as aggregator_fabric.ibnetdiscover_dump does)."""
    ports: dict[str, list[str]] = defaultdict(list)
    desc = {s: f"MF0;{s}:MQM9700/U1" for s in f.switches}
    cas = []

    def port(switch: str) -> int:
        return len(ports[switch]) + 1

    for a, b in sorted(f.switch_cables):
        pa, pb = port(a), port(b)
        ports[a].append(f'[{pa}]\t"S-{switch_guid(b)}"[{pb}]\t\t# "{desc[b]}" lid 1 4xNDR')
        ports[b].append(f'[{pb}]\t"S-{switch_guid(a)}"[{pa}]\t\t# "{desc[a]}" lid 2 4xNDR')
    for host, hca, leaf in f.host_cables:
        guid, sp = ca_guid(host, hca), port(leaf)
        ports[leaf].append(f'[{sp}]\t"H-{guid}"[1]({guid}) \t\t# "{host} mlx5_{hca}" lid 10 4xNDR')
        cas.append(
            f'vendid=0x2c9\ndevid=0x1021\nsysimgguid=0x{guid}\ncaguid=0x{guid}\nCa\t1 "H-{guid}"\t\t# "{host} mlx5_{hca}"\n'
            f'[1]({guid}) \t"S-{switch_guid(leaf)}"[{sp}]\t\t# lid 10 lmc 0 "{desc[leaf]}" lid 2 4xNDR\n'
        )
    out = []
    for s in sorted(f.switches):
        guid = switch_guid(s)
        out += [f"vendid=0x2c9\ndevid=0xd2f2\nsysimgguid=0x{guid}\nswitchguid=0x{guid}({guid})",
                f'Switch\t129 "S-{guid}"\t\t# "{desc[s]}" enhanced port 0 lid 2 lmc 0', *ports[s], ""]  # fmt: skip
    return "\n".join(out) + "\n" + "\n".join(cas)


def _model(f: Fabric) -> ClusterModel:
    """Every host's HCAs and NVLink clique as a model, for the reports agents would publish (the
    leaves a model needs are placeholders: the reports carry no LLDP, the dump cables the hosts)."""
    blocks = [
        {
            "switch": "unused",
            "nodes": [host],
            **({"annotations": {DOMAIN: f.nvlink[host]}} if host in f.nvlink else {}),
        }
        for host, count in sorted(f.hcas.items())
        for _ in range(count)
    ]
    return parse_model({"switches": {}, "blocks": blocks})


def render(f: Fabric, nodes: Iterable[str] | None = None) -> list[dict[str, Any]]:
    """The HyperNodes for the fabric, with `nodes` (default: every host) as the cluster's Nodes."""
    model = _model(f)
    wanted = set(f.hosts if nodes is None else nodes)
    reports = {n: dataclasses.replace(report_for(model, n), lldp=()) for n in sorted(wanted)}
    ready = {n: True for n in wanted}
    inputs = ClusterInputs(reports=reports, node_ready=ready, fabric=ibnetdiscover.parse(dump_text(f)))
    return Pipeline().compute(inputs, now=NOW).hypernodes


def from_dump(path: str) -> Fabric:
    """A real dump as a `Fabric` (switches by their dump names, hosts by the names their CA
    descriptions give, else by GUID), so it can be perturbed and dumped again."""
    fabric = ibnetdiscover.parse_file(path)
    names = ibnetdiscover.switch_names(fabric)
    b = _Builder(path.rsplit("/", 1)[-1])
    for link in fabric.links.values():
        a, z = names.get(link.a), names.get(link.b)
        if a and z and a != z:
            b.link(a, z)
        elif a or z:
            ca = fabric.nodes.get(link.b if a else link.a)
            if ca is None or ca.kind != "Ca":
                continue
            host = ibnetdiscover.host_of(ca.description) or f"ca-{ca.guid}"
            b.host(host, str(a or z))
    for name in names.values():  # a switch with neither cables nor hosts stays out, as in the dump
        if any(name in c for c in b.cables):
            b.spines.append(name)
    return b.done()


# --- what a render keeps -------------------------------------------------------------------------
@dataclass(frozen=True)
class View:
    tier: int
    tier_name: str
    identity: frozenset[str]
    nodes: frozenset[str]


@dataclass(frozen=True)
class Snapshot:
    views: Mapping[str, View]
    roots: frozenset[str]

    @classmethod
    def of(cls, objects: list[dict[str, Any]]) -> Snapshot:
        below = nodes_below(objects)
        inside = {m["selector"]["exactMatch"]["name"] for o in objects for m in o["spec"]["members"]
                  if m["type"] == "HyperNode"}  # fmt: skip
        views = {
            o["metadata"]["name"]: View(
                o["spec"]["tier"],
                o["spec"]["tierName"],
                frozenset(o["metadata"]["annotations"][IDENTITY].split(",")),
                below[o["metadata"]["name"]],
            )
            for o in objects
        }
        return cls(views, frozenset(views.keys() - inside))


def components(f: Fabric) -> dict[str, str]:
    """Switch or "host:NAME" -> a representative of its connected part of the fabric (hosts
    included: two planes are joined by the hosts cabled to both)."""
    parent: dict[str, str] = {}

    def find(x: str) -> str:
        while parent.setdefault(x, x) != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for a, b in [*f.switch_cables, *((f"host:{h}", leaf) for h, _, leaf in f.host_cables)]:
        parent[find(a)] = find(b)
    return {x: find(x) for x in list(parent)}


def connected(f: Fabric, nodes: Iterable[str]) -> bool:
    """Whether every one of these Nodes is cabled and reaches every other over the fabric's cables."""
    part = components(f)
    hosts = {f"host:{h}" for h in nodes}
    if hosts - part.keys():
        return False  # a Node in the tree by its NVLink clique only
    return len({part[h] for h in hosts}) <= 1


def changes(base: Snapshot, p: Perturbation, after: Snapshot) -> list[str]:
    """What the perturbation changed that it must not: each HyperNode it does not touch (no switch
    of its identity, no host of its nodes touched) missing, or with another tier, tierName or node
    set (with a subset of hosts as Nodes: its nodes less those that are no Nodes); and more roots
    than the unperturbed tree had (one, unless its top is lateral: two leaves cabled as peers)
    while the Nodes stay connected."""
    nodes = set(p.fabric.hosts if p.nodes is None else p.nodes)
    # tiers number the kinds present: with fewer Nodes a whole kind can merge away (a spine over
    # one leaf's Nodes is that leaf), and the tiers above it count one lower
    same_tiers = {v.tier_name for v in base.views.values()} == {v.tier_name for v in after.views.values()}
    found: list[str] = []
    part = components(p.fabric)
    for name, view in sorted(base.views.items()):
        if view.identity & p.touched_switches or view.nodes & p.touched_hosts:
            continue
        # its nodes still there: Nodes, and cabled to the part of the fabric its switches are in
        # (a leaf whose every uplink is gone takes its hosts out of the spine and core above it)
        reach = {part[s] for s in view.identity if s in part} or None
        kept = {n for n in view.nodes & nodes if reach is None or part.get(f"host:{n}") in reach}
        expected = View(view.tier, view.tier_name, view.identity, frozenset(kept))
        if not expected.nodes:
            continue
        now = after.views.get(name)
        if now is not None and now.nodes & p.touched_hosts:
            continue  # it gained a host the perturbation recabled
        if now is None:
            merged = any(v.nodes == expected.nodes for v in after.views.values())
            if not (p.nodes is not None and merged):  # fewer Nodes: equal sets merge, the lower kind named
                found.append(f"{name} gone")
        elif now != (expected if same_tiers else dataclasses.replace(expected, tier=now.tier)):
            found.append(
                f"{name} {view.tier}/{view.tier_name}/{len(view.nodes)} -> {now.tier}/{now.tier_name}/{len(now.nodes)}"
            )
    if not p.touched_switches and not p.touched_hosts:  # nothing touched: no new name either
        found += [f"{name} new" for name in sorted(after.views.keys() - base.views.keys())]
    placed = set().union(*(v.nodes for v in after.views.values()))
    if len(after.roots) > max(1, len(base.roots)) and connected(p.fabric, placed):
        found.append(f"{len(after.roots)} roots: {', '.join(sorted(after.roots)[:4])}")
    return found
