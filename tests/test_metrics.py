import random

import jiwer
import pytest

from asr.metrics import ErrorCounts, char_errors, word_errors

WORDS = ["A", "B", "C", "FOUR", "TWO", "YES"]


def _random_text(rng: random.Random, max_words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, max_words)))


@pytest.mark.parametrize("seed", range(5))
def test_rates_equal_jiwer(seed):
    rng = random.Random(seed)
    refs = [_random_text(rng, 8) for _ in range(20)]
    hyps = [_random_text(rng, 8) for _ in range(20)]
    assert word_errors(refs, hyps).rate == pytest.approx(jiwer.wer(refs, hyps), abs=1e-12)
    assert char_errors(refs, hyps).rate == pytest.approx(jiwer.cer(refs, hyps), abs=1e-12)


def test_counts_add_up_over_batches():
    rng = random.Random(0)
    refs = [_random_text(rng, 6) for _ in range(10)]
    hyps = [_random_text(rng, 6) for _ in range(10)]
    total = sum((word_errors([r], [h]) for r, h in zip(refs, hyps)), ErrorCounts())
    assert total == word_errors(refs, hyps)


def test_empty_hypothesis_and_reference():
    assert word_errors(["A B"], [""]) == ErrorCounts(0, 2, 0, 2)
    assert word_errors([""], ["A B"]) == ErrorCounts(0, 0, 2, 0)


def test_length_mismatch_is_an_error():
    with pytest.raises(ValueError, match="2 references but 1"):
        word_errors(["A", "B"], ["A"])
