"""Layered mappings (aggregator.layered): each version reads exactly as a dict built by applying
the same changes to a copy of the last one, and an older version never changes when newer ones
are made from it, whether its changes sit over the shared base or were folded into a new one."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aggregator import layered
from aggregator.layered import Layered

KEYS = st.integers(min_value=0, max_value=12)
changes = st.lists(
    st.tuples(st.dictionaries(KEYS, st.integers()), st.sets(KEYS), st.integers(min_value=0, max_value=20)),
    max_size=12,
)


def _reads_as(version: Layered[int, int], expected: dict[int, int]) -> None:
    assert dict(version.items()) == expected
    assert len(version) == len(expected)
    assert sorted(version) == sorted(expected)
    for key in range(13):
        assert (key in version) == (key in expected)
        assert version.get(key) == expected.get(key)
        if key not in expected:
            with pytest.raises(KeyError):
                version[key]


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(KEYS, st.integers()), changes, st.sampled_from([1, 3, 1024]))
def test_every_version_reads_as_its_own_dict(
    start: dict[int, int], sequence: list[tuple[dict[int, int], set[int], int]], fold_at: int
) -> None:
    """Updates and removals (of present and absent keys, also of a key updated at once), from any
    earlier version, folding after 1 or 3 changes or never."""
    old_fold = layered.FOLD_AT
    layered.FOLD_AT = fold_at
    try:
        versions = [(Layered(dict(start)), dict(start))]
        for updates, removed, pick in sequence:
            base, expected = versions[pick % len(versions)]
            after = {k: v for k, v in expected.items() if k not in removed or k in updates} | updates
            versions.append((base.changed(updates, removed), after))
        for version, expected in versions:
            _reads_as(version, expected)
    finally:
        layered.FOLD_AT = old_fold


def test_a_new_version_does_not_copy_the_shared_entries() -> None:
    """The point of it: a change of one entry in 100,000 copies one entry, not the base."""
    base = {n: n for n in range(100_000)}
    version = Layered(base).changed({5: -5}, {7})
    assert version._base is base and version._over == {5: -5, 7: layered._GONE}
    assert base[5] == 5 and 7 in base
    assert version[5] == -5 and 7 not in version and len(version) == 99_999
