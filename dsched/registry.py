"""Strategies chosen by name: one small registry type for every plug-in point.

Each decision with several strategies (allocator, predictor, placement, cap
and move actuators, cgroup backend) keeps one :class:`Registry`. A config key
names the strategy; an unknown name is a :class:`UnknownPlugin`, a
:class:`~dsched.config.ConfigError` naming the key and the known names, so a
typo stops the daemon at startup instead of falling back silently.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

from dsched.config import ConfigError

T = TypeVar("T")


class UnknownPlugin(ConfigError):
    """A strategy name that no registry entry answers to."""

    def __init__(self, key: str, kind: str, name: object, known: list[str]):
        super().__init__(key, f"unknown {kind} {name!r} (known: {', '.join(known)})")
        self.kind = kind
        self.name = name
        self.known = known


class Registry(Generic[T]):
    """Factories of one kind of strategy, by name.

    ``kind`` names the decision in errors ("allocator", "placement strategy");
    ``key`` is the config key that chooses it.
    """

    def __init__(self, kind: str, key: str):
        self.kind = kind
        self.key = key
        self._factories: dict[str, Callable[..., T]] = {}

    def register(self, name: str) -> Callable[[Callable[..., T]], Callable[..., T]]:
        """Decorator: ``@ALLOCATORS.register("qos-dp")`` over a class or factory."""

        def add(factory: Callable[..., T]) -> Callable[..., T]:
            self.add(name, factory)
            return factory

        return add

    def add(self, name: str, factory: Callable[..., T]) -> None:
        if name in self._factories:
            raise ValueError(f"{self.kind} {name!r} is registered twice")
        self._factories[name] = factory

    def names(self) -> list[str]:
        return sorted(self._factories)

    def check(self, name: object, key: str | None = None) -> str:
        """``name`` if registered, else UnknownPlugin naming ``key`` (default: the registry's)."""
        if not isinstance(name, str) or name not in self._factories:
            raise UnknownPlugin(key or self.key, self.kind, name, self.names())
        return name

    def factory(self, name: str, key: str | None = None) -> Callable[..., T]:
        return self._factories[self.check(name, key)]

    def create(self, name: str, *args, key: str | None = None, **options) -> T:
        """Build strategy ``name``; options go to its factory."""
        return self.factory(name, key)(*args, **options)

    def __contains__(self, name: object) -> bool:
        return name in self._factories

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self._factories)
