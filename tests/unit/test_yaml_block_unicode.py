"""yaml_block reads block YAML holding printable non-ASCII text (Unicode digits, accents, a
bidirectional override, emoji) line by line as libyaml reads it, and leaves to libyaml every
character that YAML reads otherwise than a printable one: NEL and the line and paragraph separators
(YAML line breaks), the byte-order mark (skipped at a line's start), C1 controls and surrogates
(refused), U+FFFE and U+FFFF (not characters)."""

from __future__ import annotations

import pytest
import yaml

from agent.common import yaml_block, yaml_codec

SHAPES = ["a: {c}", "a: x{c}y", "a: {c}x", "- {c}", "- x{c}", "a: '{c}'", "a:\n  b: {c}\n", "a: 1\n{c}b: 2",
          "'{c}': 1", "a: x {c}", "a: 1{c}", "a: ~{c}", "a:\n- '{c}'\n- {c}{c}"]  # fmt: skip
PRINTABLE = ["\u00e9", "\u00a0", "\u00b2", "\u0661\u0662", "\uff11", "\u202e", "\u200b", "\u3000", "\ud7ff", "\ue000",
             "\ufefe", "\uff00", "\ufffd", "\U0001f600", "\U0010ffff"]  # fmt: skip
READ_OTHERWISE = ["\x85", "\u2028", "\u2029", "\ufeff", "\x80", "\x9f", "\ud800", "\udfff", "\ufffe", "\uffff"]  # fmt: skip


def _libyaml(text: str) -> str:
    try:
        return repr(list(yaml.load_all(text, Loader=yaml_codec.Loader)))
    except (yaml.YAMLError, ValueError) as exc:  # ValueError: a surrogate cannot be encoded for libyaml
        return f"{type(exc).__name__}: {exc}"


@pytest.mark.parametrize("char", PRINTABLE, ids=ascii)
def test_printable_non_ascii_text_is_read_line_by_line_as_libyaml_reads_it(char: str) -> None:
    read = 0
    for shape in SHAPES:
        text = shape.format(c=char)
        value = yaml_codec._block(text)
        if value is not yaml_block.NOT_PLAIN:
            read += 1
            assert repr([value]) == _libyaml(text), ascii(text)
    assert read >= len(SHAPES) - 4, f"only {read} of {len(SHAPES)} shapes read line by line"


@pytest.mark.parametrize("char", READ_OTHERWISE, ids=ascii)
def test_characters_yaml_reads_otherwise_are_left_to_libyaml(char: str) -> None:
    for shape in SHAPES:
        assert yaml_codec._block(shape.format(c=char)) is yaml_block.NOT_PLAIN, ascii(shape.format(c=char))
