"""First-fit-decreasing packing of conversations into bins of a fixed token capacity.

Items are taken longest first (ties: input order) and each goes into the first (lowest-index)
bin with room for it; a new bin opens when none has. FFD uses at most 11/9*OPT + 6/9 bins
(Dosa 2007), so never more than 11/9*OPT + 1. A max-tree over the bins' free space finds the
first bin with room in O(log bins), so packing n items costs O(n log n).
"""
from __future__ import annotations

from collections.abc import Sequence


class _FirstFit:
    """Bins with free space; `place(size)` returns the lowest bin with free >= size."""

    def __init__(self, capacity: int, max_bins: int):
        self.capacity = capacity
        self.size = 1
        while self.size < max(max_bins, 1):
            self.size *= 2
        self.free = [0] * (2 * self.size)  # leaves: bins (unopened bins: capacity, set on open)
        self.n_bins = 0

    def place(self, item: int) -> int:
        if self.free[1] >= item:
            node = 1
            while node < self.size:
                node = 2 * node if self.free[2 * node] >= item else 2 * node + 1
            index = node - self.size
        else:
            index = self.n_bins
            self.n_bins += 1
            self._set(index, self.capacity)
        self._set(index, self.free[index + self.size] - item)
        return index

    def _set(self, index: int, value: int) -> None:
        node = index + self.size
        self.free[node] = value
        node //= 2
        while node:
            self.free[node] = max(self.free[2 * node], self.free[2 * node + 1])
            node //= 2


def first_fit_decreasing(sizes: Sequence[int], capacity: int) -> list[list[int]]:
    """Bins as lists of item indices (each bin in placement order); every item must fit
    (0 < size <= capacity), else ValueError."""
    bad = [s for s in sizes if not 0 < s <= capacity]
    if bad:
        raise ValueError(f"item size {bad[0]} outside 1..capacity {capacity}")
    order = sorted(range(len(sizes)), key=lambda i: (-sizes[i], i))
    packer = _FirstFit(capacity, len(sizes))
    bins: list[list[int]] = []
    for i in order:
        index = packer.place(sizes[i])
        if index == len(bins):
            bins.append([])
        bins[index].append(i)
    return bins


def packing_efficiency(sizes: Sequence[int], *, n_bins: int, capacity: int) -> float:
    """Real tokens / bin capacity: the share of packed tokens that are not padding."""
    return sum(sizes) / (n_bins * capacity) if n_bins else 0.0
