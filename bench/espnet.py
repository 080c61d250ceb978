"""Second peer: ESPnet's Transformer ASR (espnet2 `ESPnetASRModel`) against ours at its size.

The model of the `peer` part (12 encoder / 6 decoder pre-LN blocks, d=256, 4 heads, FFN 2048,
absolute sinusoids, joint CTC 0.3 / label smoothing 0.1), with the front that ESPnet's
`input_layer: conv2d` builds: two 3x3 stride-2 convolutions of 256 channels, so ours takes
`subsampling_channels: 256` here and both have the same weight shapes. The same features and
batches feed both (see `bench.peer`), and the same plain loop times the training steps,
alternating between the two, in fp32 and bf16.

Decoding: beam 10 and beam 10 + CTC 0.3 over the same 32 AN4 test utterances. Ours decodes them
as one batch; ESPnet's `BatchBeamSearch` (batched over the hypotheses of one utterance, as
`espnet2.bin.asr_inference` runs it) one utterance at a time, with `CTCPrefixScorer` and the
full-score pre-beam of 1.5x the beam, as its inference does. As both models are only briefly
trained, eos is blocked until the maximum length (`max_len_ratio` tokens per encoder frame)
in both, so both run the same number of steps.

ESPnet pins versions that clash with ours, so it lives in its own environment,
`make espnet-env` (.venv-espnet: ESPnet without its speech-enhancement and TTS extras, and a
path to .venv for torch and the rest); run this part with that environment's Python:
`.venv-espnet/bin/python -m bench espnet`.
"""

from __future__ import annotations

import importlib.metadata
import logging
from contextlib import contextmanager
from typing import Any

import torch
from torch import Tensor, nn

from bench.common import BLANK_ID, Settings
from bench.peer import (
    BEAM,
    CTC_WEIGHT,
    D_MODEL,
    DECODER_LAYERS,
    ENCODER_LAYERS,
    FFN,
    HEADS,
    LABEL_SMOOTHING,
    OUR_OVERRIDES,
    PRE_BEAM_RATIO,
    Features,
    build_ours,
    compare,
)

ESPNET_FRONT_CHANNELS = D_MODEL  # ESPnet's conv2d front has d_model channels
OVERRIDES = {
    **OUR_OVERRIDES,
    "encoder": {
        "init_args": {
            **OUR_OVERRIDES["encoder"]["init_args"],
            "subsampling_channels": ESPNET_FRONT_CHANNELS,
        }
    },
}
IGNORE_ID = -1  # ESPnet's padding of targets


class ESPnetASR(nn.Module):
    """ESPnet's `ESPnetASRModel` with its Transformer encoder (conv2d front) and decoder.

    Ids are ours (blank 0) plus one: ESPnet's sos/eos is the last id, `vocab_size`.
    """

    name = "espnet"

    def __init__(self, vocab_size: int, input_dim: int) -> None:
        from espnet2.asr.ctc import CTC
        from espnet2.asr.decoder.transformer_decoder import TransformerDecoder
        from espnet2.asr.encoder.transformer_encoder import TransformerEncoder
        from espnet2.asr.espnet_model import ESPnetASRModel

        super().__init__()
        self.eos = vocab_size
        outputs = vocab_size + 1
        size = {"attention_heads": HEADS, "linear_units": FFN, "use_flash_attn": False}
        encoder = TransformerEncoder(
            input_dim, D_MODEL, num_blocks=ENCODER_LAYERS, input_layer="conv2d", **size
        )
        decoder = TransformerDecoder(outputs, D_MODEL, num_blocks=DECODER_LAYERS, **size)
        tokens = [str(i) for i in range(outputs)]
        tokens[BLANK_ID], tokens[self.eos] = "<blank>", "<sos/eos>"
        self.model = ESPnetASRModel(
            vocab_size=outputs,
            token_list=tokens,
            frontend=None,  # fed our features, as SpeechBrain is
            specaug=None,
            normalize=None,
            preencoder=None,
            encoder=encoder,
            postencoder=None,
            decoder=decoder,
            ctc=CTC(outputs, D_MODEL),
            joint_network=None,
            ctc_weight=CTC_WEIGHT,
            lsm_weight=LABEL_SMOOTHING,
            ignore_id=IGNORE_ID,
            report_cer=False,
            report_wer=False,
        )

    def loss(self, batch: Features) -> Tensor:
        positions = torch.arange(batch.tokens.size(1), device=batch.tokens.device)
        padding = positions[None, :] >= batch.token_lens[:, None]
        text = batch.tokens.masked_fill(padding, IGNORE_ID)
        loss, _, _ = self.model(batch.feats, batch.feat_lens, text, batch.token_lens)
        return loss

    @torch.no_grad()
    def decode(self, batch: Features, ctc_weight: float, max_len_ratio: float) -> list[int]:
        """Token counts of the best hypotheses (sos and eos excluded), one utterance at a time."""
        enc, enc_lens = self.model.encode(batch.feats, batch.feat_lens)
        search = self.searcher(ctc_weight)
        counts = []
        with self.eos_blocked():
            for row, length in zip(enc, enc_lens.tolist()):
                hyps = search(row[:length], maxlenratio=max_len_ratio, minlenratio=0.0)
                counts.append(len(hyps[0].yseq) - 2 if hyps else 0)
        return counts

    def searcher(self, ctc_weight: float) -> nn.Module:
        from espnet.nets.batch_beam_search import BatchBeamSearch
        from espnet.nets.scorers.ctc import CTCPrefixScorer

        scorers: dict[str, Any] = {"decoder": self.model.decoder}
        weights = {"decoder": 1.0 - ctc_weight}
        if ctc_weight > 0:
            scorers["ctc"] = CTCPrefixScorer(ctc=self.model.ctc, eos=self.eos)
            weights["ctc"] = ctc_weight
        search = BatchBeamSearch(
            scorers=scorers,
            weights=weights,
            beam_size=BEAM,
            vocab_size=self.eos + 1,
            sos=self.eos,
            eos=self.eos,
            pre_beam_ratio=PRE_BEAM_RATIO,
            pre_beam_score_key="full",
        )
        return search.to(next(self.parameters()).device).eval()

    @contextmanager
    def eos_blocked(self):
        """The decoder's eos logit pushed far down, so that no hypothesis ends before the
        maximum length (where the search appends eos to every running one)."""
        bias = self.model.decoder.output_layer.bias
        saved = float(bias[self.eos])
        bias.data[self.eos] = -1e4
        try:
            yield
        finally:
            bias.data[self.eos] = saved


def run(settings: Settings) -> dict[str, Any]:
    """Training throughput at fp32 and bf16, then decode speed, of ours and ESPnet's."""
    try:
        version = importlib.metadata.version("espnet")
        import espnet.nets.batch_beam_search  # noqa: F401
        import espnet2.asr.espnet_model  # noqa: F401
    except Exception as err:  # not installed, or does not import with this torch
        reason = f"unavailable: {type(err).__name__}: {err} (make espnet-env)"
        return {"available": False, "reason": reason}
    logging.getLogger().setLevel(logging.WARNING)  # the search logs every step at INFO
    ours, frontend, vocab_size = build_ours(settings, OVERRIDES)
    torch.manual_seed(settings.seed)
    peer = ESPnetASR(vocab_size, frontend.output_dim).to(settings.device)
    return compare(settings, ours, peer, frontend, {"espnet_version": version})
