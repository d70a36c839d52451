"""A small HTTP/1.0 server whose cost stays bounded whatever its clients do.

Why not `http.server.ThreadingHTTPServer`: it listens with a backlog of 5 (a burst of scrapes is
refused by the kernel), gives every connection a thread before a byte has arrived (1,000 half-open
connections are 1,000 threads, several MiB of stack each, past the agent's 192 MiB limit) and
prints a traceback for every client that hangs up mid-answer. Here one thread accepts connections
and reads request heads without blocking; only a complete head (a GET has no body) reaches one of
a fixed few worker threads. So:

- the listen backlog is `BACKLOG` (the kernel caps it at net.core.somaxconn);
- at most `max_connections` are open at once; at the cap a new connection evicts the oldest one
  still sending its head after `evict_after` seconds (a slow client cannot starve a quick one), and when every open one is
  already being answered the newcomer is refused instead: either way the one closed gets `503`
  with `Retry-After: 1`, which scrapers retry;
- a head must arrive within `head_timeout` seconds and fit `max_head_bytes`, an answer must be
  taken within `write_timeout` (half-open and never-reading clients are dropped, counted);
- a client that disconnects (BrokenPipe, ConnectionReset, a timeout) is counted, never logged
  with a traceback.
"""

from __future__ import annotations

import contextlib
import io
import logging
import queue
import selectors
import socket
import threading
import time
from collections import Counter, OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger(__name__)

BACKLOG = 1024
BUSY = b"HTTP/1.0 503 Service Unavailable\r\nRetry-After: 1\r\nContent-Length: 5\r\nConnection: close\r\n\r\nbusy\n"
TIMED_OUT = b"HTTP/1.0 408 Request Timeout\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
TOO_LARGE = b"HTTP/1.0 431 Request Header Fields Too Large\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
DISCONNECTS = (BrokenPipeError, ConnectionResetError, ConnectionAbortedError, TimeoutError)

# Serves one request whose head has been read: (socket, head bytes, client address).
Answer = Callable[[socket.socket, bytes, Any], object]


@dataclass(frozen=True)
class Limits:
    """The bounds; defaults fit a metrics/health endpoint scraped every few seconds."""

    max_connections: int = 128
    workers: int = 4
    head_timeout: float = 5.0
    evict_after: float = 0.5  # a head still arriving after this long may make room for a newcomer
    write_timeout: float = 10.0
    max_head_bytes: int = 16384


@dataclass
class _Pending:
    sock: socket.socket
    address: Any
    deadline: float
    head: bytearray = field(default_factory=bytearray)


class SocketWriter(io.BufferedIOBase):
    """`wfile` for a handler: every write is a `sendall` (a plain `SocketIO.write` may send part)."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        self._sock.sendall(data)
        return len(memoryview(data))


class BoundedServer:
    """Listens on `address`; `answer` serves each complete request on a worker thread."""

    def __init__(self, address: tuple[str, int], answer: Answer, limits: Limits = Limits()) -> None:
        family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        self._listener = socket.socket(family, socket.SOCK_STREAM)
        try:
            self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self._listener.bind(address)
            self._listener.listen(BACKLOG)
        except OSError:
            self._listener.close()
            raise
        self._listener.setblocking(False)
        self.server_address: tuple[str, int] = self._listener.getsockname()[:2]
        self._answer, self.limits = answer, limits
        self.counts: Counter[str] = Counter()  # accepted, answered, evicted, refused, timed_out, ...
        self._lock = threading.Lock()
        self._open = 0  # pending + queued + being answered
        self._pending: OrderedDict[int, _Pending] = OrderedDict()  # by fd, oldest first
        self._ready: queue.Queue[_Pending | None] = queue.Queue()
        self._wake_r, self._wake_w = socket.socketpair()
        self._stopping = False
        self._threads = [threading.Thread(target=self._loop, name="http", daemon=True)]
        self._threads += [threading.Thread(target=self._work, name=f"http-{i}", daemon=True)
                          for i in range(limits.workers)]  # fmt: skip
        for thread in self._threads:
            thread.start()

    def shutdown(self) -> None:
        """Stops accepting, closes every open connection and joins the threads."""
        self._stopping = True
        self._wake_w.send(b"x")
        self._threads[0].join(timeout=5)  # the reader first: nothing is queued after the workers' stop
        for _ in range(self.limits.workers):
            self._ready.put(None)
        for thread in self._threads[1:]:
            thread.join(timeout=5)
        self._wake_r.close()
        self._wake_w.close()

    def _count(self, what: str) -> None:
        with self._lock:
            self.counts[what] += 1

    # -- the accept and head-reading thread --------------------------------------------------
    def _loop(self) -> None:
        selector = selectors.DefaultSelector()
        selector.register(self._listener, selectors.EVENT_READ, None)
        selector.register(self._wake_r, selectors.EVENT_READ, None)
        try:
            while not self._stopping:
                timeout = 0.5
                if self._pending:
                    timeout = max(0.0, min(timeout, next(iter(self._pending.values())).deadline - time.monotonic()))
                events = selector.select(timeout)
                for key, _ in events:  # heads first: a request that arrived goes before newcomers
                    if key.data is not None and key.fd in self._pending:
                        self._read(selector, key.data)
                if any(key.fileobj is self._listener for key, _ in events):
                    self._accept(selector)
                self._expire(selector)
        finally:
            for conn in list(self._pending.values()):
                self._drop(selector, conn, None)
            selector.close()
            self._listener.close()

    def _accept(self, selector: selectors.BaseSelector) -> None:
        for _ in range(64):  # a batch, then the pending heads get their turn
            try:
                sock, address = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # EMFILE and the like: leave the rest in the backlog
                self._count("accept_failed")
                log.warning("http: cannot accept: %s", exc)
                return
            sock.setblocking(False)
            self._count("accepted")
            if not self._room(selector):
                self._count("refused")
                _send_quietly(sock, BUSY)
                sock.close()
                continue
            conn = _Pending(sock, address, time.monotonic() + self.limits.head_timeout)
            self._pending[sock.fileno()] = conn
            with self._lock:
                self._open += 1
            selector.register(sock, selectors.EVENT_READ, conn)
            self._read(selector, conn)  # a scrape's request is usually there already

    def _room(self, selector: selectors.BaseSelector) -> bool:
        """Whether one more connection may open: at the cap the oldest head still arriving goes."""
        with self._lock:
            if self._open < self.limits.max_connections:
                return True
        if not self._pending or next(iter(self._pending.values())).deadline - self.limits.head_timeout > (
            time.monotonic() - self.limits.evict_after
        ):
            return False  # nothing slow to make room with: the newcomer is the one refused
        self._count("evicted")
        self._drop(selector, next(iter(self._pending.values())), BUSY)
        return True

    def _read(self, selector: selectors.BaseSelector, conn: _Pending) -> None:
        try:
            chunk = conn.sock.recv(self.limits.max_head_bytes + 1 - len(conn.head))
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            chunk = b""
        if not chunk:  # the client went away before asking
            self._count("disconnected")
            self._drop(selector, conn, None)
            return
        conn.head += chunk
        end = _head_end(conn.head)
        if end is None:
            if len(conn.head) > self.limits.max_head_bytes:
                self._count("too_large")
                self._drop(selector, conn, TOO_LARGE)
            return
        selector.unregister(conn.sock)
        del self._pending[conn.sock.fileno()]
        conn.head = conn.head[:end]
        self._ready.put(conn)

    def _expire(self, selector: selectors.BaseSelector) -> None:
        now = time.monotonic()
        while self._pending:
            oldest = next(iter(self._pending.values()))
            if oldest.deadline > now:
                return
            self._count("timed_out")
            self._drop(selector, oldest, TIMED_OUT)

    def _drop(self, selector: selectors.BaseSelector, conn: _Pending, reply: bytes | None) -> None:
        self._pending.pop(conn.sock.fileno(), None)
        selector.unregister(conn.sock)
        if reply:
            _send_quietly(conn.sock, reply)
        conn.sock.close()
        with self._lock:
            self._open -= 1

    # -- workers -----------------------------------------------------------------------------
    def _work(self) -> None:
        while (conn := self._ready.get()) is not None:
            try:
                conn.sock.setblocking(True)
                conn.sock.settimeout(self.limits.write_timeout)
                self._answer(conn.sock, bytes(conn.head), conn.address)
                self._count("answered")
            except DISCONNECTS:
                self._count("disconnected")
            except OSError as exc:
                self._count("disconnected")
                log.debug("http: %s: %s", conn.address, exc)
            except Exception as exc:  # a broken handler costs one answer, never the worker
                self._count("failed")
                log.warning("http: answering %s failed: %s", conn.address, exc)
            finally:
                _close_quietly(conn.sock)
                with self._lock:
                    self._open -= 1


def _head_end(head: bytearray) -> int | None:
    """Where the request head ends (after its blank line), or None while it has not."""
    for mark in (b"\r\n\r\n", b"\n\n"):
        at = head.find(mark)
        if at >= 0:
            return at + len(mark)
    return None


def _send_quietly(sock: socket.socket, data: bytes) -> None:
    """A best-effort, non-blocking short reply to a connection about to be closed. What the client
    had sent is read and dropped first (up to 64 KiB): closing a socket with unread input sends a
    reset, which can destroy the reply before the client reads it."""
    with contextlib.suppress(OSError):
        sock.setblocking(False)
        sock.send(data)
        sock.shutdown(socket.SHUT_WR)
        for _ in range(16):
            if not sock.recv(4096):
                break


def _close_quietly(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    sock.close()
