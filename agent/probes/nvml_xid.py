"""Critical XID events: which ones matter for health, and a thread that waits for them.

Why: XIDs are the driver's error reports (NVIDIA "XID Errors" catalogue). They are events, not
state: NVML delivers each once through an event set, so the agent must listen all the time and
remember what it saw. Most XIDs are application faults (13 graphics exception, 31 MMU fault, 43
stopped processing) and say nothing about the machine; a few mean the GPU or its fabric is broken
and work should move elsewhere. Those are catalogued here.

The watcher keeps cumulative counts (for the `hypertopo_` XID metrics) and a bounded history with
timestamps, so the probe can ask for the XIDs seen in the last window (health), and calls back on
each event so the agent can re-probe at once instead of at the next poll.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable, Mapping

from agent.background import BackgroundThread
from agent.probes.nvml_backend import NvmlBackend, NvmlError

log = logging.getLogger(__name__)

# The GPU needs a reset or is gone: nothing should be scheduled on it.
XID_FAILED: Mapping[int, str] = {
    48: "double-bit ECC error",
    79: "GPU has fallen off the bus",
    95: "uncontained ECC error",
    119: "GSP RPC timeout",
    120: "GSP error",
    140: "unrecovered ECC error",
}
# The GPU still works but lost capacity or reliability (links retraining, memory rows retired).
XID_DEGRADED: Mapping[int, str] = {
    63: "ECC row remapping event",
    64: "ECC row remapping failure",
    74: "NVLink error",
    92: "high single-bit ECC error rate",
    94: "contained ECC error",
}

DEFAULT_WINDOW_S = 3600.0
_HISTORY = 4096


class XidWatcher(BackgroundThread):
    """Background thread: registers for critical XID events and waits for them, until stopped."""

    thread_name = "xid-watcher"

    def __init__(
        self,
        backend: NvmlBackend,
        on_event: Callable[[int, int], None],
        *,
        poll_ms: int = 500,
        backoff_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__()
        self._backend = backend
        self._on_event = on_event
        self._poll_ms = poll_ms
        self._backoff_s = backoff_s
        self._clock = clock
        self._lock = threading.Lock()
        self._counts: dict[int, collections.Counter[int]] = {}
        self._history: collections.deque[tuple[float, int, int]] = collections.deque(maxlen=_HISTORY)
        self.error: str | None = None  # why the watcher could not start, or the last wait error
        self.wait_errors = 0

    def start(self) -> bool:
        """Registers every GPU and starts the thread; False (and `error`) when NVML refuses."""
        try:
            registered = self._backend.register_xid_events()
        except NvmlError as exc:
            self.error = str(exc)
            return False
        if registered == 0:
            self.error = "no GPU supports XID events"
            return False
        self._start_thread()
        return True

    def stop(self, timeout: float = 5.0) -> None:
        self._join(timeout)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                event = self._backend.wait_xid(self._poll_ms)
            except NvmlError as exc:
                self.wait_errors += 1
                self.error = str(exc)
                self._stop.wait(self._backoff_s)  # a lost GPU makes every wait fail: do not spin
                continue
            if event is not None:
                self._record(event.gpu_index, event.xid)

    def _record(self, gpu: int, xid: int) -> None:
        with self._lock:
            self._counts.setdefault(gpu, collections.Counter())[xid] += 1
            self._history.append((self._clock(), gpu, xid))
        try:
            self._on_event(gpu, xid)
        except Exception:  # a broken callback must not stop the watcher
            log.exception("XID callback failed for GPU %d XID %d", gpu, xid)

    def counts(self) -> dict[int, dict[int, int]]:
        """Cumulative XID counts per GPU index since the watcher started (for metrics)."""
        with self._lock:
            return {gpu: dict(counter) for gpu, counter in self._counts.items()}

    def recent(self, window_s: float = DEFAULT_WINDOW_S) -> dict[int, dict[int, int]]:
        """XID counts per GPU index over the last `window_s` seconds (for health)."""
        since = self._clock() - window_s
        out: dict[int, dict[int, int]] = {}
        with self._lock:
            for when, gpu, xid in self._history:
                if when >= since:
                    per_gpu = out.setdefault(gpu, {})
                    per_gpu[xid] = per_gpu.get(xid, 0) + 1
        return out
