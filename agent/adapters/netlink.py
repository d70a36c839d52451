"""rtnetlink access (pyroute2): the link table, and a watcher that reports link changes at once.

Why a watcher: a link going down must reach the NodeTopology within a second, not at the next
poll. The kernel multicasts RTM_NEWLINK/RTM_DELLINK to the RTNLGRP_LINK group on every link state,
carrier, MTU, master or name change; the watcher listens there and calls back, and the agent
re-probes. The callback carries no data on purpose: the probe re-reads the whole table, so a
missed or coalesced event can never leave the report stale.

`dump_links` and `LinkWatcher` take an optional network namespace name (as `ip netns` knows it)
so tests can run them against a namespace of their own.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import select
import threading
from collections.abc import Callable
from typing import Any

from pyroute2 import IPRoute
from pyroute2.netlink.rtnl import RTMGRP_LINK

from agent.background import BackgroundThread
from agent.probes.net import LinkRecord

log = logging.getLogger(__name__)

LINK_EVENTS = frozenset({"RTM_NEWLINK", "RTM_DELLINK"})

# include/uapi/linux/if_arp.h ARPHRD_* -> the names `ip -j link` prints as link_type
_LINK_TYPES = {1: "ether", 32: "infiniband", 512: "ppp", 768: "ipip", 772: "loopback", 776: "sit", 778: "gre",
               823: "ip6gre", 65534: "none"}  # fmt: skip


class NetlinkUnavailable(RuntimeError):
    """rtnetlink could not be opened or read (with the reason); the net probe reports it failed."""


def _open(netns: str | None) -> Any:
    try:
        # flags=0: open an existing namespace only (pyroute2's default, O_CREAT, would make one)
        return IPRoute(netns=netns, flags=0) if netns else IPRoute()
    except Exception as exc:  # pyroute2 raises OSError, NetlinkError or its own errors
        raise NetlinkUnavailable(
            f"cannot open rtnetlink{f' in netns {netns}' if netns else ''}: {exc}"
        ) from exc


def dump_links(*, netns: str | None = None) -> list[LinkRecord]:
    """The kernel's link table (RTM_GETLINK dump) as LinkRecords, masters resolved to names."""
    ipr = _open(netns)
    try:
        messages = list(ipr.get_links())
    except Exception as exc:
        raise NetlinkUnavailable(f"RTM_GETLINK dump failed: {exc}") from exc
    finally:
        ipr.close()
    names = {msg["index"]: msg.get_attr("IFLA_IFNAME") for msg in messages}
    return [_record(msg, names) for msg in messages]


def _record(msg: Any, names: dict[int, str]) -> LinkRecord:
    info = msg.get_attr("IFLA_LINKINFO")
    master = msg.get_attr("IFLA_MASTER")
    mac = msg.get_attr("IFLA_ADDRESS")
    return LinkRecord(
        index=msg["index"],
        name=msg.get_attr("IFLA_IFNAME") or f"if{msg['index']}",
        mac=mac if mac and mac != "00:00:00:00:00:00" else None,
        oper_state=str(msg.get_attr("IFLA_OPERSTATE") or "unknown").lower(),
        mtu=msg.get_attr("IFLA_MTU"),
        kind=info.get_attr("IFLA_INFO_KIND") if info is not None else None,
        master=names.get(master) if master else None,
        link_type=_LINK_TYPES.get(msg["ifi_type"]),
        flags=msg["flags"],
        carrier_changes=msg.get_attr("IFLA_CARRIER_CHANGES"),
    )


class LinkWatcher(BackgroundThread):
    """A daemon thread that calls `on_change()` after each batch of RTM_NEWLINK/RTM_DELLINK.

    `start()` returns once the netlink socket is subscribed, so no change after it is missed;
    `stop()` wakes the thread at once (self-pipe) and joins it. A failing callback is logged and
    the watcher carries on; a socket overflow (ENOBUFS: events were dropped) counts as a change;
    a broken socket is reopened."""

    thread_name = "hypertopo-link-watcher"

    def __init__(
        self, on_change: Callable[[], None], *, netns: str | None = None, retry_s: float = 1.0
    ) -> None:
        super().__init__()
        self._on_change = on_change
        self._netns = netns
        self._retry_s = retry_s
        self._ready = threading.Event()
        self._wake_r, self._wake_w = os.pipe()
        self.error: str | None = None  # the last socket error, for logs and health
        self.events = 0  # change batches delivered (for metrics and tests)

    def start(self, timeout: float = 5.0) -> None:
        if self._thread is not None:
            raise RuntimeError("LinkWatcher already started")
        thread = self._start_thread()
        if not self._ready.wait(timeout):
            self.stop()
            raise NetlinkUnavailable(f"link watcher not subscribed after {timeout}s: {self.error}")
        if self.error and not thread.is_alive():
            raise NetlinkUnavailable(self.error)

    def stop(self, timeout: float = 2.0) -> None:
        """Stops and joins the thread; closes the wake pipe once (a second call does nothing)."""
        if self._stop.is_set():
            return
        self._stop.set()
        with contextlib.suppress(OSError):
            os.write(self._wake_w, b"x")
        self._join(timeout)
        if self._thread is None or not self._thread.is_alive():
            for fd in (self._wake_r, self._wake_w):
                with contextlib.suppress(OSError):
                    os.close(fd)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                ipr = self._subscribe()
            except NetlinkUnavailable as exc:
                self.error = str(exc)
                self._ready.set()
                log.warning("%s; retrying in %.1fs", exc, self._retry_s)
                self._stop.wait(self._retry_s)
                continue
            try:
                self._listen(ipr)
            finally:
                ipr.close()
            if self.error:
                self._stop.wait(self._retry_s)

    def _subscribe(self) -> Any:
        ipr = _open(self._netns)
        try:
            ipr.bind(groups=RTMGRP_LINK)
        except Exception as exc:
            ipr.close()
            raise NetlinkUnavailable(f"cannot join RTNLGRP_LINK: {exc}") from exc
        self.error = None
        self._ready.set()
        return ipr

    def _listen(self, ipr: Any) -> None:
        """Delivers change batches until stopped or the socket breaks (then returns to reopen)."""
        while not self._stop.is_set():
            readable, _, _ = select.select([ipr.fileno(), self._wake_r], [], [])
            if self._wake_r in readable:
                return
            try:
                changed = any(msg.get("event") in LINK_EVENTS for msg in ipr.get())
            except OSError as exc:
                if exc.errno != errno.ENOBUFS:
                    self.error = f"rtnetlink receive failed: {exc}"
                    log.warning("%s; reopening", self.error)
                    return
                changed = True  # the kernel dropped events: assume the table changed
            if changed:
                self._deliver()

    def _deliver(self) -> None:
        self.events += 1
        try:
            self._on_change()
        except Exception:
            log.exception("link change callback failed; the watcher carries on")


def supported_link_modes(name: str) -> list[str]:
    """The link modes a NIC supports (`100000baseCR4/Full`, ...) from the kernel's ethtool
    interface (pyroute2's Ethtool: ethtool netlink where the kernel has it, the ioctl otherwise);
    empty when the driver does not say (veth, IPoIB, loopback). Sysfs has the current speed only."""
    from pyroute2.ethtool import Ethtool

    ethtool = Ethtool()
    try:
        return [str(mode) for mode in ethtool.get_link_mode(name).supported_modes or ()]
    except Exception:  # NotSupportedError, a vanished interface, no permission: nothing known
        return []
    finally:
        ethtool.close()
