"""Every parser of outside input holds 10,000 mutated real inputs (issue 22.4): lldpcli JSON and
keyvalue (the agent's lldpd reader), UFM's listings (the aggregator's poller), switch LLDP tables,
NodeTopology report files (YAML and JSON), cluster models (YAML, hostlists) and ibnetdiscover dumps.

Seeds are real inputs: the captures in ../shared/data (by path), the repository's models, what the
UFM stand-in serves and the reports `probe --model` publishes. Mutations: byte flips, truncation,
nesting thousands deep, values of another type, huge numbers, Unicode digits, odd names, 80 KB
lines, duplicated pieces and YAML aliases (tests/kits/fuzz_inputs.py). Each input is read or refused
with the parser's own declared error, never anything else; each input's CPU time, the growth of
the process's peak RSS over all 10,000 (so every input's memory), and the memory peak (tracemalloc)
of a seeded sample and of the slowest inputs stay under generous safety bounds
(fuzz_inputs.TIME_BOUND, MEMORY_BOUND; not benchmarks). The counts
are printed (`pytest -s`) for the issue's note. The lldpcli readers also prove that whatever they
accept, the agent's own report reader reads back unchanged: the agent never publishes a
neighbour its aggregator would refuse.
"""

from __future__ import annotations

import dataclasses
import json
import random
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from fuzz_inputs import (
    JSON_MUTATIONS,
    LINE_MUTATIONS,
    MEMORY_BOUND,
    TIME_BOUND,
    YAML_MUTATIONS,
    FuzzRun,
    fuzz,
)
from ufm_standin import listings

from agent.cluster_model import ModelError, load_model, parse_model
from agent.common import yaml_codec
from agent.common.command_line import InputError
from agent.common.report import (
    LldpNeighbour,
    NodeReport,
    WireError,
    node_topology_object,
    report_from_spec,
    report_spec,
)
from agent.lldp.lldpcli import LldpcliError, parse_json, parse_keyvalue
from agent.model_probe import report_for
from aggregator.graph import FabricGraph
from aggregator.object_files import objects_in_text, read_objects
from aggregator.sources import ibnetdiscover, nodetopology, ufm, ufm_graph
from aggregator.sources.switch_lldp import SwitchLldpError, parse_table

REPO = Path(__file__).resolve().parents[2]
MODELS = REPO / "tests" / "models"
MODEL = load_model(str(MODELS / "small-tree.yaml"))
REPORT = NodeReport(node_name="n1", health={})  # what the lldpcli readers' neighbours are published in


def check(run: FuzzRun) -> None:
    print(f"\n{run.line()}")
    assert run.inputs >= 10_000
    assert not run.uncaught, "\n".join(run.uncaught[:5])
    assert run.slowest < TIME_BOUND, run.line()
    assert run.peak < MEMORY_BOUND, run.line()
    assert run.resident_growth is not None, f"peak RSS not reset (/proc/self/clear_refs): {run.line()}"
    assert run.resident_growth < MEMORY_BOUND, run.line()  # every input's peak is under the run's
    assert run.accepted and run.refused, run.line()  # the mutations reach both outcomes: they test something


# --- lldpcli (the agent) ----------------------------------------------------------------------------

JSON0 = {"lldp": [{"interface": [{"name": "eth0", "via": "LLDP", "rid": "1", "age": "0 day, 00:00:04",
    "chassis": [{"id": [{"type": "mac", "value": "96:50:83:55:a1:8e"}], "name": [{"value": "leaf-sw1"}],
                 "descr": [{"value": "Debian GNU/Linux 12"}], "mgmt-ip": [{"value": "10.0.0.2"}],
                 "capability": [{"type": "Bridge", "enabled": True}, {"type": "Router", "enabled": False}]}],
    "port": [{"id": [{"type": "ifname", "value": "swp1"}], "descr": [{"value": "swp1"}], "ttl": [{"value": "120"}]}]}]}]}  # fmt: skip
JSON_FLAVOUR = {"lldp": {"interface": {"eth0": {"via": "LLDP", "rid": "1", "chassis": {"leaf-sw1": {
    "id": {"type": "mac", "value": "96:50:83:55:a1:8e"}, "descr": "Cumulus Linux", "mgmt-ip": ["10.0.0.2", "fe80::1"],
    "capability": [{"type": "Bridge", "enabled": True}]}}, "port": {"id": {"type": "ifname", "value": "swp1"},
    "descr": "swp1", "ttl": "120"}}}}}  # fmt: skip


def _lldpctl(shared_data: Path, pattern: str) -> list[str]:
    files = sorted((shared_data / "lldp" / "lldpctl").glob(pattern))
    assert files, f"no {pattern} in {shared_data}/lldp/lldpctl"
    return [path.read_text() for path in files]


def _published_as_read(read: Callable[[str], list[LldpNeighbour]]) -> Callable[[str], object]:
    """`read`, then the neighbours through the report the agent publishes and its reader: the
    same neighbours must come back (a WireError there would be a neighbour the agent must not publish)."""

    def parse(text: str) -> object:
        neighbours = tuple(read(text))
        spec = json.loads(json.dumps(report_spec(dataclasses.replace(REPORT, lldp=neighbours))))
        try:
            back = report_from_spec(spec)
        except WireError as exc:
            raise AssertionError(f"published a neighbour the reader refuses: {exc}") from exc
        assert back.lldp == neighbours
        return back

    return parse


def test_lldpcli_json_holds_10000_mutations_and_publishes_only_what_it_reads_back(shared_data: Path) -> None:
    seeds = [*_lldpctl(shared_data, "sichek_*.json"), json.dumps(JSON0), json.dumps(JSON_FLAVOUR)]
    check(fuzz("lldpcli-json", _published_as_read(parse_json), seeds, JSON_MUTATIONS, (LldpcliError,)))


def test_lldpcli_keyvalue_holds_10000_mutations_and_publishes_only_what_it_reads_back(shared_data: Path) -> None:
    seeds = _lldpctl(shared_data, "netbox-agent_*.txt")
    check(fuzz("lldpcli-keyvalue", _published_as_read(parse_keyvalue), seeds, LINE_MUTATIONS, (LldpcliError,)))


# --- UFM (the aggregator's poller) ------------------------------------------------------------------

UFM = listings(MODEL)
UFM_GOOD = ufm.from_listings(UFM)
UFM_BODIES = {listing: json.dumps(items).encode() for listing, items in UFM.items()}
NODE_FACTS = {node: nodetopology.facts_of(report_for(MODEL, node)) for node in MODEL.nodes()}


def _ufm_seeds() -> list[str]:
    """`<listing>\\n<body>`: each listing of the stand-in's answer, ports cut to a dozen (speed)."""
    return [f"{name}\n{json.dumps(items[:12])}" for name, items in UFM.items()]


def _ufm_graph() -> FabricGraph:
    graph = FabricGraph()
    for node, facts in NODE_FACTS.items():
        graph.add_node(node)
        graph.set_node_facts(node, facts)
    return graph


def _read_ufm(text: str) -> object:
    """The poller's path: bodies decoded and parsed, remembered against the last good fabric, and
    merged into a graph with nodes."""
    name, _, body = text.partition("\n")
    bodies = dict(UFM_BODIES)
    bodies[name if name in bodies else "ports"] = body.encode("utf-8", "surrogatepass")
    fabric = ufm.remember(UFM_GOOD, ufm.from_bodies(bodies, active_only=len(text) % 2 == 0))
    ufm_graph.apply(_ufm_graph(), fabric)
    return fabric


def test_ufm_listings_hold_10000_mutations() -> None:
    check(fuzz("ufm", _read_ufm, _ufm_seeds(), JSON_MUTATIONS, (ufm.UfmError,)))


# --- switch LLDP tables ---------------------------------------------------------------------------

LOCAL = {"local-chassis": [{"chassis": [{"id": [{"type": "mac", "value": "0c:42:a1:11:22:33"}],
                                         "name": [{"value": "leaf7"}]}]}]}  # fmt: skip


def test_switch_lldp_tables_hold_10000_mutations(shared_data: Path) -> None:
    seeds = [*_lldpctl(shared_data, "sichek_*.json"), json.dumps({**JSON0, **LOCAL}), json.dumps(JSON_FLAVOUR)]
    check(fuzz("switch-lldp", lambda text: parse_table(text, default_name="leaf1"), seeds, JSON_MUTATIONS,
               (SwitchLldpError,)))  # fmt: skip


# --- NodeTopology report files --------------------------------------------------------------------


def _trimmed(obj: dict[str, Any]) -> dict[str, Any]:
    """The report with one of its eight GPUs, and two of that GPU's eighteen NVLinks (the GPU list
    is nine tenths of it, eight alike, and its links half of what is left, eighteen alike): every
    field of every shape is still there, and mutations land on the rest of the report more often."""
    nvml = obj["spec"].get("nvml")
    if isinstance(nvml, dict) and isinstance(nvml.get("gpus"), list):
        nvml["gpus"] = nvml["gpus"][:1]
        for gpu in nvml["gpus"]:
            gpu["nvlinks"] = gpu["nvlinks"][:2]
    return obj


FILE_SHARE = 20  # one report input in this many (a seeded draw) is written to a file and read from it


def _as_read_back(text: str) -> str:
    """`text` as `read_objects` gets it back from a file `write_text` wrote it to (UTF-8 decoded
    strictly, newlines made universal as a text-mode read does): UnicodeDecodeError where the file
    could not be read. (What io.TextIOWrapper does, without building one per input.)"""
    shown = text.encode("utf-8", "surrogatepass").decode("utf-8")
    return shown.replace("\r\n", "\n").replace("\r", "\n") if "\r" in shown else shown


def _outcome(read: Callable[[], object]) -> tuple[object, InputError | WireError | None]:
    """What `read` returned, or the reader's own error it raised."""
    try:
        return read(), None
    except (InputError, WireError) as exc:
        return None, exc


def _said(outcome: tuple[object, InputError | WireError | None]) -> tuple[str, str]:
    value, error = outcome
    return ("read", repr(value)) if error is None else (type(error).__name__, str(error))


@pytest.fixture
def ram_path(request: pytest.FixtureRequest) -> Iterator[Path]:
    """A folder in RAM (/dev/shm) where there is one, else tmp_path: rewriting a file on ext4 forces
    a flush (auto_da_alloc), milliseconds each: seconds over the 500 inputs read from a file.
    (tmp_path only when needed: its first use in a session sweeps old pytest folders.)"""
    if not Path("/dev/shm").is_dir():
        yield request.getfixturevalue("tmp_path")
        return
    with tempfile.TemporaryDirectory(dir="/dev/shm") as folder:
        yield Path(folder)


@pytest.mark.parametrize("suffix", [".yaml", ".json"])
def test_report_files_hold_10000_mutations(ram_path: Path, suffix: str) -> None:
    """The reader of `render --reports` files, from the text in memory (`objects_in_text`, what
    `read_objects` does once it has the file's text); a seeded sample of the inputs is also written
    to a real file and read by `read_objects`, which must read it exactly as the text was read."""
    objects = [_trimmed(node_topology_object(report_for(MODEL, node))) for node in MODEL.nodes()[:3]]
    seeds = [yaml_codec.dump(obj) if suffix == ".yaml" else json.dumps(obj) for obj in objects]
    path = ram_path / f"report{suffix}"
    sample = random.Random(23)

    def facts(objects: list[dict[str, Any]]) -> object:
        return [nodetopology.facts_of(nodetopology.report_from_object(obj)) for obj in objects]

    def from_file(text: str) -> object:
        path.write_text(text, encoding="utf-8", errors="surrogatepass")
        return facts(read_objects(path, "NodeTopology"))

    def read(text: str) -> object:
        try:
            shown = _as_read_back(text)
        except UnicodeDecodeError:  # only the file's reader says what of that
            return from_file(text)
        in_memory = lambda: facts(objects_in_text(shown, str(path), "NodeTopology"))  # noqa: E731
        if sample.randrange(FILE_SHARE) != 0:
            return in_memory()
        value, error = outcome = _outcome(in_memory)  # read once, compared, then given back as it came
        assert _said(_outcome(lambda: from_file(text))) == _said(outcome), "the file read otherwise than its text"
        if error is not None:
            raise error
        return value

    mutations = YAML_MUTATIONS if suffix == ".yaml" else JSON_MUTATIONS
    check(fuzz(f"reports{suffix}", read, seeds, mutations, (InputError, WireError)))


# --- cluster models -------------------------------------------------------------------------------


def test_cluster_models_hold_10000_mutations() -> None:
    seeds = [path.read_text() for path in sorted(MODELS.glob("*.yaml")) if path.stat().st_size < 4000]
    assert len(seeds) >= 3
    check(fuzz("model", lambda text: parse_model(yaml_codec.load(text)), seeds,
               {**YAML_MUTATIONS, "hostlist": _hostlist}, (ModelError, yaml.YAMLError)))  # fmt: skip


def _hostlist(text: str, rng: random.Random) -> str:
    """A hostlist range made huge, reversed, Unicode or empty."""
    return text.replace("[", rng.choice(["[1-100000000,", "[\u0661-\u0669,", "[9-1,", "[,", "[1-3][1-100000]["]), 1)


# --- ibnetdiscover dumps --------------------------------------------------------------------------


def _dump_windows(shared_data: Path) -> list[str]:
    """Windows of 60 lines of every real dump, each from a block's start (whole dumps are slow
    to parse 10,000 times; the windows keep every line shape)."""
    windows: list[str] = []
    for path in sorted((shared_data / "ibnetdiscover").rglob("*")):
        if path.suffix not in (".topo", ".txt", ".out"):
            continue
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
        starts = [i for i, line in enumerate(lines) if not line.strip()][:20] or [0]
        windows.extend("\n".join(lines[start : start + 60]) for start in starts)
    return windows


def test_ibnetdiscover_dumps_hold_10000_mutations(shared_data: Path) -> None:
    def read(text: str) -> object:
        fabric = ibnetdiscover.parse(text)
        return ibnetdiscover.switch_names(fabric)

    check(fuzz("ibnetdiscover", read, _dump_windows(shared_data), LINE_MUTATIONS, (ibnetdiscover.IbnetdiscoverError,)))
