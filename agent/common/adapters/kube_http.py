"""A lean HTTP/1.1 transport to the Kubernetes API server: kept-alive TLS connections that share
one SSL context, requests written as one buffer of bytes, answers read with the few header fields
an API server's answer needs.

Why not the generated client's transport (urllib3 under `kubernetes.client.ApiClient`): on the
scheduler's bind path its per-request work (parameter sanitising, pool-manager lookups, urllib3's
header dicts, http.client's header parsing through `email.parser`) cost about 0.55 ms of CPU per
call, against about 0.1 ms here (same API server, same request, measured one after the other), and
urllib3 built a new SSL context, loading the system CA bundle, for every new connection: 40 fresh
connections were a second of CPU at a scheduler's start. The configuration (server, CA, client
certificate, token refresh) still comes from the `kubernetes` package's loaders; only the bytes
on the wire are ours.

What it speaks: HTTP/1.1 with Content-Length or chunked bodies, `Connection: close`, streamed
bodies (watches). No redirects (the API server sends none), no compression (never asked for), no
proxy (`agent.common.adapters.kube` keeps the generated transport when one is configured).

A connection that sat idle may have been closed by the server: it is checked before reuse (a
readable idle socket is an EOF, or stray bytes), and a request whose reused connection turns out
closed before any answer byte arrived (the server's idle-close racing our write) is sent once more
on a new connection. Any other failure closes the connection and raises `OSError` (a broken
answer: `ProtocolError`, one of them): the caller decides what to retry.
"""

from __future__ import annotations

import contextlib
import io
import select
import socket
import ssl
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import cast
from urllib.parse import urlsplit

Timeout = float | tuple[float, float]  # seconds, or (connect, read)
_LINE = 65536  # the longest status or header line read
_NO_BODY = frozenset({204, 304})


class ProtocolError(OSError):
    """The server's answer is not HTTP/1.x we can read (or it ended early)."""


class _Closed(ProtocolError):
    """The connection ended before the answer's first byte: the idle-close race when reused."""


# how a connection the server closed shows when we write to it or wait for its answer's first line
_IDLE_CLOSED = (_Closed, ConnectionResetError, BrokenPipeError, ssl.SSLEOFError, ssl.SSLZeroReturnError)


@dataclass(frozen=True)
class Server:
    """Where the API server is and how to reach it: host, port, TLS (None: plain HTTP), the name
    its certificate is checked against, the URL's path prefix and the Host header."""

    host: str
    port: int
    tls: ssl.SSLContext | None = None
    server_hostname: str | None = None
    prefix: str = ""
    host_header: str = ""

    @classmethod
    def from_url(cls, url: str, tls: ssl.SSLContext | None, *, server_hostname: str | None = None) -> Server:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"API server URL {url!r} is not http(s)://HOST[:PORT][/PREFIX]")
        https = parts.scheme == "https"
        if https and tls is None:
            raise ValueError(f"API server URL {url!r} is https but no TLS context was given")
        port = parts.port or (443 if https else 80)
        return cls(parts.hostname, port, tls if https else None, server_hostname or parts.hostname,
                   parts.path.rstrip("/"), parts.netloc)


def tls_context(*, verify: bool, ca_file: str | None = None, ca_data: str | bytes | None = None,
                cert_file: str | None = None, key_file: str | None = None,
                check_hostname: bool = True) -> ssl.SSLContext:
    """One client context for every connection (the CA bundle and the client key are read once)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    if verify:
        context.check_hostname = check_hostname
        if ca_file or ca_data:
            context.load_verify_locations(cafile=ca_file, cadata=ca_data)
        else:
            context.load_default_certs()
    else:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    if cert_file:
        context.load_cert_chain(cert_file, key_file)
    context.set_alpn_protocols(["http/1.1"])
    return context


def _split(timeout: Timeout) -> tuple[float, float]:
    return timeout if isinstance(timeout, tuple) else (timeout, timeout)


class _Connection:
    """One socket (TLS or plain) and its buffered reader."""

    def __init__(self, server: Server, connect_timeout: float) -> None:
        sock = socket.create_connection((server.host, server.port), timeout=connect_timeout)
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if server.tls is not None:
                sock = server.tls.wrap_socket(sock, server_hostname=server.server_hostname)
        except BaseException:
            sock.close()
            raise
        self.sock = sock
        self.reader = cast(io.BufferedReader, sock.makefile("rb", buffering=_LINE))
        self.timeout: float | None = connect_timeout
        self._poll = select.poll()
        self._poll.register(sock, select.POLLIN)

    def set_timeout(self, seconds: float) -> None:
        if seconds != self.timeout:
            self.sock.settimeout(seconds)
            self.timeout = seconds

    def dropped(self) -> bool:
        """Whether an idle connection is unusable: readable means EOF or stray bytes, except TLS
        records with no data in them (a TLS 1.3 server's session tickets after the handshake)."""
        if not self._poll.poll(0):
            return False
        if not isinstance(self.sock, ssl.SSLSocket):
            return True
        self.sock.setblocking(False)
        try:
            self.sock.recv(1)  # b"" is the EOF, bytes are stray: either way not reusable
            return True
        except ssl.SSLWantReadError:
            return False
        except OSError:
            return True
        finally:
            self.sock.settimeout(self.timeout)

    def shutdown(self) -> None:
        """Wakes a reader blocked in another thread (it then fails with an OSError)."""
        with contextlib.suppress(OSError):
            socket.socket.shutdown(self.sock, socket.SHUT_RDWR)

    def close(self) -> None:
        for part in (self.reader, self.sock):
            with contextlib.suppress(OSError):
                part.close()


@dataclass
class Response:
    """An answer: status, reason, the header fields (lower-case names) and, unless streamed, the
    whole body in `data`."""

    status: int
    reason: str
    headers: dict[str, str] = field(default_factory=dict)
    data: bytes = b""
    keep_alive: bool = True
    _stream: Iterator[bytes] | None = None
    _connection: _Connection | None = None

    def chunks(self) -> Iterator[bytes]:
        """A streamed body, piece by piece as the server sends it (then the connection closes)."""
        if self._stream is None:
            yield self.data
            return
        try:
            yield from self._stream
        finally:
            self.close()

    def shutdown(self) -> None:
        """Ends a streamed answer from another thread (its reader fails with an OSError)."""
        if self._connection is not None:
            self._connection.shutdown()

    def close(self) -> None:
        if self._connection is not None:
            self._connection.close()


def _head(reader: io.BufferedReader) -> tuple[int, str, dict[str, str], bool]:
    """Status line and header fields; `_Closed` when the connection ended before the first byte."""
    readline = reader.readline
    line = readline(_LINE)
    if not line:
        raise _Closed("connection closed by the server before an answer")
    version, _, rest = line.partition(b" ")
    code, _, reason = rest.partition(b" ")
    if not version.startswith(b"HTTP/1.") or not code.isdigit():
        raise ProtocolError(f"not an HTTP/1.x status line: {line[:80]!r}")
    headers: dict[str, str] = {}
    while True:
        line = readline(_LINE)
        if line in (b"\r\n", b"\n"):
            break
        if not line or not line.endswith(b"\n"):
            raise ProtocolError("answer ended in its header" if not line else "header line too long")
        name, _, value = line.partition(b":")
        headers[name.strip().lower().decode("latin-1")] = value.strip().decode("latin-1")
    keep_alive = version != b"HTTP/1.0" and headers.get("connection", "").lower() != "close"
    return int(code), reason.strip().decode("latin-1"), headers, keep_alive


def _chunked(reader: io.BufferedReader) -> Iterator[bytes]:
    """A chunked body (RFC 9112 section 7.1), chunk by chunk; trailers are read and dropped."""
    readline, read = reader.readline, reader.read
    while True:
        line = readline(_LINE)
        if not line:
            raise ProtocolError("connection ended inside a chunked body")
        try:
            size = int(line.split(b";", 1)[0], 16)
        except ValueError:
            raise ProtocolError(f"bad chunk size line {line[:40]!r}") from None
        if size == 0:
            while readline(_LINE) not in (b"\r\n", b"\n", b""):
                pass
            return
        data = read(size)
        if len(data) != size or read(2) != b"\r\n":
            raise ProtocolError("answer ended inside a chunk")
        yield data


def _body(reader: io.BufferedReader, method: str, status: int, headers: dict[str, str]) -> tuple[bytes, bool]:
    """The whole body, and whether the connection can carry another request after it."""
    if method == "HEAD" or status in _NO_BODY or 100 <= status < 200:
        return b"", True
    if "chunked" in headers.get("transfer-encoding", "").lower():
        return b"".join(_chunked(reader)), True
    length = headers.get("content-length")
    if length is None:
        return reader.read(), False  # delimited by the close
    data = reader.read(int(length))
    if len(data) != int(length):
        raise ProtocolError(f"answer body ended after {len(data)} of {length} bytes")
    return data, True


class Pool:
    """Kept-alive connections to one API server, safe to share between threads: at most `size`
    idle ones are kept (the most recently used is reused first); more are opened when more requests
    run at once, and closed after them."""

    def __init__(self, server: Server, *, size: int = 10) -> None:
        self.server = server
        self.size = max(1, size)
        self._idle: list[_Connection] = []
        self._lock = threading.Lock()
        self.opened = 0  # connections opened so far (tests, benchmarks)

    def _connect(self, connect_timeout: float) -> _Connection:
        connection = _Connection(self.server, connect_timeout)
        with self._lock:
            self.opened += 1
        return connection

    def _take(self, connect_timeout: float) -> tuple[_Connection, bool]:
        """An idle connection that still works (and True), else a new one (and False)."""
        while True:
            with self._lock:
                connection = self._idle.pop() if self._idle else None
            if connection is None:
                return self._connect(connect_timeout), False
            if not connection.dropped():
                return connection, True
            connection.close()

    def _give_back(self, connection: _Connection) -> None:
        with self._lock:
            if len(self._idle) < self.size:
                self._idle.append(connection)
                return
        connection.close()

    def warm(self, count: int, *, connect_timeout: float = 10.0) -> int:
        """Opens connections (TLS handshakes included) in parallel until `count` are idle, so the
        first burst of requests finds them ready; returns how many opened. Failures are left to the
        requests that follow (they report them)."""
        with self._lock:
            missing = min(count, self.size) - len(self._idle)
        opened: list[_Connection] = []

        def one() -> None:
            with contextlib.suppress(OSError):
                opened.append(self._connect(connect_timeout))

        threads = [threading.Thread(target=one, name="kube-warm", daemon=True) for _ in range(max(0, missing))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        for connection in opened:
            self._give_back(connection)
        return len(opened)

    def request(self, method: str, target: str, *, head: bytes = b"", body: bytes | None = None,
                timeout: Timeout = 10.0, stream: bool = False) -> Response:
        """One request (`target`: path and query; `head`: extra header lines, each ending CRLF).
        With `stream`, a 2xx body is left to `Response.chunks()` and the connection is the
        answer's alone; otherwise the body is read and the connection kept for the next request."""
        connect_timeout, read_timeout = _split(timeout)
        message = self._message(method, target, head, body)
        for attempt in (0, 1):
            connection, reused = self._take(connect_timeout)
            try:
                connection.set_timeout(read_timeout)
                connection.sock.sendall(message)
                status, reason, headers, keep_alive = _head(connection.reader)
            except _IDLE_CLOSED:
                connection.close()
                if reused and attempt == 0:
                    continue  # the server closed it while idle: our request never reached it
                raise
            except BaseException:
                connection.close()
                raise
            return self._finish(connection, method, Response(status, reason, headers, keep_alive=keep_alive), stream)
        raise AssertionError("unreachable")

    def _message(self, method: str, target: str, head: bytes, body: bytes | None) -> bytes:
        lines = f"{method} {self.server.prefix}{target} HTTP/1.1\r\nHost: {self.server.host_header}\r\n"
        length = b"" if body is None and method in ("GET", "HEAD") else b"Content-Length: %d\r\n" % len(body or b"")
        return lines.encode("ascii") + head + length + b"\r\n" + (body or b"")

    def _finish(self, connection: _Connection, method: str, response: Response, stream: bool) -> Response:
        try:
            if stream and 200 <= response.status <= 299:
                if "chunked" in response.headers.get("transfer-encoding", "").lower():
                    response._stream = _chunked(connection.reader)
                else:
                    response._stream = iter(lambda: connection.reader.read1(_LINE), b"")
                response._connection = connection
                return response
            response.data, reusable = _body(connection.reader, method, response.status, response.headers)
        except BaseException:
            connection.close()
            raise
        if reusable and response.keep_alive:
            self._give_back(connection)
        else:
            connection.close()
        return response

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for connection in idle:
            connection.close()
