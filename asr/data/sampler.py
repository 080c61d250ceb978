"""Length-bucketed dynamic batch sampler that is correct under DDP: every rank plans the same
batches from the seed and epoch and keeps an equal share of them."""

from __future__ import annotations

import hashlib
import logging
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch.utils.data import Sampler

logger = logging.getLogger(__name__)

_Indices = list[int]


class _Repeat(list):
    """A batch repeating an utterance to even out the ranks' counts: it counts for nothing."""


Lengths = Sequence[float] | Callable[[int], Sequence[float]]


@dataclass(frozen=True)
class LengthGrid:
    """Lengths rounded up to the geometric grid ``ratio ** k`` (k an integer).

    >>> LengthGrid(2.0).edge(3.0), LengthGrid(2.0).edge(4.0), LengthGrid(2.0).edge(0.3)
    (4.0, 4.0, 0.5)
    >>> LengthGrid(2.0).samples(16001, sample_rate=16000)
    32000
    """

    ratio: float

    def __post_init__(self) -> None:
        if not (math.isfinite(self.ratio) and self.ratio > 1):
            raise ValueError(f"grid ratio must be finite and > 1, got {self.ratio}")

    def edge(self, length: float) -> float:
        """The smallest grid point >= `length` (0 for a length of 0)."""
        if length <= 0:
            return 0.0
        power = math.ceil(math.log(length, self.ratio) - 1e-9)
        edge = self.ratio**power
        return edge if edge >= length else self.ratio ** (power + 1)

    def samples(self, count: int, sample_rate: int) -> int:
        """`count` samples padded to the grid point (in seconds) at or above them."""
        return max(count, math.floor(self.edge(count / sample_rate) * sample_rate + 1e-6))


class DynamicBucketSampler(Sampler[list[int]]):
    """Yields index lists whose padded cost ``len(batch) * max(length)`` stays within a budget.

    Each epoch sorts items into quantile buckets, packs each greedily, then splits, merges or
    repeats batches until every DDP rank gets the same number of them.

    Args:
        lengths: every item's length (any unit), or a function from the epoch to them.
        max_batch_length: budget for ``len(batch) * max(length in batch)``.
        num_buckets: number of quantile buckets.
        max_batch_size: optional cap on items per batch.
        shuffle: shuffle within buckets and the batch order; False: ascending length.
        seed: base seed; epoch ``e`` uses ``seed + e``.
        num_replicas: number of DDP ranks (default: the world size, else 1).
        rank: this process's rank (default: from torch.distributed, else 0).
        drop_last: drop a remainder that cannot be split instead of repeating utterances.
        grid: pack to this grid's fixed menu of shapes; the collate function must pad to it.
        shortest_first_epochs: the first this many epochs yield batches shortest first.
    """

    def __init__(
        self,
        lengths: Lengths,
        max_batch_length: float,
        num_buckets: int = 20,
        max_batch_size: int | None = None,
        shuffle: bool = True,
        seed: int = 0,
        num_replicas: int | None = None,
        rank: int | None = None,
        drop_last: bool = False,
        grid: LengthGrid | None = None,
        shortest_first_epochs: int = 0,
    ) -> None:
        self._length_source = lengths
        self._cached_lengths: tuple[int, list[float]] | None = None
        self._lengths_of(0)
        _check_options(max_batch_length, num_buckets, max_batch_size, shortest_first_epochs)
        self.num_replicas, self.rank = _resolve_ranks(num_replicas, rank)
        self.max_batch_length = float(max_batch_length)
        self.num_buckets = num_buckets
        self.max_batch_size = max_batch_size
        self.shuffle = shuffle
        self.seed = seed
        self.drop_last = drop_last
        self.grid = grid
        self.shortest_first_epochs = shortest_first_epochs
        self.epoch = 0
        self._batches_yielded = 0
        self._resume_at = 0
        self._cached_plan: tuple[tuple[int, int], tuple[list, list]] | None = None
        self._said: set[str] = set()
        self.oversized = [
            i for i, n in enumerate(self.lengths) if self._padded(n) > self.max_batch_length
        ]
        if self.oversized:
            self._warn(
                "%d utterance(s) longer than max_batch_length=%g (padded) form batches of their "
                "own: indices %s",
                len(self.oversized),
                self.max_batch_length,
                _preview(self.oversized),
            )

    def set_epoch(self, epoch: int) -> None:
        """Select the next iteration's epoch; a pending resume point holds for its own epoch."""
        if epoch != self.epoch:
            self._resume_at = 0
            self._batches_yielded = 0
        self.epoch = epoch

    def __iter__(self) -> Iterator[list[int]]:
        self._batches_yielded = self._resume_at
        return self._batches_from_resume()

    def _batches_from_resume(self) -> Iterator[list[int]]:
        # The resume point is taken at the first batch, not by iter(): a DataLoader with
        # workers calls iter() twice and reads only the second (torch's _reset), which would
        # otherwise start the epoch again from batch 0.
        start, self._resume_at = self._resume_at, 0
        self._batches_yielded = start
        for batch in self._rank_batches()[start:]:
            self._batches_yielded += 1
            yield list(batch)

    def __len__(self) -> int:
        """Batches in this rank's whole epoch (a resumed iteration yields fewer)."""
        return len(self._rank_batches())

    def repeats(self) -> set[int]:
        """Positions in this rank's epoch of the batches that repeat an utterance only to give
        every rank as many batches: a metric counts them for nothing."""
        return {k for k, batch in enumerate(self._rank_batches()) if isinstance(batch, _Repeat)}

    def state_dict(self) -> dict[str, Any]:
        """Position for mid-epoch resume; ``batches_yielded`` includes prefetched batches;
        ``plan`` tells whether a resumed sampler would deal the same batches."""
        return {"epoch": self.epoch, "batches_yielded": self._batches_yielded, "seed": self.seed,
                "plan": self.plan_digest()}  # fmt: skip

    def plan_digest(self) -> str:
        """A digest of every rank's batches in this epoch: the same on each rank, as the
        checkpoint (rank 0's) holds it for all."""
        digest = hashlib.blake2b(digest_size=8)
        for batch in self._plans()[0]:
            digest.update(repr(list(batch)).encode())
        return digest.hexdigest()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a position: the next iteration skips the batches already yielded."""
        missing = {"epoch", "batches_yielded", "seed"} - set(state)
        if missing:
            raise ValueError(f"sampler state_dict lacks keys {sorted(missing)}")
        self.seed = int(state["seed"])
        self.epoch = int(state["epoch"])
        self._resume_at = int(state["batches_yielded"])
        self._batches_yielded = self._resume_at

    @property
    def lengths(self) -> list[float]:
        """Every item's length in the current epoch."""
        return self._lengths_of(self.epoch)

    def _lengths_of(self, epoch: int) -> list[float]:
        """The lengths in `epoch`, checked and cached (fixed lengths once for all epochs)."""
        source, cached = self._length_source, self._cached_lengths
        if cached is not None and (cached[0] == epoch or not callable(source)):
            return cached[1]
        if callable(source):
            lengths = _check_lengths(source(epoch), epoch)
        else:
            lengths = _check_lengths(source)
        if cached is not None and len(lengths) != len(cached[1]):
            raise ValueError(
                f"lengths for epoch {epoch} count {len(lengths)} items, not {len(cached[1])}"
            )
        self._cached_lengths = (epoch, lengths)
        return lengths

    def _padded(self, length: float) -> float:
        return length if self.grid is None else self.grid.edge(length)

    def _rank_batches(self) -> list[_Indices]:
        """This rank's batches for the current (seed, epoch), cached."""
        return self._plans()[1]

    def _plans(self) -> tuple[list[_Indices], list[_Indices]]:
        """Every rank's batches, and this rank's, for the current (seed, epoch), cached."""
        key = (self.seed, self.epoch)
        if self._cached_plan is None or self._cached_plan[0] != key:
            batches = self._plan()
            mine = [batches[i] for i in self._assign_ranks(batches)[self.rank]]
            self._cached_plan = (key, (batches, mine))
        return self._cached_plan[1]

    def _plan(self) -> list[_Indices]:
        generator = torch.Generator().manual_seed(self.seed + self.epoch)
        batches = self._pack(generator)
        shortest_first = self.epoch < self.shortest_first_epochs
        if self.shuffle and not shortest_first:
            batches = [batches[i] for i in torch.randperm(len(batches), generator=generator)]
        batches = self._make_divisible(batches)
        if shortest_first:
            batches.sort(key=self._longest)
        return batches

    def _pack(self, generator: torch.Generator) -> list[_Indices]:
        """Quantile buckets, shuffled within, packed greedily under the budget."""
        if not self.lengths:
            return []
        if self.grid is not None:
            return self._pack_on_grid(self.grid, generator)
        order = torch.sort(torch.tensor(self.lengths, dtype=torch.float64), stable=True).indices
        num_buckets = min(self.num_buckets, len(order))
        batches: list[_Indices] = []
        for bucket in torch.tensor_split(order, num_buckets):
            if self.shuffle:
                bucket = bucket[torch.randperm(len(bucket), generator=generator)]
            batches.extend(self._pack_bucket(bucket.tolist()))
        return batches

    def _pack_bucket(self, indices: list[int]) -> list[_Indices]:
        batches: list[_Indices] = []
        current: _Indices = []
        longest = 0.0
        for index in indices:
            length = self.lengths[index]
            grown_cost = (len(current) + 1) * max(longest, length)
            full = self.max_batch_size is not None and len(current) >= self.max_batch_size
            if current and (grown_cost > self.max_batch_length or full):
                batches.append(current)
                current, longest = [], 0.0
            current.append(index)
            longest = max(longest, length)
        if current:
            batches.append(current)
        return batches

    def _pack_on_grid(self, grid: LengthGrid, generator: torch.Generator) -> list[_Indices]:
        """Groups by grid point, cut into that point's batch size; remainders carry over."""
        groups: dict[float, _Indices] = {}
        for index, length in enumerate(self.lengths):
            groups.setdefault(grid.edge(length), []).append(index)
        batches: list[_Indices] = []
        carried: _Indices = []
        for edge in sorted(groups):
            group = torch.tensor(groups[edge])
            if self.shuffle:
                group = group[torch.randperm(len(group), generator=generator)]
            pending = group.tolist() + carried
            size = self._grid_batch_size(edge)
            whole = len(pending) - len(pending) % size
            batches.extend(pending[k : k + size] for k in range(0, whole, size))
            carried = pending[whole:]
        if carried:
            batches.append(carried)
        return batches

    def _grid_batch_size(self, edge: float) -> int:
        size = max(1, math.floor(self.max_batch_length / edge)) if edge > 0 else len(self.lengths)
        return size if self.max_batch_size is None else min(size, self.max_batch_size)

    def _longest(self, batch: _Indices) -> float:
        return self._padded(max(self.lengths[i] for i in batch))

    def _cost(self, batch: _Indices) -> float:
        return len(batch) * self._longest(batch)

    def _make_divisible(self, batches: list[_Indices]) -> list[_Indices]:
        """Split (or, failing that, pad or drop) until the count divides by num_replicas; in
        evaluation order (no shuffle), pad: a loss averaged per batch then weighs utterances
        as one process's batches do."""
        if not self.shuffle and len(batches) % self.num_replicas:
            return self._pad_or_drop(batches)
        while len(batches) % self.num_replicas:
            splittable = [k for k, b in enumerate(batches) if len(b) > 1]
            if not splittable:
                merged = self._merge_singletons(batches)
                return self._pad_or_drop(batches) if merged is None else merged
            k = max(splittable, key=lambda k: (self._cost(batches[k]), -k))
            by_length = sorted(batches[k], key=lambda i: (self.lengths[i], i))
            half = len(by_length) // 2
            batches[k : k + 1] = [by_length[:half], by_length[half:]]
        return batches

    def _merge_singletons(self, batches: list[_Indices]) -> list[_Indices] | None:
        """Pair up the shortest single-utterance batches to lose `count % R`; None if impossible."""
        merges = len(batches) % self.num_replicas
        if len(batches) < self.num_replicas or self.max_batch_size == 1:
            return None
        by_length = sorted(range(len(batches)), key=lambda k: (self.lengths[batches[k][0]], k))
        pairs = [by_length[2 * m : 2 * m + 2] for m in range(merges)]
        if any(self._cost(batches[a] + batches[b]) > self.max_batch_length for a, b in pairs):
            return None
        merged = {a: batches[a] + batches[b] for a, b in pairs}
        dropped = {b for _, b in pairs}
        return [merged.get(k, batch) for k, batch in enumerate(batches) if k not in dropped]

    def _pad_or_drop(self, batches: list[_Indices]) -> list[_Indices]:
        """The count is not a multiple of num_replicas, and no batch is to be split or merged."""
        remainder = len(batches) % self.num_replicas
        if self.drop_last:
            self._warn(
                "drop_last: dropping %d batch(es) so that %d ranks get equal counts (epoch %d)",
                remainder,
                self.num_replicas,
                self.epoch,
            )
            return batches[: len(batches) - remainder]
        needed = self.num_replicas - remainder
        shortest = sorted(range(len(self.lengths)), key=lambda i: (self.lengths[i], i))
        repeats = [_Repeat([shortest[k % len(shortest)]]) for k in range(needed)]
        self._warn(
            "%d batch(es) cannot be shared equally by %d ranks: repeating utterance(s) %s "
            "this epoch (validation and test count them once)",
            len(batches),
            self.num_replicas,
            _preview([b[0] for b in repeats]),
        )
        return batches + repeats

    def _warn(self, message: str, *args: Any) -> None:
        """A warning rank 0 gives the first time (later epochs: at debug level); each rank's
        sampler plans alike, and one line each per epoch would flood a long DDP run."""
        if self.rank == 0:
            (logger.debug if message in self._said else logger.warning)(message, *args)
            self._said.add(message)

    def _assign_ranks(self, batches: list[_Indices]) -> list[list[int]]:
        """Positions of the batches each rank gets: equal counts, balanced total cost."""
        costs = [self._cost(batch) for batch in batches]
        loads = [0.0] * self.num_replicas
        assigned: list[list[int]] = [[] for _ in range(self.num_replicas)]
        by_cost = sorted(range(len(batches)), key=lambda k: (-costs[k], k))
        for start in range(0, len(by_cost), self.num_replicas):
            ranks = sorted(range(self.num_replicas), key=lambda r: (loads[r], r))
            round_ = by_cost[start : start + self.num_replicas]  # len(batches) % R == 0
            for rank, k in zip(ranks, round_, strict=True):
                assigned[rank].append(k)
                loads[rank] += costs[k]
        return [sorted(positions) for positions in assigned]


def _check_lengths(lengths: Sequence[float], epoch: int | None = None) -> list[float]:
    values = [float(n) for n in lengths]
    bad = [i for i, n in enumerate(values) if not math.isfinite(n) or n < 0]
    if bad:
        where = "" if epoch is None else f" (epoch {epoch})"
        raise ValueError(f"lengths must be finite and >= 0; bad at indices {_preview(bad)}{where}")
    return values


def _check_options(
    max_batch_length: float, num_buckets: int, max_batch_size: int | None, shortest_first: int
) -> None:
    if not max_batch_length > 0:
        raise ValueError(f"max_batch_length must be > 0, got {max_batch_length}")
    if num_buckets < 1:
        raise ValueError(f"num_buckets must be >= 1, got {num_buckets}")
    if max_batch_size is not None and max_batch_size < 1:
        raise ValueError(f"max_batch_size must be >= 1 or None, got {max_batch_size}")
    if shortest_first < 0:
        raise ValueError(f"shortest_first_epochs must be >= 0, got {shortest_first}")


def _resolve_ranks(num_replicas: int | None, rank: int | None) -> tuple[int, int]:
    """Fill in world size and rank from torch.distributed when initialised, else 1 and 0."""
    distributed = dist.is_available() and dist.is_initialized()
    if num_replicas is None:
        num_replicas = dist.get_world_size() if distributed else 1
    if rank is None:
        rank = dist.get_rank() if distributed else 0
    if num_replicas < 1:
        raise ValueError(f"num_replicas must be >= 1, got {num_replicas}")
    if not 0 <= rank < num_replicas:
        raise ValueError(f"rank must be in [0, {num_replicas}), got {rank}")
    return num_replicas, rank


def _preview(items: list[int], limit: int = 20) -> str:
    """The first `limit` items, and how many more.

    >>> _preview([1, 2, 3], limit=2)
    '[1, 2] (+1 more)'
    """
    shown = str(items[:limit])
    return shown if len(items) <= limit else f"{shown} (+{len(items) - limit} more)"
