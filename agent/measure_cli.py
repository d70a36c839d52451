"""`hypertopo-agent run --measure-fabric ADDRESS`: the options of the fabric measuring loop and
the wiring of its parts (responder, UDP or RDMA transport, the plan row from its own NodeTopology,
loop).

Why opt-in: measuring sends traffic over the fabric jobs use and opens a UDP port on the fabric
address. Its cost is bounded (README "Measured fabric": about ten peers, `--measure-count`
datagrams of 64 bytes each way every `--measure-interval`), but an operator turns it on knowingly.
Kept out of agent.cli so the command module stays a list of commands."""

from __future__ import annotations

import argparse
import ipaddress
import socket
from collections.abc import Callable, Mapping, Sequence
from typing import Any


def _bounded(parse: Callable[[str], Any], noun: str, low: float, high: float) -> Callable[[str], Any]:
    """An argparse `type`: a number within [low, high] (`low` itself excluded for a float), else a
    one-line usage error."""

    def convert(text: str) -> Any:
        try:
            value = parse(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a {noun}: {text!r}") from None
        if not (low <= value <= high) or (parse is float and value == low):
            raise argparse.ArgumentTypeError(
                f"must be {'above' if parse is float else 'from'} {low:g} to {high:g}"
            )
        return value

    return convert


_positive = _bounded(float, "number", 0.0, 86400.0)
_count = _bounded(int, "whole number", 1, 1000)
_port = _bounded(int, "port", 1, 65535)


def add_measure_flags(run: argparse.ArgumentParser) -> None:
    group = run.add_argument_group(
        "measured fabric (off unless --measure-fabric; see README 'Measured fabric' for the cost)"
    )
    group.add_argument(
        "--measure-fabric",
        metavar="ADDRESS|IFACE",
        default=None,
        help="measure UDP round trips to the peers the probe plan picks, from and on this fabric NIC address, "
        "or the first IPv4 (else global IPv6) address of this interface, which also ties the sockets to it "
        "(published as spec.probeAddress); off by default",
    )
    group.add_argument(
        "--measure-interface",
        metavar="IFACE",
        default=None,
        help="also tie the probe sockets to this interface (SO_BINDTODEVICE, needs CAP_NET_RAW)",
    )
    group.add_argument(
        "--measure-interval",
        type=_positive,
        default=300.0,
        metavar="SECONDS",
        help="seconds between measuring rounds (default 300)",
    )
    group.add_argument(
        "--measure-count", type=_count, default=20, metavar="N", help="probes per peer a round (default 20)"
    )
    group.add_argument(
        "--measure-port",
        type=_port,
        default=9731,
        metavar="PORT",
        help="UDP port of the probe responder (default 9731)",
    )
    group.add_argument(
        "--measure-burst-every",
        type=_bounded(int, "whole number", 0, 10000),
        default=12,
        metavar="ROUNDS",
        help="a bandwidth train to each peer every ROUNDS rounds (default 12: hourly at the default interval; 0: never)",
    )
    group.add_argument(
        "--measure-burst-count",
        type=_bounded(int, "whole number", 2, 1000),
        default=32,
        metavar="N",
        help="datagrams of 1,200 bytes in a train (default 32: ~40 KB per peer)",
    )
    group.add_argument(
        "--measure-transport",
        choices=("auto", "udp", "rdma"),
        default="auto",
        help="auto (default): RDMA with perftest's ib_write_lat/ib_write_bw when the fabric interface is an ACTIVE "
        "RDMA port and both tools are on PATH, else UDP; rdma: refuse to start without them; udp: always UDP. "
        "RDMA also answers peers' session requests with one perftest server per request on TCP ports "
        "--measure-port+1..+4",
    )
    group.add_argument(
        "--measure-rate",
        type=_positive,
        default=50.0,
        metavar="PER_SECOND",
        help="most probes answered a second (token bucket, burst 20; default 50)",
    )


def fabric_address(value: str, addresses: Mapping[str, Sequence[Any]] | None = None) -> tuple[str, str | None]:
    """(address, interface) for --measure-fabric: an IP address as given (no interface), or an
    interface's first IPv4 address, else its first global IPv6 one. ValueError in one line when
    the interface does not exist or has no usable address. `addresses`: psutil.net_if_addrs()."""
    try:
        return str(ipaddress.ip_address(value)), None
    except ValueError:
        pass
    if addresses is None:
        import psutil

        addresses = psutil.net_if_addrs()
    if value not in addresses:
        raise ValueError(f"--measure-fabric {value!r}: neither an IP address nor an interface of this host")
    found = [a.address for a in addresses[value] if a.family == socket.AF_INET]
    found += [a.address for a in addresses[value] if a.family == socket.AF_INET6 and not a.address.startswith("fe80")]
    if not found:
        raise ValueError(f"--measure-fabric {value!r}: the interface has no IPv4 or global IPv6 address")
    return found[0], value


def start_measuring(
    args: argparse.Namespace, node_name: str, kubeconfig: str | None
) -> tuple[Any, Any] | None:
    """The measuring loop and its started responder, or None when --measure-fabric is not given."""
    if not args.measure_fabric:
        return None
    from agent.adapters.fabric_cluster import own_row
    from agent.adapters.udp_probe import UdpResponder, UdpTransport
    from agent.common.adapters.kube import connect
    from agent.fabric_measure import FabricMeasure

    kube = connect(kubeconfig, timeout=(2.0, 10.0))
    address, named = fabric_address(args.measure_fabric)
    port, interface = args.measure_port, args.measure_interface or named
    udp = UdpTransport(address, port=port, interface=interface)
    transport, gate = _transport(args, address, interface or interface_of(address), udp)
    measure = FabricMeasure(
        node=node_name,
        address=address,
        transport=transport,
        row_source=lambda: own_row(kube, node_name),  # the aggregator's plan for this node
        count=args.measure_count,
        interval=args.measure_interval,
        burst_every=args.measure_burst_every,
        burst_count=args.measure_burst_count,
    )
    responder = UdpResponder(
        address, port=port, allowed=measure.allowed, rate=args.measure_rate, interface=interface, gate=gate
    )
    responder.start()
    return measure, responder


def interface_of(address: str, addresses: Mapping[str, Sequence[Any]] | None = None) -> str | None:
    """The interface that holds `address` (None: none does); `addresses`: psutil.net_if_addrs()."""
    if addresses is None:
        import psutil

        addresses = psutil.net_if_addrs()
    return next((name for name, found in addresses.items() if any(a.address == address for a in found)), None)


def _transport(args: argparse.Namespace, address: str, interface: str | None, udp: Any) -> tuple[Any, Any]:
    """(transport, gate for the responder): RDMA per --measure-transport (agent.measure_transport),
    else the UDP transport and no gate. ValueError in one line when rdma is asked for and absent."""
    import logging
    from pathlib import Path

    from agent.measure_transport import choose, find_endpoint, missing_tools, verbs_device_problem

    sysfs = Path(getattr(args, "sysfs", None) or "/sys")
    endpoint, why_not = (None, "") if args.measure_transport == "udp" else find_endpoint(sysfs, interface, address)
    if endpoint is not None and (why_not := verbs_device_problem(sysfs, endpoint.device)):
        endpoint = None
    kind, why = choose(args.measure_transport, endpoint, why_not, missing_tools())
    logging.getLogger(__name__).info("fabric probe transport: %s (%s)", kind, why)
    if kind != "rdma" or endpoint is None:
        return udp, None
    from agent.adapters.rdma_probe import RdmaGate, RdmaTransport, supports_bind

    if args.measure_port + 4 > 65535:
        raise ValueError(f"--measure-port {args.measure_port}: RDMA needs TCP ports up to 4 above it")

    bind = supports_bind("ib_write_lat")
    transport = RdmaTransport(endpoint, address, fallback=udp, port=args.measure_port, bind=bind, interface=interface)
    return transport, RdmaGate(endpoint, address, base_port=args.measure_port + 1, bind=bind).handle
