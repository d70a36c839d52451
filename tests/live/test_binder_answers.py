"""What the gang binder does with each kind of API answer to a pods/binding call: "not now"
(429, 5xx, no answer) is tried again with back-off, "no" (404 deleted pod, 409 bound elsewhere or
recreated) fails the gang at once with the server's reason and rolls back what was bound, and a
409 saying the pod already sits on *our* node counts as bound (an earlier try's answer was lost)."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Sequence

import pytest

from agent.common.api_error import ApiError
from aggregator.placement.live.binder import Backoff, Binder, BindItem, BindOutcome, already_ours

GANG = ("ns", "g")
THROTTLED = ApiError(429, "TooManyRequests", "too many requests, please try again later")
UNAVAILABLE = ApiError(503, "ServiceUnavailable", "etcd leader changed")
INTERNAL = ApiError(500, "InternalError", "Internal error occurred: etcdserver: request timed out")
UNREACHABLE = ApiError(0, "Unreachable", "API server unreachable: ConnectionRefusedError")
DELETED = ApiError(404, "NotFound", 'pods "p-1" not found')


def assigned(pod: str, node: str) -> ApiError:
    """The API server's refusal of a second binding (pkg/registry/core/pod/storage)."""
    return ApiError(409, "Conflict", f'Operation cannot be fulfilled on pods/binding "{pod}": '
                                     f'pod {pod} is already assigned to node "{node}"')


class ScriptedApi:
    """pods/binding answers from a script per pod (an exception, or None for success; the last
    entry repeats); records every call."""

    def __init__(self, script: dict[str, Sequence[ApiError | None]]) -> None:
        self.script = script
        self.binds: list[str] = []
        self.deleted: list[tuple[str, str]] = []
        self.lock = threading.Lock()

    def bind(self, namespace: str, name: str, uid: str, node: str) -> None:
        with self.lock:
            answers = self.script.get(name, [None])
            answer = answers[min(self.binds.count(name), len(answers) - 1)]
            self.binds.append(name)
        if answer is not None:
            raise answer

    def delete_pod(self, namespace: str, name: str, uid: str, *, grace_seconds: int | None = None) -> None:
        with self.lock:
            self.deleted.append((name, uid))


def bind_gang(api: ScriptedApi, pods: int = 3) -> tuple[BindOutcome, list[float]]:
    waits: list[float] = []
    done: list[BindOutcome] = []
    finished = threading.Event()

    def on_done(outcome: BindOutcome) -> None:
        done.append(outcome)
        finished.set()

    binder = Binder(api, on_done, workers=4, backoff=Backoff(tries=5, first=0.05, cap=1.0), sleep=waits.append)
    binder.submit(GANG, [BindItem(("ns", f"p-{i}"), f"uid-{i}", f"n-{i}") for i in range(pods)])
    assert finished.wait(5)
    binder.shutdown()
    return done[0], waits


@pytest.mark.parametrize("not_now", [THROTTLED, UNAVAILABLE, INTERNAL, UNREACHABLE], ids=lambda e: str(e.status))
def test_a_not_now_answer_is_tried_again_with_growing_waits_and_the_gang_binds(not_now: ApiError) -> None:
    api = ScriptedApi({"p-1": [not_now, not_now, None]})
    outcome, waits = bind_gang(api)
    assert outcome.ok and sorted(outcome.bound) == [("ns", "p-0"), ("ns", "p-1"), ("ns", "p-2")]
    assert api.binds.count("p-1") == 3 and not api.deleted
    # two waits: 0.05 then 0.10 seconds, each scaled by 0.5-1.5
    assert len(waits) == 2 and 0.025 <= waits[0] <= 0.075 and 0.05 <= waits[1] <= 0.15


def test_a_server_that_stays_unavailable_fails_the_gang_after_the_last_try_and_rolls_it_back() -> None:
    api = ScriptedApi({"p-1": [UNAVAILABLE]})
    outcome, waits = bind_gang(api)
    assert not outcome.ok and api.binds.count("p-1") == 5 and len(waits) == 4
    assert outcome.failed == {("ns", "p-1"): "503 ServiceUnavailable: etcd leader changed (after 5 tries)"}
    assert sorted(api.deleted) == [("p-0", "uid-0"), ("p-2", "uid-2")]  # with their UID preconditions
    assert sorted(outcome.rolled_back) == [("ns", "p-0"), ("ns", "p-2")] and outcome.bound == ()


def test_waits_double_up_to_the_cap() -> None:
    waits = Backoff(tries=8, first=0.1, cap=0.5).waits()
    assert len(waits) == 7
    for wait, base in zip(waits, [0.1, 0.2, 0.4, 0.5, 0.5, 0.5, 0.5], strict=True):
        assert 0.5 * base <= wait <= 1.5 * base


def test_a_deleted_pod_fails_the_gang_at_once_with_the_servers_reason() -> None:
    api = ScriptedApi({"p-1": [DELETED, None]})
    outcome, waits = bind_gang(api)
    assert api.binds.count("p-1") == 1 and waits == []
    assert outcome.failed == {("ns", "p-1"): '404 NotFound: pods "p-1" not found'}
    assert sorted(api.deleted) == [("p-0", "uid-0"), ("p-2", "uid-2")]


def test_a_pod_bound_elsewhere_fails_the_gang_at_once() -> None:
    api = ScriptedApi({"p-1": [assigned("p-1", "n-9"), None]})
    outcome, waits = bind_gang(api)
    assert api.binds.count("p-1") == 1 and waits == []
    assert "already assigned to node \"n-9\"" in outcome.failed[("ns", "p-1")]
    assert len(api.deleted) == 2


def test_a_pod_already_on_our_node_counts_as_bound_after_a_lost_answer() -> None:
    api = ScriptedApi({"p-1": [UNREACHABLE, assigned("p-1", "n-1")]})
    outcome, _ = bind_gang(api)
    assert outcome.ok and ("ns", "p-1") in outcome.bound and not api.deleted
    assert api.binds.count("p-1") == 2


def test_a_uid_precondition_conflict_is_not_mistaken_for_our_own_bind() -> None:
    recreated = ApiError(409, "Conflict", 'Operation cannot be fulfilled on Pod "p-1": the UID in the precondition '
                                          '(uid-1) does not match the UID in record (uid-x). The object might have '
                                          'been deleted and then recreated')
    api = ScriptedApi({"p-1": [recreated]})
    outcome, _ = bind_gang(api)
    assert not outcome.ok and "UID in the precondition" in outcome.failed[("ns", "p-1")]
    assert api.binds.count("p-1") == 1


@pytest.mark.apiserver
def test_the_real_api_servers_second_binding_refusal_is_recognised_only_for_the_same_node(apiserver) -> None:  # type: ignore[no-untyped-def]
    from agent.common.adapters import kube

    api = kube.connect(str(apiserver.kubeconfig))
    name = f"twice-{uuid.uuid4().hex[:8]}"
    pod = api.create(kube.PODS, {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default"},
                                 "spec": {"containers": [{"name": "c", "image": "busybox"}]}})
    try:
        api.bind("default", name, pod["metadata"]["uid"], "n-0")
        with pytest.raises(ApiError) as again:
            api.bind("default", name, pod["metadata"]["uid"], "n-0")
        assert already_ours(again.value, "n-0") and not already_ours(again.value, "n-1")
    finally:
        api.delete_pod("default", name, pod["metadata"]["uid"], grace_seconds=0)
