"""Job traces for the simulator: a documented file format and a seeded synthetic generator.

File format (YAML or JSON; times in seconds from the start):

    jobs:
      - name: train-a            # unique
        arrival: 0
        pods: 16                 # gang size (all pods are needed: minMember = pods unless min_member)
        gpus_per_pod: 8
        duration: 3600           # run time once all pods run
        min_member: 16           # optional
        mode: soft               # hard | soft (default hard, as Volcano)
        highest_tier: 2          # optional, number
        highest_tier_name: leaf  # optional, name (hypertopo.io/highest-tier-name)
        on_fabric_fault: restart-gang   # restart-pods | restart-gang | none (default restart-gang)
    failures:
      - at: 1200
        node: n17                # a node failure (its fabric fault), or
        hypernode: leaf-3        # a link failure: that HyperNode's Ready turns False
        duration: 600            # back after this long (default: never)

A top-level list is read as `jobs` alone.
"""

from __future__ import annotations

import json
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import yaml

FAULT_ACTIONS = ("restart-pods", "restart-gang", "none")


class TraceError(ValueError):
    """A trace file that cannot be replayed, with the reason."""


@dataclass(frozen=True)
class Job:
    name: str
    arrival: float
    pods: int
    gpus_per_pod: int
    duration: float
    min_member: int | None = None
    mode: str = "hard"
    highest_tier: int | None = None
    highest_tier_name: str | None = None
    on_fabric_fault: str = "restart-gang"


@dataclass(frozen=True)
class Failure:
    at: float
    node: str | None = None
    hypernode: str | None = None
    duration: float | None = None


@dataclass(frozen=True)
class Trace:
    jobs: tuple[Job, ...]
    failures: tuple[Failure, ...] = ()


def _job(raw: Any, index: int) -> Job:
    if not isinstance(raw, Mapping):
        raise TraceError(f"job {index}: expected a mapping")
    try:
        job = Job(name=str(raw.get("name", f"job-{index}")), arrival=float(raw.get("arrival", 0)),
                  pods=int(raw["pods"]), gpus_per_pod=int(raw.get("gpus_per_pod", 8)),
                  duration=float(raw["duration"]),
                  min_member=int(raw["min_member"]) if raw.get("min_member") is not None else None,
                  mode=str(raw.get("mode", "hard")),
                  highest_tier=int(raw["highest_tier"]) if raw.get("highest_tier") is not None else None,
                  highest_tier_name=raw.get("highest_tier_name"),
                  on_fabric_fault=str(raw.get("on_fabric_fault", "restart-gang")))
    except KeyError as exc:
        raise TraceError(f"job {index}: missing {exc.args[0]!r}") from exc
    except (TypeError, ValueError) as exc:
        raise TraceError(f"job {index}: {exc}") from exc
    if job.pods < 1 or job.gpus_per_pod < 0 or job.duration < 0 or job.mode not in ("hard", "soft"):
        raise TraceError(f"job {job.name}: pods >= 1, gpus_per_pod >= 0, duration >= 0, mode hard|soft")
    if job.on_fabric_fault not in FAULT_ACTIONS:
        raise TraceError(f"job {job.name}: on_fabric_fault must be one of {', '.join(FAULT_ACTIONS)}")
    return job


def _failure(raw: Any, index: int) -> Failure:
    if not isinstance(raw, Mapping) or "at" not in raw or ("node" in raw) == ("hypernode" in raw):
        raise TraceError(f"failure {index}: needs 'at' and exactly one of 'node' or 'hypernode'")
    duration = raw.get("duration")
    return Failure(at=float(raw["at"]), node=raw.get("node"), hypernode=raw.get("hypernode"),
                   duration=float(duration) if duration is not None else None)


def parse_trace(data: Any) -> Trace:
    if isinstance(data, list):
        data = {"jobs": data}
    if not isinstance(data, Mapping) or not isinstance(data.get("jobs"), list):
        raise TraceError("a trace is a mapping with a 'jobs' list (and optional 'failures')")
    jobs = tuple(_job(raw, i) for i, raw in enumerate(data["jobs"]))
    if len({j.name for j in jobs}) != len(jobs):
        raise TraceError("job names must be unique")
    failures = tuple(_failure(raw, i) for i, raw in enumerate(data.get("failures") or []))
    return Trace(jobs, failures)


def load_trace(path: str) -> Trace:
    try:
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
    except OSError as exc:
        raise TraceError(f"cannot read trace {path}: {exc.strerror}") from exc
    try:
        data = json.loads(text) if path.endswith(".json") else yaml.safe_load(text)
    except (ValueError, yaml.YAMLError) as exc:
        raise TraceError(f"trace {path} does not parse: {exc}") from exc
    return parse_trace(data)


def synthetic(nodes: Sequence[str], count: int, *, seed: int = 0, gpus_per_node: int = 8,
              load: float = 0.9, mean_duration: float = 3600.0, failures: int | None = None,
              on_fabric_fault: str = "restart-gang") -> Trace:
    """`count` jobs with Poisson arrivals sized for about `load` of the cluster's GPUs: mostly small
    gangs, some large (up to a quarter of the nodes), soft mode without a tier limit (so every gang
    can be judged against its lowest feasible tier), plus a few node failures."""
    rng = random.Random(seed)
    sizes = [s for s in (1, 2, 4, 8, 16, 32, 64, 128) if s <= max(1, len(nodes) // 4)]
    weights = [1.0 / (i + 1) for i in range(len(sizes))]
    drafts = []
    for i in range(count):
        pods = rng.choices(sizes, weights)[0]
        gpus = gpus_per_node if pods > 1 else rng.choice([g for g in (1, 2, 4, 8) if g <= gpus_per_node])
        drafts.append((f"job-{i:05d}", pods, gpus, rng.expovariate(1.0 / mean_duration)))
    work = sum(p * g * d for _, p, g, d in drafts) / max(1, count)
    gap = work / (len(nodes) * gpus_per_node * load)
    clock, jobs = 0.0, []
    for name, pods, gpus, duration in drafts:
        jobs.append(Job(name, round(clock, 3), pods, gpus, round(duration, 3), mode="soft",
                        on_fabric_fault=on_fabric_fault))
        clock += rng.expovariate(1.0 / gap) if gap > 0 else 0.0
    n_fail = max(1, count // 50) if failures is None else failures
    fails = tuple(Failure(round(rng.uniform(0, clock), 3), node=rng.choice(list(nodes)), duration=1800.0)
                  for _ in range(n_fail if nodes else 0))
    return Trace(tuple(jobs), tuple(sorted(fails, key=lambda f: f.at)))
