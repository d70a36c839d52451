"""How the aggregator and the scheduler run as services: signals, worker threads, the Lease
elector and the HTTP endpoint, started and stopped in one order.

Why shared: both run as two replicas of which one writes, and both must shut down the same safe
way on SIGTERM: stop the workers first (no write starts after that), then hand the Lease back so
the standby takes over on its next retry instead of waiting out the lease, then stop the caches
and the endpoint. Which work a replica may do is its business: it reads `elector.is_leader` (or
`may_write` below) before every write.
"""

from __future__ import annotations

import argparse
import logging
import os
import platform
import signal
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from types import FrameType

from aggregator.live.leader import ElectionConfig, LeaderElector, LeaseStore

log = logging.getLogger(__name__)

Worker = tuple[str, Callable[[threading.Event], None]]  # thread name, loop that returns once the event is set


def add_election_arguments(parser: argparse.ArgumentParser, *, lease_name: str) -> None:
    """The leader-election flags, the same for every replicated command."""
    add = parser.add_argument
    add("--identity", default=None, help="leader identity (default: $POD_NAME, else hostname_pid)")
    add("--lease-name", default=lease_name, help=f"name of the leader-election Lease (default {lease_name})")
    add("--lease-duration", type=float, default=15.0, help="seconds a lease is valid (default 15)")
    add("--renew-deadline", type=float, default=10.0, help="seconds a leader keeps writing without renewing")
    add("--retry-period", type=float, default=2.0, help="seconds between acquire/renew attempts (default 2)")
    add("--no-leader-election", action="store_true", help="write without a Lease (a single replica only)")


def identity_of(args: argparse.Namespace) -> str:
    return str(args.identity or os.environ.get("POD_NAME") or f"{platform.node()}_{os.getpid()}")


def elector_from(args: argparse.Namespace, lease: LeaseStore,
                 on_change: Callable[[bool], None] | None = None) -> LeaderElector | None:
    """The elector the flags ask for (None with --no-leader-election); args.namespace holds the Lease."""
    if args.no_leader_election:
        return None
    config = ElectionConfig(identity=identity_of(args), namespace=args.namespace, name=args.lease_name,
                            lease_duration=args.lease_duration, renew_deadline=args.renew_deadline,
                            retry_period=args.retry_period)
    return LeaderElector(lease, config, on_change=on_change)


@dataclass
class Service:
    """One process's long-running parts. `run()` blocks until SIGTERM/SIGINT (or `stop` is set)."""

    workers: Sequence[Worker]
    elector: LeaderElector | None = None
    on_stop: Callable[[], None] = lambda: None  # wakes workers that wait on something else
    cleanup: Sequence[Callable[[], None]] = ()  # after the workers and the lease: caches, endpoint
    stop: threading.Event = field(default_factory=threading.Event)
    ready_to_lead: Callable[[], bool] = lambda: True  # a candidate bids for the Lease only once this holds

    def may_write(self) -> bool:
        return self.elector.is_leader() if self.elector is not None else True

    def request_stop(self, signum: int = 0, _frame: FrameType | None = None) -> None:
        if signum:
            log.info("signal %d: shutting down", signum)
        self.stop.set()
        self.on_stop()

    def run(self) -> int:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self.request_stop)
        threads = [threading.Thread(target=target, args=(self.stop,), name=name) for name, target in self.workers]
        if self.elector is not None:
            threads.append(
                threading.Thread(target=self.elector.run, args=(self.stop, self.ready_to_lead), name="leader-election")
            )
        for thread in threads:
            thread.start()
        self.stop.wait()
        for thread in threads:
            thread.join(timeout=30)
        if self.elector is not None:
            self.elector.release()
        for step in self.cleanup:
            step()
        return 0
