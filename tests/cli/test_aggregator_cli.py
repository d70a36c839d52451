"""`hypertopo-aggregator render`: files in, a kubectl-appliable List of HyperNodes out."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import yaml
from aggregator_fabric import ibnetdiscover_dump

from agent.cluster_model import load_model
from agent.common.report import node_topology_object
from agent.model_probe import report_for

MODEL_FILE = Path(__file__).parent.parent / "models" / "fat-tree-3tier.yaml"
MODEL = load_model(str(MODEL_FILE))


def _aggregator(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "aggregator", *args], capture_output=True, text=True, timeout=120, check=False
    )


def _reports_dir(tmp_path: Path) -> Path:
    """Half the nodes as one file each, the other half as a List in one file."""
    folder = tmp_path / "reports"
    folder.mkdir()
    nodes = MODEL.nodes()
    for node in nodes[:8]:
        (folder / f"{node}.yaml").write_text(yaml.safe_dump(node_topology_object(report_for(MODEL, node))))
    items = [node_topology_object(report_for(MODEL, n)) for n in nodes[8:]]
    (folder / "rest.json").write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": items}))
    return folder


def test_render_reads_a_directory_of_reports_and_a_dump(tmp_path: Path) -> None:
    dump = tmp_path / "fabric.topo"
    dump.write_text(ibnetdiscover_dump(MODEL))
    proc = _aggregator(
        "render", "--reports", str(_reports_dir(tmp_path)), "--ibnetdiscover", str(dump), "--format", "json"
    )
    assert proc.returncode == 0, proc.stderr
    document = json.loads(proc.stdout)
    assert document["kind"] == "List"
    summary = sorted((o["spec"]["tierName"], o["status"]["nodeCount"]) for o in document["items"])
    assert summary == [
        ("core", 16),
        ("leaf", 4),
        ("leaf", 4),
        ("leaf", 4),
        ("leaf", 4),
        ("spine", 8),
        ("spine", 8),
    ]
    assert {o["status"]["conditions"][0]["status"] for o in document["items"]} == {"True"}


def test_render_from_the_model_alone_prints_yaml() -> None:
    proc = _aggregator("render", "--model", str(MODEL_FILE))
    assert proc.returncode == 0, proc.stderr
    names = [o["metadata"]["name"] for o in yaml.safe_load(proc.stdout)["items"]]
    assert names == sorted(names) and "core-core1" in names


def test_a_malformed_dump_is_reported_with_its_line_and_exit_code_1(tmp_path: Path) -> None:
    dump = tmp_path / "broken.topo"
    dump.write_text("vendid=0x2c9\nthis is not ibnetdiscover\n")
    proc = _aggregator("render", "--ibnetdiscover", str(dump))
    assert proc.returncode == 1  # input, not usage (issue 13)
    assert "line 2" in proc.stderr and "broken.topo" in proc.stderr


def test_a_named_file_without_the_kind_asked_for_is_refused_and_a_stray_document_skipped(tmp_path: Path) -> None:
    folder = _reports_dir(tmp_path)
    (folder / "kustomization.yaml").write_text("kind: Kustomization\nresources: []\n")  # a directory's other files
    pods = tmp_path / "pods.yaml"
    pods.write_text("apiVersion: v1\nkind: List\nitems:\n- {kind: Pod, metadata: {name: a}}\n")
    wrong = _aggregator("render", "--reports", str(folder), str(pods))
    assert wrong.returncode == 1 and wrong.stderr.strip().splitlines() == [
        f"hypertopo-aggregator render: {pods}: holds no NodeTopology, only Pod"
    ]
    nodes = _aggregator("render", "--reports", str(folder), "--nodes", str(pods))
    assert nodes.returncode == 1 and f"{pods}: holds no Node, only Pod" in nodes.stderr
    stray = folder / "rest.json"  # a List of 8 reports, then a document that is no object at all
    (folder / "rest.yaml").write_text(yaml.safe_dump(json.loads(stray.read_text())) + "---\njust a string\n")
    stray.unlink()
    kept = _aggregator("render", "--reports", str(folder), "--format", "json")
    assert kept.returncode == 0, kept.stderr
    assert "rest.yaml: document 2 is not a NodeTopology (no kind" in kept.stderr
    members = {m["selector"]["exactMatch"]["name"] for o in json.loads(kept.stdout)["items"]
               for m in o["spec"]["members"] if m["type"] == "Node"}
    assert members == set(MODEL.nodes())  # the file's reports are all placed, not the file dropped
    strict = _aggregator("render", "--reports", str(folder), "--strict")
    assert strict.returncode == 1 and "rest.yaml: document 2 is not a NodeTopology" in strict.stderr


def test_help_explains_the_commands() -> None:
    top = _aggregator("--help")
    assert top.returncode == 0 and "render" in top.stdout and "run" in top.stdout
    render = _aggregator("render", "--help")
    for flag in ("--reports", "--ibnetdiscover", "--switch-lldp", "--model", "--label-levels", "--format"):
        assert flag in render.stdout


FABRIC_OPTIONS = ("--ibnetdiscover", "--strip-domain", "--dump-host-regex", "--fabric-interfaces")


def _option_help(help_text: str, option: str) -> str:
    """The lines `--help` prints for one option (its usage and its wrapped help)."""
    lines = help_text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip().startswith(option))
    end = next((i for i in range(start + 1, len(lines)) if lines[i].lstrip().startswith("-")), len(lines))
    return "\n".join(lines[start:end])


def test_run_has_the_fabric_options_of_render_with_the_same_help() -> None:
    render, run = _aggregator("render", "--help"), _aggregator("run", "--help")
    assert render.returncode == run.returncode == 0, run.stderr
    for option in FABRIC_OPTIONS:
        assert _option_help(run.stdout, option) == _option_help(render.stdout, option)
    assert "--ibnetdiscover FILE [FILE ...]" in run.stdout and "--strip-domain [SUFFIX]" in run.stdout


def test_run_refuses_bad_fabric_options_with_exit_code_2_and_bad_dumps_with_1_before_connecting(tmp_path: Path) -> None:
    dump = tmp_path / "fabric.topo"
    dump.write_text(ibnetdiscover_dump(MODEL))
    broken = tmp_path / "rail2.topo"
    broken.write_text("vendid=0x2c9\nthis is not ibnetdiscover\n")
    unreachable = ("--kubeconfig", str(tmp_path / "no-such-kubeconfig"), "--listen", "127.0.0.1:0")
    regex = _aggregator("run", *unreachable, "--ibnetdiscover", str(dump), "--dump-host-regex", "(unclosed")
    assert regex.returncode == 2 and "--dump-host-regex '(unclosed': not a regular expression" in regex.stderr
    nics = _aggregator("run", *unreachable, "--fabric-interfaces", "[ib")
    assert nics.returncode == 2 and "--fabric-interfaces '[ib'" in nics.stderr
    second = _aggregator("run", *unreachable, "--ibnetdiscover", str(dump), str(broken))
    assert second.returncode == 1 and "rail2.topo" in second.stderr and "line 2" in second.stderr
