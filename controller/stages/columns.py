"""Per-instance columns out of the mappings the stages exchange.

The stages hand each other mappings keyed by instance (demands, grants, caps,
hysteresis states), and at 20,000 instances a hash per instance per mapping
is a large part of an epoch: an instance key is a tuple, whose hash is
computed afresh on every lookup and touches three more objects. Most of these
mappings list the same keys in the same order, so :func:`values_in_order`
first checks that by identity (no hashing) and then reads the values in a
row; :class:`KeyedColumn` is a mapping built from two lists that only hashes
its keys if someone looks one up.
"""

from __future__ import annotations

from collections.abc import ItemsView, Iterator, Mapping, Sequence, ValuesView
from functools import partial
from itertools import islice, repeat
from operator import is_
from typing import Any, TypeVar

K = TypeVar("K")
V = TypeVar("V")

_MISSING: Any = object()


class KeyedColumn(Mapping[K, V]):
    """A read-only mapping over parallel ``keys`` and ``values`` lists.

    Iteration and :meth:`values` follow the lists; the first lookup by key
    builds the index. Keys must be distinct.
    """

    __slots__ = ("_index", "_keys", "_values")

    def __init__(self, keys: Sequence[K], values: Sequence[V]) -> None:
        if len(keys) != len(values):
            raise ValueError(f"keys and values differ in length: {len(keys)} and {len(values)}")
        self._keys = keys
        self._values = values
        self._index: dict[K, V] | None = None

    def _lookup(self) -> dict[K, V]:
        if self._index is None:
            self._index = dict(zip(self._keys, self._values, strict=True))
        return self._index

    def __getitem__(self, key: K) -> V:
        return self._lookup()[key]

    def get(self, key: K, default: Any = None) -> Any:
        return self._lookup().get(key, default)

    def __contains__(self, key: object) -> bool:
        return key in self._lookup()

    def __iter__(self) -> Iterator[K]:
        return iter(self._keys)

    def __len__(self) -> int:
        return len(self._keys)

    def values(self) -> ValuesView[V]:
        return _Values(self)

    def items(self) -> ItemsView[K, V]:
        return _Items(self)

    def __repr__(self) -> str:
        return f"KeyedColumn({dict(self.items())!r})"


class _Values(ValuesView):
    def __iter__(self):
        return iter(self._mapping._values)


class _Items(ItemsView):
    def __iter__(self):
        m = self._mapping
        return zip(m._keys, m._values, strict=True)


def values_in_order(mapping: Mapping[K, V], keys: Sequence[K], default: Any = _MISSING) -> list:
    """``[mapping[k] for k in keys]`` (``mapping.get(k, default)`` when a default is
    given). When the mapping starts with exactly these key objects in this
    order, its values are read in a row, without hashing a key."""
    n = len(keys)
    if len(mapping) >= n and all(map(is_, mapping, keys)):
        values = mapping.values()
        return list(values if len(mapping) == n else islice(values, n))
    if default is _MISSING:
        return list(map(mapping.__getitem__, keys))
    return list(map(mapping.get, keys, repeat(default)))


def tuples(cls: type, *columns) -> map:
    """Instances of the NamedTuple ``cls`` from parallel columns, built in C
    (``tuple.__new__`` is what ``cls._make`` calls, less the Python frame)."""
    return map(partial(tuple.__new__, cls), zip(*columns, strict=True))
