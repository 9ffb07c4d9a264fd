"""Cutting and joining chunks (pure).

- `segments`: bytes cut into pieces of at most a size (an MSS).
- `item_size`: the bytes an item carries.
- `merged`: adjacent downstream chunks joined, so what one read released goes out as
  one write.
- `joined_chunk`: parts as one chunk, so a rewrite keeps the write's granularity.
"""

from __future__ import annotations

from middlebox.core.stream import DOWN, Chunk, Direction, Item


def segments(data: bytes, size: int) -> list[bytes]:
    """`data` cut into pieces of at most `size` bytes (one piece if `size` is 0)."""
    if size <= 0 or len(data) <= size:
        return [data]
    return [data[i : i + size] for i in range(0, len(data), size)]


def item_size(item: Item) -> int:
    return len(item.data) if isinstance(item, Chunk) else 0


def merged(items: list[Item]) -> list[Item]:
    """Adjacent downstream chunks as one write, as one read's bytes go out in one send."""
    out: list[Item] = []
    for item in items:
        last = out[-1] if out else None
        if isinstance(item, Chunk) and isinstance(last, Chunk) and last.direction is DOWN:
            out[-1] = Chunk(DOWN, last.data + item.data)
        else:
            out.append(item)
    return out


def joined_chunk(direction: Direction, parts: list[bytes]) -> list[Item]:
    """`parts` as one Chunk (none if empty), so a rewrite keeps the write's granularity."""
    data = b"".join(parts)
    return [Chunk(direction, data)] if data else []
