"""`hypertopo-aggregator measured`: what the agents' round trips say about the HyperNode tree.

Prints the tier profile (median p50 of the pairs that meet at each tier), each HyperNode's
measured latency inside and to its siblings, the findings that contradict the tree (aggregator.
measured), and the leaf groups latency alone suggests with how sure that is, so an operator can
check that a leaf is faster than a spine and that the cabling sources put nodes where they
measure. Live it lists HyperNodes and NodeTopology reports; `--hypernodes FILE --reports PATH`
reads saved ones (a render's output, `kubectl get ... -o yaml`)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from agent.common.command_line import EXIT_INPUT, InputError, one_line
from agent.common.report import Measurement, NodeReport
from agent.measure_plan import Domain, domains_from_hypernodes
from aggregator.measured import Fold, LeafGuess, fold, infer_leaves
from aggregator.object_files import of_kind, read_objects


def add_measured_command(sub: Any) -> None:
    cmd = sub.add_parser(
        "measured",
        help="measured fabric latency per HyperNode, contradictions with the tree, leaf groups from latency",
        description="Folds the NodeTopology measurements (agents run with --measure-fabric) over the "
        "HyperNode tree: tier profile, per-HyperNode inside and to-sibling p50, findings (a leaf pair that "
        "measures like the spine, a node that measures like another leaf, lossy pairs) and leaf groups "
        "inferred from latency alone.",
    )
    cmd.add_argument(
        "--hypernodes", metavar="FILE", help="read HyperNodes from this file instead of the cluster"
    )
    cmd.add_argument("--reports", metavar="PATH", action="append", default=[],
                     help="read NodeTopology objects from this file or directory (with --hypernodes)")  # fmt: skip
    cmd.add_argument(
        "--kubeconfig", help="kubeconfig file (default: in-cluster service account, else as kubectl)"
    )
    cmd.set_defaults(func=cmd_measured)


def cmd_measured(args: argparse.Namespace) -> int:
    try:
        domains, reports = _from_files(args) if args.hypernodes else _live(args.kubeconfig)
    except InputError as exc:
        print(f"hypertopo-aggregator measured: {one_line(str(exc), width=600)}", file=sys.stderr)
        return EXIT_INPUT
    measured = measurements_of(reports)
    sys.stdout.write(
        "".join(f"{line}\n" for line in render(domains, fold(domains, measured), infer_leaves(measured)))
    )
    return 0


def _from_files(args: argparse.Namespace) -> tuple[list[Domain], Mapping[str, NodeReport]]:
    from aggregator.inputs import load_reports  # the same reader as `render`

    hypernodes = of_kind(read_objects(args.hypernodes, "HyperNode"), "HyperNode", args.hypernodes)
    return domains_from_hypernodes(hypernodes), load_reports(args.reports, strict=False)


def _live(kubeconfig: str | None) -> tuple[list[Domain], Mapping[str, NodeReport]]:
    from agent.common.adapters.kube import HYPERNODES, NODETOPOLOGIES, connect
    from agent.common.api_error import ApiError
    from agent.common.report import WireError, report_from_spec

    try:
        client = connect(kubeconfig)
        hypernodes, _ = client.list(HYPERNODES)
        topologies, _ = client.list(NODETOPOLOGIES)
    except ApiError as exc:
        raise InputError("cluster", one_line(str(exc))) from exc
    reports = {}
    for obj in topologies:
        try:
            reports[str(obj["metadata"]["name"])] = report_from_spec(obj.get("spec") or {})
        except (WireError, KeyError, TypeError):
            continue  # one unreadable report never hides the rest (the controller logs it)
    return domains_from_hypernodes(hypernodes), reports


def _us(value: int | None, samples: int) -> str:
    return f"{value} us ({samples})" if value is not None else "-"


def render(domains: Sequence[Domain], result: Fold, guess: LeafGuess) -> list[str]:
    """The report as lines: the tier profile, one line per measured HyperNode, findings, leaves."""
    lines = ["tier profile (median p50 of pairs meeting at the tier):"]
    lines += [f"  tier {tier}: {us} us" for tier, us in result.tiers.items()] or ["  (no measurements)"]
    lines.append("hypernodes (inside p50 (samples) / to siblings p50 (samples)):")
    for d in sorted(domains, key=lambda d: (-d.tier, d.name)):
        figures = result.domains.get(d.name)
        if figures:
            inside, towards = (
                (figures.inside_us, figures.inside_samples),
                (figures.sibling_us, figures.sibling_samples),
            )
            lines.append(f"  {d.name} (tier {d.tier}): {_us(*inside)} / {_us(*towards)}")
    lines.append(f"findings: {len(result.findings)}")
    lines += [f"  FabricDegraded {f.node} [{f.kind}]: {f.text}" for f in result.findings]
    leaves = {frozenset(d.children) for d in domains if d.tier == 1}
    agree = sum(1 for g in guess.groups if g in leaves)
    lines.append(
        f"leaf groups from latency alone: {len(guess.groups)} (cut {guess.cut_us:.0f} us, gap x{guess.gap:.1f}, "
        f"{guess.coverage:.0%} of nodes linked; {agree} match a tier-1 HyperNode exactly)"
    )
    lines += [f"  {', '.join(sorted(g))}" for g in guess.groups[:50]]
    return lines


def measurements_of(reports: Mapping[str, NodeReport]) -> Mapping[str, tuple[Measurement, ...]]:
    return {name: r.measurements for name, r in reports.items() if r.measurements}
