"""The bounds of the parsers of outside input, one by one (issue 22.4; the fuzz test drives them
all at random): each limit is one line naming the file and the field, told before the work it
bounds is done; names are normalised by one rule so that two inputs never share a HyperNode name;
UFM's system names match Nodes as dump hosts do (issue 21.5)."""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path

import pytest
from ufm_standin import listings

from agent.cluster_model import ModelError, expand_hostlist, load_model, parse_model
from agent.common.command_line import InputError
from agent.common.report import NodeReport, node_topology_object, report_from_spec, report_spec
from agent.lldp.lldpcli import LldpcliError, parse_json
from agent.model_probe import report_for
from aggregator.graph import FabricGraph
from aggregator.object_files import read_objects
from aggregator.render import domain_name
from aggregator.sources import ibnetdiscover, ufm, ufm_graph
from aggregator.sources.nodetopology import switch_id

MODELS = Path(__file__).resolve().parent.parent / "models"
SMALL = load_model(str(MODELS / "small-tree.yaml"))


def test_a_report_of_yaml_aliases_is_refused_in_one_line_before_it_expands(tmp_path: Path) -> None:
    laughs = ["a0: &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    laughs += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 9)]
    report = "\n".join(["apiVersion: topology.hypertopo.io/v1alpha1", "kind: NodeTopology",
                        "metadata: {name: node01}", "spec:", *(f"  {line}" for line in laughs)])  # fmt: skip
    path = tmp_path / "node01.yaml"
    path.write_text(report)
    assert path.stat().st_size < 5000  # 10^9 strings once expanded
    started = time.process_time()
    with pytest.raises(InputError) as caught:
        read_objects(path, "NodeTopology")
    message = str(caught.value)
    assert message.startswith(f"{path}: cannot read: line ") and "YAML aliases are not accepted" in message
    assert "\n" not in message
    print(f"\naliased 4.6 KB report refused in {time.process_time() - started:.3f} s CPU")


def test_a_hostlist_of_a_hundred_million_nodes_is_refused_before_any_name_is_made() -> None:
    started = time.process_time()
    with pytest.raises(ModelError, match=r"hostlist 'n\[1-100000000\]' names more than 1000000 nodes"):
        parse_model({"blocks": [{"switch": "leaf1", "nodes": ["n[1-100000000]"]}]})
    print(f"\nn[1-100000000] refused in {time.process_time() - started:.4f} s CPU")
    with pytest.raises(
        ModelError, match="block 1 nodes: the model names more than 1000000 nodes"
    ):  # all blocks
        parse_model({"blocks": [{"switch": f"leaf{i}", "nodes": ["n[1-600000]"]} for i in (1, 2)]})
    assert expand_hostlist("n[01-03,7]") == ["n01", "n02", "n03", "n7"]


@pytest.mark.parametrize(
    "pattern", ["n[\u0661-\u0663]", "n[\u00b2]", "n[1-\uff19]", "n[3-1]", "n[1234567890]"]
)
def test_hostlist_ranges_take_ascii_digits_only(pattern: str) -> None:
    with pytest.raises(ModelError, match="bad range"):
        expand_hostlist(pattern)


@pytest.mark.parametrize("name", ["leaf1\n", "lea\x00f1", "\u202eleaf1", "x" * 300])
def test_a_model_switch_name_that_is_no_usable_name_is_refused(name: str) -> None:
    with pytest.raises(ModelError, match="is not a usable name"):
        parse_model({"switches": {"spine1": {"switches": [name]}}})


def test_an_80kb_ibnetdiscover_line_is_refused_naming_the_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "dump.txt"
    path.write_text(
        'Switch 36 "S-0002c9030005e4f1"\n[1] "H-0002c9030005e4f2"[1] # "' + "a' - '" * 14000 + '"\n'
    )
    started = time.process_time()
    with pytest.raises(ibnetdiscover.IbnetdiscoverError) as caught:
        ibnetdiscover.parse_file(str(path))
    assert str(caught.value).startswith(f"line 2: {path}: a line of 84") and "(at most 4096)" in str(
        caught.value
    )
    print(f"\n80 KB ibnetdiscover line refused in {time.process_time() - started:.4f} s CPU")


def test_port_report_descriptions_split_at_the_last_separator_as_before() -> None:
    head = "SW 1 5 0x0002c9030005e4f1 4x QDR - CA 2 1 0x0002c9030005e4f2 ( "
    fabric = ibnetdiscover.parse(
        head + "'leaf 1' - 'node01 mlx5_0' )\n" + head.replace("e4f2", "e4f3") + "'a' - ' - 'b' )"
    )
    descriptions = {guid[-4:]: node.description for guid, node in fabric.nodes.items()}
    assert descriptions == {"e4f1": "leaf 1", "e4f2": "node01 mlx5_0", "e4f3": "b"}


def test_a_name_with_a_control_character_is_one_rule_for_every_source() -> None:
    assert (
        switch_id("leaf1\n", "0c:42:a1:00:00:01") == switch_id(" leaf1", "x") == "leaf1"
    )  # blanks around: noise
    assert (
        switch_id("lea\x00f1", "0C:42:A1:00:00:01") == "0c:42:a1:00:00:01"
    )  # no usable name: the chassis ID
    assert switch_id(None, "ab\x00cd") == "ab\\x00cd"  # an ID that must stay is printed as what it is
    # two identities never share a HyperNode name ("$" matched before a trailing newline)
    assert domain_name("leaf", ("leaf1\n",)) != domain_name("leaf", ("leaf1",))
    assert domain_name("leaf", ("leaf1",)) == "leaf-leaf1"


def test_a_ufm_switch_name_with_a_control_character_is_named_by_its_guid() -> None:
    data = listings(SMALL)
    for item in data["systems"] + data["ports"]:
        if item.get("system_name") == "leaf1":
            item["system_name"] = "lea\x00f1"
    names = set(ufm_graph.switch_names(ufm.from_listings(data)).values())
    assert "leaf1" not in names and "lea\x00f1" not in names
    assert any(name.startswith("ib-") for name in names) and "leaf2" in names


def test_ufm_system_names_match_nodes_as_dump_hosts_do() -> None:
    """Upper-case system names join lower-case Nodes, and without Nodes (render) they name hosts
    lower-cased, as the hosts of a dump are."""
    data = listings(SMALL)
    for item in data["ports"] + data["systems"]:
        if str(item.get("system_name", "")).startswith("node"):
            item["system_name"] = item["system_name"].upper()
    fabric = ufm.from_listings(data)
    with_nodes = FabricGraph()
    for node in SMALL.nodes():
        with_nodes.add_node(node)
    assert ufm_graph.apply(with_nodes, fabric) == []  # every node matched, no UFM host left over
    assert set(with_nodes.attached_by_host) == set(SMALL.nodes())
    bare = FabricGraph()
    ufm_graph.apply(bare, fabric)
    assert set(bare.attached_by_host) == set(SMALL.nodes())  # "NODE01" -> "node01", as a dump says


def test_lldpcli_json_deeper_than_its_bound_is_one_line() -> None:
    text = '{"lldp": ' + "[" * 5000 + "]" * 5000 + "}"
    with pytest.raises(LldpcliError, match=r"^lldpcli JSON: nested deeper than 32 levels$"):
        parse_json(text)
    with pytest.raises(LldpcliError, match=r"nested deeper than 32 levels"):
        parse_json('{"lldp": ' + "[" * 40 + "]" * 40 + "}")


def test_an_odd_lldpcli_json_field_is_left_out_rather_than_published_as_the_reader_refuses_it() -> None:
    """`json` flavour with a description list, a numeric subtype and a nested address: the agent
    keeps what is text, and its report reads back as published."""
    doc = {"lldp": {"interface": {"eth0": {"chassis": {"leaf1": {"id": {"type": 4, "value": "0c:42:a1:00:00:01"},
           "descr": ["a", "b"], "mgmt-ip": ["10.0.0.1", ["10.0.0.2"]]}},
           "port": {"id": {"type": "ifname", "value": "swp1"}, "descr": {"x": 1}, "ttl": "\u0661\u0662"}}}}}  # fmt: skip
    (neighbour,) = parse_json(json.dumps(doc))
    assert (neighbour.chassis_id_subtype, neighbour.system_description, neighbour.port_description) == (
        "4",
        None,
        None,
    )
    assert neighbour.management_addresses == ("10.0.0.1",) and neighbour.ttl == 0
    report = dataclasses.replace(NodeReport(node_name="n1", health={}), lldp=(neighbour,))
    assert report_from_spec(json.loads(json.dumps(report_spec(report)))) == report


def test_a_report_whose_metadata_is_no_object_is_refused_by_name() -> None:
    obj = node_topology_object(report_for(SMALL, "node01"))
    from aggregator.sources.nodetopology import report_from_object

    with pytest.raises(ValueError, match=r"^metadata: expected an object, got bool$"):
        report_from_object({**obj, "metadata": True})
    nested: object = "x"
    for _ in range(900):
        nested = [nested]
    spec = {**obj["spec"], "nodeName": nested}
    with pytest.raises(ValueError, match=r"^spec.nodeName: expected a string, got list <list of 1>$"):
        report_from_object({**obj, "spec": spec})


# documents yaml_codec.Loader builds itself (errors included), and ones it hands to SafeConstructor
YAML_PLAIN = [
    "a: [1, {b: c}, [d]]\nb: !!float 1_0.5\nc: ''\nd: null\ne: 2001-12-14t21:59:43.10-05:00\nf: !!binary aGVsbG8=",
    "- 0o17\n- 0x1F\n- 1:30\n- .inf\n- ~\n- yes\n- Off\n- '1'\n- 1e3", "a: 1\na: 2", "", "x", "---\na: 1\n---\n- b\n",
    "[" * 500 + "]" * 500, "[" * 1001 + "]" * 1001, "? [a]\n: 1", "? {a: 1}\n: 1", "- !!int x\n- {<<: 5}",
    "a: {b: !!int y}\nc: !!int z",  # breadth first, as SafeConstructor: z's error, not y's
]  # fmt: skip
YAML_HANDED_OVER = [
    "a: !foo 1", "a: !foo {b: 1}", "!!map x", "a: !!str {b: 1}", "x: {<<: 5, a: !!int x}", "<<: {a: 1}\nb: 2",
    "=: 3", "a: !!set {x, y}", "a: !!omap [{a: 1}]", "a: !!pairs [{a: 1}, {a: 2}]",
]  # fmt: skip


def test_yaml_built_in_one_loop_is_what_pyyaml_builds_with_the_same_first_error() -> None:
    """yaml_codec.Loader builds maps, lists and core scalars itself (speed) and hands anything else
    to SafeConstructor: for odd shapes and 700 mutated models and reports it gives PyYAML's value
    or its first error, word for word; plain documents are built by the loop, odd ones by PyYAML."""
    import random

    import yaml
    from fuzz_inputs import YAML_MUTATIONS

    from agent.common import yaml_codec

    def outcome(loader: type, text: str) -> tuple[str, str]:
        try:
            return "read", repr(list(yaml.load_all(text, Loader=loader)))
        except (yaml.YAMLError, ValueError) as exc:  # ValueError: an integer past 4,300 digits
            return type(exc).__name__, str(exc)

    handed_over: list[object] = []
    original = yaml.constructor.BaseConstructor.construct_document

    def counted(self: object, node: object) -> object:
        if isinstance(self, yaml_codec.Loader):
            handed_over.append(node)
        return original(self, node)  # type: ignore[arg-type]

    def handed(texts: list[str]) -> int:
        before = len(handed_over)
        for text in texts:
            assert outcome(yaml_codec.Loader, text) == outcome(yaml_codec.SafeLoader, text), text[:200]
        return len(handed_over) - before

    seeds = [path.read_text() for path in sorted(MODELS.glob("*.yaml")) if path.stat().st_size < 4000]
    seeds.append(yaml_codec.dump(node_topology_object(report_for(SMALL, "node01"))))
    rng, names = random.Random(22), sorted(set(YAML_MUTATIONS) - {"alias"})  # aliases never get this far
    mutated = [YAML_MUTATIONS[names[i % len(names)]](rng.choice(seeds), rng) for i in range(700)]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(yaml.constructor.BaseConstructor, "construct_document", counted)
        assert handed(seeds + YAML_PLAIN) == 0
        assert handed(YAML_HANDED_OVER) == len(YAML_HANDED_OVER)
        odd = handed(mutated)
    assert odd < len(mutated) // 10, f"{odd} of the mutated documents went to SafeConstructor"
    print(f"\n{len(mutated)} mutated documents read alike, {odd} of them by SafeConstructor")


# block YAML's subtle spots: what yaml_block reads must be what libyaml reads; what it is unsure of goes there
YAML_BLOCK = [
    "a: b\n  c\n", "- x\n  y", "a:\n- x\n- y\nb: 1", "- a:\n  - x\n  b: 1", "- a:\n- x", "-   a: 1\n    b: 2\n- c",
    "a: 'it''s'", "a: '#x'", "a: b #c", "# c\na: 1\n   # indented\nb: 2\n\n", "a: 1\na: 2", "1: a\ntrue: b",
    "a: .nan\nb: .nan", "a: -1\nb: -x\nc: --", "a: -", "a: - x", "a:b: c", "a: b: c", "a: [x]", "a: []\nb: {}",
    "a:   b", "a: b ", "a:", "a:\nb:", "- ", "-", "- - x", "a: 2001-12-14\n2002-01-01: b", "a: 0o17\nb: 1_000\nc: 0x1F",
    "a: ~\nb: yes\nc: Off\nd: null\ne: ''\nf: '1'", "a: " + "9" * 5000, "  a: 1", "a:\n    b: 1\n  c: 2",
    "a: b\r\nc: d", "a: \tb", "--- \na: 1", "a: 1\n...\n", "a: '\n b'", "a: 'x' y", "? a\n: b", "k: v\n- x",
    "- x\n-y", "a:\n  - x\n  -  y: 1\n     z: 2", 'a: "x"', "a: x'y\nb: x\"y\nc: x,y]\nd: x[y", "a: <<", "a: =",
    "<<: 1", "a/b.c-d_e: 1\n0: x\n00: y\n1.5: z\nnull: n", "'a'': b': c\n'': d", "a: b\u00e9", "a: 1:30\nb: 1e3",
    "a: 1\n b: 2", "a:\n  b: 1\n c: 2", "- a\n - b", "a:\n  - b\n   - c", "a: b\n- c", "x", "",
]  # fmt: skip


def test_block_yaml_read_line_by_line_is_what_libyaml_reads() -> None:
    """yaml_codec reads plain block documents (reports, `kubectl -o yaml`) line by line (speed)
    and hands libyaml whatever it is unsure of: each document it reads, of odd shapes and 1,500
    mutated reports and models, has libyaml's value exactly (repr: order and types; libyaml's as
    yaml_codec.Loader builds it, which the test above holds to PyYAML's), and a seeded share of
    them is read that way (the comparison is not vacuous)."""
    import random

    import yaml
    from fuzz_inputs import YAML_MUTATIONS

    from agent.common import yaml_block, yaml_codec

    full = [yaml_codec.dump(node_topology_object(report_for(SMALL, node))) for node in SMALL.nodes()[:2]]
    models = [path.read_text() for path in sorted(MODELS.glob("*.yaml")) if path.stat().st_size < 4000]
    rng, names = random.Random(22), sorted(YAML_MUTATIONS)
    mutated = [YAML_MUTATIONS[names[i % len(names)]](rng.choice(full + models), rng) for i in range(1500)]
    read = 0
    for text in full + models + YAML_BLOCK + mutated:
        value = yaml_codec._block(text)
        if value is yaml_block.NOT_PLAIN:
            continue
        read += 1
        assert repr([value]) == repr(list(yaml.load_all(text, Loader=yaml_codec.Loader))), text[:300]
    assert read >= 80 and yaml_codec._block(full[0]) is not yaml_block.NOT_PLAIN, read
    total = len(full + models + YAML_BLOCK + mutated)
    print(f"\n{read} of {total} documents read line by line, as libyaml reads them")
