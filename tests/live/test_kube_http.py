"""The lean API-server transport (`agent.common.adapters.kube_http`): kept-alive connections are reused,
both body framings are read, a connection the server closed while idle is never used, the
idle-close race is retried once (only on a reused connection), broken answers fail clearly, a
streamed answer can be stopped from another thread; and against the real API server (TLS) warmed
connections carry the requests that follow, binding refusals come back with the server's reason,
and the server's certificate is verified against the kubeconfig's CA, by address or by
tls-server-name, a wrong name refused."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml
from controlplane.harness import ControlPlane

from agent.common.adapters import kube, kube_http
from agent.common.api_error import ApiError

Handler = Callable[[int, bytes], bytes | None]  # (request number on this connection, request) -> answer


def answer(body: bytes, *, chunked: bool = False, close: bool = False) -> bytes:
    head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n" + (b"Connection: close\r\n" if close else b"")
    if chunked:
        parts = [body[i:i + 3] for i in range(0, len(body), 3)]
        framed = b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in parts) + b"0\r\n\r\n"
        return head + b"Transfer-Encoding: chunked\r\n\r\n" + framed
    return head + b"Content-Length: %d\r\n\r\n" % len(body) + body


class LoopbackServer:
    """A plain-HTTP server on loopback whose answers a test scripts per connection."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.connections = 0
        self.requests: list[bytes] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        reader = conn.makefile("rb")
        with conn:
            for number in range(1_000):
                request = self._read(reader)
                if request is None:
                    return
                self.requests.append(request)
                reply = self.handler(number, request)
                if reply is None:
                    return  # close without an answer
                conn.sendall(reply)
                if b"Connection: close" in reply or b"X-Then-Close: 1" in reply:
                    return  # X-Then-Close: keep-alive as far as the client knows, then an idle close

    @staticmethod
    def _read(reader: object) -> bytes | None:
        head = b""
        while not head.endswith(b"\r\n\r\n"):
            line = reader.readline()  # type: ignore[attr-defined]
            if not line:
                return None
            head += line
        length = 0
        for line in head.split(b"\r\n"):
            if line.lower().startswith(b"content-length:"):
                length = int(line.split(b":")[1])
        return head + (reader.read(length) if length else b"")  # type: ignore[attr-defined]

    def pool(self, size: int = 4) -> kube_http.Pool:
        return kube_http.Pool(kube_http.Server.from_url(f"http://127.0.0.1:{self.port}/prefix", None), size=size)

    def close(self) -> None:
        self.listener.close()


@pytest.fixture
def serve() -> Iterator[Callable[[Handler], LoopbackServer]]:
    servers: list[LoopbackServer] = []

    def start(handler: Handler) -> LoopbackServer:
        servers.append(LoopbackServer(handler))
        return servers[-1]

    yield start
    for server in servers:
        server.close()


def test_kept_alive_connection_carries_every_request_and_both_framings_are_read(serve) -> None:  # type: ignore[no-untyped-def]
    server = serve(lambda n, _: answer(b'{"n": %d}' % n, chunked=n % 2 == 1))
    pool = server.pool()
    bodies = [pool.request("POST", "/api/v1/x", head=b"Accept: application/json\r\n", body=b"{}").data
              for _ in range(4)]
    assert bodies == [b'{"n": 0}', b'{"n": 1}', b'{"n": 2}', b'{"n": 3}']
    assert server.connections == 1 and pool.opened == 1
    first = server.requests[0]
    assert first.startswith(b"POST /prefix/api/v1/x HTTP/1.1\r\nHost: 127.0.0.1:")
    assert b"Accept: application/json\r\n" in first and b"Content-Length: 2\r\n" in first and first.endswith(b"{}")


def test_a_connection_the_server_closed_while_idle_is_not_used_again(serve, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    seen: list[bool] = []
    dropped = kube_http._Connection.dropped

    def spied(self: kube_http._Connection) -> bool:
        seen.append(dropped(self))
        return seen[-1]

    monkeypatch.setattr(kube_http._Connection, "dropped", spied)
    server = serve(lambda n, _: answer(b"{}").replace(b"\r\n\r\n", b"\r\nX-Then-Close: 1\r\n\r\n", 1))
    pool = server.pool()
    pool.request("GET", "/a")
    time.sleep(0.1)  # the server's close arrives while the connection is idle in the pool
    assert pool.request("GET", "/b").status == 200
    assert seen == [True]  # seen closed before use, so no request was written to it
    assert pool.opened == 2 and len(server.requests) == 2


def test_the_idle_close_race_is_retried_once_on_a_fresh_connection(serve) -> None:  # type: ignore[no-untyped-def]
    # request 0 of each connection is answered; request 1 on the same connection finds it closed
    # by the server without an answer, which is what an idle timeout racing our write looks like
    server = serve(lambda n, _: answer(b'{"ok": 1}') if n == 0 else None)
    pool = server.pool()
    pool.request("GET", "/a")
    assert pool.request("POST", "/b", body=b"{}").data == b'{"ok": 1}'
    assert server.connections == 2 and [r.split(b" ")[1] for r in server.requests] == [b"/prefix/a", b"/prefix/b",
                                                                                          b"/prefix/b"]


def test_a_fresh_connection_closed_without_an_answer_is_an_error_not_a_retry(serve) -> None:  # type: ignore[no-untyped-def]
    server = serve(lambda n, _: None)
    with pytest.raises(OSError, match="closed by the server before an answer"):
        server.pool().request("POST", "/b", body=b"{}")
    assert len(server.requests) == 1


def test_a_truncated_body_is_a_protocol_error(serve) -> None:  # type: ignore[no-untyped-def]
    server = serve(lambda n, _: b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\nConnection: close\r\n\r\n{}")
    with pytest.raises(kube_http.ProtocolError, match="ended after 2 of 10 bytes"):
        server.pool().request("GET", "/a")


def test_a_non_http_answer_is_a_protocol_error(serve) -> None:  # type: ignore[no-untyped-def]
    server = serve(lambda n, _: b"SSH-2.0-OpenSSH_9.6\r\n\r\n")
    with pytest.raises(kube_http.ProtocolError, match=r"not an HTTP/1\.x status line"):
        server.pool().request("GET", "/a")


def test_a_streamed_answer_yields_chunks_as_sent_and_stops_when_shut_down_from_another_thread(serve) -> None:  # type: ignore[no-untyped-def]
    release = threading.Event()

    def stream(n: int, _: bytes) -> bytes | None:
        release.wait(5)  # the answer's head and one event, then silence: a watch with nothing new
        return b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + b"6\r\n{\"a\"}\n\r\n"

    server = serve(stream)
    release.set()
    response = server.pool().request("GET", "/watch", stream=True)
    chunks = response.chunks()
    assert next(chunks) == b'{"a"}\n'
    threading.Timer(0.2, response.shutdown).start()
    started = time.monotonic()
    with pytest.raises((OSError, StopIteration)):
        next(chunks)
    assert time.monotonic() - started < 3


def test_url_without_a_usable_scheme_is_refused_clearly() -> None:
    with pytest.raises(ValueError, match="is not http"):
        kube_http.Server.from_url("ftp://example", None)
    with pytest.raises(ValueError, match="no TLS context"):
        kube_http.Server.from_url("https://example:6443", None)


@pytest.mark.apiserver
def test_warmed_tls_connections_carry_the_requests_that_follow(apiserver: ControlPlane) -> None:
    client = kube.connect(str(apiserver.kubeconfig), pool_size=4)
    assert client.http is not None
    assert client.warm(4) == 4
    time.sleep(0.2)  # the server's TLS 1.3 session tickets arrive on the idle connections
    for _ in range(8):
        assert client.get(kube.NAMESPACES, "default")["metadata"]["name"] == "default"
    assert client.http.opened == 4  # no warmed connection was mistaken for a closed one


@pytest.mark.apiserver
def test_binding_refusals_come_back_with_the_servers_reason(apiserver: ControlPlane) -> None:
    client = kube.connect(str(apiserver.kubeconfig))
    with pytest.raises(ApiError) as missing:
        client.bind("default", "no-such-pod", "uid-0", "n-0")
    assert missing.value.not_found and 'pods "no-such-pod" not found' in missing.value.message


def verifying_kubeconfig(plane: ControlPlane, name: str, server: str, **cluster: Any) -> str:
    """A kubeconfig that checks the API server's certificate against the CA the server made for
    itself (apiserver.crt holds the serving certificate and its CA)."""
    doc = yaml.safe_load(plane.kubeconfig.read_text())
    doc["clusters"][0]["cluster"] = {"server": server,
                                     "certificate-authority": str(plane.workdir / "certs" / "apiserver.crt"), **cluster}
    path = plane.workdir / f"kubeconfig-verify-{name}"
    path.write_text(yaml.safe_dump(doc))
    return str(path)


@pytest.mark.apiserver
def test_the_servers_certificate_is_verified_by_address_and_by_tls_server_name(apiserver: ControlPlane) -> None:
    port = urlsplit(apiserver.url).port
    by_ip = kube.connect(verifying_kubeconfig(apiserver, "ip", f"https://127.0.0.1:{port}"))
    assert by_ip.get(kube.NAMESPACES, "default")["metadata"]["name"] == "default"
    by_sni = kube.connect(verifying_kubeconfig(apiserver, "sni", f"https://127.0.0.1:{port}",
                                               **{"tls-server-name": "kubernetes.default.svc"}))
    assert by_sni.get(kube.NAMESPACES, "default")["metadata"]["name"] == "default"
    wrong_name = kube.connect(verifying_kubeconfig(apiserver, "wrong", f"https://127.0.0.1:{port}",
                                                   **{"tls-server-name": "not-the-api-server.example"}))
    with pytest.raises(ApiError) as refused:
        wrong_name.get(kube.NAMESPACES, "default")
    assert refused.value.unreachable and "CERTIFICATE_VERIFY_FAILED" in refused.value.message
