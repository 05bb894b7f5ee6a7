"""A set of small non-negative integers as a bytearray, one bit each (row n: byte n >> 3, bit n & 7).

What a run keeps per dataset row when it must keep something: a million rows cost 122 KB.
"""
from __future__ import annotations

from typing import Iterable, Iterator

_ONES = 0xFF


def empty(size: int) -> bytearray:
    return bytearray((size + 7) // 8)


def add(bits: bytearray, numbers: Iterable[int]) -> None:
    for n in numbers:
        bits[n >> 3] |= 1 << (n & 7)


def chunks(bits: bytearray, size: int = 8192) -> Iterator[list[int]]:
    """The numbers set, in order, about `size` at a time."""
    out: list[int] = []
    for i, byte in enumerate(bits):
        if byte == _ONES:
            out.extend(range(i << 3, (i << 3) + 8))
        elif byte:
            out.extend((i << 3) + j for j in range(8) if byte >> j & 1)
        else:
            continue
        if len(out) >= size:
            yield out
            out = []
    if out:
        yield out
