import math
import random

import jiwer
import pytest

from asr.metrics import (
    ErrorCounts,
    WordAlignment,
    char_errors,
    errors_by_length,
    wer_difference_interval,
    word_errors,
)

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
    assert word_errors([""], ["A B"]).rate == math.inf, "insertions alone never score 0"
    assert word_errors([""], [""]).rate == 0.0
    assert char_errors([""], [" A  B "]).insertions == len("A B"), "spaces as jiwer counts them"


def test_length_mismatch_is_an_error():
    with pytest.raises(ValueError, match="2 references but 1"):
        word_errors(["A", "B"], ["A"])


def test_length_buckets_add_up_and_find_deletions_at_the_end() -> None:
    durations = [2.0, 7.99, 8.0, 13.0, 15.0]
    refs = ["a b", "c", "d e f g h", "i j", "k l m n o p q r s t"]
    hyps = ["a b", "x", "d e f g h", "i j k", "k l m n o p q r"]  # the last one stops early
    buckets = errors_by_length(durations, [WordAlignment.of(r, h) for r, h in zip(refs, hyps)])
    assert [b.utterances for b in buckets] == [2, 2, 1]
    total = buckets[0].errors + buckets[1].errors + buckets[2].errors
    assert total == word_errors(refs, hyps)
    long = buckets[2]
    assert (long.tail_words, long.tail_deletions) == (2, 2)  # the last fifth of 10 words
    assert long.tail_deletion_rate == 1.0 and long.deletion_rate == 0.2
    assert buckets[1].tail_deletion_rate == 0.0
    one = [WordAlignment.of("a", "a")]
    assert [b.name for b in errors_by_length([1.0], one, edges=[5.0])] == [
        "< 5 s",
        ">= 5 s",
    ]


def test_reference_word_deleted_marks_only_deletions() -> None:
    assert WordAlignment.of("a b c", "a x").reference_deleted == [False, False, True]
    assert WordAlignment.of("a b", "").reference_deleted == [True, True]
    assert WordAlignment.of("", "a").reference_deleted == []


def test_hypothesis_correct_marks_only_equal_words() -> None:
    assert WordAlignment.of("a b c", "a x c d").hypothesis_correct == [True, False, True, False]
    assert WordAlignment.of("", "a b").hypothesis_correct == [False, False]


def test_words_part_at_any_whitespace() -> None:
    """A tab or a no-break space split words for one of the two and joined them for jiwer: an
    exact match had a word marked wrong, and the counts disagreed."""
    assert WordAlignment.of("A\tB", "A\tB").hypothesis_correct == [True, True]
    assert word_errors(["A\tB"], ["A B"]) == ErrorCounts(reference_length=2)


def test_one_alignment_gives_the_counts_jiwer_gives_the_set() -> None:
    rng = random.Random(3)
    pairs = [(_random_text(rng, 6), _random_text(rng, 6)) for _ in range(200)]
    pairs += [("", "A B"), ("A B", ""), ("", "")]
    pairs += [("A\tB", "A\tB"), ("A\u00a0B C", "A B\u00a0C"), (" A  B", "A\nB ")]  # any space
    summed = sum((WordAlignment.of(r, h).errors for r, h in pairs), ErrorCounts())
    assert summed == word_errors([r for r, _ in pairs], [h for _, h in pairs])
    for ref, hyp in pairs:
        aligned = WordAlignment.of(ref, hyp)
        assert sum(aligned.reference_deleted) == aligned.errors.deletions
        right = sum(aligned.hypothesis_correct)
        assert right == aligned.errors.reference_length - aligned.errors.substitutions - (
            aligned.errors.deletions
        )


def test_draws_of_references_without_words_have_no_wer_difference():
    """A draw of the empty reference alone counted its inserted word over "1 word": +300."""
    low, high = wer_difference_interval([0, 10, 10], [0, 0, 0], [1, 0, 0])
    assert 0.0 <= low <= high <= 20.0  # an insertion or two over 10 words at most
    assert all(math.isnan(x) for x in wer_difference_interval([0, 0], [1, 0], [0, 1]))


def test_wer_difference_interval_is_paired_and_holds_the_difference():
    words = [10, 8, 12, 9, 11] * 8
    a = [1, 0, 2, 1, 0] * 8
    assert wer_difference_interval(words, a, a) == (0.0, 0.0)  # the same decode: no spread
    b = [x + 1 for x in a]  # one more error in each utterance
    low, high = wer_difference_interval(words, a, b)
    assert 0 < low <= 100 * 40 / sum(words) <= high
    worse_by_chance = [x + (i % 2) for i, x in enumerate(a)]
    low, high = wer_difference_interval(words, a, worse_by_chance)
    assert 0 < low < high  # no utterance better in B: the interval lies above 0
    assert all(math.isnan(x) for x in wer_difference_interval([], [], []))
