"""`hypertopo-agent run`: serves /metrics, /healthz, /readyz; coalesces bursts of events; keeps
serving while the API server is away; stops on SIGTERM with exit 0; a real Prometheus scrapes it;
a link going down reaches the published NodeTopology in under a second."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from agent_host import HGX_SYSFS, fixture_prober
from realparts import free_port, http_get, ip, require_binary, require_root, wait_for

from agent.adapters.node_topology import KubeApi
from agent.publish import ApiError, Backoff, Publisher
from agent.runner import Agent, RunConfig, parse_listen

REPO = Path(__file__).resolve().parents[2]


class RecordingApi:
    def __init__(self, fail: bool = False) -> None:
        self.fail = fail
        self.applied: list[Mapping[str, Any]] = []

    def apply(self, obj: Mapping[str, Any]) -> Mapping[str, Any]:
        if self.fail:
            raise ApiError(0, "Unreachable", "connection refused")
        self.applied.append(obj)
        return obj

    def get(self, name: str) -> Mapping[str, Any] | None:
        return self.applied[-1] if self.applied else None


@contextmanager
def running_agent(api: RecordingApi, **config: Any) -> Iterator[Agent]:
    settings = {"interval": 60.0, "listen": ("127.0.0.1", 0), "watch": False, **config}
    agent = Agent(fixture_prober(), Publisher(api, backoff=Backoff(0.01, 0.05)), RunConfig(**settings))
    thread = threading.Thread(target=agent.run, daemon=True)
    thread.start()
    try:
        wait_for(lambda: agent.cycles >= 1)
        yield agent
    finally:
        agent.stop()
        thread.join(10)
        assert not thread.is_alive(), "agent did not stop"


def test_serves_metrics_health_and_readiness_after_the_first_probe() -> None:
    api = RecordingApi()
    with running_agent(api) as agent:
        base = f"http://127.0.0.1:{agent.port}"
        assert http_get(f"{base}/healthz") == (200, "ok\n")
        wait_for(lambda: http_get(f"{base}/readyz")[0] == 200)
        # readiness follows the probe; the publisher thread applies what the probe submitted after it
        wait_for(lambda: agent.publisher.counts().writes >= 1, what="the first publish")
        status, text = http_get(f"{base}/metrics")
        assert status == 200
        assert 'hypertopo_probe_success{probe="nvml"} 1.0' in text
        assert "hypertopo_publish_writes_total 1.0" in text
        assert "hypertopo_process_resident_memory_bytes" in text
        assert http_get(f"{base}/nope")[0] == 404
    assert len(api.applied) == 1


def test_a_burst_of_events_is_coalesced_into_one_probe_cycle() -> None:
    with running_agent(RecordingApi()) as agent:
        before = agent.cycles
        for _ in range(50):
            agent.poke()
        wait_for(lambda: agent.cycles > before)
        time.sleep(0.3)  # a second cycle, if the burst had not been coalesced, would have run by now
        assert agent.cycles == before + 1


def test_stays_up_and_serving_while_the_api_server_is_away_then_turns_unready() -> None:
    api = RecordingApi(fail=True)
    with running_agent(api, ready_grace=0.3) as agent:
        base = f"http://127.0.0.1:{agent.port}"
        wait_for(lambda: agent.publisher.counts().errors >= 2)
        status, text = http_get(f"{base}/metrics")
        assert status == 200 and 'hypertopo_probe_success{probe="rdma"} 1.0' in text
        status, reason = wait_for(lambda: (r := http_get(f"{base}/readyz"))[0] == 503 and r)
        assert "publishing failing" in reason and "connection refused" in reason
        api.fail = False
        wait_for(lambda: http_get(f"{base}/readyz")[0] == 200)
    assert len(api.applied) == 1


@pytest.mark.parametrize(
    ("text", "expected"),
    [(":9730", ("0.0.0.0", 9730)), ("127.0.0.1:1", ("127.0.0.1", 1)), ("[::1]:9730", ("::1", 9730))],
)
def test_listen_addresses_parse(text: str, expected: tuple[str, int]) -> None:
    assert parse_listen(text) == expected


@pytest.mark.parametrize("text", ["9730", "host:", ":0", ":65536", ":http"])
def test_bad_listen_addresses_are_rejected(text: str) -> None:
    with pytest.raises(ValueError, match="--listen"):
        parse_listen(text)


# --- the real command against the real API server ---------------------------------------------


@contextmanager
def agent_process(
    apiserver: Any, node: str, *extra: str, wrapper: tuple[str, ...] = ()
) -> Iterator[tuple[subprocess.Popen[str], int]]:
    port = free_port()
    argv = [*wrapper, sys.executable, "-m", "agent", "run", "--node-name", node, "--listen", f"127.0.0.1:{port}"]
    argv += ["--nvml", "fake:hgx-h100", "--sysfs", str(HGX_SYSFS), *extra]
    proc = subprocess.Popen(argv, env=apiserver.env(), cwd=REPO, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: proc.poll() is not None or http_get(f"http://127.0.0.1:{port}/readyz")[0] == 200)
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
        yield proc, port
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)
        apiserver.kubectl("delete", "nodetopology", node, "--ignore-not-found")


@pytest.mark.apiserver
def test_sigterm_stops_the_agent_promptly_with_exit_code_0(apiserver, unique) -> None:  # type: ignore[no-untyped-def]
    with agent_process(apiserver, f"agent-term-{unique}") as (proc, _port):
        api = KubeApi.from_config(str(apiserver.kubeconfig))
        wait_for(lambda: api.get(f"agent-term-{unique}"))
        start = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(5) == 0
        assert time.monotonic() - start < 3
        assert proc.stderr is not None and "received SIGTERM" in proc.stderr.read()


@pytest.mark.apiserver
def test_an_agent_without_cap_net_raw_publishes_lldp_failed_with_the_reason(apiserver, unique) -> None:  # type: ignore[no-untyped-def]
    """Not "lldp: ok" with no neighbours: the listener's socket error reaches the NodeTopology."""
    require_root()
    no_net_raw = (require_binary("setpriv"), "--bounding-set=-net_raw", "--inh-caps=-net_raw", "--")
    node = f"agent-noraw-{unique}"
    # every interface: this host's NICs are no fabric NICs of the fixture sysfs the agent reads
    with agent_process(apiserver, node, "--interfaces", "all", wrapper=no_net_raw):
        api = KubeApi.from_config(str(apiserver.kubeconfig))

        def lldp_health() -> Any:
            obj = api.get(node)
            health = (obj or {}).get("spec", {}).get("health", {}).get("lldp")
            return health if health and health["state"] != "ok" else None

        health = wait_for(lldp_health, timeout=20)
    assert health["state"] == "failed", health
    assert "Operation not permitted" in health["reason"] and "CAP_NET_RAW" in health["reason"]


def prometheus_query(base: str, query: str) -> list[dict[str, Any]]:
    url = f"{base}/api/v1/query?" + urllib.parse.urlencode({"query": query})
    status, body = http_get(url)
    if status != 200:
        return []
    result: list[dict[str, Any]] = json.loads(body)["data"]["result"]
    return result


@contextmanager
def prometheus_scraping(target_port: int) -> Iterator[str]:
    binary = require_binary("prometheus")
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="hypertopo-prom-") as tmp:
        config = Path(tmp) / "prometheus.yml"
        config.write_text(
            "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
            "scrape_configs:\n"
            f"  - job_name: hypertopo-agent\n    static_configs: [{{targets: ['127.0.0.1:{target_port}']}}]\n"
        )
        argv = [binary, f"--config.file={config}", f"--storage.tsdb.path={tmp}/data"]
        argv += [f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"]
        proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        try:
            yield f"http://127.0.0.1:{port}"
        finally:
            proc.terminate()
            proc.wait(15)


@pytest.mark.apiserver
@pytest.mark.prometheus
def test_a_real_prometheus_scrapes_the_agent_and_queries_return_its_series(apiserver, unique) -> None:  # type: ignore[no-untyped-def]
    with agent_process(apiserver, f"agent-prom-{unique}") as (_proc, port), prometheus_scraping(port) as prom:
        up = wait_for(lambda: prometheus_query(prom, 'up{job="hypertopo-agent"} == 1'), timeout=30)
        assert len(up) == 1
        nvlinks = prometheus_query(prom, "count(hypertopo_nvlink_up == 1)")
        assert nvlinks and nvlinks[0]["value"][1] == str(8 * 18)
        nvml = prometheus_query(prom, 'hypertopo_probe_success{probe="nvml"} == 1')
        assert len(nvml) == 1
        ports = prometheus_query(prom, "sum(hypertopo_rdma_port_up)")
        assert ports and ports[0]["value"][1] == "8"
        # ready follows the first probe, the first publish comes after it (publisher thread): a scrape
        # can fall in between, so wait for one that counts it
        writes = wait_for(lambda: [w for w in prometheus_query(prom, "hypertopo_publish_writes_total")
                                   if float(w["value"][1]) >= 1], timeout=30, what="a scrape counting the publish")
        assert writes and float(writes[0]["value"][1]) >= 1  # host links are live: others may add one


# --- link down to published NodeTopology --------------------------------------------------------


@contextmanager
def veth_pair(unique: str) -> Iterator[tuple[str, str]]:
    a, b = f"htv{unique}a", f"htv{unique}b"
    ip("link", "add", a, "type", "veth", "peer", "name", b)
    try:
        ip("link", "set", a, "up")
        ip("link", "set", b, "up")
        yield a, b
    finally:
        subprocess.run(["ip", "link", "del", a], capture_output=True, timeout=10, check=False)


def interface_state(api: KubeApi, node: str, name: str) -> str | None:
    obj = api.get(node)
    for iface in (obj or {}).get("spec", {}).get("interfaces", []):
        if iface["name"] == name:
            return str(iface["operState"])
    return None


@pytest.mark.netns
@pytest.mark.apiserver
def test_link_down_reaches_the_published_nodetopology_within_a_second(apiserver, unique) -> None:  # type: ignore[no-untyped-def]
    require_root()
    node = f"agent-link-{unique}"
    api = KubeApi.from_config(str(apiserver.kubeconfig))
    with veth_pair(unique) as (a, _b), agent_process(apiserver, node, "--interfaces", f"^htv{unique}[ab]$"):
        wait_for(lambda: interface_state(api, node, a) == "up")
        start = time.monotonic()
        ip("link", "set", a, "down")
        wait_for(lambda: interface_state(api, node, a) == "down", timeout=5, interval=0.005)
        latency = time.monotonic() - start
    print(f"link down -> published NodeTopology: {latency * 1000:.0f} ms")
    assert latency < 1.0
