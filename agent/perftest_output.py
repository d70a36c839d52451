"""What perftest's `ib_write_lat` and `ib_write_bw` print, read into numbers the measuring loop
uses (agent.adapters.rdma_probe runs the tools; this module only reads their text).

Why parse text: perftest has no stable machine interface across the versions nodes carry
(Debian bookworm ships 4.5-0.17, whose `--out_json` writes keys without quotes), while its report
lines are printf formats that have not changed since 4.x. The formats read here are those of
linux-rdma/perftest `src/perftest_parameters.h` (RESULT_FMT_LAT / REPORT_FMT_LAT, RESULT_FMT /
RESULT_FMT_G / REPORT_FMT) and `src/perftest_parameters.c` `print_report_lat` (the `-U` sample
lines `"%d, %g"` under `"#, usec"`), and `src/perftest_communication.h` PERF_GID_FMT (a GID as 16
decimal bytes) for the peer's address line, as of v4.5-0.17 and unchanged at 26.04.

What the numbers mean (be careful): for RDMA write, perftest times each ping-pong iteration
(`tposted[i+1] - tposted[i]`, one full round trip) and divides it by `rtt_factor` 2, so every
latency it prints, each `-U` sample, t_typical (the median) and the 99% percentile, is HALF a
round trip. `LatencyRun.round_trips_us` doubles them back: the measurement rows carry round trips
for every transport. Bandwidth is perftest's `BW average`: the message bytes of all iterations over
the time from the first post to the last completion, in Gb/s (1e9 bit/s, `--report_gbits`) or
MiB/s; here converted to Mbit/s (1e6 bit/s).

The text comes from a subprocess whose binary could be anything on PATH: it is bounded (size,
lines, line length, sample count, value range) and every refusal is one line naming the tool and
the line. Pure: text in, numbers out.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

MAX_OUTPUT = 256 * 1024  # characters: -U with the largest --measure-count (1,000) prints ~20 KB
MAX_LINES = 4096
MAX_LINE = 512
MAX_US = 10_000_000.0  # 10 s: a latency beyond it is not a fabric figure
MAX_GBPS = 100_000.0  # 100 Tb/s: beyond any link
LAT_COLUMNS = ("t_min", "t_max", "t_typical", "t_avg", "t_stdev", "99%", "99.9%")
_SAMPLE = re.compile(r"^(\d{1,9}), (\S{1,32})$")
_GID = re.compile(r"^\s*GID: ((?:\d{1,3}:){15}\d{1,3})\s*$")


class PerftestOutputError(ValueError):
    """perftest's output is not what its source prints, in one line naming the tool and line."""


@dataclass(frozen=True, slots=True)
class LatencyRun:
    """One `ib_write_lat -U` run: per-iteration samples in the order measured and perftest's
    own summary, all in microseconds of HALF a round trip, as perftest prints them."""

    size: int
    iterations: int
    samples_half_us: tuple[float, ...]
    typical_half_us: float
    p99_half_us: float

    @property
    def round_trips_us(self) -> tuple[float, ...]:
        """The samples as round trips (x2: perftest divides each ping-pong by its rtt_factor 2)."""
        return tuple(2.0 * s for s in self.samples_half_us)


@dataclass(frozen=True, slots=True)
class BandwidthRun:
    """One `ib_write_bw` run: message size, iterations, peak and average in Mbit/s."""

    size: int
    iterations: int
    peak_mbps: float
    average_mbps: float


def _lines(text: str, tool: str) -> list[str]:
    if len(text) > MAX_OUTPUT:
        raise PerftestOutputError(f"{tool} output: over {MAX_OUTPUT} characters")
    lines = text.splitlines()
    if len(lines) > MAX_LINES:
        raise PerftestOutputError(f"{tool} output: over {MAX_LINES} lines")
    for n, line in enumerate(lines, 1):
        if len(line) > MAX_LINE:
            raise PerftestOutputError(f"{tool} output line {n}: over {MAX_LINE} characters")
    return lines


def _number(token: str, tool: str, n: int, high: float) -> float:
    try:
        value = float(token)
    except ValueError:
        raise PerftestOutputError(f"{tool} output line {n}: not a number: {token[:40]!r}") from None
    if not math.isfinite(value) or not 0.0 <= value <= high:
        raise PerftestOutputError(f"{tool} output line {n}: {token[:40]!r} is outside 0..{high:g}")
    return value


def _whole(token: str, tool: str, n: int) -> int:
    if not token.isdigit() or len(token) > 12:
        raise PerftestOutputError(f"{tool} output line {n}: not a whole number: {token[:40]!r}")
    return int(token)


def _report_line(lines: list[str], header_at: int, columns: int, tool: str) -> tuple[int, list[str]]:
    """The first line after the header with exactly `columns` fields: perftest prints the report
    right under its header (only the `-U`/`-H` samples may sit between a first header and a second)."""
    for n in range(header_at + 1, len(lines)):
        fields = lines[n].split()
        if len(fields) == columns:
            return n + 1, fields
        if lines[n].startswith("-----") or lines[n].lstrip().startswith("#bytes"):
            break
    raise PerftestOutputError(f"{tool} output: no report line under the header on line {header_at + 1}")


def _samples(lines: list[str], tool: str) -> list[float]:
    """The `-U` block: `#, usec` then `i, value` lines numbered 1, 2, ... in order."""
    try:
        start = next(i for i, line in enumerate(lines) if line.startswith("#, "))
    except StopIteration:
        raise PerftestOutputError(f"{tool} output: no '#, usec' sample block (run without -U?)") from None
    if lines[start].strip() != "#, usec":
        raise PerftestOutputError(f"{tool} output line {start + 1}: samples not in usec: {lines[start][:40]!r}")
    out: list[float] = []
    for n in range(start + 1, len(lines)):
        match = _SAMPLE.match(lines[n].strip())
        if match is None:
            break
        if int(match.group(1)) != len(out) + 1:
            raise PerftestOutputError(f"{tool} output line {n + 1}: sample {match.group(1)} out of order")
        out.append(_number(match.group(2), tool, n + 1, MAX_US))
    return out


def parse_latency(text: str, tool: str = "ib_write_lat") -> LatencyRun:
    """An `ib_write_lat -U` run's samples and summary (see the module docstring for the units)."""
    lines = _lines(text, tool)
    headers = [i for i, line in enumerate(lines) if line.lstrip().startswith("#bytes") and "t_typical" in line]
    if not headers:
        raise PerftestOutputError(f"{tool} output: no latency header (#bytes ... t_typical[usec])")
    header = lines[headers[-1]]
    positions = [header.find(c) for c in LAT_COLUMNS]
    if -1 in positions or positions != sorted(positions) or "[usec]" not in header:
        raise PerftestOutputError(f"{tool} output line {headers[-1] + 1}: not perftest's latency columns in usec")
    n, fields = _report_line(lines, headers[-1], 2 + len(LAT_COLUMNS), tool)
    size, iterations = _whole(fields[0], tool, n), _whole(fields[1], tool, n)
    values = [_number(f, tool, n, MAX_US) for f in fields[2:]]
    samples = _samples(lines, tool)
    if len(samples) != iterations - 1:  # perftest measures iters - 1 gaps between iters posts
        raise PerftestOutputError(
            f"{tool} output: {len(samples)} samples for {iterations} iterations (expected {iterations - 1})"
        )
    return LatencyRun(size, iterations, tuple(samples), values[2], values[5])


_BW_UNITS = {"[Gb/sec]": 1000.0, "[MiB/sec]": 1048576 * 8 / 1e6}  # -> Mbit/s


def parse_bandwidth(text: str, tool: str = "ib_write_bw") -> BandwidthRun:
    """An `ib_write_bw` run's size, iterations, peak and average bandwidth (Mbit/s)."""
    lines = _lines(text, tool)
    headers = [i for i, line in enumerate(lines) if line.lstrip().startswith("#bytes") and "BW average" in line]
    if not headers:
        raise PerftestOutputError(f"{tool} output: no bandwidth header (#bytes ... BW average)")
    header = lines[headers[-1]]
    unit = next((u for u in _BW_UNITS if f"BW average{u}" in header), None)
    if unit is None or "MsgRate" not in header or header.count("BW ") != 2:
        raise PerftestOutputError(f"{tool} output line {headers[-1] + 1}: not perftest's bandwidth columns")
    n, fields = _report_line(lines, headers[-1], 5, tool)
    high = MAX_GBPS * 1000 / _BW_UNITS[unit]
    peak, average = (_number(f, tool, n, high) * _BW_UNITS[unit] for f in fields[2:4])
    _number(fields[4], tool, n, 1e9)  # MsgRate: checked, not used
    return BandwidthRun(_whole(fields[0], tool, n), _whole(fields[1], tool, n), peak, average)


def remote_ipv4(text: str) -> str | None:
    """The IPv4 address in the remote side's GID (RoCE v2 GIDs of IPv4 addresses are IPv4-mapped:
    ::ffff:a.b.c.d), None when the output names no such GID (InfiniBand GIDs carry no address).
    Bounded like the parsers; never raises on odd text."""
    if len(text) > MAX_OUTPUT:
        return None
    lines = text.splitlines()[:MAX_LINES]
    for i, line in enumerate(lines[:-1]):
        if not line.lstrip().startswith("remote address:"):
            continue
        match = _GID.match(lines[i + 1][:MAX_LINE])
        if match is None:
            return None
        raw = [int(b) for b in match.group(1).split(":")]
        if max(raw) > 255 or raw[:12] != [0] * 10 + [255, 255]:
            return None
        return ".".join(str(b) for b in raw[12:])
    return None
