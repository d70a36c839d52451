"""`hypertopo-agent`: print what this node would publish (`probe`), or run as the DaemonSet (`run`).

`probe` is the first thing a person tries on a laptop or a GPU node, so it must work anywhere:
absent hardware (no GPUs, no HCAs) is a normal answer and exits 0; only a probe that failed makes
the exit code 1. Bad usage is one clear line and exit code 2. Logs go to stderr, the object to
stdout, so `hypertopo-agent probe | kubectl apply -f -` works.
"""

from __future__ import annotations

import argparse
import json
import logging
import re
import signal
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from types import FrameType
from typing import Any

import yaml

from agent.collect import (
    FAKE_PREFIX,
    CollectConfig,
    ConfigError,
    Prober,
    check_nvml_mode,
    describe,
    failed_components,
)
from agent.common.command_line import (
    EXIT_INPUT,
    CommandParser,
    InputError,
    add_common_arguments,
    number_argument,
    one_line,
    setup_logging,
)
from agent.common.report import NodeReport, node_topology_object
from agent.measure_cli import add_measure_flags, start_measuring
from agent.probes.grey import GreyConfig, RateLimit, parse_limit

log = logging.getLogger("hypertopo-agent")

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


class UsageError(Exception):
    """Bad command-line input: reported in one line with exit code 2."""


EVERY_NAME = re.compile("")  # `--interfaces all`: a pattern every name matches


def _interfaces(text: str) -> re.Pattern[str] | None:
    """`fabric` -> None (agent.probes.net's fabric interfaces), `all` -> every name, else a regex."""
    if text == "fabric":
        return None
    return EVERY_NAME if text == "all" else _regex(text)


def _regex(text: str) -> re.Pattern[str]:
    try:
        return re.compile(text)
    except re.error as exc:
        raise argparse.ArgumentTypeError(f"not a valid regular expression ({exc})") from exc


def _nvml_mode(text: str) -> str:
    try:
        mode = check_nvml_mode(text)
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc
    if mode.startswith(FAKE_PREFIX):
        from agent.probes.nvml_fake import PROFILES

        profile = mode[len(FAKE_PREFIX) :]
        if profile not in PROFILES:
            known = ", ".join(sorted(PROFILES))
            raise argparse.ArgumentTypeError(f"unknown NVML fake profile {profile!r} (known: {known})")
    return mode


_non_negative = number_argument(float, "number", 0.0, "must not be negative")


def _positive(text: str) -> float:
    value = _non_negative(text)
    if value == 0:
        raise argparse.ArgumentTypeError("must be greater than zero")
    return value


def _add_seconds(group: Any, flag: str, default: float, help_text: str, *, zero: bool = False) -> None:
    """A duration option in seconds: greater than zero, or with `zero` also 0 (meaning "off")."""
    kind = _non_negative if zero else _positive
    group.add_argument(flag, type=kind, default=default, metavar="SECONDS", help=help_text)


def _add_probe_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("probe options")
    group.add_argument(
        "--sysfs",
        type=Path,
        default=Path("/sys"),
        metavar="DIR",
        help="root of sysfs to read (default /sys; in a container mount the host's /sys "
        "read-only and pass its path, e.g. /host/sys)",
    )
    group.add_argument(
        "--procfs",
        type=Path,
        default=Path("/proc"),
        metavar="DIR",
        help="root of procfs to read for host facts (default /proc)",
    )
    group.add_argument(
        "--nvml",
        type=_nvml_mode,
        default="auto",
        metavar="auto|off|fake:PROFILE",
        help="GPU source: auto = the real NVML library when present (absent otherwise), "
        "off = skip GPUs, fake:PROFILE = deterministic fake (hgx-h100, gb200-nvl72)",
    )
    group.add_argument(
        "--interfaces",
        type=_interfaces,
        default=None,
        metavar="fabric|all|REGEX",
        help="network interfaces to report: fabric (default) = physical NICs and RDMA netdevs (no veth, "
        "bridge, kube-ipvs0, CNI, tunnel or dummy links, so pod churn writes nothing); all = every "
        "interface but loopback; REGEX = every interface whose name matches",
    )
    _add_seconds(
        group,
        "--lldp-wait",
        0.0,
        "probe: listen this long for LLDP frames before reporting neighbours "
        "(needs CAP_NET_RAW; default 0 = do not listen). run: ignored, it always listens",
        zero=True,
    )
    group.add_argument(
        "--lldpd-socket",
        type=Path,
        default=None,
        metavar="PATH",
        help="also read LLDP neighbours from a host lldpd through its control socket mounted into the "
        "pod (e.g. /run/lldpd.socket; via `lldpcli -f json0`), for NICs whose firmware consumes LLDP",
    )
    _add_grey_flags(parser)


def _error_limit(text: str) -> tuple[str, RateLimit]:
    try:
        return parse_limit(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _add_grey_flags(parser: argparse.ArgumentParser) -> None:
    """Windows and thresholds of the grey-failure probes (README: Grey-failure health)."""
    grey = parser.add_argument_group("grey-failure health (run: rates need several cycles)")
    defaults = GreyConfig()
    _add_seconds(
        grey,
        "--error-window",
        defaults.error_window_s,
        "window over which port and NVLink error rates are measured (default %(default)s)",
    )
    grey.add_argument(
        "--error-limit",
        type=_error_limit,
        action="append",
        default=[],
        metavar="COUNTER=D[:F]",
        help="degraded (and failed, default 10x) rate per minute for an IB/RoCE or NVLink error "
        "counter, e.g. symbol_error=60:600; overrides the default for that counter",
    )
    _add_seconds(
        grey,
        "--flap-window",
        defaults.flap_window_s,
        "window for carrier and port state changes (default %(default)s)",
    )
    grey.add_argument(
        "--flap-limit",
        type=int,
        default=defaults.flap_limit,
        metavar="N",
        help="more than N changes in the window is flapping: degraded (default %(default)s)",
    )
    _add_seconds(
        grey,
        "--flap-hold-down",
        defaults.flap_hold_down_s,
        "a flapping link stays degraded this long after its last change (default %(default)s)",
        zero=True,
    )


def _grey_config(args: argparse.Namespace) -> GreyConfig:
    limits = dict(args.error_limit)
    defaults = GreyConfig()
    return GreyConfig(
        error_window_s=args.error_window,
        error_limits={
            **defaults.error_limits,
            **{k: v for k, v in limits.items() if k not in defaults.nvlink_limits},
        },
        nvlink_limits={
            **defaults.nvlink_limits,
            **{k: v for k, v in limits.items() if k in defaults.nvlink_limits},
        },
        flap_window_s=args.flap_window,
        flap_limit=max(0, args.flap_limit),
        flap_hold_down_s=args.flap_hold_down,
    )


def build_parser() -> argparse.ArgumentParser:
    parser = CommandParser(
        prog="hypertopo-agent",
        description="Discovers this node's GPU and network fabric (NVLink, RDMA, interfaces, LLDP) and "
        "publishes it as a hypertopo.io/v1alpha1 NodeTopology object.",
    )
    parser.add_argument(
        "--log-level",
        default="info",
        choices=["debug", "info", "warning", "error"],
        help="least severe log level written to stderr (default info)",
    )
    add_common_arguments(parser)
    sub = parser.add_subparsers(dest="command", required=True, metavar="{probe,run}")
    probe = sub.add_parser(
        "probe",
        help="print the NodeTopology object this node would publish, and exit",
        description="Runs every probe once and prints the NodeTopology object. Exit 0 "
        "when probes ran (absent hardware is fine), 1 when a probe failed, 2 on bad usage.",
    )
    probe.add_argument(
        "--format", choices=["yaml", "json"], default="yaml", help="output format (default yaml)"
    )
    probe.add_argument(
        "--node-name", default=None, metavar="NAME", help="object name (default: the host name)"
    )
    probe.add_argument(
        "--model",
        type=Path,
        default=None,
        metavar="FILE",
        help="instead of probing this host, print the report node --node would publish in "
        "this cluster model file (see DESIGN.md for the format)",
    )
    probe.add_argument("--node", default=None, metavar="NAME", help="the model node to report (with --model)")
    _add_probe_flags(probe)
    _add_run_parser(sub)
    return parser


def _add_run_parser(sub: Any) -> None:
    run = sub.add_parser(
        "run",
        help="probe continuously, publish NodeTopology, serve /metrics",
        description="The DaemonSet's command: probes at start, on link/LLDP/XID events and "
        "every --interval; applies the NodeTopology object (server-side apply) only when it "
        "changed; serves /metrics, /healthz and /readyz. SIGTERM or SIGINT stops it (exit 0).",
    )
    run.add_argument(
        "--node-name",
        required=True,
        metavar="NAME",
        help="this node's Kubernetes name, the NodeTopology object's name (in a DaemonSet: "
        "from the downward API, spec.nodeName)",
    )
    run.add_argument(
        "--kubeconfig",
        default=None,
        metavar="FILE",
        help="kubeconfig to use (default: in-cluster service account, else $KUBECONFIG)",
    )
    _add_seconds(run, "--interval", 30.0, "probe at least this often even without events (default 30)")
    run.add_argument(
        "--listen",
        default=":9730",
        metavar="HOST:PORT",
        help="address for /metrics, /healthz and /readyz (default :9730)",
    )
    _add_seconds(
        run, "--ready-grace", 300.0, "/readyz stays ready this long while publishing fails (default 300)"
    )
    _add_seconds(
        run,
        "--verify-interval",
        300.0,
        "read the NodeTopology object back this often and re-apply it if someone deleted or "
        "edited it (a GET, never a write when intact; default 300, 0 = never)",
        zero=True,
    )
    _add_probe_flags(run)
    add_measure_flags(run)


def _collect_config(args: argparse.Namespace, node_name: str) -> CollectConfig:
    return CollectConfig(
        node_name=node_name,
        sysfs=args.sysfs,
        procfs=args.procfs,
        nvml=args.nvml,
        interfaces=args.interfaces,
        lldp_wait=args.lldp_wait,
        lldpd_socket=args.lldpd_socket,
        grey=_grey_config(args),
    )


def _print(obj: dict[str, Any], fmt: str) -> None:
    if fmt == "json":
        sys.stdout.write(json.dumps(obj, indent=2, sort_keys=False) + "\n")
    else:
        sys.stdout.write(yaml.safe_dump(obj, sort_keys=False))


def _model_report(args: argparse.Namespace) -> NodeReport:
    from agent.cluster_model import ModelError, load_model

    if not args.node:
        raise UsageError("--model needs --node NAME")
    try:
        model = load_model(str(args.model))
    except ModelError as exc:  # a file that cannot be used: input, exit 1
        raise InputError("", str(exc)) from exc  # its message names the file
    if args.node not in model.nodes():
        raise UsageError(f"node {args.node!r} is not in model {args.model}")
    from agent.model_probe import report_for

    return report_for(model, args.node)


def _probe_host(args: argparse.Namespace) -> NodeReport:
    import socket

    prober = Prober(_collect_config(args, args.node_name or socket.gethostname()))
    if args.lldp_wait > 0:
        return _probe_with_lldp(prober, args.lldp_wait)
    return prober.collect()


def _probe_with_lldp(prober: Prober, wait: float) -> NodeReport:
    """Listens for LLDP for `wait` seconds on the interfaces found, then probes again."""
    from agent.adapters.raw_socket import LldpListener
    from agent.runner import lldp_interfaces

    first = prober.collect()
    names = lldp_interfaces(first)
    try:
        listener = LldpListener(names, prober.neighbour_table(), lambda *_: None)
        listener.start()
    except Exception as exc:  # report what we have, say why LLDP is missing
        log.warning("cannot listen for LLDP (%s); neighbours not reported", exc)
        prober.lldp_failure = f"cannot listen for LLDP: {exc}"
        return prober.collect()
    prober.lldp_listener = listener  # its socket errors (no CAP_NET_RAW) are the lldp health
    try:
        time.sleep(wait)
        return prober.collect()  # while listening: which interfaces could not be heard still shows
    finally:
        listener.stop()


def cmd_probe(args: argparse.Namespace) -> int:
    if args.node and not args.model:
        raise UsageError("--node is only used with --model")
    report = _model_report(args) if args.model else _probe_host(args)
    _print(node_topology_object(report), args.format)
    log.info("%s", describe(report.health))
    failed = failed_components(report)
    if failed:
        log.error("probe failed for: %s", ", ".join(failed))
        return EXIT_FAILED
    return EXIT_OK


def cmd_run(args: argparse.Namespace) -> int:
    from agent.adapters.node_topology import KubeApi
    from agent.publish import ApiError, Publisher
    from agent.runner import Agent, RunConfig, parse_listen

    try:
        listen = parse_listen(args.listen)
    except ValueError as exc:
        raise UsageError(str(exc)) from exc
    try:
        api = KubeApi.from_config(args.kubeconfig)
    except ApiError as exc:
        raise UsageError(str(exc)) from exc
    config = RunConfig(interval=args.interval, listen=listen, ready_grace=args.ready_grace)
    publisher = Publisher(api, verify_every=args.verify_interval or None)
    try:
        measuring = start_measuring(args, args.node_name, args.kubeconfig)
    except (OSError, ValueError) as exc:  # an unknown interface, an address not on this host
        raise UsageError(one_line(str(exc))) from exc
    measure = measuring[0] if measuring else None
    agent = Agent(Prober(_collect_config(args, args.node_name)), publisher, config, measure=measure)

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        log.info("received %s, stopping", signal.Signals(signum).name)
        agent.stop()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        agent.run()
    except OSError as exc:  # e.g. the --listen address is taken
        log.error("cannot run: %s", exc)
        return EXIT_FAILED
    finally:
        if measuring:
            measuring[1].stop()
    return EXIT_OK


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    setup_logging(args.log_level, args.log_format)
    try:
        result: int = {"probe": cmd_probe, "run": cmd_run}[args.command](args)
    except UsageError as exc:
        sys.stderr.write(f"hypertopo-agent: error: {exc}\n")
        return EXIT_USAGE
    except InputError as exc:
        sys.stderr.write(f"hypertopo-agent: error: {one_line(str(exc), width=600)}\n")
        return EXIT_INPUT
    return result
