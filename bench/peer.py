"""Peer comparison: SpeechBrain's TransformerASR against ours at the same size.

Both are 12 encoder / 6 decoder pre-LN blocks, d=256, 4 heads, FFN 2048 (ReLU), dropout 0.1,
a convolutional front subsampling time by 4, and a joint CTC (weight 0.3) / label-smoothed
(0.1) attention loss. The fronts differ by design: ours is `Conv2dSubsampling` with
64 channels (as conf/an4/transformer_d256.yaml); SpeechBrain's is its recipes' `ConvolutionFrontEnd`
(2 blocks of 3x3 stride-2 convolutions with LayerNorm, 64 then 32 channels). Parameter counts
and model FLOPs of both are reported beside the timings.

The same AN4 training batches (conf/an4/transformer.yaml's, seed fixed) feed both, as
our log-mel + global CMVN features computed beforehand: only model, loss, backward, gradient
clipping (5) and the optimizer step (fused AdamW, lr 1e-3, as in our configs) are timed, by the
same plain loop. Both models then decode the same batch of test utterances of similar length
with beam 10, and beam 10 + CTC 0.3 (SpeechBrain: `S2STransformerBeamSearcher` with a
`CTCScorer` on the 15 best tokens, as our pre-beam), with no length normalisation and no eos
threshold, in fp32. As both models are only briefly trained, eos is blocked until the maximum
length (`max_len_ratio` tokens per encoder frame) in both searches, so both run the same number
of steps whatever their weights predict."""

from __future__ import annotations

import importlib.metadata
import os
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch
from torch import Tensor, nn

from bench.common import (
    BLANK_ID,
    PAD_ID,
    PRECISIONS,
    SOS_EOS_ID,
    SearchOptions,
    Seq2Seq,
    Settings,
    add_sos_eos,
    audio_seconds,
    autocast,
    beam_search,
    build_module,
    count_flops,
    count_parameters,
    measure_alternating,
    model_config,
    timed_call,
    train_batches,
)
from bench.decode import Utterances, pad_waves, test_utterances

D_MODEL, HEADS, FFN, ENCODER_LAYERS, DECODER_LAYERS = 256, 4, 2048, 12, 6
CTC_WEIGHT, LABEL_SMOOTHING, CLIP, BEAM = 0.3, 0.1, 5.0, 10
PRE_BEAM_RATIO = 1.5  # candidates CTC scores per hypothesis, as a multiple of the beam
SIZE = {"d_model": D_MODEL, "num_heads": HEADS, "ffn_dim": FFN}
# The peer's model: absolute sinusoids added to the input, as SpeechBrain's TransformerASR
# (its default `regularMHA` attention), whatever conf/an4/transformer.yaml chooses.
OUR_ENCODER = {
    "num_layers": ENCODER_LAYERS,
    "subsampling_channels": 64,
    "relative_positions": False,
}
OUR_OVERRIDES = {
    "encoder": {"init_args": {**SIZE, **OUR_ENCODER}},
    "decoder": {"init_args": {**SIZE, "num_layers": DECODER_LAYERS}},
    "ctc_weight": CTC_WEIGHT,
    "label_smoothing": LABEL_SMOOTHING,
}


@dataclass
class Features:
    """A batch as both models see it."""

    feats: Tensor  # (B, T, D) log-mel + CMVN
    feat_lens: Tensor  # (B,)
    tokens: Tensor | None  # (B, L) padded with PAD_ID, no sos/eos; None for decoding
    token_lens: Tensor | None  # (B,)
    audio_seconds: float

    @property
    def relative_lens(self) -> Tensor:
        """SpeechBrain's relative lengths."""
        return self.feat_lens.float() / self.feats.size(1)


@torch.no_grad()
def features(
    frontend: nn.Module,
    waves: Tensor,
    wave_lens: Tensor,
    tokens: Tensor | None = None,
    token_lens: Tensor | None = None,
) -> Features:
    """`Features` of a padded wave batch by our frontend in eval mode (no SpecAugment)."""
    frontend.eval()
    feats, feat_lens = frontend(waves, wave_lens)
    return Features(feats, feat_lens, tokens, token_lens, audio_seconds(wave_lens))


class Ours(nn.Module):
    """Our `Seq2Seq` from features: encoder, joint loss, batched beam search."""

    name = "ours"

    def __init__(self, model: Seq2Seq) -> None:
        super().__init__()
        self.model = model

    def loss(self, batch: Features) -> Tensor:
        enc, enc_lens = self.model.encoder(batch.feats, batch.feat_lens)
        out = self.model.loss_from_encoder(
            enc, enc_lens, batch.tokens, batch.token_lens, CTC_WEIGHT, LABEL_SMOOTHING
        )
        return out.loss

    @torch.no_grad()
    def decode(self, batch: Features, ctc_weight: float, max_len_ratio: float) -> list[int]:
        """Token counts of the best hypotheses."""
        enc, enc_lens = self.model.encoder(batch.feats, batch.feat_lens)
        ctc = self.model.ctc(enc) if ctc_weight > 0 else None
        options = SearchOptions(
            beam_size=BEAM,
            ctc_weight=ctc_weight,
            max_len_ratio=max_len_ratio,
            min_len_ratio=max_len_ratio,  # eos blocked: every hypothesis runs to the limit
        )
        nbest = beam_search(self.model.decoder, enc, enc_lens, options, ctc)
        return [len(hyps[0].tokens) if hyps else 0 for hyps in nbest]


class SpeechBrainASR(nn.Module):
    """SpeechBrain's recipe model at our size: `ConvolutionFrontEnd` -> `TransformerASR`,
    linear CTC and attention outputs, trained as its recipes train it.

    Ids are ours (blank 0, pad 1, sos 3) plus one: SpeechBrain's CTC scorer needs an eos
    distinct from bos, so eos is the extra id `vocab_size`.
    """

    name = "speechbrain"

    def __init__(self, vocab_size: int, input_dim: int) -> None:
        from speechbrain.lobes.models.convolution import ConvolutionFrontEnd
        from speechbrain.lobes.models.transformer.TransformerASR import TransformerASR
        from speechbrain.nnet.linear import Linear

        super().__init__()
        self.eos = vocab_size
        outputs = vocab_size + 1
        self.cnn = ConvolutionFrontEnd(
            input_shape=(8, 10, input_dim),
            num_blocks=2,
            num_layers_per_block=1,
            out_channels=(64, 32),
            kernel_sizes=(3, 3),
            strides=(2, 2),
            residuals=(False, False),
        )
        self.transformer = TransformerASR(
            tgt_vocab=outputs,
            input_size=32 * (input_dim // 4),  # channels x subsampled feature bins
            d_model=D_MODEL,
            nhead=HEADS,
            num_encoder_layers=ENCODER_LAYERS,
            num_decoder_layers=DECODER_LAYERS,
            d_ffn=FFN,
            dropout=0.1,
            activation=nn.ReLU,
            normalize_before=True,
            causal=False,
        )
        self.ctc_lin = Linear(input_size=D_MODEL, n_neurons=outputs)
        self.seq_lin = Linear(input_size=D_MODEL, n_neurons=outputs)

    def loss(self, batch: Features) -> Tensor:
        from speechbrain.nnet.losses import ctc_loss, kldiv_loss

        ys_in, ys_out = add_sos_eos(batch.tokens, batch.token_lens)
        rows = torch.arange(len(ys_out), device=ys_out.device)
        ys_out[rows, batch.token_lens] = self.eos
        enc, dec = self.transformer(
            self.cnn(batch.feats), ys_in, batch.relative_lens, pad_idx=PAD_ID
        )
        ctc_logp = self.ctc_lin(enc).float().log_softmax(-1)
        seq_logp = self.seq_lin(dec).float().log_softmax(-1)
        target_lens = batch.token_lens.float() / batch.tokens.size(1)
        reduction = "batchmean"  # as SpeechBrain's recipes
        ctc = ctc_loss(
            ctc_logp, batch.tokens, batch.relative_lens, target_lens, BLANK_ID, reduction
        )
        eos_lens = (batch.token_lens + 1).float() / ys_out.size(1)
        seq = kldiv_loss(
            seq_logp,
            ys_out,
            length=eos_lens,
            label_smoothing=LABEL_SMOOTHING,
            pad_idx=PAD_ID,
            reduction=reduction,
        )
        return CTC_WEIGHT * ctc + (1 - CTC_WEIGHT) * seq

    @torch.no_grad()
    def decode(self, batch: Features, ctc_weight: float, max_len_ratio: float) -> list[int]:
        """Token counts of the best hypotheses (eos excluded)."""
        enc = self.transformer.encode(self.cnn(batch.feats), batch.relative_lens, pad_idx=PAD_ID)
        hyps, _, _, _ = self.searcher(ctc_weight, max_len_ratio)(enc, batch.relative_lens)
        return [len([t for t in hyp if t != self.eos]) for hyp in hyps]

    def searcher(self, ctc_weight: float, max_len_ratio: float) -> nn.Module:
        from speechbrain.decoders import CTCScorer, S2STransformerBeamSearcher, ScorerBuilder

        scorer = None
        if ctc_weight > 0:
            ctc = CTCScorer(ctc_fc=self.ctc_lin, blank_index=BLANK_ID, eos_index=self.eos)
            scorer = ScorerBuilder(
                partial_scorers=[ctc],
                weights={"ctc": ctc_weight},
                scorer_beam_scale=PRE_BEAM_RATIO,
            )
        return S2STransformerBeamSearcher(
            modules=[self.transformer, self.seq_lin],
            bos_index=SOS_EOS_ID,
            eos_index=self.eos,
            min_decode_ratio=max_len_ratio,  # eos blocked: every hypothesis runs to the limit
            max_decode_ratio=max_len_ratio,
            beam_size=BEAM,
            scorer=scorer,
            using_eos_threshold=False,
            length_normalization=False,
        )


System = Ours | SpeechBrainASR


def training_step(system: System, precision: str, settings: Settings) -> Callable[[Features], None]:
    """`system`'s training step (AdamW, clipping) at `precision`, with its own optimizer."""
    system.train()
    params = list(system.parameters())
    optimizer = torch.optim.AdamW(params, lr=1e-3, betas=(0.9, 0.98), weight_decay=1e-6, fused=True)

    def step(batch: Features) -> None:
        optimizer.zero_grad(set_to_none=True)
        forward_backward(system, batch, precision, settings.device)
        torch.nn.utils.clip_grad_norm_(params, CLIP)
        optimizer.step()

    return step


def forward_backward(system: System, batch: Features, precision: str, device: torch.device) -> None:
    """`system`'s loss on `batch` at `precision`, and its gradients."""
    with autocast(device, precision):
        loss = system.loss(batch)
    loss.backward()


def train_throughput(
    systems: Sequence[System], batches: list[Features], precision: str, settings: Settings
) -> dict[str, dict[str, Any]]:
    """Training throughput of each system at `precision` (`measure_alternating`: their passes
    alternate), after 2 untimed steps each (1 with --quick); and each one's loss on the first
    batch after."""
    steps = {system.name: training_step(system, precision, settings) for system in systems}
    audio = [b.audio_seconds for b in batches]
    warmup, passes = settings.pick(1, 2), settings.pick(1, 3)
    results = measure_alternating(steps, batches, audio, warmup, settings.device, passes)
    for system in systems:
        with torch.no_grad(), autocast(settings.device, precision):
            results[system.name]["final_loss"] = float(system.loss(batches[0]))
    return results


def decode_speed(system: System, batch: Features, settings: Settings) -> dict[str, Any]:
    """Seconds for beam 10 and beam 10 + CTC over `batch`, in eval mode and fp32."""
    system.eval()
    results = {}
    for name, weight in (("beam10", 0.0), ("beam10_ctc", CTC_WEIGHT)):
        system.decode(_head(batch, 2), weight, settings.max_len_ratio)  # warm-up
        seconds, lengths = timed_call(
            lambda w=weight: system.decode(batch, w, settings.max_len_ratio), settings.device
        )
        results[name] = {
            "seconds": seconds,
            "rtf": seconds / batch.audio_seconds,
            "mean_tokens": sum(lengths) / len(lengths),
        }
    return results


def _head(batch: Features, n: int) -> Features:
    length = int(batch.feat_lens[:n].max())
    return Features(batch.feats[:n, :length], batch.feat_lens[:n], None, None, 0.0)


def model_flops(system: System, batch: Features, device: torch.device) -> int:
    """Model FLOPs of `system`'s forward + backward on `batch` in training mode (fp32); the
    gradients it leaves are cleared."""
    system.train()
    flops = count_flops(partial(forward_backward, system, batch, "fp32", device))
    system.zero_grad(set_to_none=True)
    return flops


def similar_lengths(utts: Utterances, count: int) -> Utterances:
    """The `count` length-sorted utterances around the median: a batch with little padding,
    so SpeechBrain's limit (from the padded length) matches ours (from each length)."""
    start = max(0, min(len(utts.waves) - count, len(utts.waves) // 2 - count // 2))
    return Utterances(utts.texts[start : start + count], utts.waves[start : start + count])


def build_ours(
    settings: Settings, overrides: dict[str, Any] = OUR_OVERRIDES
) -> tuple[Ours, nn.Module, int]:
    """Our model at the peer's size (conf/an4/transformer.yaml with `overrides`), its frontend
    for the features, and the vocabulary size."""
    module = build_module(model_config("transformer", settings.data, overrides), settings.seed)
    ours = Ours(module.model.to(settings.device))
    return ours, module.model.frontend, module.hparams.vocab_size


def build_systems(settings: Settings) -> tuple[Ours, SpeechBrainASR, nn.Module]:
    """Both models from the same seed, and our frontend for the features."""
    ours, frontend, vocab_size = build_ours(settings)
    torch.manual_seed(settings.seed)
    peer = SpeechBrainASR(vocab_size, frontend.output_dim).to(settings.device)
    return ours, peer, frontend


def run(settings: Settings) -> dict[str, Any]:
    """Training throughput at fp32 and bf16, then decode speed, of both systems."""
    # SpeechBrain's import-time "quirks" would switch on TF32 matmuls for every later part.
    os.environ.setdefault("SB_DISABLE_QUIRKS", "allow_tf32,disable_jit_profiling")
    try:
        version = importlib.metadata.version("speechbrain")
        import speechbrain.decoders  # noqa: F401
        import speechbrain.lobes.models.transformer.TransformerASR  # noqa: F401
    except Exception as err:  # not installed, or does not import with this torch
        return {"available": False, "reason": f"unavailable: {type(err).__name__}: {err}"}
    with warnings.catch_warnings():  # SpeechBrain's masks: a deprecation notice per step
        warnings.filterwarnings("ignore", "Support for mismatched key_padding_mask")
        ours, peer, frontend = build_systems(settings)
        return compare(settings, ours, peer, frontend, {"speechbrain_version": version})


def compare(
    settings: Settings, ours: Ours, peer: nn.Module, frontend: nn.Module, versions: dict[str, str]
) -> dict[str, Any]:
    """Ours and `peer` (a system with `name`, `loss` and `decode`, as `SpeechBrainASR`):
    parameters, FLOPs, training throughput and decode speed, with `versions` recorded."""
    steps = settings.pick(2, 8)
    raw = train_batches("transformer", settings, steps, settings.pick(8.0, None))
    batches = [features(frontend, b.waves, b.wave_lens, b.tokens, b.token_lens) for b in raw]
    results: dict[str, Any] = {"available": True, **versions}
    for system in (ours, peer):
        flops = model_flops(system, batches[0], settings.device)
        results[system.name] = {
            "parameters": count_parameters(system),
            "flops_per_audio_second": flops / batches[0].audio_seconds,
        }
    for precision in PRECISIONS:
        for name, measured in train_throughput((ours, peer), batches, precision, settings).items():
            results[name][precision] = measured
    utts = similar_lengths(test_utterances(settings, None), settings.pick(4, 32))
    test = features(frontend, *pad_waves(utts.waves, settings.device))
    results["decode_batch"] = {"utterances": len(utts.waves), "audio_seconds": utts.seconds}
    for system in (ours, peer):
        results[system.name]["decode"] = decode_speed(system, test, settings)
    return results
