#!/usr/bin/env python3
"""A stand-in for perftest's `ib_write_lat` and `ib_write_bw` (called by those names through links
in a test's bin directory), for machines without an RDMA device: this kernel has no
CONFIG_INFINIBAND, so neither soft-RoCE (rdma_rxe) nor any HCA can exist here.

It sits exactly behind the real tools' interface as the agent uses it, written from perftest's
source (linux-rdma/perftest v4.5-0.17, Debian bookworm's `perftest` 4.5+0.17-1), not copied:
- command line: `src/perftest_parameters.c` `parser()` / `usage()`: -d/--ib-dev, -i/--ib-port,
  -x/--gid-index, -n/--iters (at least 5), -s/--size, -p/--port, -F/--CPU-freq,
  -U/--report-unsorted, --report_gbits, --bind_source_ip (23.07+), -h; anything else is refused
  with the real tool's "unrecognized option" and " Invalid Command or flag." lines, exit 1; one
  positional argument (the server's address) makes a client;
- device: `-d` must name a device under $HYPERTOPO_STANDIN_SYSFS/class/infiniband, else the real
  tool's " Unable to find the Infiniband/RoCE device", exit 1;
- server: prints "* Waiting for client to connect... *", takes one TCP connection on -p (default
  18515) and exits after one run, as `ethernet_server_connect` does;
- output: `ctx_print_test_info`, `ctx_print_pingpong_data` (" local address: LID ..." and
  " GID: " as 16 decimal bytes, the RoCE v2 GID of each side's IPv4 address), RESULT_LINE,
  RESULT_FMT_LAT / REPORT_FMT_LAT with the `-U` block ("#, usec", then "%d, %g" half round trips
  in time order) from `print_report_lat`, RESULT_FMT(_G) / REPORT_FMT from `print_report_bw`.

What it cannot be is RDMA: the ping-pong and the bandwidth run go over the TCP connection of the
exchange (TCP_NODELAY), so what it times is the lab's paths, not an HCA's. Latencies are halved
as perftest halves them (rtt_factor 2 for write), so the agent's conversion is tested against
the same meaning. HYPERTOPO_STANDIN_LOG: append each invocation's argv (tests check what ran).
"""

from __future__ import annotations

import itertools
import math
import os
import socket
import sys
import time
from pathlib import Path

LINE = "-" * 87
LAT_HEADER = (
    " #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    t_stdev[usec]"
    "   99% percentile[usec]   99.9% percentile[usec] "
)
BW_HEADERS = {
    True: " #bytes     #iterations    BW peak[Gb/sec]    BW average[Gb/sec]   MsgRate[Mpps]",
    False: " #bytes     #iterations    BW peak[MiB/sec]    BW average[MiB/sec]   MsgRate[Mpps]",
}
WITH_VALUE = {"-d": "dev", "--ib-dev": "dev", "-i": "ib_port", "--ib-port": "ib_port", "-x": "gid",
              "--gid-index": "gid", "-n": "iters", "--iters": "iters", "-s": "size", "--size": "size",
              "-p": "port", "--port": "port", "--bind_source_ip": "bind"}  # fmt: skip
FLAGS = {"-F": "cpu_freq", "--CPU-freq": "cpu_freq", "-U": "unsorted", "--report-unsorted": "unsorted",
         "--report_gbits": "gbits"}  # fmt: skip


def refuse(tool: str, what: str) -> None:
    print(f"{tool}: {what}", file=sys.stderr)
    print(" Invalid Command or flag.\n Please check command line and run again.\n", file=sys.stderr)
    sys.exit(1)


def parse(tool: str, argv: list[str]) -> dict:
    opts: dict = {"port": "18515", "host": None}
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg in ("-h", "--help"):
            usage(tool)
        if arg in WITH_VALUE:
            if i + 1 >= len(argv):
                refuse(tool, f"option requires an argument -- '{arg.lstrip('-')}'")
            opts[WITH_VALUE[arg]] = argv[i + 1]
            i += 2
            continue
        if arg in FLAGS:
            opts[FLAGS[arg]] = True
        elif arg.startswith("-"):
            refuse(tool, f"unrecognized option '{arg}'")
        elif opts["host"] is None:
            opts["host"] = arg
        else:
            refuse(tool, f"extra argument '{arg}'")
        i += 1
    validate(opts)
    return opts


def usage(tool: str) -> None:
    print(f"Usage:\n  {tool}            start a server and wait for connection")
    print(f"  {tool} <host>     connect to server at <host>\n")
    print("  -n, --iters=<iters>  Number of exchanges (at least 5, default 1000)")
    print("      --bind_source_ip  Source IP of the interface used for connection establishment.")
    sys.exit(0)


def validate(opts: dict) -> None:
    for key in ("iters", "size", "port", "ib_port", "gid"):
        if key in opts and not str(opts[key]).isdigit():
            print(f" Invalid value for {key}", file=sys.stderr)
            sys.exit(1)
    if int(opts.get("iters", 1000)) < 5:
        print(" Iteration num should be at least 5", file=sys.stderr)
        sys.exit(1)


def gid(address: str) -> str:
    octets = [0] * 10 + [255, 255] + [int(b) for b in address.split(".")]
    return ":".join(f"{b:02d}" for b in octets)


def banner(tool: str, opts: dict, me: str, peer: str, client: bool) -> None:
    kind = "Latency" if tool.endswith("lat") else "BW"
    print(LINE)
    print(f"                    RDMA_Write {kind} Test")
    print(f" Dual-port       : OFF\t\tDevice         : {opts['dev']}")
    print(" Number of qps   : 1\t\tTransport type : IB")
    print(" Connection type : RC\t\tUsing SRQ      : OFF")
    print(" PCIe relax order: OFF")
    print(" ibv_wr* API     : OFF")
    if client:
        print(f" TX depth        : {1 if kind == 'Latency' else 128}")
    print(" Mtu             : 1024[B]")
    print(" Link type       : Ethernet")
    print(f" GID index       : {opts.get('gid', 0)}")
    print(" Max inline data : 220[B]" if kind == "Latency" else " Max inline data : 0[B]")
    print(" rdma_cm QPs\t : OFF")
    print(" Data ex. method : Ethernet")
    print(LINE)
    for side, address, qpn in (("local", me, 0x11), ("remote", peer, 0x12)):
        print(f" {side} address: LID 0000 QPN {qpn:#06x} PSN 0x2a1b3c RKey 0x000204 VAddr 0x0055f0c8e9a000")
        print(f" GID: {gid(address)}")


def fmt_g(value: float) -> str:
    return f"{value:g}"


def latency_report(opts: dict, deltas_s: list[float]) -> None:
    """print_report_lat: half round trips (rtt_factor 2), unsorted block, then the summary."""
    half = [d * 1e6 / 2 for d in deltas_s]
    if opts.get("unsorted"):
        print("#, usec")
        for i, value in enumerate(half, 1):
            print(f"{i}, {fmt_g(value)}")
        print(LINE)
        print(LAT_HEADER)
    ordered = sorted(half)
    n = len(ordered) - 2  # LAT_MEASURE_TAIL
    median = (ordered[n // 2] + ordered[n // 2 - 1]) / 2 if (n - 1) % 2 else ordered[n // 2]
    average = sum(ordered[:n]) / n
    stdev = math.sqrt(sum(int(average - v) ** 2 for v in ordered[:n]) / n)
    p99, p999 = ordered[math.ceil(n * 0.99)], ordered[math.ceil(n * 0.999)]
    print(f" {opts['size']:<7} {opts['iters']}          {ordered[0]:<7.2f}        {ordered[n]:<7.2f}      "
          f"{median:<7.2f}  \t       {average:<7.2f}     \t{stdev:<7.2f}\t\t{p99:<7.2f} \t\t{p999:<7.2f}")  # fmt: skip


def recv_exactly(conn: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = conn.recv(size - len(data))
        if not chunk:
            raise ConnectionError("peer closed")
        data += chunk
    return data


def run(tool: str, opts: dict, conn: socket.socket, client: bool) -> None:
    me, peer = conn.getsockname()[0], conn.getpeername()[0]
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    banner(tool, opts, me, peer, client)
    iters, size = int(opts["iters"]), int(opts["size"])
    print(LINE)
    if tool.endswith("lat"):
        print(LAT_HEADER)
        message = b"x" * size
        posted = []
        for _ in range(iters):
            if client:
                posted.append(time.perf_counter())
                conn.sendall(message)
                recv_exactly(conn, size)
            else:
                recv_exactly(conn, size)
                conn.sendall(message)
        if client:
            latency_report(opts, [b - a for a, b in itertools.pairwise(posted)])
    else:
        gbits = bool(opts.get("gbits"))
        print(BW_HEADERS[gbits])
        if client:
            start = time.perf_counter()
            for _ in range(iters):
                conn.sendall(b"w" * size)
            recv_exactly(conn, 1)  # the server has it all: the last completion
            seconds = time.perf_counter() - start
            rate = size * iters / seconds / (125_000_000 if gbits else 0x100000)
            print(f" {size:<7}    {iters:<10}       {rate:<7.2f}            {rate:<7.2f}\t\t   {iters / seconds / 1e6:<7.6f}")
        else:
            recv_exactly(conn, size * iters)
            conn.sendall(b"d")
    print(LINE)


def main() -> None:
    tool = Path(sys.argv[0]).name
    log = os.environ.get("HYPERTOPO_STANDIN_LOG")
    if log:
        with open(log, "a") as f:
            f.write(" ".join([tool, *sys.argv[1:]]) + "\n")
    opts = parse(tool, sys.argv[1:])
    opts.setdefault("iters", "1000" if tool.endswith("lat") else "5000")
    opts.setdefault("size", "2" if tool.endswith("lat") else "65536")
    sysfs = Path(os.environ.get("HYPERTOPO_STANDIN_SYSFS", "/sys"))
    if "dev" not in opts or not (sysfs / "class" / "infiniband" / opts["dev"]).is_dir():
        print(" Did not detect devices \n If device exists, check if driver is up", file=sys.stderr)
        print(" Unable to find the Infiniband/RoCE device", file=sys.stderr)
        sys.exit(1)
    port = int(opts["port"])
    if opts["host"] is None:
        print("\n************************************\n* Waiting for client to connect... *\n************************************")
        sys.stdout.flush()
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as listener:
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            listener.bind((opts.get("bind", "0.0.0.0"), port))
            listener.listen(1)
            conn, _ = listener.accept()
        with conn:
            run(tool, opts, conn, client=False)
        return
    try:
        conn = socket.create_connection((opts["host"], port), timeout=10,
                                        source_address=(opts["bind"], 0) if "bind" in opts else None)  # fmt: skip
    except OSError:
        print(f"Couldn't connect to {opts['host']}:{port}", file=sys.stderr)
        print(" Unable to open file descriptor for socket connection Unable to init the socket connection", file=sys.stderr)
        sys.exit(1)
    with conn:
        run(tool, opts, conn, client=True)


if __name__ == "__main__":
    main()
