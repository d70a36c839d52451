"""Reads a host lldpd through its control socket with `lldpcli -f json0`, when one is mounted.

Some nodes already run lldpd; asking it costs one short command instead of a second listener, and
it sees LLDP even where the agent's raw socket cannot (a NIC whose firmware consumes LLDP, or a
host lldpd that already holds the interface). json0 is used because its shape does not change
with the number of neighbours. The command runner is injectable so tests can replay outputs, and
every failure becomes a per-probe result: no socket -> absent, lldpcli failing -> failed.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from agent.common.report import ComponentHealth, Health, LldpNeighbour, ProbeResult
from agent.lldp.lldpcli import LldpcliError, parse_json

DEFAULT_SOCKET = Path("/run/lldpd.socket")  # Debian's lldpd 1.0.x


@dataclass(frozen=True)
class CommandOutput:
    returncode: int
    stdout: str
    stderr: str


Runner = Callable[[Sequence[str], float], CommandOutput]


def run_command(argv: Sequence[str], timeout_s: float) -> CommandOutput:
    proc = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout_s, check=False)
    return CommandOutput(proc.returncode, proc.stdout, proc.stderr)


class LldpdReader:
    """`probe()` -> the host lldpd's neighbours, sorted like `NeighbourTable.snapshot`."""

    def __init__(
        self,
        socket_path: Path = DEFAULT_SOCKET,
        *,
        lldpcli: str = "lldpcli",
        run: Runner = run_command,
        timeout_s: float = 5.0,
    ) -> None:
        self.socket_path = socket_path
        self._lldpcli = lldpcli
        self._run = run
        self._timeout_s = timeout_s

    def argv(self) -> list[str]:
        return [self._lldpcli, "-u", str(self.socket_path), "-f", "json0", "show", "neighbors", "details"]

    def probe(self) -> ProbeResult[tuple[LldpNeighbour, ...]]:
        if not self.socket_path.exists():
            return ProbeResult.absent(f"no lldpd socket at {self.socket_path}")
        try:
            out = self._run(self.argv(), self._timeout_s)
        except FileNotFoundError:
            return ProbeResult.absent(f"{self._lldpcli} is not installed")
        except subprocess.TimeoutExpired:
            return ProbeResult.failed(f"lldpcli did not answer within {self._timeout_s:g}s")
        except OSError as exc:
            return ProbeResult.failed(f"cannot run lldpcli: {exc}")
        if out.returncode != 0:
            detail = (out.stderr.strip() or out.stdout.strip())[:200]
            return ProbeResult.failed(f"lldpcli exited with {out.returncode}: {detail}")
        try:
            neighbours = parse_json(out.stdout)
        except LldpcliError as exc:
            return ProbeResult.failed(f"cannot read lldpcli output: {exc}")
        ordered = sorted(neighbours, key=lambda n: (n.interface, n.chassis_id, n.port_id))
        return ProbeResult(tuple(ordered), ComponentHealth(Health.OK))
