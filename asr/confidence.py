"""Word confidence that means what it says: Platt scaling of word probabilities, fitted on dev.

A word's probability (`asr.timing.Word.probability`, the product of its tokens' decoder
probabilities) ranks words well but is far from the share of words that are right: label
smoothing and joint CTC/attention search leave it much too low. `PlattScaling` maps it to

    confidence = sigmoid(scale * log(probability) + bias)

fitted by logistic regression on a dev set's words, labelled right or wrong by their word
alignment with the reference (`asr calibrate`). The map is increasing, so it keeps the order of
the words (the ROC area) and changes only how the numbers read. The fit is stored in the
checkpoint (`confidence_scaling`), and every `Word` of that recognizer then carries it as
`confidence`.
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
    """`confidence = sigmoid(scale * log(probability) + bias)`.

    >>> PlattScaling(scale=0.5, bias=1.0)(math.exp(-2.0))
    0.5
    """

    scale: float
    bias: float

    def __post_init__(self) -> None:
        if not (math.isfinite(self.scale) and math.isfinite(self.bias)):
            raise ValueError(f"scale and bias must be finite, got {self.scale}, {self.bias}")
        if self.scale < 0:
            raise ValueError(f"scale must be >= 0 (the map keeps the order), got {self.scale}")

    def __call__(self, probability: float) -> float:
        return _sigmoid(self.scale * math.log(max(probability, LOG_FLOOR)) + self.bias)

    @classmethod
    def fit(cls, probabilities: Sequence[float], correct: Sequence[bool]) -> PlattScaling:
        """The scaling that maximises the likelihood of `correct` given `probabilities`.

        Raises:
            ValueError: mismatched lengths.
            UnfittableWords: not both right and wrong words (nothing to tell apart).
        """
        if len(probabilities) != len(correct):
            raise ValueError(f"{len(probabilities)} probabilities but {len(correct)} labels")
        y = np.asarray(correct, dtype=np.float64)
        if y.size == 0 or y.min() == y.max():
            raise UnfittableWords(
                f"fitting a confidence scaling needs both right and wrong words; got "
                f"{int(y.sum())} right of {y.size}"
            )
        x = np.log(np.maximum(np.asarray(probabilities, dtype=np.float64), LOG_FLOOR))
        scale, bias = _logistic_regression(x, y)
        return cls(max(scale, 0.0), bias)

    def as_dict(self) -> dict[str, float]:
        return {"scale": self.scale, "bias": self.bias}


def _sigmoid(z: float) -> float:
    return 1.0 / (1.0 + math.exp(-z)) if z >= 0 else math.exp(z) / (1.0 + math.exp(z))


def _logistic_regression(
    x: np.ndarray, y: np.ndarray, l2: float = 1e-6, iterations: int = 100
) -> tuple[float, float]:
    """Weight and bias of `P(y=1) = sigmoid(w x + b)` by Newton's method; a tiny L2 penalty
    keeps separable data finite."""
    design = np.stack([x, np.ones_like(x)], axis=1)
    theta = np.zeros(2)
    for _ in range(iterations):
        p = 1.0 / (1.0 + np.exp(-(design @ theta)))
        gradient = design.T @ (p - y) + l2 * theta
        hessian = (design * (p * (1 - p))[:, None]).T @ design + l2 * np.eye(2)
        step = np.linalg.solve(hessian, gradient)
        theta -= step
        if np.abs(step).max() < 1e-10:
            break
    return float(theta[0]), float(theta[1])
