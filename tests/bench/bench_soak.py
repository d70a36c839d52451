"""Soak benchmark: two aggregator replicas on a real API server under churn, the leader killed.

    python tests/bench/bench_soak.py [--nodes 5000] [--churn-per-min 1] [--minutes 10] [--kill-leader-at 240]
                               [--rollout-at SECONDS]

A private etcd + kube-apiserver (tests/controlplane) holds N Nodes and a NodeTopology each, written
as kubelet and the agents write them (tests/kits/soak_kit.py); two `hypertopo-aggregator run` processes
elect a leader. Once the HyperNode tree is up, `--churn-per-min` percent of the nodes per minute
lose one RDMA port for `--flap-seconds` (the agent's report edits, down then up; one flapping node
per leaf at a time, so each HyperNode condition names exactly the node it reflects). At
`--kill-leader-at` seconds into the churn the leader gets kill -9 (a replacement replica starts once
the standby leads, as a Deployment would); `--rollout-at` restarts the replicas one by one with
SIGTERM. A watch on the HyperNodes times every write.

Printed: time to converge at start (from the replicas' start to the tree equal to a render of the
reports), HyperNode writes per minute, change -> condition latency p50/p95 (a report edit to the
leaf's Ready condition naming the node, or no longer naming it; the 5 s hold-down included),
failover (kill -> the Lease held by the standby) and catch-up (takeover -> the last edit made while
nobody led reflected), HyperNodes deleted or re-created, errors logged, each replica's RSS over
time. Exit 1 when a HyperNode was deleted or re-created, the standby did not take over, or the tree
at the end differs from a fresh `hypertopo-aggregator render` of the reports the API server holds.
"""

from __future__ import annotations

import argparse
import functools
import heapq
import os
import random
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "kits"))

from bench_memory import rss_mb
from controlplane.harness import ControlPlane, running
from soak_kit import Agents, HyperNodeWatch, Replicas, Seen, differences, fresh_render, load

from agent.common.adapters.kube import KubeClient, Resource, connect
from agent.common.api_error import ApiError

NAMESPACES = Resource("", "v1", "namespaces", "Namespace")


@dataclass
class Config:
    nodes: int = 5000
    churn_per_min: float = 1.0  # percent of the nodes
    minutes: float = 10.0
    kill_leader_at: float | None = 240.0  # seconds into the churn
    rollout_at: float | None = None
    flap_seconds: float = 30.0
    per_leaf: int = 32
    lease_flags: list[str] = field(default_factory=list)
    seed: int = 1
    settle_timeout: float = 300.0


@dataclass
class Flap:
    node: str
    leaf: str
    down_at: float
    up_at: float | None = None
    down_seen: float | None = None
    up_seen: float | None = None


@dataclass
class Result:
    converge_s: float | None = None
    first_writes_per_hypernode: float = 0.0
    hypernodes: int = 0
    writes_per_min: list[int] = field(default_factory=list)
    flaps: list[Flap] = field(default_factory=list)
    killed: str = ""
    standby: str = ""
    new_leader: str = ""
    kill_at: float | None = None
    takeover_at: float | None = None
    deleted: int = 0
    recreated: int = 0
    diffs: list[str] = field(default_factory=list)
    errors_logged: int = 0
    edit_errors: int = 0
    rss: list[tuple[float, dict[str, float]]] = field(default_factory=list)
    rollout: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return (self.converge_s is not None and not self.deleted and not self.recreated and not self.diffs
                and (self.kill_at is None or (self.takeover_at is not None and self.new_leader == self.standby)))


class Churn(threading.Thread):
    """Agents' RDMA port flaps at a steady rate, one flapping node per leaf at a time."""

    def __init__(self, agents: Agents, leaf_of: dict[str, str], cfg: Config) -> None:
        super().__init__(daemon=True)
        self.agents, self.leaf_of, self.cfg = agents, leaf_of, cfg
        self.interval = 60.0 / max(cfg.churn_per_min / 100 * cfg.nodes, 1e-9)
        self.rng = random.Random(cfg.seed)
        self.flaps: list[Flap] = []
        self.errors = 0
        self.halt = threading.Event()
        self._pending: list[tuple[float, int]] = []  # (up due, index in flaps)
        self._free_at: dict[str, float] = {}  # leaf -> when it may flap again

    def _edit(self, write: Callable[[], float]) -> float:
        while True:  # an agent retries until its write lands
            try:
                return write()
            except ApiError:
                self.errors += 1
                time.sleep(0.5)

    def _down(self, now: float) -> None:
        nodes = sorted(self.leaf_of)
        for _ in range(50):
            node = self.rng.choice(nodes)
            leaf = self.leaf_of[node]
            if self._free_at.get(leaf, 0.0) <= now:
                break
        else:
            return
        device = self.rng.randrange(len(self.agents.healthy[node].rdma))
        at = self._edit(lambda: self.agents.flap_down(node, device))
        self._free_at[leaf] = float("inf")
        self.flaps.append(Flap(node, leaf, at))
        heapq.heappush(self._pending, (time.monotonic() + self.cfg.flap_seconds, len(self.flaps) - 1))

    def _up(self) -> None:
        _, index = heapq.heappop(self._pending)
        flap = self.flaps[index]
        flap.up_at = self._edit(lambda: self.agents.flap_up(flap.node))
        self._free_at[flap.leaf] = time.monotonic() + 15.0  # the repair seen (hold-down) before the next

    def run(self) -> None:
        due = time.monotonic()
        while not self.halt.is_set():
            now = time.monotonic()
            if self._pending and self._pending[0][0] <= now:
                self._up()
            elif now >= due:
                self._down(now)
                due += self.interval
            else:
                self.halt.wait(min(due, self._pending[0][0] if self._pending else due) - now)
        while self._pending:  # the flaps under way last their whole time
            time.sleep(max(0.0, self._pending[0][0] - time.monotonic()))
            self._up()


def _wait(check: Callable[[], bool], timeout: float, step: float = 0.25) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(step)
    return False


class Soak:
    """One run: load, converge, churn with the kill (and rollout), settle, compare."""

    def __init__(self, cfg: Config, plane: ControlPlane, out: Callable[[str], None]) -> None:
        self.cfg, self.plane, self.out = cfg, plane, out
        self.kube: KubeClient = connect(str(plane.kubeconfig), pool_size=16)
        self.result = Result()

    def run(self) -> Result:
        self.kube.create(NAMESPACES, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "hypertopo-system"}})
        agents = Agents(self.kube, self.cfg.nodes, self.cfg.per_leaf)
        started = time.monotonic()
        load(self.kube, agents)
        self.out(f"loaded {self.cfg.nodes} Nodes and NodeTopologies in {time.monotonic() - started:.0f} s "
                 f"(load average {os.getloadavg()[0]:.1f})")
        want = fresh_render(self.kube, self.plane.workdir)
        leaf_of = {m["selector"]["exactMatch"]["name"]: name for name, o in want.items() if o["spec"]["tier"] == 1
                   for m in o["spec"]["members"] if m["type"] == "Node"}
        self.watch = HyperNodeWatch(self.kube)
        self.replicas = Replicas(self.plane, self.kube, self.cfg.lease_flags)
        try:
            self._converge(want)
            churn = Churn(agents, leaf_of, self.cfg)
            self.churn_start = time.time()
            churn.start()
            self._timeline()
            churn.halt.set()
            churn.join()
            self.result.flaps, self.result.edit_errors = churn.flaps, churn.errors
            self._settle()
        finally:
            self.watch.close()
            self.result.errors_logged = self.replicas.errors_logged()
            self.replicas.close()
        return self.result

    def _converge(self, want: dict[str, dict[str, Any]]) -> None:
        r = self.result
        t0 = time.time()
        first = self.replicas.start()
        _wait(lambda: self.replicas.holder() == first, 60)
        self.replicas.start()
        if _wait(lambda: not differences(self.watch.snapshot(), want), 900, 0.5):
            r.converge_s = time.time() - t0
        r.hypernodes = len(want)
        time.sleep(5)  # writes still in flight are counted with the first ones
        r.first_writes_per_hypernode = self.watch.writes_between(t0, time.time()) / max(len(want), 1)
        self.out(f"converged in {r.converge_s or float('nan'):.1f} s: {len(want)} HyperNodes, "
                 f"{r.first_writes_per_hypernode:.2f} writes per HyperNode")

    def _timeline(self) -> None:
        end = self.churn_start + self.cfg.minutes * 60
        next_rss = 0.0
        rollout: threading.Thread | None = None
        while (now := time.time()) < end:
            at = now - self.churn_start
            if self.cfg.kill_leader_at is not None and self.result.kill_at is None and at >= self.cfg.kill_leader_at:
                self._kill()
            elif self.result.kill_at is not None and self.result.takeover_at is None:
                self._takeover()
            if self.cfg.rollout_at is not None and rollout is None and at >= self.cfg.rollout_at:
                rollout = threading.Thread(target=self._rollout, daemon=True)  # RSS sampled meanwhile
                rollout.start()
            if now >= next_rss:
                self.result.rss.append((at, {n: rss_mb(p) for n, p in self.replicas.alive().items()}))
                next_rss = now + 15
            time.sleep(0.1)
        if rollout is not None:
            rollout.join()
        self.result.writes_per_min = [self.watch.writes_between(self.churn_start + 60 * m, self.churn_start + 60 * m + 60)
                                      for m in range(int(self.cfg.minutes))] or \
            [self.watch.writes_between(self.churn_start, end)]

    def _kill(self) -> None:
        r = self.result
        r.killed = self.replicas.holder()
        r.standby = next((n for n in self.replicas.alive() if n != r.killed), "")
        self.replicas.kill(r.killed)
        r.kill_at = time.time()

    def _takeover(self) -> None:
        r = self.result
        holder = self.replicas.holder()
        if holder and holder != r.killed:
            r.takeover_at, r.new_leader = time.time(), holder
            self.replicas.start()  # the Deployment's replacement pod

    def _rollout(self) -> None:
        """A Deployment's rolling update (maxSurge 1, maxUnavailable 0, the readiness probe on
        /readyz): a new replica started, once ready an old one stopped with SIGTERM (the standby
        first; the leader releases its Lease), then the next."""
        for name in sorted(self.replicas.alive(), key=lambda n: n == self.replicas.holder()):
            started = time.time()
            new = self.replicas.start()
            ready = _wait(functools.partial(self.replicas.ready, new), 900, 1.0)
            self.replicas.stop(name)
            self.result.rollout.append(f"{new} {'ready' if ready else 'NOT READY'} after {time.time() - started:.1f} s, "
                                       f"{name} stopped; lease holder now {self.replicas.holder() or '-'}")

    def _settle(self) -> None:
        want = fresh_render(self.kube, self.plane.workdir)
        started = time.monotonic()
        _wait(lambda: not differences(self.watch.snapshot(), want), self.cfg.settle_timeout, 0.5)
        self.out(f"settled {time.monotonic() - started:.1f} s after the churn stopped")
        from aggregator.adapters.kube import HYPERNODES

        have = {o["metadata"]["name"]: o for o in self.kube.list(HYPERNODES)[0]}
        self.result.diffs = differences(have, fresh_render(self.kube, self.plane.workdir))
        self.result.deleted, self.result.recreated = self.watch.deleted, self.watch.recreated
        match_flaps(self.result.flaps, self.watch.log)


def match_flaps(flaps: list[Flap], log: dict[str, list[Seen]]) -> None:
    """When each edit showed: the leaf's Ready condition naming the node (down), then not (up)."""
    for flap in flaps:
        seen = log.get(flap.leaf, [])
        tag = f"{flap.node}:"
        flap.down_seen = next((s.t for s in seen if s.t >= flap.down_at and s.ready == "False" and tag in s.message),
                              None)
        if flap.up_at is not None and flap.down_seen is not None:  # a flap never shown has no repair to show
            flap.up_seen = next((s.t for s in seen if s.t >= flap.up_at and tag not in s.message), None)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def report(cfg: Config, r: Result, out: Callable[[str], None]) -> None:
    lat = [s - e for f in r.flaps for e, s in ((f.down_at, f.down_seen), (f.up_at, f.up_seen))
           if e is not None and s is not None]
    gap = (r.kill_at or 0.0, r.takeover_at or 0.0)
    steady = [s - e for f in r.flaps for e, s in ((f.down_at, f.down_seen), (f.up_at, f.up_seen))
              if e is not None and s is not None and not gap[0] - 10 <= e <= gap[1]]
    damped = sum(1 for f in r.flaps if f.down_seen is None)
    unrepaired = sum(1 for f in r.flaps if f.down_seen is not None and f.up_seen is None)
    out(f"churn: {cfg.churn_per_min:g} % of {cfg.nodes} nodes per minute for {cfg.minutes:g} min, flaps of "
        f"{cfg.flap_seconds:g} s: {len(r.flaps)} flaps, {2 * len(r.flaps)} report edits ({r.edit_errors} retried)")
    out(f"HyperNode writes per minute: {r.writes_per_min} (of {r.hypernodes} HyperNodes)")
    out(f"change -> condition: p50 {percentile(lat, 0.5):.2f} s, p95 {percentile(lat, 0.95):.2f} s over "
        f"{len(lat)} edits; away from the failover p50 {percentile(steady, 0.5):.2f} s, p95 "
        f"{percentile(steady, 0.95):.2f} s; {damped} flaps never shown (repaired within the hold-down of a new "
        f"leader's first sight of them), {unrepaired} shown but their repair never")
    if r.kill_at is not None:
        during = [s for f in r.flaps for e, s in ((f.down_at, f.down_seen), (f.up_at, f.up_seen))
                  if e is not None and gap[0] <= e <= (r.takeover_at or float("inf"))]
        caught = max((s for s in during if s is not None), default=None)
        failover = f"{r.takeover_at - r.kill_at:.1f} s" if r.takeover_at else "NEVER"
        catch_up = f"{caught - r.takeover_at:.1f} s" if caught and r.takeover_at else "-"
        out(f"kill -9 of the leader {r.killed}: {r.standby} leads after {failover} (lease holder {r.new_leader or '-'}); "
            f"{len(during)} edits made meanwhile, the last shown {catch_up} after the takeover")
    for line in r.rollout:
        out(f"rollout: {line}")
    out(f"HyperNodes deleted: {r.deleted}, re-created: {r.recreated}; errors logged by the replicas: {r.errors_logged}")
    out(f"tree at the end vs a fresh render: {len(r.diffs)} differences{': ' + '; '.join(r.diffs[:5]) if r.diffs else ''}")
    out("RSS (MB) over time, seconds into the churn:")
    for at, rss in r.rss:
        out(f"  {at:6.0f}  " + "  ".join(f"{n} {v:6.1f}" for n, v in sorted(rss.items())))


def soak(cfg: Config, out: Callable[[str], None] = print) -> Result:
    out(f"soak: {cfg.nodes} nodes, load average {os.getloadavg()[0]:.1f} at the start, {os.cpu_count()} CPUs")
    with running() as plane:
        try:
            result = Soak(cfg, plane, out).run()
        finally:
            for proc in plane.processes:
                proc.kill()
    report(cfg, result, out)
    out(f"load average at the end {os.getloadavg()[0]:.1f}; verdict: {'OK' if result.ok else 'FAILED'}")
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--churn-per-min", type=float, default=1.0, help="percent of the nodes per minute")
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--kill-leader-at", type=float, default=None,
                        help="seconds into the churn (default: 40 %% of it); negative: no kill")
    parser.add_argument("--rollout-at", type=float, default=None, help="seconds into the churn")
    parser.add_argument("--flap-seconds", type=float, default=30.0)
    args = parser.parse_args()
    kill = args.kill_leader_at if args.kill_leader_at is not None else 0.4 * args.minutes * 60
    cfg = Config(nodes=args.nodes, churn_per_min=args.churn_per_min, minutes=args.minutes,
                 kill_leader_at=kill if kill >= 0 else None, rollout_at=args.rollout_at, flap_seconds=args.flap_seconds)
    return 0 if soak(cfg).ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
