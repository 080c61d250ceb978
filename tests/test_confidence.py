import math

import numpy as np
import pytest

from asr.confidence import PlattScaling


def _labelled(scale: float, bias: float, count: int, seed: int = 0):
    """Word probabilities, and labels drawn with P(right) = sigmoid(scale log p + bias)."""
    rng = np.random.default_rng(seed)
    probs = np.exp(rng.uniform(-8.0, 0.0, count))
    chance = 1 / (1 + np.exp(-(scale * np.log(probs) + bias)))
    return probs.tolist(), (rng.random(count) < chance).tolist()


def test_fit_recovers_the_scaling_that_made_the_labels():
    probs, correct = _labelled(scale=0.6, bias=1.5, count=20000)
    fitted = PlattScaling.fit(probs, correct)
    assert fitted.scale == pytest.approx(0.6, abs=0.05)
    assert fitted.bias == pytest.approx(1.5, abs=0.1)


def test_fitted_confidences_average_to_the_share_of_words_right():
    """The bias's likelihood equation: at the fit, the mean confidence is the accuracy,
    however far the raw probabilities were from it."""
    probs, correct = _labelled(scale=0.3, bias=2.0, count=500, seed=1)
    assert np.mean(probs) < np.mean(correct) - 0.3, "raw probabilities far too low"
    fitted = PlattScaling.fit(probs, correct)
    confidences = [fitted(p) for p in probs]
    assert np.mean(confidences) == pytest.approx(np.mean(correct), abs=1e-6)


def test_the_map_keeps_the_order_and_stays_a_probability():
    scaling = PlattScaling(scale=0.8, bias=0.5)
    probs = [0.0, 1e-30, 1e-6, 0.01, 0.3, 0.9, 1.0]
    confidences = [scaling(p) for p in probs]
    assert all(0.0 < c < 1.0 for c in confidences)
    assert confidences == sorted(confidences)
    assert confidences[0] == confidences[1], "below the floor, log p is the floor's"
    assert PlattScaling(scale=0.0, bias=0.0)(0.01) == 0.5


def test_a_decreasing_or_non_finite_map_is_refused():
    with pytest.raises(ValueError, match="scale must be >= 0"):
        PlattScaling(scale=-1.0, bias=0.0)
    with pytest.raises(ValueError, match="finite"):
        PlattScaling(scale=math.nan, bias=0.0)


@pytest.mark.parametrize("correct", [[True, True, True], [False, False], []])
def test_fit_needs_right_and_wrong_words(correct):
    with pytest.raises(ValueError, match="both right and wrong words"):
        PlattScaling.fit([0.5] * len(correct), correct)


def test_fit_refuses_mismatched_lengths():
    with pytest.raises(ValueError, match="2 probabilities but 1 labels"):
        PlattScaling.fit([0.5, 0.2], [True])


def test_separable_words_give_a_finite_steep_map():
    fitted = PlattScaling.fit([0.9, 0.8, 0.01, 0.02], [True, True, False, False])
    assert math.isfinite(fitted.scale) and fitted.scale > 0
    assert fitted(0.9) > 0.9 and fitted(0.01) < 0.1


def test_words_two_probabilities_separate_get_a_map_that_separates_them():
    """Full Newton steps ran to weights of millions: every word at confidence 0, the right
    one too."""
    probs, ctc = [0.7, 0.45, 0.54, 0.01], [0.01, 0.02, 0.03, 0.05]
    fitted = PlattScaling.fit(probs, [False, False, True, False], ctc)
    confidences = [fitted(p, c) for p, c in zip(probs, ctc, strict=True)]
    assert confidences[2] > 0.99 and max(confidences[:2] + confidences[3:]) < 0.01
    assert max(abs(fitted.scale), abs(fitted.bias), abs(fitted.ctc_scale)) < 1e3


def _two_opinions(count: int, seed: int = 0):
    """Decoder and CTC probabilities, labels drawn from both:
    P(right) = sigmoid(0.3 log p + 0.8 log p_ctc + 2)."""
    rng = np.random.default_rng(seed)
    probs, ctc = np.exp(rng.uniform(-8.0, 0.0, (2, count)))
    chance = 1 / (1 + np.exp(-(0.3 * np.log(probs) + 0.8 * np.log(ctc) + 2.0)))
    return probs.tolist(), ctc.tolist(), (rng.random(count) < chance).tolist()


def test_fit_with_ctc_probabilities_recovers_both_weights():
    probs, ctc, correct = _two_opinions(20000)
    fitted = PlattScaling.fit(probs, correct, ctc)
    assert fitted.scale == pytest.approx(0.3, abs=0.05)
    assert fitted.ctc_scale == pytest.approx(0.8, abs=0.05)
    assert fitted.bias == pytest.approx(2.0, abs=0.15)
    assert fitted(0.5, 0.5) > fitted(0.5, 0.01), "confidence grows with the CTC probability"


def test_a_ctc_probability_that_would_lower_confidence_is_dropped():
    probs, ctc, correct = _two_opinions(5000, seed=2)
    reversed_ctc = [1.0 - c for c in ctc]  # higher now means more often wrong
    fitted = PlattScaling.fit(probs, correct, reversed_ctc)
    assert fitted.ctc_scale == 0.0 and fitted.scale > 0
    assert fitted == PlattScaling.fit(probs, correct), "refitted on the decoder's alone"


def test_probabilities_that_fall_as_words_get_right_give_the_share_right():
    """A negative weight is dropped; the bias is then refitted alone, so every word's
    confidence is the share of words right (keeping the bias fitted beside the dropped weight
    gave a constant far from it)."""
    probs, correct = _labelled(scale=-0.8, bias=-1.0, count=3000, seed=3)
    for ctc in (None, probs):
        fitted = PlattScaling.fit(probs, correct, ctc)
        assert fitted.scale == fitted.ctc_scale == 0.0
        assert fitted(0.5) == pytest.approx(np.mean(correct), abs=1e-9)


def test_a_missing_ctc_probability_counts_at_the_floor():
    scaling = PlattScaling(scale=0.5, bias=3.0, ctc_scale=0.2)
    assert scaling(0.5, None) == scaling(0.5, 0.0) < scaling(0.5, 1e-3)
    assert PlattScaling(scale=0.5, bias=3.0)(0.5, None) == PlattScaling(0.5, 3.0)(0.5)
    probs, ctc, correct = _two_opinions(500, seed=3)
    missing = [None if i % 7 == 0 else c for i, c in enumerate(ctc)]
    floored = [1e-12 if c is None else c for c in missing]
    assert PlattScaling.fit(probs, correct, missing) == PlattScaling.fit(probs, correct, floored)


def test_a_stored_scaling_round_trips_and_old_ones_load():
    scaling = PlattScaling(scale=0.5, bias=3.0, ctc_scale=0.2)
    assert PlattScaling.from_dict(scaling.as_dict()) == scaling
    assert PlattScaling.from_dict({"scale": 0.5, "bias": 3.0}) == PlattScaling(0.5, 3.0)
