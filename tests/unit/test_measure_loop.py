"""The agent's measuring loop (agent.fabric_measure): probes the peers of its published plan row,
answers only the nodes that plan to probe it, follows a new row, latches what it publishes, and
stamps the report; its row is read from its own NodeTopology alone (agent.adapters.fabric_cluster)."""

from __future__ import annotations

from agent.common.measure_rows import rows
from agent.common.report import ComponentHealth, Health, NodeReport
from agent.fabric_measure import FabricMeasure, MeasureMetrics
from agent.measure_plan import Domain, plan

DOMAINS = [
    Domain("leaf-a", 1, ("a1", "a2", "a3")),
    Domain("leaf-b", 1, ("b1", "b2", "b3")),
    Domain("spine", 2, ("leaf-a", "leaf-b")),
]
ADDRESSES = {n: f"10.0.0.{i}" for i, n in enumerate(["a1", "a2", "a3", "b1", "b2", "b3"], start=1)}


class FakeTransport:
    """Round trips from a table: 10 us inside a leaf, 100 us across, with a scale to move them."""

    name = "udp"

    def __init__(self) -> None:
        self.scale = 1.0
        self.asked: list[str] = []

    def round_trips(self, peer_address: str, count: int) -> list[float | None]:
        self.asked.append(peer_address)
        across = peer_address in {ADDRESSES[n] for n in ("b1", "b2", "b3")}
        return [(100e-6 if across else 10e-6) * self.scale] * count


def loop(domains=DOMAINS, addresses=ADDRESSES):
    view = {"domains": domains, "addresses": addresses}
    transport = FakeTransport()
    measure = FabricMeasure(
        "a1", "10.0.0.1", transport, lambda: rows(view["domains"], view["addresses"]).get("a1"), count=5
    )
    return measure, transport, view


def test_a_round_probes_the_planned_peers_at_their_published_addresses():
    measure, transport, _ = loop()
    published = measure.round()
    planned = {p.peer for p in plan(DOMAINS)["a1"]}
    assert {m.peer for m in published} == planned
    assert sorted(transport.asked) == sorted(ADDRESSES[p] for p in planned)
    assert {m.peer: m.p50_us for m in published}["a2"] == 10


def test_the_responder_answers_only_nodes_whose_plan_names_this_one():
    measure, _, _ = loop()
    measure.round()
    probers = {n for n, ps in plan(DOMAINS).items() if any(p.peer == "a1" for p in ps)}
    assert measure.allowed() == {ADDRESSES[n] for n in probers} and measure.allowed()


def test_peers_without_a_probe_address_are_skipped():
    measure, transport, _ = loop(addresses={"a1": "10.0.0.1"})
    assert measure.round() == () and transport.asked == []


def test_no_published_row_probes_nobody_and_answers_nobody():
    transport = FakeTransport()
    measure = FabricMeasure("a1", "10.0.0.1", transport, lambda: None, count=5)
    measure.probers = frozenset({"10.0.0.9"})  # from an earlier row
    assert measure.round() == () and transport.asked == [] and measure.allowed() == frozenset()


def test_a_new_tree_gives_a_new_row_and_new_peers():
    measure, _, view = loop()
    measure.round()
    digest = measure.digest
    measure.round()
    assert measure.digest == digest
    view["domains"] = [
        Domain("leaf-a", 1, ("a1", "a2", "a3", "b1")),
        Domain("leaf-b", 1, ("b2", "b3")),
        Domain("spine", 2, ("leaf-a", "leaf-b")),
    ]
    measure.round()
    assert measure.digest != digest and "b1" in {peer for peer, _ in measure.peers}


def test_published_figures_stay_while_within_the_band_and_metrics_show_the_live_ones():
    measure, transport, _ = loop()
    first = measure.round()
    transport.scale = 1.1  # 10 -> 11 us, 100 -> 110 us: within the band
    assert measure.round() == first
    assert {m.peer: m.p50_us for m in measure.live.values()}["a2"] == 11
    families = {f.name: f for f in MeasureMetrics(measure).collect()}
    samples = {s.labels["peer"]: s.value for s in families["hypertopo_fabric_rtt_p50_seconds"].samples}
    assert samples["a2"] == 11e-6
    transport.scale = 3.0
    assert measure.round() != first


def test_the_report_carries_the_probe_address_and_the_latched_measurements():
    measure, _, _ = loop()
    measure.round()
    report = measure.stamp(NodeReport("a1", {"host": ComponentHealth(Health.OK)}))
    assert report.probe_address == "10.0.0.1" and report.measurements == measure.measurements


class FakeKube:
    """GETs of NodeTopology objects from a table, counted; a name not in it is a 404."""

    def __init__(self, objects: dict) -> None:
        self.objects = objects
        self.gets: list[str] = []

    def get(self, resource, name):
        from agent.common.api_error import ApiError

        self.gets.append(name)
        if name not in self.objects:
            raise ApiError(404, "NotFound")
        return self.objects[name]


def test_the_row_is_one_get_of_the_nodes_own_report():
    from agent.adapters.fabric_cluster import own_row
    from agent.common.measure_rows import to_wire

    row = rows(DOMAINS, ADDRESSES)["a1"]
    kube = FakeKube({"a1": {"spec": {}, "status": {"probePlan": to_wire(row)}}, "a2": {"spec": {}}})
    assert own_row(kube, "a1") == row
    assert own_row(kube, "a2") is None and own_row(kube, "gone") is None  # not planned yet; no report yet
    assert kube.gets == ["a1", "a2", "gone"]  # its own object only: no peer's, no HyperNode list


def test_a_malformed_row_is_one_line_naming_the_field():
    import pytest

    from agent.adapters.fabric_cluster import own_row
    from agent.common.measure_rows import RowError

    bad = {"peers": [{"node": "a2", "address": ""}]}
    with pytest.raises(RowError, match=r"status.probePlan.peers\[0\].address"):
        own_row(FakeKube({"a1": {"status": {"probePlan": bad}}}), "a1")
    with pytest.raises(RowError, match="at most 64"):
        own_row(FakeKube({"a1": {"status": {"probePlan": {"peers": [{}] * 65}}}}), "a1")


def test_an_api_server_away_is_an_error_not_a_missing_row():
    import pytest

    from agent.adapters.fabric_cluster import own_row
    from agent.common.api_error import ApiError

    class Away(FakeKube):
        def get(self, resource, name):
            raise ApiError(0, "Unreachable")

    with pytest.raises(ApiError):
        own_row(Away({}), "a1")


class TrainTransport(FakeTransport):
    """FakeTransport with bandwidth trains: `rate` Mbit/s, counted."""

    def __init__(self) -> None:
        super().__init__()
        self.rate: float | None = 400.0
        self.trains: list[str] = []

    def burst(self, peer_address: str, count: int) -> float | None:
        self.trains.append(peer_address)
        return self.rate


def test_trains_go_every_nth_round_and_their_rate_is_carried_until_the_next():
    transport, view = TrainTransport(), {"domains": DOMAINS, "addresses": ADDRESSES}
    measure = FabricMeasure("a1", "10.0.0.1", transport, lambda: rows(view["domains"], view["addresses"]).get("a1"),
                            count=5, burst_every=3)  # fmt: skip
    first = measure.round()  # round 0: a train to every peer
    assert len(transport.trains) == len(first) and all(m.bandwidth_mbps == 400 for m in first)
    transport.rate = 410.0  # within the band: what was published stays, with its rate
    assert measure.round() == first and measure.round() == first and len(transport.trains) == len(first)
    transport.rate = 40.0  # the next train (round 3) finds a tenth: published again
    moved = measure.round()
    assert len(transport.trains) == 2 * len(first) and {m.bandwidth_mbps for m in moved} == {40}
    families = {f.name: f for f in MeasureMetrics(measure).collect()}
    assert {s.value for s in families["hypertopo_fabric_bandwidth_bits_per_second"].samples} == {40e6}
