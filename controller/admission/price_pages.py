"""Pages of ``GetPrices``: how many servers' prices one answer carries, and what an
answer too large for one message is told.

At 10,000 servers x 5 resources one slot of prices is about 0.4 MB, so an answer of
every server over 40 slots passes gRPC's 16 MiB cap on one message, and gRPC refused
it with ``Sent message larger than max`` after the daemon had built it (``oasis prices
--slots 48`` and ``oasis status --slots 48`` failed so). Clients page instead
(``page_size``, ``page_token``); an answer asked whole is refused before it is built.
"""

from __future__ import annotations

__all__ = ["ROW_OVERHEAD_BYTES", "price_page", "too_many_prices"]

ROW_OVERHEAD_BYTES = 64
"""Bytes counted per (server, resource) row beyond its prices: the names and framing."""


def price_page(page_size: int, slots: int, resources: int, max_page_bytes: int) -> int:
    """Servers in one page: ``page_size`` (> 0), fewer if their rows of ``slots`` prices
    for ``resources`` resources would pass ``max_page_bytes`` (``limits.max_page_bytes``),
    and at least one."""
    per_server = max(resources, 1) * (8 * max(slots, 1) + ROW_OVERHEAD_BYTES)
    return max(1, min(page_size, max_page_bytes // per_server))


def too_many_prices(servers: int, size: int) -> str:
    """Why an answer of ``servers`` servers' prices, about ``size`` bytes, is refused."""
    return (
        f"the prices of {servers:,} servers are about {size / 2**20:,.1f} MiB, more than "
        f"one answer holds (16 MiB): ask page_size (oasis prices and oasis status page by "
        f"themselves), fewer slots, or one server"
    )
