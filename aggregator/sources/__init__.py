"""Fabric sources: each turns one kind of input into facts in the fabric graph (aggregator.graph).

Every source (NodeTopology reports, ibnetdiscover dumps, switch LLDP tables, node-label levels,
a cluster model, UFM, ...) is one class following the `Source` protocol below, and one line in
the list `aggregator.registry.SOURCES`. That list drives everything that touches sources: the
command-line options of `render` and `run`, loading from those options, the graph build
(aggregator.pipeline), and the live controller's refreshes and worker threads. So a new source is
one new file (the class; plus an adapter module when it talks to the network) and one line in
that list; `pipeline.py`, `feed.py`, `controller.py` and `cli.py` do not change.

Writing a source, step by step:

1. `add_arguments(parser, live=...)` (classmethod): add your options. `live` is True for `run`
   (the controller) and False for `render` (files only); a source that only makes sense live may
   add nothing when `live` is False. Options shared with another source are added once, by the
   first source in the list that uses them (`--strip-domain` and `--dump-host-regex` belong to
   ibnetdiscover; read them with `ibnetdiscover.host_names_from(options)`).
2. `load(options, live=...)` (classmethod): build the source from the parsed options, or return
   None when its options were not given (the source is off). Read files here and raise your
   module's error (a ValueError subclass naming file and line) for unusable input; the command
   line turns it into exit code 1 and one line on stderr. Do no network I/O in a pure module: a
   source that polls a server lives in (or is built by) an adapter module under
   `aggregator/adapters/`, and only `aggregator.registry` imports it.
3. `apply(graph, cluster)`: add your facts to the graph. `cluster` holds what is known of the
   Kubernetes side (`reports`, `node_ready`, `node_labels`, `include_fabric_hosts`; see `Cluster`);
   the graph already holds every node (`graph.nodes`) and the facts of the sources before you in
   the list. Use the graph's builders (`add_switch_link`, `add_uplink`, `attach_guid`,
   `attach_host`, `declare`, `add_fabric_faults`, ...) and append what you could not place
   (hosts matching no node, ...) to `graph.warnings` as one line each, prefixed with your `name`.
   `apply` must be a pure function of the source's current facts and `cluster`: it is called
   again on every rebuild, so it must not consume anything.
4. Live sources only (a server polled on a period):
   * `workers(registry=..., wake=...)` returns the loops the controller runs on threads of their
     own beside reconcile, each `(name, loop(stop_event))`, returning once the event is set. A
     poller fetches on its own period there, keeps the last good snapshot (never replacing it
     with a failed or malformed answer; an exception of any kind while reading an answer is one
     failed poll, counted and stale, never the end of the loop), registers its metrics in
     `registry` (the controller's prometheus CollectorRegistry), and calls `wake()` when its facts
     changed so the controller reconciles at once instead of on its next tick.
   * `refresh(now)` is called by the controller before every reconcile (on every change and at
     least every `--period` seconds): take the poller's latest good snapshot and return True when
     it differs from the one `apply` last used (the controller then rebuilds the graph), False
     otherwise. It must be cheap (compare a generation counter) and must not block on I/O.
   * `ready()` returns False until the first good facts arrived (default True): the controller
     does not reconcile before every source is ready, so a server down at start-up never costs
     the cluster the HyperNodes its facts give.
   * `stale()` returns None while the facts are fresh, else one line saying why and since when
     ("UFM unreachable since 01:02:03, 5 polls failed; using the facts of 01:00:00"). The
     controller logs it (once per change, as an input warning) and renders with the last good
     facts: an outage of a source never costs the cluster its HyperNodes. Export the same state
     as metrics from your adapter (`hypertopo_source_stale{source=NAME}`, ...).
   Static sources (files read once) keep the defaults: no workers, `refresh` False, never stale.
5. `node_labels_matter`: True when `apply` reads `cluster.node_labels`, so that a changed Node
   label makes the live controller rebuild (labels sources); False otherwise.

`name` is the source's short name, used in warnings, logs and metric labels.
"""

from __future__ import annotations

import argparse
import re
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

if TYPE_CHECKING:
    from agent.common.report import NodeReport
    from aggregator.graph import FabricGraph

Worker = tuple[str, Callable[[threading.Event], None]]  # thread name, loop that returns once the event is set


class OptionError(ValueError):
    """An option's value a source cannot use (a bad regular expression): exit code 2, not 1."""


class SourceError(ValueError):
    """A source's input that cannot be used (a file, with its line), as `load` raised it: exit 1."""


def regex_option(text: str | None, option: str) -> str | None:
    """`text` when it compiles as a regular expression (None stays None), else OptionError."""
    if text is not None:
        try:
            re.compile(text)
        except re.error as exc:
            raise OptionError(f"{option} {text!r}: not a regular expression: {exc}") from exc
    return text


class Cluster(Protocol):
    """What a source may read of the Kubernetes side (aggregator.pipeline.ClusterInputs)."""

    @property
    def reports(self) -> Mapping[str, NodeReport]: ...  # NodeTopology reports by node name
    @property
    def node_ready(self) -> Mapping[str, bool]: ...  # the cluster's Nodes (empty: no cluster known)
    @property
    def node_labels(self) -> Mapping[str, Mapping[str, str]]: ...
    @property
    def include_fabric_hosts(self) -> bool: ...  # render without a cluster: hosts a dump names are nodes


class Source(Protocol):
    """One fabric source (see the module docstring for how to write one)."""

    name: ClassVar[str]
    node_labels_matter: ClassVar[bool] = False

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser, *, live: bool) -> None:
        """Adds this source's options to `render` (live False) or `run` (live True)."""

    @classmethod
    def load(cls, options: argparse.Namespace, *, live: bool) -> Source | None:
        """The source built from parsed options; None when they do not ask for it."""

    def apply(self, graph: FabricGraph, cluster: Cluster) -> None:
        """Adds this source's facts to the graph."""

    def refresh(self, now: float) -> bool:
        """Live sources: take the latest good facts; True when they changed (rebuild)."""
        return False

    def stale(self) -> str | None:
        """None while the facts are fresh; else why they are not (the last good ones stay in use)."""
        return None

    def ready(self) -> bool:
        """Live sources: False until the first good facts arrived (a tree built without them would
        drop the HyperNodes they give); the controller neither reconciles nor reports ready until
        every source is ready."""
        return True

    def workers(self, *, registry: Any = None, wake: Callable[[], None] = lambda: None) -> Sequence[Worker]:
        """Live sources: the loops the controller runs beside reconcile (pollers)."""
        return ()
