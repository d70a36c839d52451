"""A read-only mapping that shares an older version's entries: copy on write in the size of the change.

The pipeline hands out a new node -> labels map (and the tree a new node -> domain map) after
every structural change, while earlier results stay valid for whoever holds them. Copying a
100,000-entry dict for a change of a few dozen entries costs more than the rest of the update,
so a version is a base dict, shared and never written once shared, plus the entries changed since
the base. A new version copies only those; once they grow past an eighth of the base they are
folded into a new base (amortised, a few entries copied per change).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Generic, TypeVar

K = TypeVar("K")
V = TypeVar("V")

_GONE: object = object()  # in `changes`: the key was removed
FOLD_AT = 1024  # changes kept apart from the base at least up to this many


class Layered(Mapping[K, V], Generic[K, V]):
    """A mapping version: `base` (shared, never written) with `over` (key -> value or removed) on top."""

    __slots__ = ("_base", "_len", "_over")

    def __init__(
        self, base: Mapping[K, V], over: dict[K, object] | None = None, length: int | None = None
    ) -> None:
        """`base` becomes this mapping's (and its later versions'): the caller must not write it."""
        self._base = base
        self._over: dict[K, object] = over or {}
        self._len = len(base) if length is None else length

    def __getitem__(self, key: K) -> V:
        over = self._over
        if key in over:
            value = over[key]
            if value is _GONE:
                raise KeyError(key)
            return value  # type: ignore[return-value]
        return self._base[key]

    def __contains__(self, key: object) -> bool:
        over = self._over
        if key in over:
            return over[key] is not _GONE
        return key in self._base

    def __iter__(self) -> Iterator[K]:
        over = self._over
        yield from (k for k in self._base if k not in over)
        yield from (k for k, v in over.items() if v is not _GONE)

    def __len__(self) -> int:
        return self._len

    def changed(self, updates: Mapping[K, V], removed: frozenset[K] | set[K] = frozenset()) -> Layered[K, V]:
        """A new version with `updates` set and `removed` gone; this one stays as it is."""
        length = self._len
        for key in updates:
            if key not in self:
                length += 1
        gone = [key for key in removed if key not in updates and key in self]
        length -= len(gone)
        over = {**self._over, **updates, **dict.fromkeys(gone, _GONE)}
        if len(over) > max(FOLD_AT, len(self._base) // 8):
            base = dict(self._base)
            for key, value in over.items():
                if value is _GONE:
                    base.pop(key, None)
                else:
                    base[key] = value  # type: ignore[assignment]
            return Layered(base)
        return Layered(self._base, over, length)
