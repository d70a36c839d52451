"""The shared client reuses its bearer-token setting for a few seconds instead of running the
kubeconfig loader's refresh hook on every request (a third of a pods/binding call's client-side
CPU), and a 401 makes it ask again at once, so a rotated token is picked up on the next request."""

from __future__ import annotations

from typing import Any

import pytest
from controlplane.harness import ControlPlane

from agent.common.adapters import kube
from agent.common.api_error import ApiError

pytestmark = pytest.mark.apiserver


def counting_asks(client: kube.KubeClient) -> list[int]:
    """Counts how often the client asks the configuration for its auth settings (each ask runs the
    kubeconfig loader's refresh hook, which re-installs itself, so the hook cannot be wrapped)."""
    calls = [0]
    configuration: Any = client.api.configuration
    asks = configuration.auth_settings
    assert configuration.refresh_api_key_hook is not None  # the loader installs one for token users

    def counted() -> dict[str, Any]:
        calls[0] += 1
        return dict(asks())

    configuration.auth_settings = counted
    return calls


def test_the_token_setting_is_asked_for_once_per_reuse_period_not_per_request(apiserver: ControlPlane) -> None:
    client = kube.connect(str(apiserver.kubeconfig))
    calls = counting_asks(client)
    for _ in range(20):
        client.get(kube.NAMESPACES, "default")
    assert calls[0] == 1

    every_time = kube.connect(str(apiserver.kubeconfig))
    every_time.auth_reuse = 0.0
    calls = counting_asks(every_time)
    for _ in range(20):
        every_time.get(kube.NAMESPACES, "default")
    assert calls[0] == 20


def test_a_401_drops_the_reused_token_so_the_next_request_uses_the_new_one(apiserver: ControlPlane) -> None:
    client = kube.connect(str(apiserver.kubeconfig))
    configuration: Any = client.api.configuration
    configuration.refresh_api_key_hook = None  # the test plays the token source
    good = configuration.api_key["BearerToken"]
    configuration.api_key["BearerToken"] = "Bearer revoked-token"
    with pytest.raises(ApiError) as refused:
        client.get(kube.NAMESPACES, "default")
    assert refused.value.status == 401
    configuration.api_key["BearerToken"] = good  # the source has a new token now
    assert client.get(kube.NAMESPACES, "default")["metadata"]["name"] == "default"
    # and while it is reused, a change in the source is not read per request
    configuration.api_key["BearerToken"] = "Bearer revoked-token"
    assert client.get(kube.NAMESPACES, "default")["metadata"]["name"] == "default"
