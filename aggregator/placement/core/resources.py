"""Resources as placement sees them: free capacity per node and what one pod asks for.

Placement only needs four numbers per node (GPUs `nvidia.com/gpu`, CPU in millicores, memory in
bytes, pod slots) and the same four per pod. They are parsed here from the Kubernetes objects as
the API returns them (quantity strings), so the core works on integers and never on strings.

Quantity grammar (k8s.io/apimachinery resource.Quantity): a signed decimal number, optionally in
exponent form (`1e3`), followed by a binary suffix (Ki Mi Gi Ti Pi Ei), a decimal suffix
(n u m k M G T P E) or nothing.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any

GPU = "nvidia.com/gpu"

_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {"n": Decimal("1e-9"), "u": Decimal("1e-6"), "m": Decimal("1e-3"), "": Decimal(1),
            "k": Decimal("1e3"), "M": Decimal("1e6"), "G": Decimal("1e9"), "T": Decimal("1e12"),
            "P": Decimal("1e15"), "E": Decimal("1e18")}
_QUANTITY = re.compile(r"^([+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)([a-zA-Z]*)$")


class QuantityError(ValueError):
    """A resource quantity string that Kubernetes would not accept."""


def parse_quantity(text: str | int | float) -> Decimal:
    """`"500m"` -> 0.5, `"2Gi"` -> 2147483648, `"1e3"` -> 1000, `4` -> 4."""
    if isinstance(text, (int, float)):
        return Decimal(str(text))
    match = _QUANTITY.match(text.strip())
    if not match:
        raise QuantityError(f"not a quantity: {text!r}")
    number, suffix = match.groups()
    try:
        value = Decimal(number)
    except InvalidOperation as exc:
        raise QuantityError(f"not a quantity: {text!r}") from exc
    if suffix in _BINARY:
        return value * _BINARY[suffix]
    if suffix in _DECIMAL:
        return value * _DECIMAL[suffix]
    raise QuantityError(f"unknown suffix {suffix!r} in quantity {text!r}")


def _ceil(value: Decimal) -> int:
    return math.ceil(value)


@functools.lru_cache(maxsize=4096, typed=True)
def _scaled(raw: str | int | float, scale: int) -> int:
    """`parse_quantity(raw) * scale`, rounded up, remembered: a cluster's pods and nodes repeat a
    handful of quantity strings ("100m", "64Mi", "8"), and parsing one through Decimal cost more
    than the rest of charging a pod at its assumption. A string that is no quantity raises again
    each time (errors are not cached)."""
    return _ceil(parse_quantity(raw) * scale)


@dataclass(frozen=True, order=True)
class Resources:
    """Four integer amounts; used both for free capacity and for a pod's request."""

    gpus: int = 0
    cpu_milli: int = 0
    memory: int = 0
    pods: int = 0

    def __add__(self, other: Resources) -> Resources:
        return Resources(self.gpus + other.gpus, self.cpu_milli + other.cpu_milli,
                         self.memory + other.memory, self.pods + other.pods)

    def __sub__(self, other: Resources) -> Resources:
        return Resources(self.gpus - other.gpus, self.cpu_milli - other.cpu_milli,
                         self.memory - other.memory, self.pods - other.pods)

    def covers(self, request: Resources) -> bool:
        """True when a pod asking `request` fits in this free capacity."""
        return (self.gpus >= request.gpus and self.cpu_milli >= request.cpu_milli
                and self.memory >= request.memory and self.pods >= request.pods)

    def count(self, request: Resources) -> int:
        """How many pods of shape `request` fit in this free capacity (0 when none)."""
        best = 1 << 62
        for have, want in ((self.gpus, request.gpus), (self.cpu_milli, request.cpu_milli),
                           (self.memory, request.memory), (self.pods, request.pods)):
            if want > 0:
                best = min(best, have // want if have > 0 else 0)
            elif have < 0:
                return 0
        return best

    def limiting(self, request: Resources) -> str:
        """The resource that bounds `count(request)`: `nvidia.com/gpu`, `cpu`, `memory` or `pods`."""
        names = (GPU, "cpu", "memory", "pods")
        pairs = zip(names, (self.gpus, self.cpu_milli, self.memory, self.pods),
                    (request.gpus, request.cpu_milli, request.memory, request.pods), strict=True)
        ratios = [(have // want if want > 0 else 1 << 62, name) for name, have, want in pairs]
        return min(ratios)[1]


def resources_from(amounts: Mapping[str, Any]) -> Resources:
    """A `resources.requests` / `status.allocatable` map -> Resources (CPU and memory rounded up)."""
    def amount(key: str, scale: int = 1) -> int:
        raw = amounts.get(key)
        if raw is None:
            return 0
        return _scaled(raw, scale) if isinstance(raw, (str, int, float)) else _ceil(parse_quantity(raw) * scale)

    return Resources(gpus=amount(GPU), cpu_milli=amount("cpu", 1000), memory=amount("memory"),
                     pods=amount("pods"))


def node_allocatable(node: Mapping[str, Any]) -> Resources:
    """What a Node object offers to pods (`status.allocatable`)."""
    return resources_from((node.get("status") or {}).get("allocatable") or {})


def pod_request(pod: Mapping[str, Any]) -> Resources:
    """A Pod's effective request as kube-scheduler computes it: the sum over containers, at least
    the largest init container, plus `spec.overhead`; one pod slot."""
    spec = pod.get("spec") or {}
    total = Resources()
    for container in spec.get("containers") or []:
        total += resources_from((container.get("resources") or {}).get("requests") or {})
    for init in spec.get("initContainers") or []:
        one = resources_from((init.get("resources") or {}).get("requests") or {})
        total = Resources(max(total.gpus, one.gpus), max(total.cpu_milli, one.cpu_milli),
                          max(total.memory, one.memory), 0)
    total += resources_from(spec.get("overhead") or {})
    return Resources(total.gpus, total.cpu_milli, total.memory, 1)


def free_per_node(nodes: Iterable[Mapping[str, Any]], pods: Iterable[Mapping[str, Any]]) -> dict[str, Resources]:
    """Allocatable minus the requests of the pods bound to each node (finished pods excluded)."""
    free = {node["metadata"]["name"]: node_allocatable(node) for node in nodes}
    for pod in pods:
        node_name = (pod.get("spec") or {}).get("nodeName")
        phase = (pod.get("status") or {}).get("phase")
        if node_name in free and phase not in ("Succeeded", "Failed"):
            free[node_name] = free[node_name] - pod_request(pod)
    return free
