"""Runs the agent's raw-socket LLDP listener on the interfaces named on the command line and prints
one JSON line per change of the neighbour table: {"neighbours": [...], "errors": {...}}.

The netns tests start it with `ip netns exec` so it listens inside a network namespace; it runs
until it is terminated."""

from __future__ import annotations

import dataclasses
import json
import sys
import threading
import time

from agent.adapters.raw_socket import LldpListener
from agent.probes.lldp import NeighbourTable


def main(interfaces: list[str]) -> None:
    table = NeighbourTable()
    changed = threading.Event()
    listener = LldpListener(interfaces, table, changed.set, poll_s=0.05)
    listener.start()
    deadline = time.monotonic() + 5.0
    while not (listener.listening or listener.errors) and time.monotonic() < deadline:
        time.sleep(0.01)
    changed.set()  # report the start, so the test knows whether the sockets are open
    while True:
        if not changed.wait(1.0):
            continue
        changed.clear()
        snapshot = table.snapshot(time.monotonic()).value or ()
        line = {
            "neighbours": [dataclasses.asdict(n) for n in snapshot],
            "listening": sorted(listener.listening),
            "errors": listener.errors,
            "frames": dict(table.frames),
            "rejected": dict(table.rejected),
        }
        print(json.dumps(line), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
