"""yaml_block remembers the value of each short one-line scalar it has read (speed: field names and
values repeat from line to line and report to report): a value read again is the value read the
first time, and nothing mutable or unequal to itself is ever shared between two reads."""

from __future__ import annotations

import math

import yaml

from agent.common import yaml_block, yaml_codec

TEXT = "a: []\nb: {}\nc: 1\nd: .nan\ne: '1'\nf: 2024-01-01\ng: yes\nh: ~\ni: x\nj:\n- .nan\n- []\n- c\n- 1\n"


def test_a_document_read_again_is_read_as_the_first_time_and_as_pyyaml_reads_it() -> None:
    assert yaml_codec._block(TEXT) is not yaml_block.NOT_PLAIN  # read line by line, not by libyaml
    first, second = yaml_codec.load(TEXT), yaml_codec.load(TEXT)
    assert repr(first) == repr(second) == repr(yaml.load(TEXT, Loader=yaml.SafeLoader))
    assert first["c"] == 1 and first["e"] == "1" and first["g"] is True and first["h"] is None


def test_lists_and_maps_are_never_shared_between_reads() -> None:
    first, second = yaml_codec.load(TEXT), yaml_codec.load(TEXT)
    for key in ("a", "b"):
        assert first[key] is not second[key]
    assert first["j"][1] is not second["j"][1]
    first["a"].append(1)
    first["b"]["x"] = 1
    assert yaml_codec.load(TEXT)["a"] == [] and yaml_codec.load(TEXT)["b"] == {}
    assert math.isnan(first["d"]) and math.isnan(second["j"][0])
