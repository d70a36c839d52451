"""Leader election on a real Lease: one holder at a time, expiry judged on the candidate's own clock,
release hands over at once, and a leader that cannot renew stops writing at its renew deadline.

Time is faked (each elector has its own clock) while the Lease lives on the real API server."""

from __future__ import annotations

from typing import Any

import pytest
from fake_clock import FakeClock

from aggregator.adapters.kube import LEASES, KubeClient, LeaseClient, connect
from aggregator.live.leader import ElectionConfig, LeaderElector
from aggregator.live.reconcile import ApiError

pytestmark = pytest.mark.apiserver
NAMESPACE = "hypertopo-leader-test"


@pytest.fixture(scope="module")
def kube(apiserver: Any) -> KubeClient:
    apiserver.kubectl("create", "namespace", NAMESPACE, check=False)
    return connect(str(apiserver.kubeconfig))


def elector(kube: KubeClient, lease: str, identity: str, clock: FakeClock) -> LeaderElector:
    config = ElectionConfig(identity=identity, namespace=NAMESPACE, name=lease,
                            lease_duration=15, renew_deadline=10, retry_period=2)
    return LeaderElector(LeaseClient(kube, namespace=NAMESPACE, name=lease), config, clock=clock)


def holder(kube: KubeClient, lease: str) -> str:
    return str(kube.get(LEASES, lease, namespace=NAMESPACE)["spec"].get("holderIdentity") or "")


def test_one_candidate_acquires_and_the_other_waits_a_full_lease_on_its_own_clock(
    kube: KubeClient, unique: str
) -> None:
    lease = f"lease-{unique}"
    clock_a, clock_b = FakeClock(), FakeClock()
    a, b = elector(kube, lease, "a", clock_a), elector(kube, lease, "b", clock_b)
    assert a.step() and not b.step()
    assert holder(kube, lease) == "a"
    clock_b.now += 14  # a stopped renewing 14 s ago (b's clock): not expired yet
    assert not b.step()
    clock_b.now += 2
    assert b.step() and holder(kube, lease) == "b"
    lease_obj = kube.get(LEASES, lease, namespace=NAMESPACE)
    assert lease_obj["spec"]["leaseTransitions"] == 1 and lease_obj["spec"]["leaseDurationSeconds"] == 15
    clock_a.now += 9  # a still believes it leads until its renew deadline (10 s) ...
    assert a.is_leader()
    clock_a.now += 2  # ... and not a moment later, long before b could have taken the lease
    assert not a.is_leader()
    assert not a.step() and holder(kube, lease) == "b"  # renewing fails: b holds a live lease


def test_a_renewing_leader_keeps_the_lease(kube: KubeClient, unique: str) -> None:
    lease = f"lease-{unique}"
    clock_a, clock_b = FakeClock(), FakeClock()
    a, b = elector(kube, lease, "a", clock_a), elector(kube, lease, "b", clock_b)
    a.step()
    b.step()
    for _ in range(10):  # 20 s of renewals every 2 s: b sees the record change each time
        clock_a.now += 2
        clock_b.now += 2
        assert a.step() and not b.step()
    assert holder(kube, lease) == "a"


def test_release_hands_the_lease_over_at_once(kube: KubeClient, unique: str) -> None:
    lease = f"lease-{unique}"
    a, b = elector(kube, lease, "a", FakeClock()), elector(kube, lease, "b", FakeClock())
    a.step()
    assert not b.step()
    assert a.release() and not a.is_leader()
    assert holder(kube, lease) == ""
    assert b.step() and holder(kube, lease) == "b"


class RacingStore(LeaseClient):
    """Someone else updates the Lease between our read and our write: the write must get 409."""

    def __init__(self, kube: KubeClient, lease: str, rival: LeaderElector):
        super().__init__(kube, namespace=NAMESPACE, name=lease)
        self.rival = rival

    def replace(self, lease: dict[str, Any]) -> dict[str, Any]:
        self.rival.step()
        return super().replace(lease)


def test_two_candidates_racing_for_an_expired_lease_produce_one_leader(kube: KubeClient, unique: str) -> None:
    lease = f"lease-{unique}"
    old = elector(kube, lease, "old", FakeClock())
    old.step()
    clock_a, clock_b = FakeClock(), FakeClock()
    b = elector(kube, lease, "b", clock_b)
    config = ElectionConfig(identity="a", namespace=NAMESPACE, name=lease)
    a = LeaderElector(RacingStore(kube, lease, b), config, clock=clock_a)
    a.step()
    b.step()
    clock_a.now += 16
    clock_b.now += 16
    assert not a.step()  # b won inside a's read-modify-write; a's write was refused with 409
    assert b.is_leader() and holder(kube, lease) == "b"


def test_an_unreachable_api_server_is_a_failed_round_not_a_crash(unique: str) -> None:
    class Down:
        def get(self) -> dict[str, Any]:
            raise ApiError(0, "MaxRetryError", "connection refused")

        create = replace = lambda self, lease: self.get()

    config = ElectionConfig(identity="a", name=f"lease-{unique}")
    assert not LeaderElector(Down(), config, clock=FakeClock()).step()


def test_election_timings_must_nest() -> None:
    with pytest.raises(ValueError):
        ElectionConfig(identity="a", lease_duration=10, renew_deadline=10, retry_period=2)


def test_a_candidate_still_loading_does_not_bid_but_a_leader_renews_and_a_loaded_one_takes_over(
    kube: KubeClient, unique: str
) -> None:
    lease = f"lease-{unique}"
    clock_a, clock_b = FakeClock(), FakeClock()
    a, b = elector(kube, lease, "a", clock_a), elector(kube, lease, "b", clock_b)
    loading = {"a": True, "b": True}
    assert not a.bid(lambda: not loading["a"])
    with pytest.raises(ApiError):  # no bid, so no Lease was even created
        kube.get(LEASES, lease, namespace=NAMESPACE)
    loading["b"] = False
    assert b.bid(lambda: not loading["b"]) and holder(kube, lease) == "b"
    loading["b"] = True  # a leader whose caches go back to syncing (a re-list) keeps renewing
    clock_b.now += 2
    assert b.bid(lambda: not loading["b"])
    clock_a.now += 16  # a is still loading: it stays out, whatever the lease
    assert not a.bid(lambda: not loading["a"]) and holder(kube, lease) == "b"
    loading["a"] = False  # loaded: it bids, sees b's live lease, and takes it once b stops renewing
    assert not a.bid(lambda: not loading["a"])
    clock_a.now += 16
    assert a.bid(lambda: not loading["a"]) and holder(kube, lease) == "a"
