"""A restarted agent loses nothing: it reads back the NodeTopology its previous run published before
it writes, believes that report's LLDP neighbours for one more TTL (unless a fresh frame replaces
them) and remembers which RDMA ports were in use; an unchanged node costs no write on restart."""

from __future__ import annotations

import dataclasses
import shutil
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from agent_host import HGX_SYSFS, LINKS, NODE
from fake_clock import FakeClock
from realparts import wait_for
from test_lldp_neighbour_table import frame

from agent.collect import CollectConfig, Prober
from agent.common.report import Health, LldpNeighbour, NodeReport, node_topology_object
from agent.probes.lldp import NeighbourTable
from agent.probes.nvml_fake import FakeNvml
from agent.publish import ApiError, Backoff, Publisher
from agent.runner import Agent, RunConfig


def neighbour(interface: str, switch: str, ttl: int = 30) -> LldpNeighbour:
    return LldpNeighbour(interface=interface, chassis_id=switch, port_id="swp1", ttl=ttl,
                         chassis_id_subtype="local", port_id_subtype="ifname", system_name=switch)  # fmt: skip


def names(table: NeighbourTable, now: float) -> list[tuple[str, str | None]]:
    return [(n.interface, n.system_name) for n in table.snapshot(now).value or ()]


# --- the neighbour table ----------------------------------------------------------------------------


def test_a_carried_neighbour_lives_one_ttl_from_the_restart_unless_a_frame_replaces_it() -> None:
    table = NeighbourTable()
    assert table.carry([neighbour("ib0", "leaf1", ttl=30), neighbour("ib1", "leaf2", ttl=30)], now=100.0) == 2
    assert names(table, 129.9) == [("ib0", "leaf1"), ("ib1", "leaf2")]
    assert table.carried == 2
    # ib0 was recabled while the agent was down: the first frame on it replaces the carried one
    table.observe("ib0", frame(chassis="leaf9", name="leaf9", ttl=120), now=110.0)
    assert names(table, 111.0) == [("ib0", "leaf9"), ("ib1", "leaf2")]
    assert table.carried == 1
    # ib1 heard nothing in a whole TTL since the restart: its carried neighbour expires
    assert names(table, 130.0) == [("ib0", "leaf9")]
    assert table.carried == 0


def test_a_frame_from_the_carried_neighbour_itself_refreshes_it() -> None:
    table = NeighbourTable()
    table.observe("ib0", frame(chassis="leaf1", name="leaf1", ttl=30), now=0.0)
    carried = table.snapshot(0.0).value or ()
    fresh = NeighbourTable()
    fresh.carry(carried, now=100.0)
    fresh.observe("ib0", frame(chassis="leaf1", name="leaf1", ttl=30), now=125.0)
    assert fresh.carried == 0
    assert names(fresh, 150.0) == [("ib0", "leaf1")]  # alive until 155, the frame's TTL


def test_a_neighbour_heard_before_the_carry_wins_and_a_zero_ttl_is_not_carried() -> None:
    table = NeighbourTable()
    table.observe("ib0", frame(chassis="leaf1", name="leaf1", ttl=120), now=100.0)
    taken = table.carry([LldpNeighbour("ib0", "leaf1", "swp1", 30), neighbour("ib2", "leaf3", ttl=0)], now=101.0)
    assert taken == 0 and table.carried == 0
    assert [(n.interface, n.ttl) for n in table.snapshot(102.0).value or ()] == [("ib0", 120)]


def test_carried_neighbours_of_interfaces_no_longer_reported_are_dropped() -> None:
    table = NeighbourTable()
    table.carry([neighbour("ib0", "leaf1"), neighbour("eth9", "mgmt-sw")], now=0.0)
    assert table.drop_carried({"ib0", "ib1"})
    assert names(table, 1.0) == [("ib0", "leaf1")]
    assert not table.drop_carried({"ib0"})


# --- the publisher ------------------------------------------------------------------------------------


class StoredApi:
    """One stored object (or none); get can be scripted to fail first; records applies."""

    def __init__(self, stored: Mapping[str, Any] | None, *get_errors: ApiError) -> None:
        self.stored = stored
        self.get_errors = list(get_errors)
        self.gets = 0
        self.applied: list[Mapping[str, Any]] = []

    def apply(self, obj: Mapping[str, Any]) -> Mapping[str, Any]:
        self.applied.append(obj)
        self.stored = obj
        return obj

    def get(self, name: str) -> Mapping[str, Any] | None:
        self.gets += 1
        if self.get_errors:
            raise self.get_errors.pop(0)
        return self.stored


def stored_form(obj: Mapping[str, Any]) -> dict[str, Any]:
    """As the API server returns it: with server metadata the agent never sends."""
    meta = {**obj["metadata"], "resourceVersion": "42", "uid": "u-1", "managedFields": [{"manager": "x"}]}
    return {**obj, "metadata": meta}


def test_nothing_is_applied_before_the_previous_object_was_read_back() -> None:
    clock = FakeClock()
    api = StoredApi(None, ApiError(503, "starting"))
    publisher = Publisher(api, clock=clock, rng=lambda: 0.0)
    seen: list[Mapping[str, Any] | None] = []
    publisher.expect_read_back("n1", seen.append)
    publisher.submit({"metadata": {"name": "n1"}, "spec": {"v": 1}})
    assert not publisher.attempt() and api.applied == []
    assert not publisher.read_back()  # 503: retried after the backoff
    assert publisher.due_in() == 0.5 and seen == []
    clock.now += 1
    assert publisher.read_back() and seen == [None]
    assert publisher.attempt() and len(api.applied) == 1


def test_an_unchanged_node_restarts_without_a_write() -> None:
    obj = {"apiVersion": "hypertopo.io/v1alpha1", "kind": "NodeTopology", "metadata": {"name": "n1"},
           "spec": {"v": 1}}  # fmt: skip
    api = StoredApi(stored_form(obj))
    publisher = Publisher(api)
    publisher.expect_read_back("n1", lambda stored: None)
    assert publisher.read_back()
    publisher.submit(obj)
    assert publisher.attempt() and api.applied == [] and publisher.counts().writes == 0
    publisher.submit({**obj, "spec": {"v": 2}})
    assert publisher.attempt() and len(api.applied) == 1


def test_a_refused_read_back_gives_up_and_publishes_anyway() -> None:
    api = StoredApi(None, ApiError(403, "Forbidden", "cannot get nodetopologies"))
    publisher = Publisher(api)
    publisher.expect_read_back("n1", lambda stored: None)
    assert publisher.read_back()
    publisher.submit({"metadata": {"name": "n1"}, "spec": {"v": 1}})
    assert publisher.attempt() and len(api.applied) == 1


# --- the agent ------------------------------------------------------------------------------------------


def fresh_prober(sysfs: Path = HGX_SYSFS) -> Prober:
    """The fixture host just after a restart: no LLDP frame heard yet."""
    config = CollectConfig(node_name=NODE, sysfs=sysfs, nvml="fake:hgx-h100")
    return Prober(config, links=lambda: LINKS, nvml_backend=FakeNvml("hgx-h100"), clock=lambda: 1000.0)


@contextmanager
def running(agent: Agent) -> Iterator[Agent]:
    thread = threading.Thread(target=agent.run, daemon=True)
    thread.start()
    try:
        wait_for(lambda: agent.cycles >= 1, what="the first probe")
        yield agent
    finally:
        agent.stop()
        thread.join(10)
        assert not thread.is_alive(), "agent did not stop"


def previous_report(**changes: Any) -> NodeReport:
    """What the previous run published: the fixture host with a neighbour on eno1 and ib3."""
    report = fresh_prober().collect()
    lldp = (neighbour("eno1", "mgmt-sw", ttl=120), neighbour("ib3", "leaf-a1", ttl=120))
    return dataclasses.replace(report, lldp=lldp, **changes)


def test_a_restarted_agent_publishes_its_previous_neighbours_first() -> None:
    before = previous_report()
    api = StoredApi(stored_form(node_topology_object(before)))
    agent = Agent(fresh_prober(), Publisher(api, backoff=Backoff(0.01, 0.05)),
                  RunConfig(interval=60.0, listen=("127.0.0.1", 0), watch=False))  # fmt: skip
    with running(agent):
        wait_for(lambda: agent.carried == 2, what="the carry-over")
        wait_for(lambda: agent.prober.latest and agent.prober.latest.report.lldp == before.lldp,
                 what="a report with the carried neighbours")  # fmt: skip
        wait_for(lambda: not agent.publisher.pending, what="the publisher idle")
        assert api.gets >= 1
        assert api.applied == []  # what it would publish is what is stored: no write at all


def test_a_restarted_agent_without_a_previous_object_publishes_what_it_sees() -> None:
    api = StoredApi(None)
    agent = Agent(fresh_prober(), Publisher(api, backoff=Backoff(0.01, 0.05)),
                  RunConfig(interval=60.0, listen=("127.0.0.1", 0), watch=False))  # fmt: skip
    with running(agent):
        wait_for(lambda: len(api.applied) == 1, what="the first publish")
        assert api.applied[0]["spec"].get("lldp", []) == [] and agent.carried == 0


def test_a_port_in_use_before_the_restart_and_down_after_it_is_failed_not_unused(tmp_path: Path) -> None:
    sysfs = tmp_path / "sys"
    shutil.copytree(HGX_SYSFS, sysfs, symlinks=True)
    port = sysfs / "class" / "infiniband" / "mlx5_3" / "ports" / "1"
    (port / "state").write_text("1: DOWN\n")
    (port / "phys_state").write_text("2: Polling\n")

    def health_of_port(prober: Prober) -> Health | None:
        report = prober.collect()
        return next(p.health for d in report.rdma if d.name == "mlx5_3" for p in d.ports)

    assert health_of_port(fresh_prober(sysfs)) is Health.UNUSED  # never seen up: quiet
    restarted = fresh_prober(sysfs)
    restarted.restore(previous_report())  # the previous run saw it ACTIVE
    assert health_of_port(restarted) is Health.FAILED
    assert restarted.collect().health["rdma"].state is Health.DEGRADED
