"""perftest's output read by the RDMA probe (agent.perftest_output): the shapes perftest prints,
built here with perftest's own printf formats (linux-rdma/perftest v4.5-0.17,
src/perftest_parameters.h: RESULT_FMT_LAT, REPORT_FMT_LAT, RESULT_FMT, RESULT_FMT_G, REPORT_FMT;
the "%d, %g" sample lines of print_report_lat; PERF_GID_FMT of perftest_communication.h); half
round trips doubled into round trips; and hostile or mutated output refused in one line, never
with another exception."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent.perftest_output import (
    MAX_LINE,
    MAX_OUTPUT,
    PerftestOutputError,
    parse_bandwidth,
    parse_latency,
    remote_ipv4,
)

LINE = "-" * 87  # RESULT_LINE
RESULT_FMT_LAT = (
    " #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    t_stdev[usec]"
    "   99% percentile[usec]   99.9% percentile[usec] "
)
REPORT_FMT_LAT = " %-7lu %lu          %-7.2f        %-7.2f      %-7.2f  \t       %-7.2f     \t%-7.2f\t\t%-7.2f \t\t%-7.2f"
RESULT_FMT = " #bytes     #iterations    BW peak[MiB/sec]    BW average[MiB/sec]   MsgRate[Mpps]"
RESULT_FMT_G = " #bytes     #iterations    BW peak[Gb/sec]    BW average[Gb/sec]   MsgRate[Mpps]"
REPORT_FMT = " %-7lu    %-10lu       %-7.2lf            %-7.2lf\t\t   %-7.6lf"
PERF_GID_FMT = " %s: " + ":".join(["%02d"] * 16)
BANNER = f"""{LINE}
                    RDMA_Write Latency Test
 Dual-port       : OFF\t\tDevice         : mlx5_0
 Number of qps   : 1\t\tTransport type : IB
 Connection type : RC\t\tUsing SRQ      : OFF
 PCIe relax order: OFF
 ibv_wr* API     : ON
 TX depth        : 1
 Mtu             : 4096[B]
 Link type       : Ethernet
 GID index       : 3
 Max inline data : 220[B]
 rdma_cm QPs\t : OFF
 Data ex. method : Ethernet
{LINE}
 local address: LID 0000 QPN 0x0108 PSN 0x9a2b4c RKey 0x1fff00 VAddr 0x005581e6a4b000
{PERF_GID_FMT % ("GID", 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 255, 255, 10, 77, 0, 1)}
 remote address: LID 0000 QPN 0x0109 PSN 0x1f3e2d RKey 0x2fff00 VAddr 0x00562a1f8f0000
{PERF_GID_FMT % ("GID", 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 255, 255, 10, 77, 0, 2)}
{LINE}
{RESULT_FMT_LAT}
"""
HALVES = [1.62, 1.58, 1.61, 1.60, 1.63, 1.59, 1.64, 2.91, 1.60, 1.61]  # -U: half round trips, in time order


def lat_output(halves: list[float] = HALVES, *, iterations: int | None = None, unsorted: bool = True) -> str:
    """What `ib_write_lat -n N -U` prints (N = samples + 1)."""
    iterations = len(halves) + 1 if iterations is None else iterations
    ordered = sorted(halves)
    text = BANNER
    if unsorted:
        text += "#, usec\n" + "".join(f"{i}, {v:g}\n" for i, v in enumerate(halves, 1))
        text += f"{LINE}\n{RESULT_FMT_LAT}\n"
    n = len(ordered) - 2
    report = REPORT_FMT_LAT % (2, iterations, ordered[0], ordered[n], ordered[n // 2], 1.6, 0.0, ordered[n], ordered[n])
    return text + report + "\n" + LINE + "\n"


def bw_output(header: str = RESULT_FMT_G, peak: float = 96.53, average: float = 94.81) -> str:
    return f"{LINE}\n                    RDMA_Write BW Test\n{LINE}\n{header}\n" + (
        REPORT_FMT % (65536, 32, peak, average, 0.180833) + "\n" + LINE + "\n"
    )


def test_latency_samples_are_read_in_time_order_and_doubled_into_round_trips() -> None:
    run = parse_latency(lat_output())
    assert run.samples_half_us == tuple(HALVES)
    assert run.round_trips_us == tuple(2 * h for h in HALVES)  # perftest halves each ping-pong (rtt_factor 2)
    assert (run.size, run.iterations) == (2, 11)
    assert run.typical_half_us == sorted(HALVES)[4] and run.p99_half_us == sorted(HALVES)[8]


def test_latency_without_the_unsorted_block_is_refused_since_round_trips_need_samples() -> None:
    with pytest.raises(PerftestOutputError, match=r"^ib_write_lat output: no '#, usec' sample block"):
        parse_latency(lat_output(unsorted=False))


def test_bandwidth_in_gbits_and_in_mib_per_second_becomes_mbit_per_second() -> None:
    run = parse_bandwidth(bw_output())
    assert (run.size, run.iterations) == (65536, 32)
    assert run.average_mbps == pytest.approx(94_810.0) and run.peak_mbps == pytest.approx(96_530.0)
    mib = parse_bandwidth(bw_output(RESULT_FMT, peak=11_000.0, average=10_000.0))
    assert mib.average_mbps == pytest.approx(10_000 * 1048576 * 8 / 1e6)


def test_the_remote_gid_of_a_roce_v2_peer_names_its_ipv4_address() -> None:
    assert remote_ipv4(lat_output()) == "10.77.0.2"
    ib = lat_output().replace(
        PERF_GID_FMT % ("GID", 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 255, 255, 10, 77, 0, 2),
        PERF_GID_FMT % ("GID", 254, 128, 0, 0, 0, 0, 0, 0, 12, 66, 161, 3, 0, 11, 204, 214),
    )
    assert remote_ipv4(ib) is None  # an InfiniBand GID carries no IP address
    assert remote_ipv4(" remote address: LID 0000\n GID: 999:0:0:0:0:0:0:0:0:0:255:255:1:2:3:4\n") is None
    assert remote_ipv4("x" * (MAX_OUTPUT + 1)) is None


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("", r"no latency header"),
        ("x" * (MAX_OUTPUT + 1), rf"over {MAX_OUTPUT} characters"),
        ("\n" * 5000, r"over 4096 lines"),
        ("a" * (MAX_LINE + 1), rf"line 1: over {MAX_LINE} characters"),
        (lat_output(iterations=40), r"10 samples for 40 iterations \(expected 39\)"),
        (lat_output().replace("#, usec", "#, cycles"), r"samples not in usec"),
        (lat_output().replace("\n3, ", "\n4, "), r"sample 4 out of order"),
        (lat_output([1.6, float("nan"), 1.7, 1.8, 1.9, 2.0]), r"'nan' is outside"),
        (lat_output([1.6, 1.7, 1.8, 1.9, 2.0, 3e9]), r"is outside 0\.\.1e\+07"),
        (lat_output().replace(" 2       11", " -2       11"), r"not a whole number: '-2'"),
        (lat_output().replace("t_typical[usec]", "t_median[usec]"), r"no latency header"),
        (lat_output().replace("t_min[usec]    t_max", "t_max[usec]    t_min"), r"not perftest's latency columns"),
        (lat_output().rsplit("\n", 3)[0], r"no report line under the header"),
    ],
)
def test_malformed_latency_output_is_one_line_naming_what(text: str, error: str) -> None:
    with pytest.raises(PerftestOutputError, match=error) as caught:
        parse_latency(text)
    assert "\n" not in str(caught.value) and str(caught.value).startswith("ib_write_lat output")


@pytest.mark.parametrize(
    ("text", "error"),
    [
        (lat_output(), r"no bandwidth header"),
        (bw_output().replace("Gb/sec", "Kb/sec"), r"not perftest's bandwidth columns"),
        (bw_output(peak=float("inf")), r"'inf' is outside"),
        (bw_output(average=1e9), r"is outside 0\.\.100000"),
        (bw_output().replace("0.180833", "fast"), r"not a number: 'fast'"),
    ],
)
def test_malformed_bandwidth_output_is_one_line_naming_what(text: str, error: str) -> None:
    with pytest.raises(PerftestOutputError, match=error) as caught:
        parse_bandwidth(text)
    assert "\n" not in str(caught.value)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 2000), st.sampled_from(["drop", "dup", "junk", "swap"]), st.text(max_size=20)),
        max_size=6,
    ),
    st.booleans(),
)
def test_mutated_output_parses_or_is_refused_in_one_line(mutations: list, bandwidth: bool) -> None:
    """Lines dropped, repeated, replaced or swapped anywhere: a result or PerftestOutputError, nothing else."""
    lines = (bw_output() if bandwidth else lat_output()).splitlines()
    for at, kind, junk in mutations:
        i = at % len(lines)
        if kind == "drop" and len(lines) > 1:
            del lines[i]
        elif kind == "dup":
            lines.insert(i, lines[i])
        elif kind == "junk":
            lines[i] = junk
        else:
            lines[i], lines[-1 - i] = lines[-1 - i], lines[i]
    text = "\n".join(lines)
    try:
        (parse_bandwidth if bandwidth else parse_latency)(text)
    except PerftestOutputError as exc:
        assert "\n" not in str(exc)
    remote_ipv4(text)
