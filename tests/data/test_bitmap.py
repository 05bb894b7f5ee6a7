"""hermes.data.bitmap: the rows a run has done, one bit each, read back in order."""
import random

from hermes.data import bitmap


def test_the_numbers_added_come_back_sorted_once_each_in_chunks():
    rng = random.Random(7)
    numbers = rng.sample(range(100_003), 60_000) + list(range(0, 64)) + [100_002]
    bits = bitmap.empty(100_003)
    bitmap.add(bits, numbers)
    bitmap.add(bits, numbers[:10])  # adding twice changes nothing
    chunks = list(bitmap.chunks(bits, size=1000))
    assert [n for c in chunks for n in c] == sorted(set(numbers))
    assert all(1000 <= len(c) < 1008 for c in chunks[:-1])


def test_an_empty_set_yields_nothing():
    assert list(bitmap.chunks(bitmap.empty(0))) == list(bitmap.chunks(bitmap.empty(50))) == []
