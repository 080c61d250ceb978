"""Word confidence by Platt scaling of word decoder and CTC probabilities, fitted on a dev set
(`asr calibrate`): the raw probabilities rank words well but sit far too low."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

LOG_FLOOR = 1e-12  # log 0 is undefined


class UnfittableWords(ValueError):
    """The words are all right or all wrong (or none): a fact about the data, not a fault."""


# Below this many words a fitted map follows its few words (perfectly separated, it is extreme)
FEWEST_CALIBRATION_WORDS = 200


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
        """The confidence of a word; a missing CTC probability counts at the floor."""
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
        """The maximum-likelihood scaling; a negative weight is dropped so the map increases."""
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
        if min(weights) < 0:  # no feature rises with being right: the share right, for every word
            share = float(y.mean())
            return cls(0.0, math.log(share / (1.0 - share)), 0.0)
        full = dict(zip(used, weights))
        return cls(full.get(0, 0.0), bias, full.get(1, 0.0))

    def as_dict(self) -> dict[str, float]:
        return {"scale": self.scale, "bias": self.bias, "ctc_scale": self.ctc_scale}

    @classmethod
    def from_dict(cls, stored: dict[str, float]) -> PlattScaling:
        """From `as_dict`; a stored scaling may lack `ctc_scale`."""
        return cls(stored["scale"], stored["bias"], stored.get("ctc_scale", 0.0))


def _log(probability: float) -> float:
    return math.log(max(probability, LOG_FLOOR))


def _sigmoid(z: float) -> float:
    return 1.0 / (1.0 + math.exp(-z)) if z >= 0 else math.exp(z) / (1.0 + math.exp(z))


def _logistic_regression(
    x: np.ndarray, y: np.ndarray, l2: float = 1e-6, iterations: int = 100
) -> list[float]:
    """Weights, then bias, of `P(y=1) = sigmoid(x w + b)` by Newton's method; L2 keeps it finite.

    Each step is halved until the penalised loss falls: on words the features separate, a
    full step overshoots to weights of millions that put every word at 0 or 1.
    """
    design = np.concatenate([x, np.ones((len(x), 1))], axis=1)

    def loss(theta: np.ndarray) -> float:
        z = design @ theta
        return float(np.sum(np.logaddexp(0.0, z) - y * z) + 0.5 * l2 * theta @ theta)

    theta = np.zeros(design.shape[1])
    current = loss(theta)
    for _ in range(iterations):
        p = np.exp(-np.logaddexp(0.0, -(design @ theta)))  # the sigmoid, without overflow
        gradient = design.T @ (p - y) + l2 * theta
        hessian = (design * (p * (1 - p))[:, None]).T @ design + l2 * np.eye(len(theta))
        step = np.linalg.solve(hessian, gradient)
        while np.abs(step).max() >= 1e-10 and loss(theta - step) > current:
            step = step / 2
        if np.abs(step).max() < 1e-10:
            break
        theta = theta - step
        current = loss(theta)
    return [float(t) for t in theta]
