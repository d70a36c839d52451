"""The publisher: writes only when the wire form changed, retries with backoff and jitter while the
API server is away, and then publishes the latest state; against a scripted API and the real one."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

import pytest
from agent_host import fixture_prober
from fake_clock import FakeClock
from hypothesis import given
from hypothesis import strategies as st
from realparts import free_port, wait_for

from agent.adapters.node_topology import FIELD_MANAGER, KubeApi
from agent.common.adapters.kube import KubeClient
from agent.common.report import node_topology_object, report_from_spec, report_spec
from agent.probes.nvml_fake import FakeNvml
from agent.publish import ApiError, Backoff, Publisher


class ScriptedApi:
    """Fails with the scripted errors first (None = succeed), then succeeds; records every call."""

    def __init__(self, *script: ApiError | None) -> None:
        self.script = list(script)
        self.calls: list[Mapping[str, Any]] = []
        self.applied: list[Mapping[str, Any]] = []

    def apply(self, obj: Mapping[str, Any]) -> Mapping[str, Any]:
        self.calls.append(obj)
        error = self.script.pop(0) if self.script else None
        if error is not None:
            raise error
        self.applied.append(obj)
        return obj

    def get(self, name: str) -> Mapping[str, Any] | None:
        return next((o for o in reversed(self.applied) if o["metadata"]["name"] == name), None)


def obj(name: str, generation: int) -> dict[str, Any]:
    return {"metadata": {"name": name}, "spec": {"value": generation}}


def test_an_unchanged_object_is_applied_once() -> None:
    api = ScriptedApi()
    publisher = Publisher(api)
    for _ in range(3):
        publisher.submit(obj("n1", 1))
        assert publisher.attempt()
    assert len(api.calls) == 1 and publisher.counts().writes == 1
    assert publisher.due_in() is None and not publisher.pending


def test_key_order_does_not_count_as_a_change() -> None:
    api = ScriptedApi()
    publisher = Publisher(api)
    publisher.submit({"spec": {"a": 1, "b": 2}, "metadata": {"name": "n"}})
    publisher.attempt()
    publisher.submit({"metadata": {"name": "n"}, "spec": {"b": 2, "a": 1}})
    publisher.attempt()
    assert len(api.calls) == 1


@pytest.mark.parametrize("status", [None, 500, 503, 409, 429])
def test_transient_errors_back_off_exponentially_then_publish_the_latest(status: int | None) -> None:
    clock = FakeClock(100.0)
    api = ScriptedApi(*[ApiError(status or 0, "away")] * 4)
    publisher = Publisher(api, backoff=Backoff(base=1.0, cap=30.0), clock=clock, rng=lambda: 1.0)
    delays = []
    for generation in range(1, 5):
        publisher.submit(obj("n1", generation))
        assert publisher.due_in() == 0.0
        assert not publisher.attempt()
        delays.append(publisher.due_in())
        clock.now += delays[-1] or 0
    assert delays == [1.0, 2.0, 4.0, 8.0]  # base * 2**(failures-1) with the jitter draw at its top
    publisher.submit(obj("n1", 9))
    assert publisher.attempt()
    assert api.applied == [obj("n1", 9)]  # generations 1-4 were never applied: only the latest
    assert publisher.counts().errors == 4 and publisher.counts().writes == 1
    assert publisher.failures == 0 and publisher.failing_since is None


def test_a_new_state_during_backoff_waits_for_the_backoff() -> None:
    clock = FakeClock(100.0)
    publisher = Publisher(ScriptedApi(ApiError(0, "down")), clock=clock, rng=lambda: 0.0)
    publisher.submit(obj("n1", 1))
    publisher.attempt()
    publisher.submit(obj("n1", 2))
    assert publisher.due_in() == pytest.approx(0.5)  # base delay, jitter at its bottom


def test_jitter_spreads_delays_between_base_and_the_exponential_ceiling() -> None:
    backoff = Backoff(base=0.5, cap=30.0)
    assert backoff.delay(1, lambda: 0.0) == 0.5 and backoff.delay(1, lambda: 1.0) == 0.5
    assert backoff.delay(4, lambda: 0.0) == 0.5 and backoff.delay(4, lambda: 1.0) == 4.0
    assert backoff.delay(4, lambda: 0.5) == pytest.approx(2.25)
    assert backoff.delay(30, lambda: 1.0) == 30.0  # capped


def test_permanent_errors_retry_slowly_at_the_cap() -> None:
    clock = FakeClock(100.0)
    publisher = Publisher(ScriptedApi(ApiError(422, "invalid")), clock=clock, rng=lambda: 0.0)
    publisher.submit(obj("n1", 1))
    assert not publisher.attempt()
    assert publisher.due_in() == 30.0
    assert "invalid" in publisher.last_error


def test_a_deleted_or_edited_object_is_noticed_by_verify_and_re_applied() -> None:
    api = ScriptedApi()
    publisher = Publisher(api)
    publisher.submit(obj("n1", 1))
    publisher.attempt()
    assert not publisher.verify() and publisher.due_in() is None  # still there, unchanged: no write
    api.applied.append(obj("n1", 666))  # someone edited the spec
    assert publisher.verify() and publisher.due_in() == 0.0
    publisher.attempt()
    api.applied.clear()  # someone deleted it
    assert publisher.verify()
    publisher.attempt()
    assert api.applied == [obj("n1", 1)] and publisher.counts().writes == 3


def test_verification_is_due_every_period_after_the_last_apply() -> None:
    clock = FakeClock(100.0)
    publisher = Publisher(ScriptedApi(), verify_every=60.0, clock=clock)
    publisher.submit(obj("n1", 1))
    publisher.attempt()
    clock.now += 59
    assert publisher._verify_in_locked() == pytest.approx(1.0)
    clock.now += 2
    assert publisher._verify_in_locked() == 0.0
    publisher.verify()
    assert publisher._verify_in_locked() == 60.0


def test_the_publisher_thread_retries_until_the_api_answers() -> None:
    api = ScriptedApi(ApiError(0, "refused"), ApiError(0, "refused"), ApiError(503, "503"))
    publisher = Publisher(api, backoff=Backoff(base=0.01, cap=0.05))
    stop = threading.Event()
    thread = threading.Thread(target=publisher.run, args=(stop,), daemon=True)
    thread.start()
    try:
        publisher.submit(obj("n1", 1))
        wait_for(lambda: len(api.applied) == 1, timeout=10)
        assert len(api.calls) == 4 and publisher.counts().errors == 3
    finally:
        stop.set()
        publisher.wake()
        thread.join(5)
    assert not thread.is_alive()


# --- against the real API server ------------------------------------------------------------------


def resource_version(api: KubeApi, name: str) -> str:
    found = api.get(name)
    assert found is not None
    return str(found["metadata"]["resourceVersion"])


@pytest.mark.apiserver
def test_object_created_once_unchanged_probe_writes_nothing_change_writes_once(apiserver, unique) -> None:  # type: ignore[no-untyped-def]
    api = KubeApi.from_config(str(apiserver.kubeconfig))
    fake = FakeNvml("hgx-h100")
    prober = fixture_prober(fake, node=f"agent-pub-{unique}")
    publisher = Publisher(api)
    name = prober.config.node_name
    assert api.get(name) is None
    try:
        publisher.submit(node_topology_object(prober.collect()))
        assert publisher.attempt() and publisher.counts().writes == 1
        created = api.get(name)
        assert created is not None
        assert [m["manager"] for m in created["metadata"]["managedFields"]] == [FIELD_MANAGER]
        rv = resource_version(api, name)

        publisher.submit(node_topology_object(prober.collect()))  # nothing changed on the node
        assert publisher.attempt()
        assert publisher.counts().writes == 1 and resource_version(api, name) == rv

        fake.set_link(2, 11, up=False)
        publisher.submit(node_topology_object(prober.collect()))
        assert publisher.attempt() and publisher.counts().writes == 2
        changed = api.get(name)
        assert changed is not None and changed["metadata"]["resourceVersion"] != rv
        assert changed["spec"]["nvml"]["gpus"][2]["nvlinks"][11]["state"] == "down"

        assert not publisher.verify()  # read back: as applied, so no write
        apiserver.kubectl("delete", "nodetopology", name)
        assert publisher.verify() and publisher.attempt()
        recreated = api.get(name)
        assert recreated is not None and recreated["spec"] == changed["spec"]
        assert publisher.counts().writes == 3
    finally:
        apiserver.kubectl("delete", "nodetopology", name, "--ignore-not-found")


@pytest.mark.apiserver
def test_the_api_server_accepts_the_object_and_returns_the_same_report(apiserver, unique) -> None:  # type: ignore[no-untyped-def]
    api = KubeApi.from_config(str(apiserver.kubeconfig))
    report = fixture_prober(node=f"agent-schema-{unique}").collect()
    try:
        api.apply(node_topology_object(report))  # the CRD's structural schema validated it
        stored = api.get(report.node_name)
        assert stored is not None
        assert stored["spec"] == report_spec(report)  # nothing pruned, nothing defaulted
        assert report_from_spec(stored["spec"]).nvml == report_from_spec(report_spec(report)).nvml
    finally:
        apiserver.kubectl("delete", "nodetopology", report.node_name, "--ignore-not-found")


class Switchable:
    """An API that can be re-pointed, as when the API server comes back at its address."""

    def __init__(self, target: KubeApi) -> None:
        self.target = target

    def apply(self, obj: Mapping[str, Any]) -> Mapping[str, Any]:
        return self.target.apply(obj)

    def get(self, name: str) -> Mapping[str, Any] | None:
        return self.target.get(name)


@pytest.mark.apiserver
def test_while_the_api_server_is_away_it_retries_then_publishes_the_latest(apiserver, unique) -> None:  # type: ignore[no-untyped-def]
    client = apiserver.api_client()
    client.configuration.host = f"https://127.0.0.1:{free_port()}"  # nothing listens there
    client.configuration.retries = False
    api = Switchable(KubeApi(KubeClient(client, timeout=(0.5, 2.0))))
    fake = FakeNvml("hgx-h100")
    prober = fixture_prober(fake, node=f"agent-away-{unique}")
    publisher = Publisher(api, backoff=Backoff(base=0.02, cap=0.1))
    stop = threading.Event()
    thread = threading.Thread(target=publisher.run, args=(stop,), daemon=True)
    thread.start()
    try:
        publisher.submit(node_topology_object(prober.collect()))
        wait_for(lambda: publisher.counts().errors >= 3, timeout=10)
        assert "unreachable" in publisher.last_error and publisher.counts().writes == 0
        fake.set_link(6, 0, up=False)  # the node changes while the API server is away
        latest = node_topology_object(prober.collect())
        publisher.submit(latest)
        api.target = KubeApi.from_config(str(apiserver.kubeconfig))
        wait_for(lambda: publisher.counts().writes == 1, timeout=10)
        stored = api.target.get(prober.config.node_name)
        assert stored is not None and stored["spec"] == latest["spec"]
        assert publisher.failing_since is None
    finally:
        stop.set()
        publisher.wake()
        thread.join(5)
        apiserver.kubectl("delete", "nodetopology", prober.config.node_name, "--ignore-not-found")


@given(st.lists(st.tuples(st.integers(0, 3), st.sampled_from([None, 409, 429, 500, 503, 0])), max_size=30))
def test_whatever_the_api_does_the_latest_state_wins_and_no_write_repeats(
    steps: list[tuple[int, int | None]],
) -> None:
    clock = FakeClock(100.0)
    api = ScriptedApi()
    publisher = Publisher(api, clock=clock)
    for generation, status in steps:
        publisher.submit(obj("n1", generation))
        if publisher.due_in() == 0.0:
            api.script = [None if status is None else ApiError(status or 0, "no")]
            publisher.attempt()
        clock.now += 60  # past any backoff
    publisher.submit(obj("n1", 7))
    assert publisher.attempt()
    assert api.applied[-1] == obj("n1", 7)
    assert all(a != b for a, b in zip(api.applied, api.applied[1:], strict=False))  # no repeated write
    assert publisher.counts().writes == len(api.applied)
