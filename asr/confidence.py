"""Word confidence that means what it says: Platt scaling of word probabilities, fitted on dev.

A word's probability (`asr.timing.Word.probability`, the product of its tokens' decoder
probabilities) ranks words well but is far from the share of words that are right: label
smoothing and joint CTC/attention search leave it much too low. Where the model has a CTC
head, the word's CTC probability (`Word.ctc_probability`: its tokens' posteriors on the CTC
path of the hypothesis) is a second, partly independent opinion. `PlattScaling` maps them to

    confidence = sigmoid(scale * log(probability) + ctc_scale * log(ctc_probability) + bias)

fitted by logistic regression on a dev set's words, labelled right or wrong by their word
alignment with the reference (`asr calibrate`); `ctc_scale` is 0 without a CTC head. The map
increases with both probabilities. The fit is stored in the checkpoint (`confidence_scaling`),
and every `Word` of that recognizer then carries it as `confidence`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

LOG_FLOOR = 1e-12  # probabilities below this count as this (log 0 is undefined)


class UnfittableWords(ValueError):
    """The words are all right or all wrong (or there are none): nothing tells them apart, so
    no scaling can be fitted. A model that makes no mistakes on dev, or only mistakes, meets
    this; it is a fact about the data, not a fault."""


@dataclass(frozen=True)
class PlattScaling:
    """`confidence = sigmoid(scale * log(p) + ctc_scale * log(p_ctc) + bias)`.

    >>> PlattScaling(scale=0.5, bias=1.0)(math.exp(-2.0))
    0.5
    >>> PlattScaling(scale=0.5, bias=2.0, ctc_scale=1.0)(math.exp(-2.0), math.exp(-1.0))
    0.5
    """

    scale: float
    bias: float
    ctc_scale: float = 0.0

    def __post_init__(self) -> None:
        weights = (self.scale, self.bias, self.ctc_scale)
        if not all(math.isfinite(w) for w in weights):
            raise ValueError(f"scale, bias and ctc_scale must be finite, got {weights}")
        if self.scale < 0 or self.ctc_scale < 0:
            raise ValueError(
                f"scale and ctc_scale must be >= 0 (confidence grows with each probability), "
                f"got {self.scale}, {self.ctc_scale}"
            )

    def __call__(self, probability: float, ctc_probability: float | None = None) -> float:
        """The confidence of a word. Where the scaling uses the CTC probability and it is
        missing (CTC could not align the hypothesis), the CTC term counts at its floor."""
        z = self.scale * _log(probability) + self.bias
        if self.ctc_scale:
            z += self.ctc_scale * _log(LOG_FLOOR if ctc_probability is None else ctc_probability)
        return _sigmoid(z)

    @classmethod
    def fit(
        cls,
        probabilities: Sequence[float],
        correct: Sequence[bool],
        ctc_probabilities: Sequence[float | None] | None = None,
    ) -> PlattScaling:
        """The scaling that maximises the likelihood of `correct` given the probabilities
        (and the CTC probabilities, where given; a missing one counts at the floor, as in
        `__call__`). A weight that comes out negative (the feature adds nothing in the
        direction that keeps the map increasing) is dropped and the rest fitted again.

        Raises:
            ValueError: mismatched lengths.
            UnfittableWords: not both right and wrong words (nothing to tell apart).
        """
        features = [list(probabilities)]
        if ctc_probabilities is not None:
            features.append([LOG_FLOOR if p is None else p for p in ctc_probabilities])
        if any(len(f) != len(correct) for f in features):
            lengths = " and ".join(str(len(f)) for f in features)
            raise ValueError(f"{lengths} probabilities but {len(correct)} labels")
        y = np.asarray(correct, dtype=np.float64)
        if y.size == 0 or y.min() == y.max():
            raise UnfittableWords(
                f"fitting a confidence scaling needs both right and wrong words; got "
                f"{int(y.sum())} right of {y.size}"
            )
        x = np.log(np.maximum(np.asarray(features, dtype=np.float64).T, LOG_FLOOR))  # (N, F)
        used = list(range(x.shape[1]))
        while True:
            *weights, bias = _logistic_regression(x[:, used], y)
            if len(used) == 1 or min(weights) >= 0:
                break
            used = [used[int(np.argmax(weights))]]
        full = dict(zip(used, weights))
        return cls(max(full.get(0, 0.0), 0.0), bias, max(full.get(1, 0.0), 0.0))

    def as_dict(self) -> dict[str, float]:
        return {"scale": self.scale, "bias": self.bias, "ctc_scale": self.ctc_scale}

    @classmethod
    def from_dict(cls, stored: dict[str, float]) -> PlattScaling:
        """From `as_dict` (a scaling stored before CTC probabilities had no `ctc_scale`)."""
        return cls(stored["scale"], stored["bias"], stored.get("ctc_scale", 0.0))


def _log(probability: float) -> float:
    return math.log(max(probability, LOG_FLOOR))


def _sigmoid(z: float) -> float:
    return 1.0 / (1.0 + math.exp(-z)) if z >= 0 else math.exp(z) / (1.0 + math.exp(z))


def _logistic_regression(
    x: np.ndarray, y: np.ndarray, l2: float = 1e-6, iterations: int = 100
) -> list[float]:
    """Weights of the columns of `x` `(N, F)`, then the bias, of `P(y=1) = sigmoid(x w + b)`
    by Newton's method; a tiny L2 penalty keeps separable data finite."""
    design = np.concatenate([x, np.ones((len(x), 1))], axis=1)
    theta = np.zeros(design.shape[1])
    for _ in range(iterations):
        p = 1.0 / (1.0 + np.exp(-(design @ theta)))
        gradient = design.T @ (p - y) + l2 * theta
        hessian = (design * (p * (1 - p))[:, None]).T @ design + l2 * np.eye(len(theta))
        step = np.linalg.solve(hessian, gradient)
        theta -= step
        if np.abs(step).max() < 1e-10:
            break
    return [float(t) for t in theta]
