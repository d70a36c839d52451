"""`hypertopo-scheduler`: `run` (the live scheduler) and `simulate` (replay a job trace offline).

`run` lives in `aggregator.placement.live.scheduler` and is imported only when asked for, so
`simulate` works without the Kubernetes client being configured.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from collections.abc import Sequence

from agent.cluster_model import ModelError, load_model
from agent.common.command_line import EXIT_INPUT, CommandParser, add_common_arguments, one_line, setup_logging
from aggregator.placement.core import spares
from aggregator.placement.core.topology import build
from aggregator.placement.sim.policies import POLICIES, policy
from aggregator.placement.sim.simulate import Simulation, model_hypernodes, node_capacity
from aggregator.placement.sim.trace import TraceError, load_trace, synthetic

SIMULATE_HELP = """\
Replays a job trace over a cluster model file and prints JSON figures: decision latency p50/p99,
share of gangs at the lowest feasible tier, mean lowest-common tier, leaves per gang, GPU
utilisation, queueing delay and evictions; with node failures, the recoveries (kept their tier, on
spares), the time to whole and the whole-time ratio. The HyperNodes are what `hypertopo-aggregator render
--model` gives for the same model (the aggregator's own tier inference). The job file format is
documented in aggregator/placement/sim/trace.py.

example: hypertopo-scheduler simulate --model cluster.yaml --synthetic 500 --policy first-fit
"""


def _add_simulate(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    sim = sub.add_parser("simulate", help="replay a job trace over a cluster model, print JSON figures",
                         description=SIMULATE_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    sim.add_argument("--model", required=True, help="cluster model file (YAML: switches, blocks)")
    source = sim.add_mutually_exclusive_group(required=True)
    source.add_argument("--jobs", help="job trace file (YAML or JSON)")
    source.add_argument("--synthetic", type=int, metavar="N", help="generate N jobs (seeded)")
    sim.add_argument("--policy", default="hypertopo", choices=sorted(POLICIES), help="placement policy")
    sim.add_argument("--seed", type=int, default=0, help="seed of the synthetic trace (default 0)")
    sim.add_argument("--gpus-per-node", type=int, default=8, help="GPUs of every modelled node (default 8)")
    sim.add_argument("--failures", type=int, metavar="N",
                     help="node failures in the synthetic trace (default: one per 50 jobs)")
    sim.add_argument("--load", type=load_value, default=0.9, metavar="L",
                     help="GPU-seconds the synthetic trace asks per GPU-second of the cluster while jobs arrive "
                          "(default 0.9; above 1 the queue grows)")
    sim.add_argument("--fault-policy", default="restart-gang", choices=("restart-pods", "restart-gang", "none"),
                     help="on_fabric_fault of the synthetic trace's jobs (default restart-gang)")
    sim.add_argument("--spare-nodes", default="", metavar="N|P%", type=spare_value,
                     help="every gang of more than one pod asks this many warm spares (hypertopo.io/spare-nodes); "
                          "the same trace is replayed without spares too, and both are printed")
    sim.add_argument("--recovery-seconds", default=0.0, type=recovery_value, metavar="S",
                     help="seconds a replaced pod or a restarted gang takes from bound to running (the gang makes no "
                          "progress meanwhile); the time to whole and the whole-time ratio count it (default 0)")
    add_common_arguments(sim, top=False)
    sim.set_defaults(handler=_simulate)


def spare_value(text: str) -> str:
    """A `hypertopo.io/spare-nodes` value given as an option (a bad one: one line, exit 2)."""
    try:
        spares.parse_request(text, 100)
    except spares.SpareRequestError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text.strip()


def load_value(text: str) -> float:
    """`--load`: above 0, at most 10 (a bad one: one line, exit 2)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text[:32]!r} is not a number") from None
    if not 0 < value <= 10:
        raise argparse.ArgumentTypeError(f"{text[:32]!r} is not above 0 and at most 10")
    return value


def recovery_value(text: str) -> float:
    """`--recovery-seconds`: 0 to a day (a bad one: one line, exit 2)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text[:32]!r} is not a number of seconds") from None
    if not 0 <= value <= 86400:
        raise argparse.ArgumentTypeError(f"{text[:32]!r} is not from 0 to 86400 seconds")
    return value


def _simulate(args: argparse.Namespace) -> int:
    try:
        model = load_model(args.model)
        nodes = model.nodes()
        trace = load_trace(args.jobs) if args.jobs else synthetic(
            nodes, args.synthetic, seed=args.seed, gpus_per_node=args.gpus_per_node, load=args.load,
            failures=None if args.failures is None else max(0, min(args.failures, 1_000_000)),
            on_fabric_fault=args.fault_policy)
    except (ModelError, TraceError) as exc:  # a file that cannot be used: input, exit 1
        print(f"hypertopo-scheduler simulate: {one_line(str(exc), width=600)}", file=sys.stderr)
        return EXIT_INPUT
    topology = build(model_hypernodes(model))
    capacity = node_capacity(nodes, args.gpus_per_node)
    simulation = Simulation(topology, capacity, trace, policy(args.policy), spare_nodes=args.spare_nodes,
                            recovery_seconds=args.recovery_seconds)
    result = {"policy": args.policy, "model": args.model, "nodes": len(nodes),
              "hypernodes": len(topology.domains), **simulation.run()}
    if args.spare_nodes:  # the same trace without spares, beside it
        result["without_spares"] = Simulation(topology, capacity, trace, policy(args.policy),
                                              recovery_seconds=args.recovery_seconds).run()
    print(json.dumps(result, indent=2))
    return 0


def _add_run(sub: argparse._SubParsersAction[argparse.ArgumentParser], load: bool) -> None:
    run = sub.add_parser("run", help="schedule pods with schedulerName hypertopo-scheduler (live cluster)",
                         description="Runs the live gang, topology-aware scheduler against the API server.")
    if not load:  # only `run` pays for importing the live scheduler and the Kubernetes client
        return
    try:
        scheduler = importlib.import_module("aggregator.placement.live.scheduler")
    except ImportError as exc:
        reason = str(exc)
        run.set_defaults(handler=lambda _args: _missing_run(reason))
        return
    scheduler.add_run_arguments(run)
    add_common_arguments(run, top=False)
    run.set_defaults(handler=scheduler.run)


def _missing_run(reason: str) -> int:
    print(f"hypertopo-scheduler run: the live scheduler is not available: {reason}", file=sys.stderr)
    return 2


def parser(*, load_run: bool = True) -> argparse.ArgumentParser:
    top: argparse.ArgumentParser = CommandParser(prog="hypertopo-scheduler",
                                  description="Gang, topology-aware placement on Volcano HyperNodes.")
    add_common_arguments(top)
    sub = top.add_subparsers(dest="command", required=True, metavar="{run,simulate}")
    _add_run(sub, load_run)
    _add_simulate(sub)
    return top


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser(load_run="run" in argv).parse_args(argv)
    setup_logging(getattr(args, "log_level", "info"), args.log_format)  # before run's basicConfig
    code: int = args.handler(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
