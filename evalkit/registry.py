"""Name -> factory registries that fail loudly on collisions and typos (lm-eval style)."""
from __future__ import annotations

import difflib
from typing import Generic, Iterator, TypeVar

T = TypeVar("T")


class RegistryError(KeyError, ValueError):
    """A collision or an unknown name: a KeyError for lookups, a ValueError for bad input."""
    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0])


class Registry(Generic[T]):
    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._items: dict[str, T] = {}
        self._origin: dict[str, str] = {}

    def add(self, name: str, item: T, origin: str = "") -> T:
        if name in self._items:
            raise RegistryError(
                f"{self.kind} {name!r} is already registered (by {self._origin[name] or 'unknown'}); "
                f"refusing to replace it with the one from {origin or 'unknown'}")
        self._items[name] = item
        self._origin[name] = origin
        return item

    def get(self, name: str) -> T:
        if name not in self._items:
            near = difflib.get_close_matches(name, list(self._items), n=3)
            hint = f"; did you mean {', '.join(map(repr, near))}?" if near else ""
            raise RegistryError(
                f"unknown {self.kind} {name!r}{hint} (known: {', '.join(sorted(self._items)) or 'none'})")
        return self._items[name]

    __getitem__ = get

    def remove(self, name: str) -> T:
        """Take `name` out (a test or a plugin undoing its registration); returns its item."""
        item = self.get(name)
        del self._items[name], self._origin[name]
        return item

    def values(self) -> list[T]:
        """The items in registration order (the order their modules declare them)."""
        return list(self._items.values())

    def origin(self, name: str) -> str:
        self.get(name)
        return self._origin[name]

    def __contains__(self, name: object) -> bool:
        return name in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(self._items))

    def names(self) -> list[str]:
        return sorted(self._items)
