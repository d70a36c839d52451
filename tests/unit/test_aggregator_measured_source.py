"""The `measured` source (aggregator.sources.measured) over plain caches: it publishes each
measuring node's probe-plan row, folds the measurements over the published tree into HyperNode
annotations (latched), grey faults on the nodes findings blame, and a check of the tree against
the measured clusters; with --measured-leaves it gives uncabled nodes leaf groups from latency and
keeps them; and the plan writer writes only rows whose digest the records do not carry."""

from __future__ import annotations

from typing import Any

from agent.common.api_error import ApiError
from agent.common.measure_rows import PLAN_DIGEST_KEY, UNPLACED, rows, to_wire
from agent.common.report import ComponentHealth, Health, Measurement, NodeReport
from agent.measure_plan import Domain, plan
from aggregator.adapters.probe_plans import ProbePlanWriter
from aggregator.graph import FabricGraph
from aggregator.sources.measured import INSIDE, SIBLING, MeasuredFabric, MeasuredMetrics
from aggregator.sources.nodetopology import PARSED_KEY

DOMAINS = [
    Domain("leaf-a", 1, ("a1", "a2", "a3", "a4")),
    Domain("leaf-b", 1, ("b1", "b2", "b3", "b4")),
    Domain("spine", 2, ("leaf-a", "leaf-b")),
]
LEAF = {n: d.name for d in DOMAINS if d.tier == 1 for n in d.children}
NODES = sorted(LEAF)
ADDRESS = {n: f"10.0.0.{i}" for i, n in enumerate(NODES, start=1)}


def hypernodes(domains: list[Domain]) -> dict[str, dict[str, Any]]:
    out = {}
    for d in domains:
        kind = "Node" if d.tier == 1 else "HyperNode"
        members = [{"type": kind, "selector": {"exactMatch": {"name": c}}} for c in d.children]
        out[d.name] = {"metadata": {"name": d.name}, "spec": {"tier": d.tier, "members": members}}
    return out


def record(node: str, measured: list[Measurement], digest: str | None = None) -> dict[str, Any]:
    report = NodeReport(node, {"host": ComponentHealth(Health.OK)}, measurements=tuple(measured),
                        probe_address=ADDRESS[node])  # fmt: skip
    out: dict[str, Any] = {"metadata": {"name": node}, PARSED_KEY: report}
    if digest:
        out[PLAN_DIGEST_KEY] = digest
    return out


def m(peer: str, us: int, loss: float = 0.0) -> Measurement:
    return Measurement(peer, us, us + us // 10, loss, 20, "2026-11-25T18:00:00Z")


def measured(domains: list[Domain], rtt: Any) -> dict[str, dict[str, Any]]:
    """Every node measures its planned peers; `rtt(a, b)` gives the p50."""
    plans = plan(domains)
    return {n: record(n, [m(p.peer, rtt(a=n, b=p.peer)) for p in plans.get(n, ())]) for n in NODES}


def healthy(a: str, b: str) -> int:
    return 10 if LEAF[a] == LEAF[b] else 100


class Caches:
    def __init__(self, hns: dict[str, Any], records: dict[str, Any]) -> None:
        self.hns, self.records = hns, records
        self.published: list[dict[str, Any]] = []

    def view(self) -> tuple[dict[str, Any], dict[str, Any]]:
        return self.hns, self.records

    def publish(self, rows_: Any, records: Any) -> int:
        self.published.append(dict(rows_))
        return len(rows_)


def source(caches: Caches, **options: Any) -> MeasuredFabric:
    s = MeasuredFabric(period=1.0, **options)
    s.attach(caches.view, caches.publish)
    return s


def graph_of(nodes: list[str]) -> FabricGraph:
    g = FabricGraph()
    for n in nodes:
        g.add_node(n)
    return g


def test_each_measuring_node_is_handed_its_row_with_peer_addresses_and_probers() -> None:
    caches = Caches(hypernodes(DOMAINS), measured(DOMAINS, healthy))
    source(caches).step()
    published = caches.published[-1]
    assert set(published) == set(NODES)
    planned = plan(DOMAINS)
    for node, row in published.items():
        assert [p for p, _ in row.peers] == [p.peer for p in planned[node]]
        assert all(address == ADDRESS[p] for p, address in row.peers)
        assert row.probers == {ADDRESS[n] for n, ps in planned.items() if any(p.peer == node for p in ps)}


def test_nodes_in_no_leaf_are_planned_in_one_pseudo_leaf_and_nodes_not_measuring_get_no_row() -> None:
    loose = rows(DOMAINS[:1], {"a1": "10.0.0.1", "x1": "10.0.0.8", "x2": "10.0.0.9"})
    assert set(loose) == {"a1", "x1", "x2"} and loose["a1"].peers == ()  # a2..a4 publish no address
    assert loose["x1"].peers == (("x2", "10.0.0.9"),) and loose["x2"].probers == {"10.0.0.8"}
    assert rows(DOMAINS[:1], {"x1": "10.0.0.8"})["x1"].peers == ()  # one loose node: no pseudo-leaf
    assert UNPLACED not in {p for r in loose.values() for p, _ in r.peers}


def test_a_row_digest_follows_its_content() -> None:
    a = rows(DOMAINS, ADDRESS)["a1"]
    b = rows(DOMAINS, {**ADDRESS, "a2": "10.9.9.9"})["a1"]
    assert a.digest == rows(DOMAINS, dict(reversed(ADDRESS.items())))["a1"].digest
    assert a.digest != b.digest and to_wire(a)["digest"] == a.digest


def test_a_healthy_fabric_annotates_hypernodes_and_marks_nobody() -> None:
    caches = Caches(hypernodes(DOMAINS), measured(DOMAINS, healthy))
    s = source(caches)
    assert s.step() is False  # nothing for the graph: no faults, no disagreements
    assert s.state.tiers == {1: 10, 2: 100} and s.state.faults == {} and s.state.disagreements == ()
    objects = [{"metadata": {"name": name, "annotations": {"x": "y"}}} for name in ("leaf-a", "spine", "other")]
    annotated = s.annotate(objects)
    assert annotated[0]["metadata"]["annotations"] == {"x": "y", INSIDE: "10", SIBLING: "100"}
    assert annotated[1]["metadata"]["annotations"] == {"x": "y", INSIDE: "100"}
    assert annotated[2] is objects[2] and objects[0]["metadata"]["annotations"] == {"x": "y"}  # copies


def test_figures_stay_put_within_the_band_and_move_beyond_it() -> None:
    caches = Caches(hypernodes(DOMAINS), measured(DOMAINS, healthy))
    s = source(caches)
    s.step()
    caches.records = measured(DOMAINS, lambda a, b: healthy(a, b) + 15)  # 25 us, 115 us: within max(20us, 25%)
    s.step()
    assert s.state.figures["leaf-a"] == {INSIDE: 10, SIBLING: 100}
    caches.records = measured(DOMAINS, lambda a, b: 4 * healthy(a, b))
    s.step()
    assert s.state.figures["leaf-a"] == {INSIDE: 40, SIBLING: 400}


def test_a_slow_node_becomes_a_grey_fault_in_the_graph_once_and_the_controller_is_told() -> None:
    def slow_a3(a: str, b: str) -> int:
        return healthy(a, b) + (90 if "a3" in (a, b) else 0)

    caches = Caches(hypernodes(DOMAINS), measured(DOMAINS, slow_a3))
    woken = []
    s = source(caches)
    s.workers(wake=lambda: woken.append(1))
    assert s.step() is True and woken == [1] and s.refresh(0) is True
    graph = graph_of(NODES)
    s.apply(graph, None)  # type: ignore[arg-type]
    assert s.refresh(0) is False and set(graph.fabric_faults) == {"a3"}
    fault = graph.fabric_faults["a3"][0]
    assert not fault.failure and fault.cause == "latency" and "like tier 2 (100 us)" in fault.text
    assert s.step() is False and woken == [1]  # the same measurements: no fold, no rebuild
    families = {f.name: f for f in MeasuredMetrics(s).collect()}
    kinds = {x.labels["kind"]: x.value for x in families["hypertopo_measured_findings"].samples}
    assert kinds["slow-in-leaf"] >= 1 and kinds["other-leaf"] == 0


def test_a_node_measuring_like_another_leaf_disagrees_with_the_tree() -> None:
    where = {**LEAF, "b4": "leaf-a"}  # b4 is cabled (and reported) under leaf-b but sits with leaf-a

    caches = Caches(hypernodes(DOMAINS), measured(DOMAINS, lambda a, b: 10 if where[a] == where[b] else 100))
    s = source(caches)
    s.step()
    assert "measured: b4 (leaf-b) measures as one leaf with 4 nodes of leaf-a" in s.state.disagreements
    assert any("leaf-b measure as 2 separate leaf groups" in line for line in s.state.disagreements)
    graph = graph_of(NODES)
    s.apply(graph, None)  # type: ignore[arg-type]
    assert set(s.state.disagreements) <= set(graph.warnings) and "b4" in graph.fabric_faults


def test_uncabled_nodes_get_leaf_groups_from_latency_that_stay_once_declared() -> None:
    flat: list[Domain] = []  # no cabling source: no HyperNodes at all
    loose = rows(flat, ADDRESS)  # the pseudo-leaf: each node probes 3 ring neighbours

    def rtt(a: str, b: str) -> int:
        return healthy(a, b)

    caches = Caches({}, {n: record(n, [m(p, rtt(n, p)) for p, _ in loose[n].peers]) for n in NODES})
    s = source(caches, leaves=True, min_gap=2.0)
    s.apply(graph_of(NODES), None)  # type: ignore[arg-type]  # a first build: every node uncabled
    s.step()
    assert s.state.guess is not None and s.state.guess.gap >= 2
    assert set(s.groups) == {frozenset(n for n in NODES if LEAF[n] == leaf) for leaf in ("leaf-a", "leaf-b")}
    graph = graph_of(NODES)
    s.apply(graph, None)  # type: ignore[arg-type]
    assert graph.declared["a1"] == {"measured-a1"} and graph.declared["b2"] == {"measured-b1"}
    assert ("measured-a1", "measured-root") in graph.uplinks
    assert any("2 leaf groups of 8 uncabled nodes" in w for w in graph.warnings)
    # the tree built from them: probes now stay inside those leaves; no sure guess, the groups stay
    caches.hns = hypernodes([Domain("m-a", 1, tuple(n for n in NODES if n < "b")),
                             Domain("m-b", 1, tuple(n for n in NODES if n > "b"))])  # fmt: skip
    caches.records = {n: record(n, [m(p, 10 + i) for i, p in enumerate(NODES) if LEAF[p] == LEAF[n] and p != n])
                      for n in NODES}  # fmt: skip
    s.step()
    assert set(s.groups) == {frozenset(n for n in NODES if LEAF[n] == leaf) for leaf in ("leaf-a", "leaf-b")}


def test_a_cabled_node_is_never_given_a_measured_leaf() -> None:
    caches = Caches({}, {n: record(n, []) for n in NODES})
    s = source(caches, leaves=True)
    s.groups = (frozenset({"a1", "a2", "a3"}),)
    graph = graph_of(NODES)
    graph.declare("a1", "switch-1")  # a model (or any source) placed a1
    s.apply(graph, None)  # type: ignore[arg-type]
    assert graph.declared["a1"] == {"switch-1"} and graph.declared["a2"] == {"measured-a1"}


class FakeKube:
    def __init__(self, fail: set[str] = frozenset()) -> None:  # type: ignore[assignment]
        self.patched: list[tuple[str, dict[str, Any]]] = []
        self.fail = fail

    def patch_status(self, resource: Any, namespace: Any, name: str, patch: dict[str, Any]) -> None:
        if name in self.fail:
            raise ApiError(404, "NotFound")
        self.patched.append((name, patch))


def test_the_writer_writes_only_rows_not_yet_published_and_only_when_leading() -> None:
    table = rows(DOMAINS, ADDRESS)
    records = {n: record(n, [], digest=table[n].digest if n != "a2" else "old") for n in NODES}
    records.pop("b4")  # its report is gone: nothing to write into
    kube = FakeKube(fail={"b1"})
    leading = [False]
    writer = ProbePlanWriter(kube, may_write=lambda: leading[0])  # type: ignore[arg-type]
    assert writer(table, records) == 0 and kube.patched == []
    leading[0] = True
    records["b1"] = record("b1", [], digest="old")
    assert writer(table, records) == 1 and writer.errors == 1
    assert kube.patched == [("a2", {"status": {"probePlan": to_wire(table["a2"])}})]
