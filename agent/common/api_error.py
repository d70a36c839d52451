"""The one error every Kubernetes API call raises, in the agent, the aggregator and the scheduler.

Why a pure module of its own: the pure layers (the agent's publisher, the aggregator's reconcile,
the Lease elector) must catch API failures without importing the client adapter; the adapter
(`agent.common.adapters.kube`) turns every HTTP answer and transport failure into this one type, so no
caller ever sees a urllib3 or `kubernetes` exception. Status 0 means the server gave no answer.
"""

from __future__ import annotations

TRANSIENT_STATUS = frozenset({409, 429})


class ApiError(Exception):
    """A failed API call: HTTP status (0 = server unreachable), the Status reason and its message."""

    def __init__(self, status: int, reason: str, message: str = "") -> None:
        super().__init__(f"{status} {reason}: {message}" if message else f"{status} {reason}")
        self.status = status
        self.reason = reason
        self.message = message

    @property
    def unreachable(self) -> bool:
        return self.status == 0

    @property
    def conflict(self) -> bool:
        return self.status == 409

    @property
    def not_found(self) -> bool:
        return self.status == 404

    @property
    def gone(self) -> bool:
        return self.status == 410

    @property
    def transient(self) -> bool:
        """Worth retrying soon: no answer, a server error, a conflict or throttling."""
        return self.status == 0 or self.status >= 500 or self.status in TRANSIENT_STATUS
