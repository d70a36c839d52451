"""Writes each measuring node's probe-plan row into its NodeTopology status (`status.probePlan`,
agent.common.measure_rows), where that node's agent reads it.

Why the status subresource: the report (`spec`) is the agent's, written by it alone (its admission
policy); the status is the consumers', and a merge patch of `/status` never races the agent's
writes of `spec`. A row is written only when its digest differs from the one the informer's record
keeps (`measure_rows.PLAN_DIGEST_KEY`, kept by aggregator.live.slim), so an unchanged plan costs no
write, a new leader rewrites nothing already published, and a re-plan writes only the rows that
changed. Only the leader writes (`may_write`)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

from agent.common.adapters.kube import NODETOPOLOGIES, KubeClient
from agent.common.api_error import ApiError
from agent.common.measure_rows import PLAN_DIGEST_KEY, PlanRow, to_wire

log = logging.getLogger(__name__)
MAX_WRITES = 2000  # rows a fold writes at most; the rest on the next fold (a re-plan of 10,000 nodes: 5 folds)


class ProbePlanWriter:
    def __init__(self, kube: KubeClient, *, may_write: Callable[[], bool] = lambda: True) -> None:
        self._kube, self._may_write = kube, may_write
        self.errors = 0

    def __call__(self, rows: Mapping[str, PlanRow], records: Mapping[str, Mapping[str, Any]]) -> int:
        """Writes the rows whose digest the records do not carry yet; returns the writes made."""
        if not self._may_write():
            return 0
        writes = 0
        for node, row in sorted(rows.items()):
            record = records.get(node)
            if record is None or record.get(PLAN_DIGEST_KEY) == row.digest:
                continue
            if writes >= MAX_WRITES or not self._may_write():
                break
            try:
                self._kube.patch_status(NODETOPOLOGIES, None, node, {"status": {"probePlan": to_wire(row)}})
                writes += 1
            except ApiError as exc:
                self.errors += 1
                if exc.status == 0:  # the API server away: the next fold tries again
                    log.warning("probe plan of %s not written: %s", node, exc)
                    break
                log.warning("probe plan of %s not written: %s", node, exc)
        if writes:
            log.info("probe plans: %d rows written", writes)
        return writes
