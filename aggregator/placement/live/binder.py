"""All-or-nothing binding of a gang through the pods/binding subresource, in parallel, bounded.

Kubernetes has no "unbind": once the API server accepts a Binding the pod is on that node. So a
gang is bound in parallel (bounded by the worker pool), and if any bind fails (the pod was
deleted or recreated — the Binding carries the pod UID as a precondition —, bound by someone
else, or the API refused) the pods that *were* bound are rolled back by deleting them, with a UID
precondition, so their controller (Job, JobSet, LeaderWorkerSet, ...) recreates them and the
gang is scheduled again whole. A bare pod has no controller: rolling it back deletes it, which
still keeps the invariant that matters — no partial gang stays bound. The caller releases its
assumptions for every pod that did not stay bound.

Answers that say "not now" rather than "no" (429 throttling, 5xx, no answer at all) are retried
with exponential back-off a few times before the gang counts as failed: rolling a whole gang back
for one throttled call would cost far more than waiting. A 409 saying the pod "is already
assigned to node" *our* node means an earlier try went through (its answer was lost) or someone
bound it exactly where we would: bound. Any other refusal (404: the pod was deleted; 409: bound
elsewhere, or the UID precondition failed) fails the gang at once, with the API server's reason.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Protocol

from agent.common.api_error import ApiError
from aggregator.placement.live.state import PodKey

log = logging.getLogger(__name__)


class BindApi(Protocol):
    def bind(self, namespace: str, name: str, uid: str, node: str) -> None: ...
    def delete_pod(self, namespace: str, name: str, uid: str, *, grace_seconds: int | None = None) -> None: ...


RETRY_STATUS = frozenset({0, 429, 500, 502, 503, 504})  # not now, rather than no


@dataclass(frozen=True)
class Backoff:
    """How often and how patiently a bind answered "not now" is tried again: `tries` in all,
    waits of `first` seconds doubling up to `cap`, each scaled by 0.5-1.5 so retries spread."""

    tries: int = 5
    first: float = 0.05
    cap: float = 1.0

    def waits(self) -> list[float]:
        return [min(self.cap, self.first * 2 ** i) * random.uniform(0.5, 1.5) for i in range(self.tries - 1)]


def already_ours(error: ApiError, node: str) -> bool:
    """A 409 whose message says the pod is already assigned to this very node (the API server's
    pods/binding wording: `pod NAME is already assigned to node "NODE"`)."""
    return error.conflict and f'is already assigned to node "{node}"' in error.message


@dataclass(frozen=True)
class BindItem:
    pod: PodKey
    uid: str
    node: str


@dataclass(frozen=True)
class BindOutcome:
    gang: PodKey
    items: tuple[BindItem, ...]
    bound: tuple[PodKey, ...]  # bound and kept
    failed: Mapping[PodKey, str]  # bind refused -> why
    rolled_back: tuple[PodKey, ...]  # bound, then deleted because the gang failed
    seconds: float

    @property
    def ok(self) -> bool:
        return not self.failed


@dataclass
class _GangJob:
    gang: PodKey
    items: tuple[BindItem, ...]
    started: float
    left: int
    bound: list[PodKey] = field(default_factory=list)
    failed: dict[PodKey, str] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)


class Binder:
    """Binds gangs on a shared pool of `workers` threads; `on_done(outcome)` is called once per
    gang, from a worker thread, after any rollback."""

    def __init__(self, api: BindApi, on_done: Callable[[BindOutcome], None], *, workers: int = 16,
                 backoff: Backoff = Backoff(), sleep: Callable[[float], None] = time.sleep) -> None:
        self.api = api
        self.on_done = on_done
        self.backoff, self._sleep = backoff, sleep
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="bind")
        self._pending = 0  # binds submitted and not finished (queued or in flight)
        self._pending_lock = threading.Lock()

    def submit(self, gang: PodKey, items: Sequence[BindItem]) -> None:
        job = _GangJob(gang, tuple(items), time.monotonic(), len(items))
        with self._pending_lock:
            self._pending += len(items)
        for item in items:
            self._pool.submit(self._bind_one, job, item)

    def busy(self) -> bool:
        """Whether binds are queued or in flight (lower-priority API writes wait for them)."""
        return self._pending > 0

    def shutdown(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)

    def bind(self, item: BindItem) -> str:
        """Binds one pod, retrying "not now" answers (see the module docstring); "" when bound,
        else why not."""
        waits = self.backoff.waits()
        for tries, wait in enumerate([*waits, None], start=1):
            try:
                self.api.bind(item.pod[0], item.pod[1], item.uid, item.node)
                return ""
            except ApiError as exc:
                if already_ours(exc, item.node):
                    return ""
                if exc.status not in RETRY_STATUS or wait is None:
                    return f"{exc} (after {tries} tries)" if tries > 1 else str(exc)
                log.debug("bind %s/%s: %s; trying again in %.2fs", *item.pod, exc, wait)
            except Exception as exc:
                return str(exc) or type(exc).__name__
            self._sleep(wait)
        raise AssertionError("unreachable")

    def _bind_one(self, job: _GangJob, item: BindItem) -> None:
        try:
            error = self.bind(item)
        finally:
            with self._pending_lock:
                self._pending -= 1
        with job.lock:
            if error:
                job.failed[item.pod] = error
            else:
                job.bound.append(item.pod)
            job.left -= 1
            last = job.left == 0
        if last:
            self._finish(job)

    def _finish(self, job: _GangJob) -> None:
        rolled_back: list[PodKey] = []
        if job.failed:
            uids = {i.pod: i.uid for i in job.items}
            for key in job.bound:
                rolled_back.append(key)
                try:
                    self.api.delete_pod(key[0], key[1], uids[key], grace_seconds=0)
                except Exception as exc:
                    log.warning("rollback of %s/%s failed: %s", key[0], key[1], exc)
        kept = () if job.failed else tuple(job.bound)
        outcome = BindOutcome(job.gang, job.items, kept, dict(job.failed), tuple(rolled_back), time.monotonic() - job.started)
        try:
            self.on_done(outcome)
        except Exception:
            log.exception("bind completion callback failed")
