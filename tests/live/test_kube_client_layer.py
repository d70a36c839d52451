"""The one client layer: one kubeconfig precedence, one error type, an informer that says which
keys changed (also across a re-list) and treats an absent optional kind as empty."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aggregator_controller_kit import wait_for

from agent.common.adapters import kube
from agent.common.adapters.informer import Informer
from agent.common.adapters.kube import HYPERNODES, WatchEvent, config_source
from agent.common.api_error import ApiError


def test_an_explicit_kubeconfig_wins_over_the_environment_and_the_pod(tmp_path: Path) -> None:
    env = {"KUBECONFIG": "/elsewhere", "KUBERNETES_SERVICE_HOST": "10.0.0.1"}
    assert config_source(str(tmp_path / "cfg"), env) == ("kubeconfig", str(tmp_path / "cfg"))


def test_in_a_pod_the_service_account_comes_before_kubeconfig_env(monkeypatch: pytest.MonkeyPatch,
                                                                   tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("t")
    monkeypatch.setattr(kube, "SERVICE_ACCOUNT_TOKEN", str(token))
    assert config_source(None, {"KUBECONFIG": "/k", "KUBERNETES_SERVICE_HOST": "10.0.0.1"}) == ("in-cluster", None)
    token.unlink()  # a service host without a mounted token is not a pod we can act as
    assert config_source(None, {"KUBECONFIG": "/k", "KUBERNETES_SERVICE_HOST": "10.0.0.1"}) == ("kubeconfig", "/k")


def test_outside_a_pod_kubectls_order_applies() -> None:
    assert config_source(None, {"KUBECONFIG": "/k"}) == ("kubeconfig", "/k")
    assert config_source(None, {}) == ("kubeconfig", None)  # the client's default: ~/.kube/config


def test_a_missing_kubeconfig_is_one_clear_api_error(tmp_path: Path) -> None:
    with pytest.raises(ApiError) as caught:
        kube.connect(str(tmp_path / "absent"))
    assert caught.value.unreachable and "no usable Kubernetes configuration" in str(caught.value)
    assert f"kubeconfig {tmp_path / 'absent'}: no such file" in str(caught.value)


def test_a_file_that_is_not_a_kubeconfig_is_named_as_such(tmp_path: Path) -> None:
    for text in ("root:x:0:0\n", "apiVersion: v1\nclusters: 5\n"):
        junk = tmp_path / "config"
        junk.write_text(text)
        with pytest.raises(ApiError) as caught:
            kube.connect(str(junk))
        assert f"kubeconfig {junk} is not a kubeconfig (" in str(caught.value), text


def test_the_error_type_says_what_is_worth_retrying() -> None:
    assert [ApiError(s, "x").transient for s in (0, 409, 429, 500, 503)] == [True] * 5
    assert [ApiError(s, "x").transient for s in (400, 403, 404, 422)] == [False] * 4
    assert ApiError(410, "Expired").gone and ApiError(404, "NotFound").not_found and ApiError(409, "").conflict


def obj(name: str, rv: str, namespace: str | None = None) -> dict[str, Any]:
    meta = {"name": name, "resourceVersion": rv, **({"namespace": namespace} if namespace else {})}
    return {"metadata": meta}


class Script:
    """list() answers in turn; each watch() yields its scripted events, then the next one blocks."""

    def __init__(self, lists: list[Any], watches: list[list[Any]]) -> None:
        self.lists, self.watches = lists, watches
        self.release = threading.Event()
        self.watch_calls = 0

    def list(self, resource: Any, **_: Any) -> tuple[list[dict[str, Any]], str]:
        answer = self.lists.pop(0) if len(self.lists) > 1 else self.lists[0]
        if isinstance(answer, ApiError):
            raise answer
        return answer

    def watch(self, resource: Any, **_: Any) -> ScriptedWatch:
        self.watch_calls += 1
        return ScriptedWatch(self._events(self.watches.pop(0) if self.watches else None), self.release)

    def _events(self, script: list[Any] | None) -> Iterator[WatchEvent]:
        if script is None:
            self.release.wait(5)
            return
        for item in script:
            if isinstance(item, threading.Event):  # a gate the test opens
                item.wait(5)
                continue
            if isinstance(item, ApiError):
                raise item
            yield item


class ScriptedWatch:
    """Like `kube.Watch`: iterable, and `close()` from another thread wakes a blocked reader."""

    def __init__(self, events: Iterator[WatchEvent], release: threading.Event) -> None:
        self.events, self.close = events, release.set

    def __iter__(self) -> Iterator[WatchEvent]:
        return self.events


def test_the_informer_reports_each_changed_key_once_per_drain() -> None:
    script = Script([([obj("a", "1"), obj("b", "1", "ns")], "1")],
                    [[WatchEvent("MODIFIED", obj("a", "2")), WatchEvent("BOOKMARK", obj("", "3")),
                      WatchEvent("DELETED", obj("b", "4", "ns")), WatchEvent("ADDED", obj("c", "5"))]])
    informer = Informer(script, HYPERNODES, track_changes=True).start()  # type: ignore[arg-type]
    try:
        wait_for(lambda: script.watch_calls >= 2, timeout=5, what="the scripted events")
        assert informer.drain_changed() == {"a", "ns/b", "c"}  # the initial list, then the events
        assert informer.drain_changed() == set()  # drained: nothing changed since
        assert informer.snapshot() == {"a": obj("a", "2"), "c": obj("c", "5")}
    finally:
        script.release.set()
        informer.stop()


def test_a_relist_reports_only_the_keys_that_differ() -> None:
    first = ([obj("a", "1"), obj("b", "1"), obj("c", "1")], "1")
    after_gone = ([obj("a", "1"), obj("b", "7"), obj("d", "7")], "7")  # b changed, c went, d came
    gate = threading.Event()
    script = Script([first, after_gone], [[gate, ApiError(410, "Expired", "too old")]])
    informer = Informer(script, HYPERNODES, track_changes=True).start()  # type: ignore[arg-type]
    try:
        wait_for(lambda: script.watch_calls >= 1, timeout=5, what="the first watch")
        assert informer.drain_changed() == {"a", "b", "c"}
        gate.set()  # now the watch ends with 410 Gone: history compacted, re-list
        wait_for(lambda: informer.relists >= 2 and script.watch_calls >= 2, timeout=5, what="the re-list")
        assert informer.drain_changed() == {"b", "c", "d"}  # a is unchanged: not reported again
    finally:
        script.release.set()
        informer.stop()


def test_an_informer_that_nobody_drains_keeps_no_keys() -> None:
    script = Script([([obj("a", "1")], "1")], [[WatchEvent("ADDED", obj("b", "2"))]])
    informer = Informer(script, HYPERNODES).start()  # type: ignore[arg-type]
    try:
        wait_for(lambda: script.watch_calls >= 2, timeout=5, what="the scripted events")
        assert informer.snapshot().keys() == {"a", "b"} and not informer._changed
        with pytest.raises(RuntimeError, match="track_changes"):
            informer.drain_changed()
    finally:
        script.release.set()
        informer.stop()


def test_an_optional_kind_not_served_is_empty_and_synced_then_looked_for_again() -> None:
    script = Script([ApiError(404, "NotFound", "the server could not find the requested resource"),
                     ([obj("q", "9")], "9")], [])
    events: list[tuple[str, Any]] = []
    informer = Informer(script, HYPERNODES, optional=True, absent_recheck=0.05,  # type: ignore[arg-type]
                        on_event=lambda kind, payload: events.append((kind, payload))).start()
    try:
        wait_for(lambda: informer.synced.is_set(), timeout=5, what="synced while absent")
        wait_for(lambda: ("SYNC", [obj("q", "9")]) in events, timeout=5, what="the kind served later")
        assert events[0] == ("ABSENT", []) and not informer.absent
        assert informer.snapshot() == {"q": obj("q", "9")}
    finally:
        script.release.set()
        informer.stop()
