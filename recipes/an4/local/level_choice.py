"""Which level fix to build in: probed on a model trained without any, at inference only.

Decodes the clean test set and its -20/-30 dB copies (as `asr robustness` builds them) with
the model's frontend changed three ways, and prints WER per condition:

    as trained        the frontend unchanged
    gain to -30 dBFS  `LevelNormalizer` before the features: each utterance scaled to the
                      AN4 training median level (-30 dBFS RMS), which the CMVN statistics
                      were computed at
    utterance mean    each utterance's log-mel mean moved to the corpus mean before the
                      global CMVN (per-utterance mean normalisation on top of global stats)

    python recipes/an4/local/level_choice.py --checkpoint exp/an4/transformer/avg.ckpt \
        --manifest data/an4/test.jsonl --out exp/an4/level_choice
"""

from __future__ import annotations

import argparse
import copy
from dataclasses import replace

from torch import Tensor, nn

from asr.frontends import LevelNormalizer, UtteranceCMVN
from asr.recognizer import load_model
from asr.robustness import Condition, robustness

AN4_MEDIAN_DBFS = -30.0  # median RMS level of the AN4 training utterances


class ToCorpusMean(nn.Module):
    """Per-utterance mean normalisation, then the corpus mean added back: the global CMVN
    after it sees every utterance at the corpus mean."""

    def __init__(self, corpus_mean: Tensor) -> None:
        super().__init__()
        self.utterance = UtteranceCMVN(norm_means=True)
        self.register_buffer("corpus_mean", corpus_mean.clone())

    def forward(self, x: Tensor, x_lens: Tensor) -> tuple[Tensor, Tensor]:
        y, y_lens = self.utterance(x, x_lens)
        return y + self.corpus_mean, y_lens


def variants(recognizer):
    """The recognizer as trained, with gain normalisation, with utterance mean normalisation."""
    yield "as trained", recognizer
    gain = copy.deepcopy(recognizer.model)
    gain.frontend.level = LevelNormalizer(target_dbfs=AN4_MEDIAN_DBFS)
    yield f"gain to {AN4_MEDIAN_DBFS:g} dBFS", replace(recognizer, model=gain.eval())
    mean = copy.deepcopy(recognizer.model)
    global_cmvn = mean.frontend.normalize
    mean.frontend.normalize = _Chain(ToCorpusMean(global_cmvn.mean), global_cmvn)
    yield "utterance mean", replace(recognizer, model=mean.eval())


class _Chain(nn.Module):
    def __init__(self, *parts: nn.Module) -> None:
        super().__init__()
        self.parts = nn.ModuleList(parts)

    def forward(self, x: Tensor, x_lens: Tensor) -> tuple[Tensor, Tensor]:
        for part in self.parts:
            x, x_lens = part(x, x_lens)
        return x, x_lens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--manifest", required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    conditions = [Condition.parse(c) for c in ("clean", "level:-20", "level:-30")]
    print("| frontend | " + " | ".join(c.label for c in conditions) + " |")
    print("|---|" + "---|" * len(conditions))
    for name, recognizer in variants(load_model(args.checkpoint)):
        out = f"{args.out}/{name.replace(' ', '_')}"
        rows = robustness(recognizer, args.manifest, out, conditions, progress=False)
        print(f"| {name} | " + " | ".join(f"{r['wer']:.1f}" for r in rows) + " |")


if __name__ == "__main__":
    main()
