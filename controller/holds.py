"""How many of something each holder holds now: a client's calls in flight or waiting
for their request, a host's streams or console connections.

Every cap per client or per host counts the same way: one more when a holder takes one,
one fewer when it gives one back, and the holder forgotten once it holds none, so the
count is as large as the holders of the moment, never every peer ever seen.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

__all__ = ["Holds"]


class Holds(Mapping[str, int]):
    """What each holder holds (a mapping of the holders holding any to their counts)."""

    def __init__(self) -> None:
        self._held: dict[str, int] = {}

    def of(self, holder: str) -> int:
        """What ``holder`` holds (0: nothing)."""
        return self._held.get(holder, 0)

    def take(self, holder: str) -> None:
        """``holder`` holds one more."""
        self._held[holder] = self._held.get(holder, 0) + 1

    def give_back(self, holder: str) -> None:
        """``holder`` holds one fewer; forgotten once it holds none (one it did not
        hold: nothing)."""
        left = self._held.get(holder, 0) - 1
        if left > 0:
            self._held[holder] = left
        else:
            self._held.pop(holder, None)

    def __getitem__(self, holder: str) -> int:
        return self._held[holder]

    def __iter__(self) -> Iterator[str]:
        return iter(self._held)

    def __len__(self) -> int:
        return len(self._held)
