"""The publisher: keeps the node's NodeTopology object true with as few API writes as possible.

An unchanged node must cost the API server nothing, so the publisher remembers the wire form it
last applied and sends a server-side apply only when the new one differs. The API server may be
away (restarting, overloaded: unreachable, 5xx, 409, 429); then the publisher retries with
exponential backoff and jitter, and each retry sends the LATEST state, never a stale queued one:
intermediate states are simply skipped, nothing is lost that matters.

The Kubernetes client lives in `agent.common.adapters.kube`; here the API is a one-method protocol, so
the retry logic is tested with a scripted API and time is injected.

Remembering what was applied has one blind spot: someone deleting or editing the object. So every
`verify_every` seconds the publisher reads the object back (a GET, not a write) and re-applies only
if it is gone or its spec is not what was applied.

A restarted agent first reads back what its previous run published (`expect_read_back`), before it
writes anything: the runner carries that report's LLDP neighbours over (agent.collect.Prober.restore),
so a restart never publishes a report that lost its cabling, and a stored object equal to the new
report costs no write at all.
"""

from __future__ import annotations

import json
import logging
import random
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from agent.common.api_error import ApiError as ApiError  # re-exported: callers catch it from here
from agent.metrics import PublishCounts

log = logging.getLogger(__name__)


class ObjectApi(Protocol):
    def apply(self, obj: Mapping[str, Any]) -> Mapping[str, Any]:
        """Server-side apply of the whole object; raises ApiError."""

    def get(self, name: str) -> Mapping[str, Any] | None:
        """The stored object, None when it does not exist; raises ApiError."""


@dataclass(frozen=True)
class Backoff:
    """Exponential backoff with full jitter: attempt n waits uniform(base, min(cap, base * 2**n))."""

    base: float = 0.5
    cap: float = 30.0

    def delay(self, failures: int, rng: Callable[[], float] = random.random) -> float:
        ceiling = min(self.cap, self.base * 2 ** max(0, failures - 1))
        return self.base + (ceiling - self.base) * rng()


def wire_form(obj: Mapping[str, Any]) -> str:
    """Canonical text of an object: equal text means no write is needed."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"))


class Publisher:
    """Holds the desired object, the last applied wire form, and the retry schedule.

    `submit` records the latest desired object (any thread); `attempt` makes at most one apply;
    `run` loops `attempt` in a thread until stopped."""

    def __init__(
        self,
        api: ObjectApi,
        *,
        backoff: Backoff = Backoff(),
        verify_every: float | None = 300.0,
        clock: Callable[[], float] = time.monotonic,
        rng: Callable[[], float] = random.random,
    ) -> None:
        self._api = api
        self._backoff = backoff
        self._clock = clock
        self._rng = rng
        self._cond = threading.Condition()
        self._desired: Mapping[str, Any] | None = None
        self._applied: str | None = None
        self._retry_at = 0.0
        self.failures = 0  # consecutive
        self.failing_since: float | None = None
        self.last_error = ""
        self._writes = 0
        self._errors = 0
        self._verify_every = verify_every
        self._verified_at = clock()
        # (object name, callback) while the previous run's object is still to be read back
        self._read_back: tuple[str, Callable[[Mapping[str, Any] | None], None]] | None = None

    def counts(self) -> PublishCounts:
        return PublishCounts(writes=self._writes, errors=self._errors)

    @property
    def pending(self) -> bool:
        """True while the desired object differs from what was last applied."""
        with self._cond:
            return self._desired is not None and wire_form(self._desired) != self._applied

    def submit(self, obj: Mapping[str, Any]) -> None:
        with self._cond:
            self._desired = obj
            self._cond.notify_all()

    def due_in(self) -> float | None:
        """Seconds until an attempt is due (0: now), or None when nothing needs writing."""
        with self._cond:
            return self._due_in_locked()

    def expect_read_back(self, name: str, on_read: Callable[[Mapping[str, Any] | None], None]) -> None:
        """Before the first write, read object `name` back and hand it (None: there is none) to
        `on_read`, from the publisher's thread; nothing is applied until then. A transient error is
        retried with the usual backoff (the apply would fail the same way); a permanent one (no
        `get` permission) gives up with a warning and publishes without."""
        with self._cond:
            self._read_back = (name, on_read)
            self._cond.notify_all()

    def read_back(self) -> bool:
        """The pending read-back (see `expect_read_back`); True when done (or none was pending)."""
        with self._cond:
            pending = self._read_back
        if pending is None:
            return True
        name, on_read = pending
        stored: Mapping[str, Any] | None = None
        try:
            stored = self._api.get(name)
        except ApiError as exc:
            if exc.transient:
                self._record_failure(exc)
                return False
            log.warning("cannot read back NodeTopology %s, starting without its last report: %s", name, exc)
        with self._cond:
            self._read_back = None
            self.failures, self.failing_since, self._retry_at = 0, None, 0.0
            if stored is not None and self._applied is None:  # an identical first report: no write
                self._applied = wire_form(_as_applied(stored))
        try:
            on_read(stored)
        except Exception:  # a bad stored object must not stop publishing
            log.exception("NodeTopology %s read back, but its report could not be carried over", name)
        return True

    def _due_in_locked(self) -> float | None:
        if self._read_back is not None:
            return max(0.0, self._retry_at - self._clock())
        if self._desired is None or wire_form(self._desired) == self._applied:
            return None
        return max(0.0, self._retry_at - self._clock())

    def attempt(self) -> bool:
        """Applies the latest desired object if it changed; True when the server has it now.
        Nothing is applied while the previous run's object is still to be read back."""
        with self._cond:
            desired, reading = self._desired, self._read_back is not None
        if desired is None or reading:
            return False
        text = wire_form(desired)
        if text == self._applied:
            return True
        try:
            self._api.apply(desired)
        except ApiError as exc:
            self._record_failure(exc)
            return False
        with self._cond:
            self._applied, self._writes = text, self._writes + 1
            self.failures, self.failing_since, self._retry_at = 0, None, 0.0
            self._verified_at = self._clock()
        log.info("published NodeTopology %s", desired.get("metadata", {}).get("name"))
        return True

    def _record_failure(self, exc: ApiError) -> None:
        with self._cond:
            self._errors += 1
            self.failures += 1
            if self.failing_since is None:
                self.failing_since = self._clock()
            delay = self._backoff.delay(self.failures, self._rng)
            if not exc.transient:
                delay = self._backoff.cap  # will not heal by itself; retry slowly
            self._retry_at = self._clock() + delay
            self.last_error = str(exc)
        level = logging.WARNING if exc.transient else logging.ERROR
        log.log(level, "publish failed (attempt %d, retry in %.1fs): %s", self.failures, delay, exc)

    def verify(self) -> bool:
        """Reads the object back; if it was deleted or edited, forgets it so the next attempt
        re-applies. True when a re-apply is now needed."""
        with self._cond:
            desired, applied = self._desired, self._applied
            self._verified_at = self._clock()
        if desired is None or applied is None or wire_form(desired) != applied:
            return False
        name = str(desired["metadata"]["name"])
        try:
            stored = self._api.get(name)
        except ApiError as exc:
            log.debug("cannot verify NodeTopology %s: %s", name, exc)
            return False
        if stored is not None and stored.get("spec") == desired.get("spec"):
            return False
        log.warning("NodeTopology %s was %s; re-applying", name, "deleted" if stored is None else "edited")
        with self._cond:
            if self._applied == applied:
                self._applied = None
        return True

    def _verify_in_locked(self) -> float | None:
        if self._verify_every is None:
            return None
        return max(0.0, self._verified_at + self._verify_every - self._clock())

    def run(self, stop: threading.Event) -> None:
        """Publishes until `stop` is set; wakes on `submit`, `stop` (call `wake`), a retry deadline
        or the next verification."""
        while not stop.is_set():
            with self._cond:
                due, verify_in = self._due_in_locked(), self._verify_in_locked()
                if due is not None and due <= 0:
                    action = self.read_back if self._read_back is not None else self.attempt
                elif verify_in is not None and verify_in <= 0:
                    action = self.verify
                else:
                    self._cond.wait(timeout=min((t for t in (due, verify_in) if t is not None), default=None))
                    continue
            action()

    def wake(self) -> None:
        with self._cond:
            self._cond.notify_all()


def _as_applied(stored: Mapping[str, Any]) -> dict[str, Any]:
    """A stored object in the shape the agent applies (what `wire_form` compares): the server's
    metadata (resourceVersion, managedFields, owner) is not the agent's to compare."""
    name = (stored.get("metadata") or {}).get("name")
    return {
        "apiVersion": stored.get("apiVersion"),
        "kind": stored.get("kind"),
        "metadata": {"name": name},
        "spec": stored.get("spec"),
    }
