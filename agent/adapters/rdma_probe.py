"""RDMA round trips and bandwidth with perftest (`ib_write_lat`, `ib_write_bw`): the prober that
runs the client and the gate that starts a server for a peer that asks (agent.measure_transport
decides whether a node uses them).

Why perftest and not verbs from Python: perftest is the tool RDMA operators already trust and
read, it is packaged (Debian `perftest`), and it needs no native binding in the agent; its text is
read by agent.perftest_output, bounded.

How a measurement goes. perftest's server takes one client on a TCP port (its out-of-band
exchange of QP numbers and keys) and then the RDMA ping-pong runs between the HCAs. A perftest
server has no notion of who may connect, so the agent does not leave one running: the prober sends
the peer's probe responder (agent.adapters.udp_probe, same UDP port, same allow-list and token
bucket) a 64-byte session request (kind, iterations); the peer's gate, if it has RDMA, starts one
server for exactly that run on one of `slots` TCP ports (`--measure-port` + 1 ...), answers the
port once the server listens, and kills it after `session_timeout`. So a server exists only
while an allowed peer asked for one, for one connection, at most `slots` at once and `rate` a
second; a request from anyone else gets no answer at all. With a perftest that has
`--bind_source_ip` (23.07 and later) both sides are tied to the fabric address; 4.5 (Debian
bookworm) has none, so its server listens on every address of the node for that one connection.
After the run the gate reads the client's GID from the server's output: a RoCE v2 GID is the
client's IPv4 address, and one that is not the requester's is logged and counted (`intruded`).

A peer whose responder does not answer a session request (no RDMA there, an older agent) is
measured over UDP that round (`used` says which, and the measurement row names it); so is a run
that fails (tool error, timeout, output that does not parse: one warning line each), since a
broken tool is not a broken fabric. Every subprocess runs under a timeout and its output is
read only up to agent.perftest_output.MAX_OUTPUT.
"""

from __future__ import annotations

import logging
import os
import random
import select
import socket
import struct
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from agent.adapters.udp_probe import PACKET_SIZE, SESSION_MAGIC, UdpTransport, _bind
from agent.measure_transport import RdmaEndpoint
from agent.perftest_output import MAX_OUTPUT, PerftestOutputError, parse_bandwidth, parse_latency, remote_ipv4
from agent.probes.fabric_rtt import TokenBucket

log = logging.getLogger(__name__)

REQUEST_MAGIC, ANSWER_MAGIC = SESSION_MAGIC, b"HTRA"
_REQUEST = struct.Struct("!4sQBI")  # magic, nonce, kind, iterations
_ANSWER = struct.Struct("!4sQBH")  # magic, nonce, status, TCP port
LATENCY, BANDWIDTH = 1, 2
OK, BUSY, PENDING = 0, 1, 2  # PENDING: a server is starting, OK with its port follows
LAT_SIZE = 2  # bytes a ping-pong writes: perftest's own default for latency
BW_SIZE = 65536  # bytes a bandwidth iteration writes: perftest's default for bandwidth
MIN_ITERS = 5  # perftest refuses fewer (MIN_ITER)
MAX_ITERS = {LATENCY: 1001, BANDWIDTH: 1000}  # --measure-count + 1, --measure-burst-count
LISTEN_WAIT = 5.0  # seconds a server may take to listen (open the device, register memory) before it is killed
TOOL = {LATENCY: "ib_write_lat", BANDWIDTH: "ib_write_bw"}


@dataclass(frozen=True, slots=True)
class ToolRun:
    """A finished subprocess: exit status (None: killed by us), output, why it failed ("" if not)."""

    status: int | None
    output: str
    error: str


def run_tool(
    argv: Sequence[str], timeout: float, *, started: Callable[[subprocess.Popen[bytes]], None] | None = None
) -> ToolRun:
    """Runs argv with its output read up to MAX_OUTPUT characters and its time up to `timeout`
    seconds; killed past either. `started` (the gate's) runs once the process exists."""
    try:
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    except OSError as exc:
        return ToolRun(None, "", f"{argv[0]}: {exc.strerror or exc}")
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout
    chunks: list[bytes] = []
    error = f"{argv[0]}: interrupted"  # until read: an exception below leaves no process behind
    try:
        if started is not None:
            started(proc)
        chunks, error = _read_bounded(proc.stdout.fileno(), deadline, argv[0], timeout)
    finally:
        if error:
            _kill(proc)
        elif proc.poll() is None:
            _end(proc, deadline)
        proc.stdout.close()
    text = b"".join(chunks).decode("utf-8", errors="replace")
    status = None if error else proc.returncode
    if not error and status != 0:
        last = next((line.strip() for line in reversed(text.splitlines()) if line.strip()), "")
        error = f"{argv[0]}: exit status {status}: {last[:160]}"
    return ToolRun(status, text, error)


def _read_bounded(fd: int, deadline: float, name: str, timeout: float) -> tuple[list[bytes], str]:
    """What the process writes until it closes its output, the deadline or MAX_OUTPUT bytes."""
    chunks: list[bytes] = []
    size = 0
    while (left := deadline - time.monotonic()) > 0:
        ready, _, _ = select.select([fd], [], [], left)
        if not ready:
            continue
        data = os.read(fd, 65536)
        if not data:
            return chunks, ""
        size += len(data)
        if size > MAX_OUTPUT:
            return chunks, f"{name}: output over {MAX_OUTPUT} bytes"
        chunks.append(data)
    return chunks, f"{name}: no result within {timeout:g} s"


def _end(proc: subprocess.Popen[bytes], deadline: float) -> None:
    """Waits for the process until the deadline (it closed its output: it is exiting), else kills it."""
    try:
        proc.wait(timeout=max(0.05, deadline - time.monotonic()))
        return
    except subprocess.TimeoutExpired:
        _kill(proc)


def _kill(proc: subprocess.Popen[bytes]) -> None:
    proc.kill()
    proc.wait()
    proc.returncode = None


def supports_bind(tool: str, timeout: float = 5.0) -> bool:
    """Whether this perftest has --bind_source_ip (23.07+): its usage text names it."""
    return "--bind_source_ip" in run_tool([tool, "-h"], timeout).output


def perftest_argv(
    kind: int, endpoint: RdmaEndpoint, iterations: int, tcp_port: int, *, bind: str | None, peer: str | None
) -> list[str]:
    """perftest's command line for one run; `peer` None is the server side. Options as in
    perftest's usage (src/perftest_parameters.c): -d device, -i port, -x GID index, -n iterations,
    -s size, -p TCP port, -F (no CPU-frequency refusal), -U samples in time order, --report_gbits."""
    argv = [TOOL[kind], "-d", endpoint.device, "-i", str(endpoint.port)]
    if endpoint.gid_index is not None:
        argv += ["-x", str(endpoint.gid_index)]
    argv += ["-n", str(iterations), "-p", str(tcp_port), "-F"]
    argv += ["-s", str(LAT_SIZE), "-U"] if kind == LATENCY else ["-s", str(BW_SIZE), "--report_gbits"]
    if bind:
        argv += ["--bind_source_ip", bind]
    return [*argv, peer] if peer else argv


def listening(port: int, proc_net: Path = Path("/proc/net")) -> bool:
    """Whether a TCP socket of this network namespace listens on `port` (/proc/net/tcp{,6}:
    local address `HEX:PORT`, state 0A). Read instead of connecting, which would use up the
    server's one connection."""
    wanted = f":{port:04X}"
    for name in ("tcp", "tcp6"):
        try:
            lines = (proc_net / name).read_text().splitlines()[1:20000]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) > 3 and fields[1].endswith(wanted) and fields[3] == "0A":
                return True
    return False


class RdmaGate:
    """Starts one perftest server per accepted session request (see the module docstring)."""

    def __init__(
        self,
        endpoint: RdmaEndpoint,
        address: str,
        *,
        base_port: int,
        slots: int = 4,
        rate: float = 1.0,
        burst: float = 8.0,
        session_timeout: float = 20.0,
        bind: bool = False,
        listening: Callable[[int], bool] = listening,
    ) -> None:
        self.endpoint, self.address, self.session_timeout = endpoint, address, session_timeout
        self.ports = [base_port + i for i in range(slots)]
        self.busy: set[int] = set()
        self.bucket = TokenBucket(rate, burst)
        self.bind = address if bind else None
        self.listening = listening
        self.lock = threading.Lock()
        self.served = self.refused = self.failed = self.intruded = 0

    def handle(self, data: bytes, sender: str, reply: Callable[[bytes], None]) -> None:
        """A session request from an allowed sender (the responder checked); answers on `reply`
        from a worker thread once the server listens, or BUSY at once."""
        magic, nonce, kind, iterations = _REQUEST.unpack_from(data)
        if magic != REQUEST_MAGIC or kind not in MAX_ITERS or not MIN_ITERS <= iterations <= MAX_ITERS[kind]:
            self.refused += 1
            return
        with self.lock:
            free = [p for p in self.ports if p not in self.busy]
            if not free or not self.bucket.allow(time.monotonic()):
                reply(_answer(nonce, BUSY, 0))
                return
            port = free[0]
            self.busy.add(port)
        reply(_answer(nonce, PENDING, 0))  # a gate is here: the prober waits for the port
        argv = perftest_argv(kind, self.endpoint, iterations, port, bind=self.bind, peer=None)
        threading.Thread(
            target=self._serve, args=(argv, port, nonce, sender, reply), name="fabric-rdma-session", daemon=True
        ).start()

    def _serve(self, argv: list[str], port: int, nonce: int, sender: str, reply: Callable[[bytes], None]) -> None:
        def answer_when_listening(proc: subprocess.Popen[bytes]) -> None:
            until = time.monotonic() + LISTEN_WAIT
            while not self.listening(port):
                if time.monotonic() > until or proc.poll() is not None:
                    proc.kill()  # never left open unannounced; the prober hears BUSY and retries
                    reply(_answer(nonce, BUSY, 0))
                    return
                time.sleep(0.01)
            reply(_answer(nonce, OK, port))

        try:
            run = run_tool(argv, self.session_timeout, started=answer_when_listening)
        finally:
            with self.lock:
                self.busy.discard(port)
        if run.error:
            self.failed += 1
            log.warning("RDMA probe session for %s failed: %s", sender, run.error)
            return
        self.served += 1
        client = remote_ipv4(run.output)
        if client is not None and client != sender:
            self.intruded += 1
            log.warning("RDMA probe session asked for by %s was taken by %s", sender, client)


def _answer(nonce: int, status: int, port: int) -> bytes:
    return _ANSWER.pack(ANSWER_MAGIC, nonce, status, port).ljust(PACKET_SIZE, b"\0")


class RdmaTransport:
    """Round trips (`ib_write_lat`) and bandwidth (`ib_write_bw`) to peers, UDP (`fallback`) to a
    peer that grants no session or whose run fails. `used`: the transport of the last call."""

    name = "rdma"

    def __init__(
        self,
        endpoint: RdmaEndpoint,
        address: str,
        *,
        fallback: UdpTransport,
        port: int,
        timeout: float = 0.5,
        run_timeout: float = 15.0,
        bind: bool = False,
        interface: str | None = None,
        tries: int = 4,
    ) -> None:
        self.endpoint, self.address, self.fallback, self.port = endpoint, address, fallback, port
        self.timeout, self.run_timeout, self.tries, self.interface = timeout, run_timeout, tries, interface
        self.bind = address if bind else None
        self.used = "rdma"
        self.failures = 0
        self.last_error = ""

    def round_trips(self, peer_address: str, count: int) -> list[float | None]:
        iterations = max(MIN_ITERS, count + 1)  # perftest times iterations - 1 gaps
        run = self._run(peer_address, LATENCY, iterations)
        if run is not None:
            try:
                measured = parse_latency(run.output).round_trips_us
                self.used = "rdma"
                return [us / 1e6 for us in measured[:count]]
            except PerftestOutputError as exc:
                self._failed(peer_address, str(exc))
        self.used = "udp"
        return self.fallback.round_trips(peer_address, count)

    def burst(self, peer_address: str, count: int) -> float | None:
        """Mbit/s of a `count`-iteration ib_write_bw of 64 KiB writes (UDP train where the last
        round trips went over UDP); None when the run fails."""
        if self.used == "udp":
            return self.fallback.burst(peer_address, count)
        run = self._run(peer_address, BANDWIDTH, max(MIN_ITERS, count))
        if run is None:
            return None
        try:
            return parse_bandwidth(run.output).average_mbps
        except PerftestOutputError as exc:
            self._failed(peer_address, str(exc))
            return None

    def _run(self, peer_address: str, kind: int, iterations: int) -> ToolRun | None:
        port, answered = self._session(peer_address, kind, iterations)
        if port is None:
            if answered:  # a gate is there but never served: its server cannot start, or it is full
                self._failed(peer_address, f"its RDMA gate answered but started no server in {self.tries} tries")
            return None  # else no gate there: a peer without RDMA, measured over UDP as it should be
        argv = perftest_argv(kind, self.endpoint, iterations, port, bind=self.bind, peer=peer_address)
        run = run_tool(argv, self.run_timeout)
        if run.error:
            self._failed(peer_address, run.error)
            return None
        return run

    def _failed(self, peer: str, error: str) -> None:
        self.failures += 1
        self.last_error = error
        log.warning("RDMA probe to %s failed, measured over UDP instead: %s", peer, error)

    def _session(self, peer_address: str, kind: int, iterations: int) -> tuple[int | None, bool]:
        """(the TCP port of a server the peer started for this run, whether a gate answered at
        all); the port is None when nothing answers (no gate there) or it stays busy through
        `tries`."""
        nonce = int.from_bytes(os.urandom(8), "big")
        request = _REQUEST.pack(REQUEST_MAGIC, nonce, kind, iterations).ljust(PACKET_SIZE, b"\0")
        sock = _bind(self.address, 0, self.interface)
        answered = False
        try:
            for attempt in range(self.tries):
                answer = self._ask(sock, (peer_address, self.port), request, nonce)
                if answer is None and attempt >= 1:
                    return None, answered  # twice unanswered: no RDMA gate there
                if answer is not None and answer[0] == OK:
                    return answer[1], True
                answered = answered or answer is not None
                time.sleep(0.1 * (attempt + 1) + random.uniform(0, 0.1))  # spreads retries
            return None, answered
        finally:
            sock.close()

    def _ask(
        self, sock: socket.socket, peer: tuple[str, int], request: bytes, nonce: int
    ) -> tuple[int, int] | None:
        try:
            sock.sendto(request, peer)
        except OSError:
            return None
        deadline = time.perf_counter() + self.timeout
        while (left := deadline - time.perf_counter()) > 0:
            ready, _, _ = select.select([sock], [], [], left)
            if not ready:
                break
            data, sender = sock.recvfrom(PACKET_SIZE + 1)
            if len(data) != PACKET_SIZE or sender[0] != peer[0] or not data.startswith(ANSWER_MAGIC):
                continue
            _, answered, status, port = _ANSWER.unpack_from(data)
            if answered != nonce:
                continue
            if status == PENDING:  # the gate starts a server and answers once it listens
                deadline = time.perf_counter() + self.timeout + LISTEN_WAIT
            elif status == BUSY or (status == OK and 0 < port < 65536):
                return status, port
        return None
