"""Turns at the decision thread, round-robin over clients, with a cap on each client's
calls waiting: one client's burst of quotes delays another's submit by at most one of its
decisions (``holders`` of them), not by the whole burst (a FIFO lock would serve the
burst first)."""

from __future__ import annotations

import asyncio
from collections import OrderedDict, deque

from controller.errors import BusyError

__all__ = ["Turns"]


class Turns:
    """Up to ``holders`` holders at a time; waiting calls are granted a client at a time,
    in turn.

    Args:
        max_waiting: the most calls of one client inside (waiting or holding); one more
            raises :class:`BusyError` at once. 0: no cap. The daemon's own steps (client
            ``""``: slot ticks, the execution plane) are never capped.
        holders: turns granted at once. The decision thread runs one step at a time; a
            second holder has its step queued behind, so the thread starts it as soon as
            the first ends instead of waiting for the event loop to grant the next turn.
    """

    def __init__(self, max_waiting: int = 0, holders: int = 1) -> None:
        self.max_waiting = max_waiting
        self.holders = holders
        self._held = 0  # turns granted and not released
        self._queues: OrderedDict[str, deque[asyncio.Future[None]]] = OrderedDict()
        self._inside: dict[str, int] = {}

    def inside(self, client: str) -> int:
        """Calls of ``client`` waiting for or holding a turn."""
        return self._inside.get(client, 0)

    async def acquire(self, client: str) -> None:
        """Wait for a turn (first come among the clients' heads, each client in turn).

        Raises:
            BusyError: ``client`` already has ``max_waiting`` calls inside.
        """
        count = self._inside.get(client, 0)
        if self.max_waiting and client and count >= self.max_waiting:
            raise BusyError(
                f"{count} calls of this client in flight; at most limits.max_in_flight = "
                f"{self.max_waiting} (wait for their answers)"
            )
        self._inside[client] = count + 1
        if self._held < self.holders and not self._queues:
            self._held += 1
            return
        turn: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._queues.setdefault(client, deque()).append(turn)
        try:
            await turn
        except BaseException:
            if turn.done() and not turn.cancelled():
                self.release(client)  # granted as it was cancelled: pass the turn on
            else:
                queue = self._queues.get(client)
                if queue is not None and turn in queue:
                    queue.remove(turn)
                    if not queue:
                        del self._queues[client]
                self._leave(client)
            raise

    def release(self, client: str) -> None:
        """End ``client``'s turn and grant the next: the head of the next client's queue."""
        self._leave(client)
        self._held -= 1
        while self._queues:
            name, queue = next(iter(self._queues.items()))
            turn = queue.popleft()
            if queue:
                self._queues.move_to_end(name)  # its next call waits for the others
            else:
                del self._queues[name]
            if not turn.done():
                self._held += 1
                turn.set_result(None)
                return

    def _leave(self, client: str) -> None:
        left = self._inside.get(client, 0) - 1
        if left > 0:
            self._inside[client] = left
        else:
            self._inside.pop(client, None)
