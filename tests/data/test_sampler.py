"""Contracts of the DDP-correct dynamic bucket sampler, checked over random length lists."""

from __future__ import annotations

import logging
import math
from collections import Counter

import pytest
import torch

from asr.data.sampler import DynamicBucketSampler, LengthGrid


def random_config(case: int) -> dict:
    """A random sampler configuration: lengths, budget, replicas (deterministic per case)."""
    g = torch.Generator().manual_seed(case)
    n = int(torch.randint(1, 120, (1,), generator=g))
    lengths = (torch.rand(n, generator=g) * 15 + 0.5).tolist()
    return {
        "lengths": lengths,
        "max_batch_length": float(torch.empty(1).uniform_(10, 80, generator=g)),
        "num_buckets": int(torch.randint(1, 8, (1,), generator=g)),
        "max_batch_size": [None, 3, 7][case % 3],
        "seed": case,
    }


def rank_batches(config: dict, num_replicas: int, epoch: int = 0, **extra) -> list[list]:
    """Batches of every rank for one epoch."""
    out = []
    for rank in range(num_replicas):
        sampler = DynamicBucketSampler(**config, **extra, num_replicas=num_replicas, rank=rank)
        sampler.set_epoch(epoch)
        out.append(list(sampler))
    return out


def cost(batch: list[int], lengths: list[float], grid: LengthGrid | None = None) -> float:
    longest = max(lengths[i] for i in batch)
    return len(batch) * (longest if grid is None else grid.edge(longest))


GRIDS = [None, LengthGrid(1.1), LengthGrid(1.5)]


@pytest.mark.parametrize("grid", GRIDS)
@pytest.mark.parametrize("num_replicas", [1, 2, 3, 4])
def test_ranks_get_disjoint_equal_shares_covering_every_utterance_once(num_replicas, grid):
    for case in range(25):
        config = random_config(case) | {"grid": grid}
        for epoch in (0, 1):
            per_rank = rank_batches(config, num_replicas, epoch)
            assert len({len(batches) for batches in per_rank}) == 1, "unequal batch counts"
            seen = Counter(i for batches in per_rank for batch in batches for i in batch)
            if len(config["lengths"]) >= num_replicas:
                assert seen == Counter(range(len(config["lengths"])))
            else:  # only here may utterances repeat (see test_fewer_utterances_than_replicas)
                assert set(seen) == set(range(len(config["lengths"])))


@pytest.mark.parametrize("grid", GRIDS)
def test_budget_never_exceeded_except_single_oversized_utterances(caplog, grid):
    for case in range(25):
        config = random_config(case) | {"grid": grid}
        lengths = config["lengths"]
        budget = config["max_batch_length"]
        with caplog.at_level(logging.WARNING, logger="asr.data.sampler"):
            caplog.clear()
            sampler = DynamicBucketSampler(**config)
        expected_oversized = [i for i, n in enumerate(lengths) if cost([i], lengths, grid) > budget]
        assert sampler.oversized == expected_oversized
        assert bool(caplog.records) == bool(expected_oversized)
        for batch in sampler:
            if cost(batch, lengths, grid) > budget:
                assert len(batch) == 1 and batch[0] in expected_oversized
            if config["max_batch_size"] is not None:
                assert len(batch) <= config["max_batch_size"]


def test_oversized_utterances_reported_once_with_count_and_indices(caplog):
    with caplog.at_level(logging.WARNING, logger="asr.data.sampler"):
        sampler = DynamicBucketSampler([1.0, 50.0, 2.0, 60.0], max_batch_length=10.0)
        list(sampler)
        sampler.set_epoch(1)
        list(sampler)
    assert len(caplog.records) == 1
    message = caplog.records[0].getMessage()
    assert "2 utterance(s)" in message and "[1, 3]" in message
    assert sampler.oversized == [1, 3]
    assert [1] in list(sampler) and [3] in list(sampler)


def test_batches_pack_similar_lengths():
    # Two clusters of lengths: no batch should mix them when buckets separate them.
    lengths = [1.0] * 50 + [10.0] * 50
    batches = list(DynamicBucketSampler(lengths, max_batch_length=40.0, num_buckets=2))
    assert all(len({lengths[i] for i in batch}) == 1 for batch in batches)
    sizes = {n: sorted(len(b) for b in batches if lengths[b[0]] == n) for n in (1.0, 10.0)}
    assert sizes == {1.0: [10, 40], 10.0: [2] + [4] * 12}


def test_same_seed_and_epoch_identical_other_epochs_and_seeds_differ():
    config = random_config(7) | {"lengths": [float(n % 13 + 1) for n in range(200)]}

    def plan(seed: int, epoch: int) -> list:
        return rank_batches(config | {"seed": seed}, 2, epoch)

    assert plan(3, 0) == plan(3, 0)
    assert plan(3, 1) == plan(3, 1)
    assert plan(3, 0) != plan(3, 1)
    assert plan(3, 0) != plan(4, 0)
    # seed + epoch is the generator seed, as documented
    assert plan(3, 1) == plan(4, 0)


def test_without_shuffle_plan_ignores_epoch_and_runs_short_to_long():
    lengths = [float(n) for n in torch.randperm(60, generator=torch.Generator().manual_seed(0))]
    sampler = DynamicBucketSampler(lengths, max_batch_length=100.0, shuffle=False)
    first = list(sampler)
    sampler.set_epoch(5)
    assert list(sampler) == first
    maxima = [max(lengths[i] for i in batch) for batch in first]
    assert maxima == sorted(maxima)


@pytest.mark.parametrize("grid", GRIDS)
@pytest.mark.parametrize("num_replicas", [1, 3])
def test_len_equals_number_of_batches_yielded(num_replicas, grid):
    for case in range(15):
        config = random_config(case) | {"grid": grid}
        for rank in range(num_replicas):
            sampler = DynamicBucketSampler(**config, num_replicas=num_replicas, rank=rank)
            for epoch in (0, 1):
                sampler.set_epoch(epoch)
                assert len(sampler) == len(list(sampler))


def test_split_instead_of_repeat_when_count_not_multiple_of_replicas(caplog):
    # One bucket, everything fits one batch; 4 ranks need 4 batches: split, never repeat.
    config = {"lengths": [1.0, 2.0, 3.0, 4.0, 5.0], "max_batch_length": 100.0, "num_buckets": 1}
    with caplog.at_level(logging.WARNING, logger="asr.data.sampler"):
        per_rank = rank_batches(config, 4)
    assert [len(batches) for batches in per_rank] == [1, 1, 1, 1]
    assert sorted(i for batches in per_rank for b in batches for i in b) == [0, 1, 2, 3, 4]
    assert not caplog.records


def test_merge_single_utterance_batches_instead_of_repeat(caplog):
    # 20 buckets for 5 utterances: five single batches; 4 ranks: the two shortest merge.
    config = {"lengths": [5.0, 1.0, 4.0, 2.0, 3.0], "max_batch_length": 100.0}
    with caplog.at_level(logging.WARNING, logger="asr.data.sampler"):
        per_rank = rank_batches(config, 4)
    batches = [sorted(b) for batches in per_rank for b in batches]
    assert sorted(batches) == [[0], [1, 3], [2], [4]]
    assert not caplog.records


@pytest.mark.parametrize(
    "config",
    [
        {"lengths": [6.0] * 5, "max_batch_length": 10.0},  # a pair would cost 12 > 10
        {"lengths": [1.0] * 5, "max_batch_length": 10.0, "max_batch_size": 1},
    ],
)
def test_repeat_when_neither_split_nor_merge_fits(config, caplog):
    with caplog.at_level(logging.WARNING, logger="asr.data.sampler"):
        per_rank = rank_batches(config, 4)
    assert [len(batches) for batches in per_rank] == [2, 2, 2, 2]
    seen = Counter(i for batches in per_rank for b in batches for i in b)
    assert set(seen) == set(range(5)) and sum(seen.values()) == 8
    assert any("repeating" in r.getMessage() for r in caplog.records)
    # what the repeats leave out, each utterance once, is what a metric counts
    samplers = [DynamicBucketSampler(**config, num_replicas=4, rank=r) for r in range(4)]
    counted = [i for s in samplers for k, b in enumerate(s) if k not in s.repeats() for i in b]
    assert sorted(counted) == list(range(5))


@pytest.mark.parametrize("num_replicas", [2, 3])
def test_evaluation_batches_are_one_processes_shared_out(num_replicas):
    """Validation and test (no shuffle): the ranks' batches, repeats aside, are one process's,
    never split or merged, so that a loss averaged per batch weighs utterances alike."""
    for case in range(15):
        config = random_config(case) | {"shuffle": False}
        (alone,) = rank_batches(config, 1)
        samplers = [DynamicBucketSampler(**config, num_replicas=num_replicas, rank=r)
                    for r in range(num_replicas)]  # fmt: skip
        shared = [b for s in samplers for k, b in enumerate(s) if k not in s.repeats()]
        assert sorted(map(sorted, shared)) == sorted(map(sorted, alone)), case
        assert len({len(list(s)) for s in samplers}) == 1, "equal batch counts per rank"


def test_rank_loads_differ_by_at_most_one_batch_cost():
    for case in range(15):
        config = random_config(case)
        lengths = config["lengths"]
        per_rank = rank_batches(config, 3)
        loads = [sum(cost(b, lengths) for b in batches) for batches in per_rank]
        biggest = max((cost(b, lengths) for batches in per_rank for b in batches), default=0)
        assert max(loads) - min(loads) <= biggest + 1e-9


def test_fewer_utterances_than_replicas_repeats_with_warning(caplog):
    with caplog.at_level(logging.WARNING, logger="asr.data.sampler"):
        per_rank = rank_batches({"lengths": [3.0, 1.0], "max_batch_length": 10.0}, 4)
    assert [len(batches) for batches in per_rank] == [1, 1, 1, 1]
    seen = Counter(i for batches in per_rank for b in batches for i in b)
    assert set(seen) == {0, 1} and sum(seen.values()) == 4
    assert seen[1] > 1, "the shortest utterance is the one repeated"
    assert any("repeating" in r.getMessage() for r in caplog.records)


def test_rank_zero_warns_of_repeats_once_and_later_epochs_at_debug_level(caplog):
    """Each rank plans alike: a line per rank per epoch said one thing 480 times on 8 GPUs
    over 60 epochs."""
    config = {"lengths": [6.0] * 5 + [30.0], "max_batch_length": 10.0}
    with caplog.at_level(logging.DEBUG, logger="asr.data.sampler"):
        samplers = [DynamicBucketSampler(**config, num_replicas=4, rank=r) for r in range(4)]
        for epoch in range(3):
            for sampler in samplers:
                sampler.set_epoch(epoch)
                assert len(list(sampler)) == 2
    said = [(r.levelname, r.getMessage().split(" ", 2)[2][:14]) for r in caplog.records]
    assert said == [("WARNING", "longer than ma"), ("WARNING", "cannot be shar"),
                    ("DEBUG", "cannot be shar"), ("DEBUG", "cannot be shar")]  # fmt: skip


def test_fewer_utterances_than_replicas_drop_last(caplog):
    with caplog.at_level(logging.WARNING, logger="asr.data.sampler"):
        per_rank = rank_batches(
            {"lengths": [1.0, 2.0, 3.0], "max_batch_length": 10.0}, 4, drop_last=True
        )
    assert per_rank == [[], [], [], []]
    assert any("drop_last" in r.getMessage() for r in caplog.records)


def test_single_utterance_batches_drop_last_drops_only_the_remainder():
    config = {"lengths": [1.0] * 7, "max_batch_length": 10.0, "max_batch_size": 1}
    per_rank = rank_batches(config, 3, drop_last=True)
    assert [len(batches) for batches in per_rank] == [2, 2, 2]
    flat = [i for batches in per_rank for b in batches for i in b]
    assert len(set(flat)) == 6


def test_empty_dataset_yields_nothing():
    sampler = DynamicBucketSampler([], max_batch_length=10.0, num_replicas=2, rank=1)
    assert len(sampler) == 0 and list(sampler) == []


@pytest.mark.parametrize("grid", [None, LengthGrid(1.1)])
@pytest.mark.parametrize("consumed", [0, 1, 5])
def test_resume_from_state_dict_yields_exactly_the_remaining_batches(consumed, grid):
    config = random_config(3) | {"lengths": [float(n % 17 + 1) for n in range(150)], "grid": grid}
    sampler = DynamicBucketSampler(**config, num_replicas=2, rank=1)
    sampler.set_epoch(2)
    full = list(sampler)
    assert len(full) > 5
    iterator = iter(sampler)
    head = [next(iterator) for _ in range(consumed)]
    state = sampler.state_dict()
    assert state == {"epoch": 2, "batches_yielded": consumed, "seed": config["seed"],
                     "plan": sampler.plan_digest()}  # fmt: skip

    resumed = DynamicBucketSampler(**(config | {"seed": 12345}), num_replicas=2, rank=1)
    resumed.load_state_dict(state)
    assert resumed.plan_digest() == state["plan"], "the checkpoint's seed: its batches"
    other_rank = DynamicBucketSampler(**config, num_replicas=2, rank=0)
    other_rank.set_epoch(2)  # the checkpoint is rank 0's: every rank compares it with its own
    assert other_rank.plan_digest() == state["plan"] and list(other_rank) != full
    resumed.set_epoch(2)  # what Lightning does at epoch start: must keep the resume point
    assert len(resumed) == len(full), "the epoch's length, as the training loop counts it"
    assert head + list(resumed) == full
    # the resume point is used once; the next pass over the same epoch is complete again
    assert list(resumed) == full
    assert resumed.state_dict()["batches_yielded"] == len(full)


def test_a_loader_with_workers_resumes_where_the_sampler_stopped():
    """torch's DataLoader with workers calls iter() on its batch sampler twice and reads the
    second: the resume point must survive the first, or the epoch restarts from batch 0."""
    config = random_config(4) | {"lengths": [float(n % 13 + 1) for n in range(120)]}
    sampler = DynamicBucketSampler(**config)
    full = list(sampler)
    resumed = DynamicBucketSampler(**config)
    resumed.load_state_dict({"epoch": 0, "batches_yielded": 3, "seed": config["seed"]})
    indices = list(range(120))
    loader = torch.utils.data.DataLoader(indices, batch_sampler=resumed, num_workers=2,
                                         collate_fn=list)  # fmt: skip
    assert list(loader) == full[3:]


def test_resume_point_cleared_by_moving_to_another_epoch():
    sampler = DynamicBucketSampler([float(n) for n in range(1, 40)], max_batch_length=50.0)
    sampler.load_state_dict({"epoch": 0, "batches_yielded": 3, "seed": 0})
    sampler.set_epoch(1)
    fresh = DynamicBucketSampler(sampler.lengths, max_batch_length=50.0)
    fresh.set_epoch(1)
    assert len(sampler) == len(fresh)
    assert list(sampler) == list(fresh)


def test_defaults_without_torch_distributed_are_one_replica_rank_zero():
    sampler = DynamicBucketSampler([1.0, 2.0], max_batch_length=10.0)
    assert (sampler.num_replicas, sampler.rank) == (1, 0)


@pytest.mark.parametrize("grid", GRIDS)
@pytest.mark.parametrize("num_replicas", [1, 2, 3])
def test_shortest_first_epochs_yield_batches_shortest_first(num_replicas, grid):
    """SortaGrad: in the first epochs each rank's batches come in ascending order of their
    (padded) longest utterance, every utterance still once."""
    for case in range(15):
        config = random_config(case) | {"grid": grid}
        lengths = config["lengths"]
        for epoch in (0, 1):
            per_rank = rank_batches(config, num_replicas, epoch, shortest_first_epochs=2)
            seen = Counter(i for batches in per_rank for batch in batches for i in batch)
            if len(lengths) >= num_replicas:
                assert seen == Counter(range(len(lengths)))
            for batches in per_rank:
                longest = [
                    cost([max(batch, key=lengths.__getitem__)], lengths, grid) for batch in batches
                ]
                assert longest == sorted(longest), (case, epoch)


def test_shortest_first_epochs_end_and_shuffled_order_returns():
    lengths = [float(n % 37 + 1) for n in range(300)]
    sampler = DynamicBucketSampler(lengths, 60.0, num_buckets=10, shortest_first_epochs=1)
    longest = [max(lengths[i] for i in batch) for batch in sampler]
    assert longest == sorted(longest)
    sampler.set_epoch(1)
    longest = [max(lengths[i] for i in batch) for batch in sampler]
    assert longest != sorted(longest)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"lengths": [1.0, float("nan")]},
        {"lengths": [1.0, -2.0]},
        {"max_batch_length": 0.0},
        {"num_buckets": 0},
        {"max_batch_size": 0},
        {"shortest_first_epochs": -1},
        {"num_replicas": 2, "rank": 2},
        {"num_replicas": 0, "rank": 0},
    ],
)
def test_bad_arguments_raise_value_error(kwargs):
    args = {"lengths": [1.0, 2.0], "max_batch_length": 10.0} | kwargs
    with pytest.raises(ValueError):
        DynamicBucketSampler(**args)


def test_load_state_dict_rejects_incomplete_state():
    sampler = DynamicBucketSampler([1.0], max_batch_length=10.0)
    with pytest.raises(ValueError, match="batches_yielded"):
        sampler.load_state_dict({"epoch": 0, "seed": 0})


# ------------------------------------------------------------------ lengths by epoch, grid


def perturbed(base: list[float], seed: int = 0):
    """Lengths as a function of the epoch: each item scaled by a factor drawn per epoch."""

    def lengths(epoch: int) -> list[float]:
        g = torch.Generator().manual_seed(seed * 1000 + epoch)
        factors = torch.tensor([0.9, 1.0, 1.1])[torch.randint(3, (len(base),), generator=g)]
        return [n / float(f) for n, f in zip(base, factors, strict=True)]

    return lengths


@pytest.mark.parametrize("grid", [None, LengthGrid(1.1)])
def test_lengths_by_epoch_set_each_epoch_budget_and_cover_all(grid):
    for case in range(10):
        config = random_config(case)
        lengths_of = perturbed(config["lengths"], case)
        config |= {"lengths": lengths_of, "grid": grid}
        sampler = DynamicBucketSampler(**config)
        for epoch in (0, 1, 2):
            sampler.set_epoch(epoch)
            lengths = lengths_of(epoch)
            assert sampler.lengths == lengths
            batches = list(sampler)
            assert sorted(i for b in batches for i in b) == list(range(len(lengths)))
            for batch in batches:
                assert len(batch) == 1 or cost(batch, lengths, grid) <= config["max_batch_length"]


def test_lengths_by_epoch_must_keep_the_item_count():
    sampler = DynamicBucketSampler(lambda epoch: [1.0] * (3 + epoch), max_batch_length=10.0)
    sampler.set_epoch(1)
    with pytest.raises(ValueError, match="epoch 1 count 4 items, not 3"):
        list(sampler)


def test_grid_batches_come_from_a_fixed_menu_of_shapes():
    """A batch holds floor(budget / grid point) utterances for the grid point above its
    longest or (carried utterances only) for a later grid point; one smaller batch ends the
    epoch. Epochs thus share one menu of shapes."""
    grid, budget = LengthGrid(1.1), 40.0
    base = (torch.rand(400, generator=torch.Generator().manual_seed(0)) * 9 + 1).tolist()
    sampler = DynamicBucketSampler(perturbed(base), max_batch_length=budget, grid=grid)
    shapes = set()
    for epoch in range(6):
        sampler.set_epoch(epoch)
        lengths = sampler.lengths
        points = sorted({grid.edge(n) for n in lengths})
        off_menu = []
        for batch in sampler:
            edge = grid.edge(max(lengths[i] for i in batch))
            sizes = {int(budget // point) for point in points if point >= edge}
            (shapes.add if len(batch) in sizes else off_menu.append)((len(batch), edge))
        assert len(off_menu) <= 1, off_menu  # the last remainder
    on_own_point = sum(size == int(budget // edge) for size, edge in shapes)
    assert on_own_point >= 0.75 * len(shapes), "carried-only batches should be rare"


def test_grid_remainders_follow_the_next_longer_group():
    # 5 items at grid point 1 (batch size 4) and 3 at grid point 2 (batch size 2): the
    # first group's remainder shares a batch with the second group's last item.
    lengths = [1.0] * 5 + [2.0] * 3
    batches = list(DynamicBucketSampler(lengths, 4.0, grid=LengthGrid(2.0), shuffle=False))
    assert batches == [[0, 1, 2, 3], [5, 6], [7, 4]]


@pytest.mark.parametrize("ratio", [1.01, 1.1, 2.0, 3.7])
def test_length_grid_edge_is_the_least_grid_point_at_or_above(ratio):
    grid = LengthGrid(ratio)
    for length in (torch.rand(500, generator=torch.Generator().manual_seed(1)) * 100).tolist():
        edge = grid.edge(length)
        assert length <= edge < length * ratio * (1 + 1e-9)
        power = round(math.log(edge, ratio))
        assert edge == pytest.approx(ratio**power, rel=1e-12)
    for power in range(-5, 30):
        assert grid.edge(ratio**power) == ratio**power


def test_length_grid_samples_agree_with_seconds():
    grid, rate = LengthGrid(1.1), 16000
    for count in range(1, 200_000, 997):
        padded = grid.samples(count, rate)
        assert padded >= count
        assert padded == math.floor(grid.edge(count / rate) * rate + 1e-6) or padded == count


@pytest.mark.parametrize("ratio", [1.0, 0.5, float("inf"), float("nan")])
def test_length_grid_rejects_ratios_not_above_one(ratio):
    with pytest.raises(ValueError, match="ratio"):
        LengthGrid(ratio)
