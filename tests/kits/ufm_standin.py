"""A stand-in for NVIDIA UFM's REST API on loopback, serving a cluster model's fabric.

`listings(model)` writes what UFM's documented listings would hold for the model's fabric (ports,
links, systems; field names and value spellings as UFM's REST API guide shows them), with the
same GUIDs as `aggregator_fabric.ibnetdiscover_dump` and the agents' reports (agent.model_probe),
so one model gives a dump, a UFM and reports that agree. `UfmStandIn` serves them over HTTP with
UFM's two authentication paths (basic on /ufmRest, an access token on /ufmRestV3) and can be told
to fail the way a real server does: 401, 403, 500, a hang past the client's timeout, HTML instead
of JSON, a truncated body, a dropped connection. `ports?active=true` answers the active ports only
(Active, Armed, Initialize), as UFM's filter does, or 400/404 as a UFM without the filter would. Responses are sent whole (UFM does not page its
listings), with chunked transfer encoding on request, as large fabrics are served.
"""

from __future__ import annotations

import base64
import json
import ssl
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from aggregator_fabric import ca_guid, hca_attachments, switch_guid

from agent.cluster_model import ClusterModel

Obj = dict[str, Any]
NDR_LANE = "100.0 Gbps"  # NDR: 100 Gb/s per lane, 4 lanes
ENABLED_SPEEDS = ["25.0 Gbps", "50.0 Gbps", "100.0 Gbps"]
SUPPORTED_SPEEDS = ["10.0 Gbps", "14.0 Gbps", "25.0 Gbps", "50.0 Gbps", "100.0 Gbps"]


@dataclass
class _Port:
    guid: str
    number: int
    system_guid: str
    system_name: str
    switch: bool
    node_description: str
    peer: tuple[str, int] | None = None
    peer_name: str = ""
    peer_dname: str = ""
    peer_description: str = ""


def _port_object(port: _Port, *, state: str, lane: str, peers: bool) -> Obj:
    logical, physical = {"up": ("Active", "Link Up"), "down": ("Down", "Disabled"), "polling": ("Down", "Polling"),
                         "unused": ("Down", "Polling")}.get(state, ("Active", "Link Up"))  # fmt: skip
    unused = state == "unused"  # nothing plugged in: no rate, and (as UFM's guide shows) no enabled rates
    dname = str(port.number) if not port.switch else f"1/{(port.number + 1) // 2}/{2 - port.number % 2}"
    kind = "Switch" if port.switch else "Computer"
    obj: Obj = {  # every field UFM's guide lists for a port, so a large answer is as large as UFM's
        "guid": port.guid,
        "number": port.number,
        "external_number": port.number,
        "dname": dname,
        "name": f"{port.guid}_{port.number}",
        "path": f"default / {kind}: {port.system_name} / NA / {dname}",
        "systemID": port.system_guid,
        "system_name": port.system_name,
        "system_ip": "0.0.0.0",
        "system_capabilities": ["burn_cables_transceivers"] if port.switch else [],
        "system_mirroring_template": False,
        "node_description": port.node_description,
        "description": f"{kind} IB Port",
        "logical_state": logical,
        "physical_state": physical,
        "active_speed": None if unused else lane,
        "active_width": None if unused else "4x",
        "enabled_speed": [] if unused else ENABLED_SPEEDS,
        "enabled_width": [] if unused else ["1x", "2x", "4x"],
        "supported_speed": [] if unused else SUPPORTED_SPEEDS,
        "supported_width": [] if unused else ["1x", "2x", "4x", "8x", "12x"],
        "severity": "Info" if state == "up" else "Critical",
        "high_ber_severity": "N/A",
        "tier": 1,
        "lid": 10 + port.number,
        "mtu": 4096,
        "module": "N/A",
        "mirror": "disable",
        "capabilities": ["healthy_operations", "reset", "disable", "get_cables_info"],
        "peer_port_dname": "N/A",
    }
    if peers and port.peer is not None and state == "up":  # UFM drops the peer of a port without a link
        obj["peer"] = f"{port.peer[0]}_{port.peer[1]}"
        obj["peer_guid"] = obj["peer_node_guid"] = port.peer[0]
        obj["peer_port_dname"] = port.peer_dname
        obj["peer_node_name"] = port.peer_name
        obj["peer_node_description"] = port.peer_description
        obj["peer_lid"] = 10 + port.peer[1]
        obj["peer_ip"] = "0.0.0.0"
    return obj


@dataclass
class Fault:
    """A cable's state as UFM would show it: `side` "host" (the HCA's port), "switch" or "both"."""

    state: str = "down"  # "down" | "polling" | "slow" (trained at a lower rate) | "unhealthy" (UFM's mark)
    side: str = "switch"


def listings(
    model: ClusterModel,
    *,
    faults: dict[tuple[str, int], Fault] | None = None,
    peers: bool = True,
    with_links: bool = True,
    with_systems: bool = True,
    with_unhealthy: bool = True,
    only: Collection[str] | None = None,
    radix: int = 0,
) -> dict[str, list[Obj]]:
    """{"ports": [...], "links": [...], "systems": [...], "unhealthy_ports": [...]} for the model's
    fabric; `faults` keys are (node, hca index) and mark that HCA's cable (down, polling, slow, or
    unhealthy: UFM's mark on the `side` end); `peers=False` leaves the peer fields out of port
    objects (cabling only from the links listing); `radix` lists every switch with that many ports at
    least, as UFM lists a switch's unused ports too (Down/Polling, no peer, no rate)."""
    faults = faults or {}
    ports: dict[tuple[str, int], _Port] = {}
    next_port: dict[str, int] = defaultdict(int)
    cables: list[tuple[tuple[str, int], tuple[str, int], tuple[str, int] | None]] = []
    kept = set(model.switches) if only is None else set(only)

    def switch_port(switch: str) -> _Port:
        next_port[switch] += 1
        number, guid = next_port[switch], switch_guid(switch)
        port = _Port(guid, number, guid, switch, True, f"{switch}:{number}")
        ports[(guid, number)] = port
        return port

    for child, parent in sorted(model.parents.items()):
        if child in kept and parent in kept:
            a, b = switch_port(child), switch_port(parent)
            _cable(a, b)
            cables.append(((a.guid, a.number), (b.guid, b.number), None))
    for leaf, node, hca in hca_attachments(model):
        if leaf not in kept:
            continue
        guid = ca_guid(node, hca)
        host = _Port(guid, 1, ca_guid(node, 0), node, False, f"{node} mlx5_{hca}")
        ports[(guid, 1)] = host
        sw = switch_port(leaf)
        _cable(host, sw)
        cables.append(((guid, 1), (sw.guid, sw.number), (node, hca)))
    for switch in sorted(kept & set(model.switches)):
        _unused_ports(switch, next_port, radix, switch_port)
    states = _states(cables, faults)
    out: dict[str, list[Obj]] = {"ports": _port_objects(ports, states, peers=peers)}
    if with_links:
        out["links"] = [_link_object(ports[a], ports[b]) for a, b, _ in cables
                        if states.get(a, ("up",))[0] in ("up", "slow") and states.get(b, ("up",))[0] in ("up", "slow")]  # fmt: skip
    if with_systems:
        out["systems"] = _systems(model, kept, {node for _, node, _ in hca_attachments(model)})
    if with_unhealthy:
        out["unhealthy_ports"] = _unhealthy_objects(cables, faults, ports)
    return out


ACTIVE_STATES = ("Active", "Armed", "Initialize")  # what UFM's active filter keeps (its user manual)


def active_ports(ports: list[Obj]) -> list[Obj]:
    """The port listing as UFM answers `ports?active=true`: only ports logically Active, Armed or
    Initialize (the unused, down and polling ones left out)."""
    return [port for port in ports if port.get("logical_state") in ACTIVE_STATES]


def _unhealthy_objects(
    cables: list[tuple[tuple[str, int], tuple[str, int], tuple[str, int] | None]],
    faults: dict[tuple[str, int], Fault],
    ports: dict[tuple[str, int], _Port],
) -> list[Obj]:
    return [
        _unhealthy_object(ports[switch if faults[hca].side == "switch" else host], ports)
        for host, switch, hca in cables
        if hca is not None and hca in faults and faults[hca].state == "unhealthy"
    ]


def _unused_ports(switch: str, used: dict[str, int], radix: int, add: Callable[[str], object]) -> None:
    """The switch's ports beyond those cabled, up to `radix`: nothing plugged in."""
    for _ in range(used[switch], radix):
        add(switch)


def _port_objects(ports: dict[tuple[str, int], _Port], states: dict[tuple[str, int], tuple[str, str]], *, peers: bool) -> list[Obj]:
    """The port listing in UFM's order (by system, then port number); a port without a cable is unused."""
    out = []
    for key, port in sorted(ports.items(), key=lambda kv: (kv[1].system_name, kv[0][1])):
        state, lane = states.get(key, ("up", NDR_LANE)) if port.peer is not None else ("unused", NDR_LANE)
        out.append(_port_object(port, state=state, lane=lane, peers=peers))
    return out


def _unhealthy_object(port: _Port, ports: dict[tuple[str, int], _Port]) -> Obj:
    """An entry of UFM's unhealthy-port list (OpenSM's mark), for `port`."""
    assert port.peer is not None
    peer = ports[port.peer]
    return {
        "UnhealthyGUID": port.guid,
        "UnhealthyPortNumber": port.number,
        "UnhealthyNode": port.system_name,
        "UnhealthyPort": f"{port.system_name}/{port.number}",
        "UnhealthyPortDname": str(port.number),
        "PeerGUID": peer.guid,
        "PeerPortNumber": peer.number,
        "PeerNode": peer.system_name,
        "Condition": ["HIGH_BER"],
        "State": "Warning",
        "StatusTime": "Mon Nov 23 01:00:00 2026",
    }


def _cable(a: _Port, b: _Port) -> None:
    a.peer, b.peer = (b.guid, b.number), (a.guid, a.number)
    a.peer_name, b.peer_name = b.system_name, a.system_name
    a.peer_dname, b.peer_dname = str(b.number), str(a.number)
    a.peer_description, b.peer_description = b.node_description, a.node_description


def _states(
    cables: list[tuple[tuple[str, int], tuple[str, int], tuple[str, int] | None]],
    faults: dict[tuple[str, int], Fault],
) -> dict[tuple[str, int], tuple[str, str]]:
    """Port key -> (state, per-lane speed) for the faulty cables."""
    out: dict[tuple[str, int], tuple[str, str]] = {}
    for host, switch, hca in cables:
        fault = faults.get(hca) if hca is not None else None
        if fault is None:
            continue
        if fault.state == "slow":  # a cable trained at HDR: both ends run the slower rate
            out[host] = out[switch] = ("up", "50.0 Gbps")
            continue
        if fault.state == "unhealthy":  # up at full rate, marked by UFM (listed apart)
            continue
        down = (fault.state, NDR_LANE)
        other = ("polling", NDR_LANE)  # the far end of a dead cable sees no light either
        if fault.side == "host":
            out[host], out[switch] = down, other
        elif fault.side == "switch":
            out[switch], out[host] = down, other
        else:
            out[host] = out[switch] = down
    return out


def _link_object(a: _Port, b: _Port) -> Obj:
    return {
        "source_guid": a.guid,
        "source_port": str(a.number),
        "destination_guid": b.guid,
        "destination_port": str(b.number),
        "source_port_name": f"{a.guid}_{a.number}",
        "destination_port_name": f"{b.guid}_{b.number}",
        "source_port_node_description": a.node_description,
        "destination_port_node_description": b.node_description,
        "width": "4x",
        "severity": "Info",
        "name": f"{a.guid}_{a.number}:{b.guid}_{b.number}",
    }


def _systems(model: ClusterModel, kept: set[str], hosts: set[str]) -> list[Obj]:
    out: list[Obj] = []
    leaves = {block.switch for block in model.blocks}
    for switch in sorted(kept & set(model.switches)):
        out.append({"system_name": switch, "guid": switch_guid(switch), "type": "switch", "model": "MQM9700",
                    "vendor": "Mellanox", "role": "tor" if switch in leaves else "core",
                    "description": "NDR switch", "ip": "0.0.0.0", "severity": "Info"})  # fmt: skip
    for node in sorted(hosts):
        out.append({"system_name": node, "guid": ca_guid(node, 0), "type": "host", "role": "endpoint",
                    "model": "HCA", "vendor": "Mellanox", "description": "Computer", "ip": "0.0.0.0",
                    "severity": "Info"})  # fmt: skip
    return out


# --- the HTTP server -----------------------------------------------------------------------------


def _spoiled(fail: str | None, name: str, body: bytes) -> bytes:
    """The body as a failing UFM would send it (HTML, JSON of the wrong shape, nothing, half)."""
    if fail == "html":
        return b"<html><body>UFM is starting, please wait</body></html>"
    if fail == "not-array" and name == "ports":
        return b'{"ports": "unavailable"}'
    if fail == "empty":
        return b"[]"
    if fail == "truncated":
        return body[: len(body) // 2]
    return body


@dataclass
class Behaviour:
    """How the stand-in answers: normally, or one of the ways a real server fails."""

    fail: str | None = None  # None | "401" | "403" | "500" | "hang" | "html" | "truncated" | "drop" | "not-array" | "empty"
    hang_seconds: float = 5.0
    chunked: bool = False
    missing: set[str] = field(default_factory=set)  # listings answered with 404 (older UFM)
    filter_refused: int | None = None  # 400 or 404: `ports?active=true` refused (a UFM without the filter)
    raw: dict[str, bytes] = field(default_factory=dict)  # listing -> the exact body to send (poisoned JSON)


class UfmStandIn:
    """`with UfmStandIn(data, username=..., password=..., token=...) as ufm: ufm.url`"""

    def __init__(
        self,
        data: dict[str, list[Obj]],
        *,
        username: str = "admin",
        password: str = "123456",
        token: str = "",
        tls: tuple[str, str] | None = None,
    ) -> None:
        self.data = data
        self.username, self.password, self.token = username, password, token
        self.behaviour = Behaviour()
        self.requests: list[tuple[str, str]] = []  # (path without the query, authorization header)
        self.targets: list[str] = []  # each request's path with its query ("...ports?active=true")
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        self.scheme = "http"
        if tls is not None:  # (certificate file, key file)
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(*tls)
            self._server.socket = context.wrap_socket(self._server.socket, server_side=True)
            self.scheme = "https"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        text = host.decode() if isinstance(host, bytes) else host
        return f"{self.scheme}://{text}:{port}"

    def __enter__(self) -> UfmStandIn:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()

    def set(self, data: dict[str, list[Obj]]) -> None:
        with self._lock:
            self.data = data

    def paths(self) -> Iterator[str]:
        return (p for p, _ in list(self.requests))

    def _authorised(self, path: str, header: str) -> bool:
        if path.startswith("/ufmRestV3/"):
            return bool(self.token) and header == f"Basic {self.token}"
        pair = base64.b64encode(f"{self.username}:{self.password}".encode()).decode()
        return header == f"Basic {pair}"

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        return type("Handler", (_Handler,), {"standin": self})


class _Handler(BaseHTTPRequestHandler):
    """UFM's REST paths, answered from the stand-in `standin` (set per server)."""

    standin: UfmStandIn

    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        pass

    def do_GET(self) -> None:
        header = self.headers.get("Authorization", "")
        path, _, query = self.path.partition("?")
        self.standin.requests.append((path, header))
        self.standin.targets.append(self.path)
        refusal = self._refusal(path, header)
        if refusal is not None:
            if refusal:
                self._send(*refusal)
            return
        name = path.rstrip("/").rsplit("/", 1)[-1]  # ports, links, systems, unhealthy_ports
        with self.standin._lock:
            listing = self.standin.data.get(name)
        if listing is None or name in self.standin.behaviour.missing:
            self._send(404, b'{"error": "Not Found"}')
            return
        if name == "ports" and "active=true" in query.split("&"):
            refused = self.standin.behaviour.filter_refused
            if refused is not None:
                self._send(refused, b'{"error": "Unknown parameter: active"}')
                return
            listing = active_ports(listing)
        raw = self.standin.behaviour.raw.get(name)
        body = raw if raw is not None else _spoiled(self.standin.behaviour.fail, name, json.dumps(listing).encode())
        self._send(200, body, chunked=self.standin.behaviour.chunked)

    def _refusal(self, path: str, header: str) -> tuple[int, bytes] | tuple[()] | None:
        """(status, body) of a failing answer, () for no answer at all, None to serve."""
        fail = self.standin.behaviour.fail
        if fail == "drop":
            self.connection.close()
            return ()
        if fail == "hang":
            time.sleep(self.standin.behaviour.hang_seconds)
        if fail in ("401", "403", "500"):
            return (int(fail), b'{"error": "stand-in failure"}')
        if not self.standin._authorised(path, header):
            return (401, b'{"error": "Unauthorized"}')
        if not path.split("/", 2)[-1].startswith(("resources/", "app/unhealthy_ports")):
            return (404, b'{"error": "Not Found"}')
        return None

    def _send(self, status: int, body: bytes, *, chunked: bool = False) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        if chunked:
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for start in range(0, len(body), 64 << 10):
                piece = body[start : start + (64 << 10)]
                self.wfile.write(f"{len(piece):x}\r\n".encode() + piece + b"\r\n")
            self.wfile.write(b"0\r\n\r\n")
            return
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
