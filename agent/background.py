"""What the agent's watcher threads share: one daemon thread running `_run` until stopped.

The LLDP listener, the link watcher and the XID watcher each wait on something of their own
(raw sockets, rtnetlink, NVML events); how they start and stop that is theirs, the thread's life
is this class's: started by `start()`, told to end through the `_stop` event, joined by `stop()`,
and a `with` block around it.
"""

from __future__ import annotations

import threading
from typing import Self


class BackgroundThread:
    thread_name = "background"

    def __init__(self) -> None:
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> object:
        return self._start_thread()

    def stop(self, timeout: float = 2.0) -> None:
        self._join(timeout)

    def _run(self) -> None:
        raise NotImplementedError

    def _start_thread(self) -> threading.Thread:
        self._thread = threading.Thread(target=self._run, name=self.thread_name, daemon=True)
        self._thread.start()
        return self._thread

    def _join(self, timeout: float) -> None:
        """Tells `_run` to end (the `_stop` event) and waits up to `timeout` seconds for it."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
