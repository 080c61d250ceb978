"""The attention encoder-decoder recognizer: `Seq2Seq(frontend, encoder, decoder, ctc=None)`."""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from asr.frontends import features_of
from asr.models.ctc import CTCHead, InterCTC
from asr.text import PAD_ID, SOS_EOS_ID


@dataclass
class LossOutput:
    """Training losses and the quantities behind them."""

    loss: Tensor  # the weighted total that is back-propagated
    attention_loss: Tensor  # label-smoothed cross-entropy per token
    ctc_loss: Tensor | None  # CTC loss per target token, when a CTC head is present
    token_accuracy: Tensor  # teacher-forced next-token accuracy over real tokens
    attention: Tensor  # (B, K, L+1, T_enc) cross-attention weights
    inter_ctc_loss: Tensor | None = None  # mean CTC loss of the tapped blocks (`InterCTC`)


def add_sos_eos(tokens: Tensor, token_lens: Tensor) -> tuple[Tensor, Tensor]:
    """Decoder inputs `[sos] + y` and targets `y + [eos]`, padded with PAD_ID.

    >>> ys_in, ys_out = add_sos_eos(torch.tensor([[5, 6], [7, 1]]), torch.tensor([2, 1]))
    >>> ys_in.tolist(), ys_out.tolist()
    ([[3, 5, 6], [3, 7, 1]], [[5, 6, 3], [7, 3, 1]])
    """
    batch = tokens.size(0)
    sos = tokens.new_full((batch, 1), SOS_EOS_ID)
    pad = tokens.new_full((batch, 1), PAD_ID)
    ys_in = torch.cat([sos, tokens], dim=1)
    ys_out = torch.cat([tokens, pad], dim=1)
    ys_out[torch.arange(batch, device=tokens.device), token_lens] = SOS_EOS_ID
    return ys_in, ys_out


MEASURE_SECONDS = 12  # extra audio `frame_timing` measures over (divisible by common hops)


@torch.inference_mode()
def frame_timing(
    module: Callable[[Tensor, Tensor], tuple[Tensor, Tensor]],
    sample_rate: int,
    device: torch.device | str = "cpu",
) -> tuple[float, float]:
    """Measured seconds per output frame of `module`, and the seconds of 1 s its frames omit."""
    short, extra = sample_rate, MEASURE_SECONDS * sample_rate
    lens = torch.tensor([short, short + extra], device=device)
    _, out_lens = module(torch.zeros(2, short + extra, device=device), lens)
    frames = int(out_lens[1] - out_lens[0])
    if frames <= 0:
        raise ValueError("the model's output length does not grow with audio")
    frame_seconds = round(MEASURE_SECONDS / frames, 9)
    return frame_seconds, round(1.0 - int(out_lens[0]) * frame_seconds, 9)


@contextlib.contextmanager
def _measuring(module: nn.Module) -> Iterator[None]:
    """Eval mode while measuring lengths on zeros, which batch norms in training mode would
    learn from (and dropout randomise); each submodule's mode restored after."""
    modes = [(m, m.training) for m in module.modules()]
    module.eval()
    try:
        yield
    finally:
        for m, training in modes:
            m.training = training


def _device(module: nn.Module) -> torch.device:
    tensor = next(itertools.chain(module.parameters(), module.buffers()), None)
    return torch.device("cpu") if tensor is None else tensor.device


class Seq2Seq(nn.Module):
    """Frontend -> encoder -> attention decoder, with an optional CTC head on the encoder."""

    def __init__(
        self,
        frontend: nn.Module,
        encoder: nn.Module,
        decoder: nn.Module,
        ctc: CTCHead | None = None,
    ):
        super().__init__()
        self.frontend = frontend
        self.encoder = encoder
        self.decoder = decoder
        self.ctc = ctc

    @property
    def vocab_size(self) -> int:
        return self.decoder.vocab_size

    @property
    def sample_rate(self) -> int:
        """The audio rate the frontend expects (16 kHz where it does not say)."""
        return int(getattr(features_of(self.frontend), "sample_rate", 16000))

    def encoder_timing(self) -> tuple[float, float]:
        """`frame_timing` of the encoder."""
        with _measuring(self):
            return frame_timing(self.encode, self.sample_rate, _device(self))

    def feature_seconds(self) -> float:
        """Seconds per feature frame (the frontend's hop), measured."""
        with _measuring(self):
            return frame_timing(self.frontend, self.sample_rate, _device(self))[0]

    @torch.inference_mode()
    def shortest_input(self) -> int:
        """The fewest samples that give an encoder frame, measured."""
        low, high = 1, self.sample_rate
        with _measuring(self):
            while low < high:
                middle = (low + high) // 2
                if self._frames(middle) > 0:
                    high = middle
                else:
                    low = middle + 1
        return low

    @torch.inference_mode()
    def encoder_frames(self, samples: int) -> int:
        """The encoder frames `samples` of audio give, measured (0: too short)."""
        with _measuring(self):
            return self._frames(samples)

    def _frames(self, samples: int) -> int:
        device = _device(self)
        lens = torch.tensor([samples], device=device)
        try:
            return int(self.encode(torch.zeros(1, samples, device=device), lens)[1][0])
        except ValueError:  # too short to subsample
            return 0

    def encode(self, waves: Tensor, wave_lens: Tensor) -> tuple[Tensor, Tensor]:
        """Args: waves `(B, S)`, wave_lens `(B,)`. Returns: enc `(B, T, D)`, enc_lens `(B,)`."""
        feats, feat_lens = self.frontend(waves, wave_lens)
        return self.encoder(feats, feat_lens)

    def forward(
        self, waves: Tensor, wave_lens: Tensor, tokens: Tensor, token_lens: Tensor
    ) -> tuple[Tensor, Tensor]:
        """Args: waves `(B, S)`, wave_lens `(B,)`, tokens `(B, L)` (no sos/eos), token_lens `(B,)`.
        Returns: logits `(B, L+1, V)` for `tokens + [eos]`, attention `(B, K, L+1, T_enc)`."""
        enc, enc_lens = self.encode(waves, wave_lens)
        ys_in, _ = add_sos_eos(tokens, token_lens)
        return self.decoder(enc, enc_lens, ys_in)

    def loss(
        self,
        waves: Tensor,
        wave_lens: Tensor,
        tokens: Tensor,
        token_lens: Tensor,
        ctc_weight: float = 0.0,
        label_smoothing: float = 0.0,
        inter_ctc: InterCTC | None = None,
    ) -> LossOutput:
        """Joint CTC/attention loss from audio; see `loss_from_encoder`."""
        enc, enc_lens, intermediate = self.encode_tapped(waves, wave_lens, inter_ctc)
        return self.loss_from_encoder(
            enc, enc_lens, tokens, token_lens, ctc_weight, label_smoothing,
            intermediate, inter_ctc,
        )  # fmt: skip

    def encode_tapped(
        self, waves: Tensor, wave_lens: Tensor, inter_ctc: InterCTC | None
    ) -> tuple[Tensor, Tensor, list[Tensor]]:
        """`encode`, plus the outputs of the blocks `inter_ctc` taps (none without it)."""
        if inter_ctc is None:
            return (*self.encode(waves, wave_lens), [])
        with inter_ctc.tap(self.encoder) as intermediate:
            enc, enc_lens = self.encode(waves, wave_lens)
        return enc, enc_lens, intermediate

    def loss_from_encoder(
        self,
        enc: Tensor,
        enc_lens: Tensor,
        tokens: Tensor,
        token_lens: Tensor,
        ctc_weight: float = 0.0,
        label_smoothing: float = 0.0,
        intermediate: Sequence[Tensor] = (),
        inter_ctc: InterCTC | None = None,
    ) -> LossOutput:
        """`ctc_weight * ctc + (1 - ctc_weight) * attention`, both per target token."""
        if ctc_weight > 0 and self.ctc is None:
            raise ValueError(f"ctc_weight={ctc_weight} but the model has no CTC head")
        ys_in, ys_out = add_sos_eos(tokens, token_lens)
        logits, attn = self.decoder(enc, enc_lens, ys_in)
        att_loss = F.cross_entropy(
            logits.float().transpose(1, 2),  # (B, V, L+1)
            ys_out,
            ignore_index=PAD_ID,
            label_smoothing=label_smoothing,
        )
        valid = ys_out != PAD_ID
        accuracy = ((logits.argmax(-1) == ys_out) & valid).sum() / valid.sum()
        ctc_loss = inter_loss = None
        total = att_loss
        if self.ctc is not None and ctc_weight > 0:
            ctc_loss = ctc_term = self._ctc_loss(enc, enc_lens, tokens, token_lens)
            if intermediate and inter_ctc is not None:
                inter = [self._ctc_loss(h, enc_lens, tokens, token_lens) for h in intermediate]
                inter_loss = torch.stack(inter).mean()
                ctc_term = (1 - inter_ctc.weight) * ctc_loss + inter_ctc.weight * inter_loss
            total = ctc_weight * ctc_term + (1 - ctc_weight) * att_loss
        return LossOutput(total, att_loss, ctc_loss, accuracy, attn, inter_loss)

    def _ctc_loss(
        self, enc: Tensor, enc_lens: Tensor, tokens: Tensor, token_lens: Tensor
    ) -> Tensor:
        return self.ctc.loss(self.ctc(enc), enc_lens, tokens, token_lens)


def build_seq2seq(
    frontend: nn.Module,
    encoder: Callable[[int], nn.Module],
    decoder: Callable[[int, int], nn.Module],
    vocab_size: int,
    ctc_weight: float = 0.3,
) -> Seq2Seq:
    """A `Seq2Seq` from part factories, each given the sizes of the one before."""
    if vocab_size <= 0:
        raise ValueError("vocab_size must be positive (link it from data.vocab_size)")
    enc = encoder(frontend.output_dim)
    ctc = CTCHead(vocab_size, enc.output_dim) if ctc_weight > 0 else None
    return Seq2Seq(frontend, enc, decoder(vocab_size, enc.output_dim), ctc)
