"""Discrete-event replay of a job trace over a modelled cluster, one placement policy at a time.

It answers "what does topology-aware placement buy, and what does it cost" without a cluster:
events (arrivals, completions, node and HyperNode failures and recoveries) are processed in time
order; the queue is first-come-first-served with backfill (a later gang may start when an earlier
one does not fit); every placement is a real policy call, timed. Fabric faults follow each job's
`on_fabric_fault` (restart-pods re-places only the lost pods next to the rest, restart-gang
requeues the whole gang at the head of the queue, none leaves it running). Each gang started is
read in rank order: the HyperNode boundaries consecutive ranks cross, per tier, against the fewest
any rank order over the same nodes could cross (`ranks.crossings`, `ranks.minimum_crossings`).
"""

from __future__ import annotations

import heapq
import itertools
import math
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from agent.cluster_model import ClusterModel
from aggregator.pipeline import ClusterInputs, Pipeline
from aggregator.placement.core import ranks, spares
from aggregator.placement.core.free_index import FreeIndex
from aggregator.placement.core.gang import Gang, Mode, Placement, PodSpec
from aggregator.placement.core.place import describe, lowest_feasible_tier
from aggregator.placement.core.resources import Resources
from aggregator.placement.core.topology import Topology
from aggregator.placement.sim.policies import Policy
from aggregator.placement.sim.sim_recovery import WholeBook
from aggregator.placement.sim.spare_book import SpareBook
from aggregator.placement.sim.trace import Failure, Job, Trace

POD_CPU_MILLI = 1000
POD_MEMORY = 2**30


def model_hypernodes(model: ClusterModel) -> list[dict[str, Any]]:
    """The HyperNodes `hypertopo-aggregator render --model FILE` writes for `model`, built by the
    aggregator's own pipeline (its tier inference, names and members), so what the simulator and
    the benchmarks place on is what the cluster gets."""
    return Pipeline().compute(ClusterInputs({}, include_fabric_hosts=True, model=model), now=0.0).hypernodes


def node_capacity(nodes: list[str], gpus_per_node: int = 8) -> dict[str, Resources]:
    """Uniform simulated nodes: `gpus_per_node` GPUs, 128 CPUs, 2 TiB, 110 pod slots."""
    return {n: Resources(gpus_per_node, 128_000, 2 * 2**40, 110) for n in nodes}


def gang_of(job: Job) -> Gang:
    request = Resources(job.gpus_per_pod, POD_CPU_MILLI, POD_MEMORY, 1)
    pods = tuple(PodSpec(f"{job.name}-{i:04d}", request) for i in range(job.pods))
    return Gang(job.name, pods, min_member=job.min_member, mode=Mode(job.mode),
                highest_tier=job.highest_tier, highest_tier_name=job.highest_tier_name)


def mean(values: list[float] | list[int]) -> float:
    return round(sum(values) / len(values), 4) if values else 0.0


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100); 0 for no values."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]


@dataclass
class _Run:
    job: Job
    pods: dict[str, PodSpec]
    where: dict[str, str]  # pod -> node
    token: int
    ends: float  # when its work is done if it stays whole
    left: float = 0.0  # work left when a fault broke it (no progress until whole again)


@dataclass
class _Stats:
    latencies_ms: list[float] = field(default_factory=list)
    at_lowest: int = 0
    judged: int = 0
    tiers: list[int] = field(default_factory=list)
    leaves: list[int] = field(default_factory=list)
    delays: list[float] = field(default_factory=list)
    evictions: int = 0
    gpu_seconds: float = 0.0
    completed: int = 0
    crossings: dict[int, list[int]] = field(default_factory=dict)  # tier -> [crossed, minimum], summed
    at_minimum: int = 0  # gangs whose rank order crosses the fewest boundaries at every tier
    ranked: int = 0  # gangs read in rank order
    unfit_skipped: int = 0  # queued gangs no domain could hold: not offered to the policy


_FULL = Resources()  # what the index shows for a node held out of every placement


class Simulation:
    """One replay. `run()` returns the JSON-ready summary.

    Down nodes and reserved spares are held out of the free index (shown full, their real free
    capacity kept aside in `held`) rather than excluded at every decision: excluding hundreds of
    spares took them out of the index and put them back per decision, which made a busy 10k-node
    replay with spares take hours. A queued gang that no domain can hold now (an aggregate read,
    `core.lowest_feasible_tier`) is not offered to the policy, whose failure would count every node.
    `recovery_seconds`: a replaced pod, or a restarted gang, runs that long after being bound."""

    def __init__(self, topology: Topology, capacity: Mapping[str, Resources], trace: Trace,
                 policy: Policy, *, judge_tiers: bool = True, spare_nodes: str = "",
                 recovery_seconds: float = 0.0) -> None:
        self.topology, self.trace, self.policy, self.judge = topology, trace, policy, judge_tiers
        self.free = FreeIndex(topology, capacity)  # aggregates kept per bind, as the live scheduler does
        self.total_gpus = sum(r.gpus for r in capacity.values())
        self.down_nodes: set[str] = set()
        self.down_domains: set[str] = set()
        self.held: dict[str, Resources] = {}  # node held out of the index -> its real free resources
        self.queue: list[Job] = []
        self.started: set[str] = set()
        self.running: dict[str, _Run] = {}
        self.events: list[tuple[float, int, str, Any]] = []
        self.seq = itertools.count()
        self.tokens = itertools.count(1)
        self.stats = _Stats()
        self.clock = 0.0
        self.used_gpus = 0
        self.book = SpareBook(spare_nodes, capacity)  # warm spares (`spares`): who holds which, what they cost
        self.whole = WholeBook(recovery_seconds)
        self.unwhole = 0  # recoveries still open when the replay ended
        self._gangs: dict[str, Gang] = {}
        self._keys: dict[str, tuple[Resources, int] | None] = {}

    def _push(self, at: float, kind: str, payload: Any) -> None:
        heapq.heappush(self.events, (at, next(self.seq), kind, payload))

    # -- free capacity: the index, with down nodes and reserved spares held out ---------------------

    def _sync(self, nodes: Iterable[str]) -> None:
        """Hold a node out of the index while it is down or some gang's spare; put it back after."""
        for node in nodes:
            out = node in self.down_nodes or self.book.holds(node)
            if out and node not in self.held:
                self.held[node] = self.free[node]
                self.free.set(node, _FULL)
            elif not out and node in self.held:
                self.free.set(node, self.held.pop(node))

    def _take(self, run: _Run, where: Mapping[str, str], sign: int) -> None:
        for pod, node in where.items():
            request = run.pods[pod].request
            if node in self.held:
                self.held[node] = self.held[node] - request if sign > 0 else self.held[node] + request
            else:
                self.free.set(node, self.free[node] - request if sign > 0 else self.free[node] + request)
            self.used_gpus += sign * request.gpus

    def _reserve(self, gang: str, nodes: Iterable[str]) -> None:
        before = self.book.of(gang)
        self.book.reserve(gang, nodes)
        self._sync({*before, *self.book.of(gang)})

    def _release(self, gang: str) -> None:
        before = self.book.of(gang)
        self.book.release(gang)
        self._sync(before)

    # -- decisions -------------------------------------------------------------------------------

    def _decide(self, gang: Gang, *, fresh: bool = False) -> Placement:
        """The policy's placement, off other gangs' spares (held out); a gang starting (`fresh`)
        that asks spares is placed with them (`spares.place`) and holds them."""
        begin = time.perf_counter()
        domains = frozenset(self.down_domains)
        count = self.book.count(gang) if fresh else 0
        if count:
            placement, nodes = spares.place(self.topology, self.free, gang, count, excluded_domains=domains,
                                            placer=self.policy)
            if placement.ok:
                self._reserve(gang.name, nodes)
        else:
            placement = self.policy(self.topology, self.free, gang, excluded_domains=domains)
        self.stats.latencies_ms.append((time.perf_counter() - begin) * 1000)
        return placement

    def _fits(self, gang: Gang) -> tuple[bool, int | None]:
        """(whether some domain holds the gang and the spares it asks, its lowest feasible tier)."""
        domains = frozenset(self.down_domains)
        lowest = lowest_feasible_tier(self.topology, self.free, gang, excluded_domains=domains)
        count = self.book.count(gang)
        if lowest is None or not count:
            return lowest is not None, lowest
        inflated = spares.inflate(gang, count)
        return lowest_feasible_tier(self.topology, self.free, inflated, excluded_domains=domains) is not None, lowest

    def _gang(self, job: Job) -> Gang:
        """The job's gang, built once: a busy queue asks for it at every pass."""
        found = self._gangs.get(job.name)
        if found is None:
            found = self._gangs[job.name] = gang_of(job)
        return found

    def _shape_key(self, name: str, gang: Gang) -> tuple[Resources, int] | None:
        """(pod shape, spares asked) of a single-shape gang, kept: a long queue asks at every pass."""
        if name not in self._keys:
            homogeneous = bool(gang.pods) and gang.homogeneous
            self._keys[name] = (gang.pods[0].request, self.book.count(gang)) if homogeneous else None
        return self._keys[name]

    def _try_start(self, job: Job, short: dict[tuple[Resources, int], int] | None = None) -> bool:
        """Starts the job if it fits now. `short`: per (pod shape, spares asked), the fewest pods
        found not to fit during this pass over the queue; capacity only shrinks within a pass, so
        a gang of that shape asking as many or more does not fit either (a long queue costs a few
        checks per shape, not one per gang)."""
        gang = self._gang(job)
        key = self._shape_key(job.name, gang)
        if short is not None and key is not None and gang.required >= short.get(key, gang.required + 1):
            self.stats.unfit_skipped += 1
            return False
        fits, lowest = self._fits(gang)
        if not fits:
            self.stats.unfit_skipped += 1
            if short is not None and key is not None:
                short[key] = min(short.get(key, gang.required), gang.required)
            return False
        placement = self._decide(gang, fresh=True)
        if not placement.ok:
            return False
        self._start(job, gang, placement)
        if self.judge and lowest is not None and placement.tier is not None:
            self.stats.judged += 1
            self.stats.at_lowest += placement.tier <= lowest
        return True

    def _start(self, job: Job, gang: Gang, placement: Placement) -> None:
        whole_at = self.whole.started(job.name, self.clock)
        run = _Run(job, {p.name: p for p in gang.pods}, dict(placement.assignments), next(self.tokens),
                   whole_at + job.duration, left=job.duration)
        self._take(run, run.where, +1)
        self.running[job.name] = run
        if self.whole.is_broken(job.name):  # a restart after a fault: whole once it runs
            self._push(whole_at, "whole", (job.name, run.token))
        self._push(run.ends, "finish", (job.name, run.token))
        if job.name not in self.started:
            self.started.add(job.name)
            self.stats.delays.append(self.clock - job.arrival)
        self._count_crossings(placement, gang)
        if placement.tier is not None:
            self.stats.tiers.append(placement.tier)
            self.stats.leaves.append(placement.leaves)

    def _count_crossings(self, placement: Placement, gang: Gang) -> None:
        order = ranks.nodes_in_rank_order(placement.assignments, gang.pods)
        crossed, least = ranks.crossings(self.topology, order), ranks.minimum_crossings(self.topology, order)
        for tier, count in crossed.items():
            sums = self.stats.crossings.setdefault(tier, [0, 0])
            sums[0] += count
            sums[1] += least[tier]
        self.stats.at_minimum += crossed == least
        self.stats.ranked += 1

    def _drain_queue(self) -> None:
        waiting, self.queue = self.queue, []
        short: dict[tuple[Resources, int], int] = {}
        for job in waiting:
            if not self._try_start(job, short):
                self.queue.append(job)

    # -- events ----------------------------------------------------------------------------------

    def _finish(self, name: str, token: int) -> None:
        run = self.running.get(name)
        if run is None or run.token != token:
            return  # a stale completion of a gang that was restarted or delayed by a recovery
        self._take(run, run.where, -1)
        del self.running[name]
        self._release(name)
        self.whole.ended(name, self.clock)
        self.stats.completed += 1
        self._drain_queue()

    def _whole(self, name: str, token: int) -> None:
        run = self.running.get(name)
        if run is not None and run.token == token:
            self.whole.whole(name, self.clock)

    def _fault(self, failure: Failure, down: bool) -> None:
        if failure.node is not None:
            (self.down_nodes.add if down else self.down_nodes.discard)(failure.node)
            lost = {failure.node}
            self._sync(lost)
        else:
            name = failure.hypernode or ""
            (self.down_domains.add if down else self.down_domains.discard)(name)
            lost = set(self.topology.nodes_of(name)) if name in self.topology.domains else set()
        if down:
            for run in sorted(self.running.values(), key=lambda r: r.job.name):
                hit = {p: n for p, n in run.where.items() if n in lost}
                if hit:
                    self._react(run, hit)
            if failure.duration is not None:
                self._push(self.clock + failure.duration, "recover", failure)
        self._drain_queue()

    def _react(self, run: _Run, hit: dict[str, str]) -> None:
        action = run.job.on_fabric_fault
        if action == "none":
            return
        name = run.job.name
        if not self.whole.is_broken(name):
            run.left = max(0.0, run.ends - self.clock)
        self.whole.broken(name, self.clock)
        if action == "restart-pods" and self._replace_pods(run, hit):
            return
        self._take(run, run.where, -1)
        self.stats.evictions += len(run.where)
        del self.running[name]
        self._release(name)
        self.queue.insert(0, run.job)

    def _replace_pods(self, run: _Run, hit: dict[str, str]) -> bool:
        """Evict only the pods on lost nodes and place them next to the rest of the gang: on its
        spares first, the rest where the policy says (`spares.replace`). The gang runs whole
        `recovery_seconds` later and its work resumes then."""
        before = describe(self.topology, run.where).tier
        self._take(run, hit, -1)
        self.stats.evictions += len(hit)
        for pod in hit:
            del run.where[pod]
        base = self._gang(run.job)
        gang = Gang(base.name, tuple(run.pods[p] for p in sorted(hit)), mode=base.mode,
                    highest_tier=base.highest_tier, highest_tier_name=base.highest_tier_name,
                    running=dict(run.where))
        own = self.book.of(base.name)
        domains = frozenset(self.down_domains)
        placement, _ = spares.replace(self.topology, {n: self.held[n] for n in own if n in self.held}, self.free, gang,
                                      own, excluded_nodes=frozenset(self.down_nodes), excluded_domains=domains,
                                      placer=self.policy)
        placement = placement or self._decide(gang)
        if not placement.ok:
            self.book.recovered(before, None, on_spares=0, pods=len(hit))
            return False
        taken = [n for n in placement.assignments.values() if n in own]
        self._take(run, placement.assignments, +1)
        run.where.update(placement.assignments)
        self.book.used(base.name, taken)
        self._sync(taken)
        self.book.recovered(before, describe(self.topology, run.where).tier, on_spares=len(taken), pods=len(hit))
        run.token = next(self.tokens)
        whole_at = self.clock + self.whole.delay
        run.ends = whole_at + run.left
        self._push(whole_at, "whole", (base.name, run.token))
        self._push(run.ends, "finish", (base.name, run.token))
        return True

    def run(self) -> dict[str, Any]:
        for job in self.trace.jobs:
            self._push(job.arrival, "arrive", job)
        for failure in self.trace.failures:
            self._push(failure.at, "fail", failure)
        while self.events:
            at, _, kind, payload = heapq.heappop(self.events)
            self.stats.gpu_seconds += self.used_gpus * (at - self.clock)
            self.book.accrue(at - self.clock)
            self.clock = at
            if kind == "arrive":
                if not self._try_start(payload):
                    self.queue.append(payload)
            elif kind == "finish":
                self._finish(*payload)
            elif kind == "whole":
                self._whole(*payload)
            else:
                self._fault(payload, down=kind == "fail")
        self.unwhole = self.whole.close(self.clock)
        return self.summary()

    def summary(self) -> dict[str, Any]:
        s = self.stats
        return {
            "jobs": len(self.trace.jobs), "completed": s.completed, "unplaced": len(self.queue),
            "decisions": len(s.latencies_ms),
            "decision_latency_ms": {"p50": round(percentile(s.latencies_ms, 50), 3),
                                    "p99": round(percentile(s.latencies_ms, 99), 3)},
            "lowest_feasible_tier_share": round(s.at_lowest / s.judged, 4) if s.judged else None,
            "mean_lca_tier": mean(s.tiers), "mean_leaves_per_gang": mean(s.leaves),
            "gpu_utilisation": round(s.gpu_seconds / (self.total_gpus * self.clock), 4)
            if self.clock > 0 and self.total_gpus else 0.0,
            "queueing_delay_s": {"mean": mean(s.delays), "p50": round(percentile(s.delays, 50), 3),
                                 "p99": round(percentile(s.delays, 99), 3)},
            "evictions": s.evictions, "makespan_s": round(self.clock, 3),
            "rank_order_crossings": {str(t): {"tier_name": self.topology.tier_names.get(t, ""), "crossed": c,
                                              "minimum": m} for t, (c, m) in sorted(s.crossings.items())},
            "gangs_at_minimum_crossings": f"{s.at_minimum}/{s.ranked}",
            "unfit_skipped": s.unfit_skipped,
            **self.book.summary(), **self.whole.summary(self.unwhole),
        }
