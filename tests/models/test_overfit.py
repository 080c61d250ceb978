"""A tiny overfit run per family: a few real AN4 utterances, greedy decoding must reproduce the
exact reference transcripts (the whole pipeline can learn: frontend, encoder, attention, loss,
search)."""

from __future__ import annotations

from functools import partial

import pytest
import torch

from asr.audio import load_audio
from asr.data.dataset import collate
from asr.frontends import Frontend, LogMelFilterbank, UtteranceCMVN
from asr.models.attention import LocationAwareAttention
from asr.models.ctc import CTCHead
from asr.models.rnn import RNNAttentionDecoder, RNNEncoder
from asr.models.seq2seq import Seq2Seq
from asr.models.transformer import TransformerDecoder, TransformerEncoder
from asr.search import greedy_search
from asr.text import CharTokenizer

pytestmark = pytest.mark.needs_corpus

UTTERANCES = {  # AN4 training utterances with short transcripts (etc/an4_train.transcription)
    "an4_clstk/fash/an251-fash-b": "YES",
    "an4_clstk/fash/an253-fash-b": "GO",
    "an4_clstk/fash/an254-fash-b": "YES",
    "an4_clstk/fash/an255-fash-b": "U M N Y H SIX",
}

FAMILIES = {
    "transformer": (
        partial(TransformerEncoder, d_model=64, num_heads=4, ffn_dim=128, num_layers=2,
                dropout=0.0),
        partial(TransformerDecoder, d_model=64, num_heads=4, ffn_dim=128, num_layers=1,
                dropout=0.0),
        2e-3,
    ),
    "rnn_location": (
        partial(RNNEncoder, hidden_size=64, num_layers=2, subsample="2_2", projection_dim=64),
        partial(RNNAttentionDecoder, attention=partial(LocationAwareAttention, attention_dim=64,
                conv_kernel=10), embed_dim=32, hidden_size=64),
        3e-3,
    ),
}  # fmt: skip


@pytest.fixture(scope="module")
def an4_batch(request):
    from conftest import corpus_path

    root = corpus_path("an4", "wav")
    tokenizer = CharTokenizer.train(UTTERANCES.values())
    items = [
        {
            "id": path,
            "wave": load_audio(root / f"{path}.wav"),
            "text": text,
            "tokens": torch.tensor(tokenizer.encode(text)),
        }
        for path, text in UTTERANCES.items()
    ]
    return collate(items, pad_id=tokenizer.pad_id), tokenizer


@pytest.mark.parametrize(
    "family",  # RNN-attention learns slowest: its contracts run by default in test_rnn.py
    [pytest.param(f, marks=pytest.mark.slow) if f.startswith("rnn") else f for f in FAMILIES],
)
def test_overfit_reaches_exact_transcripts(family, an4_batch):
    batch, tokenizer = an4_batch
    make_encoder, make_decoder, lr = FAMILIES[family]
    torch.manual_seed(0)
    frontend = Frontend(LogMelFilterbank(n_mels=40), UtteranceCMVN(norm_vars=True))
    encoder = make_encoder(frontend.output_dim)
    decoder = make_decoder(tokenizer.vocab_size, encoder.output_dim)
    model = Seq2Seq(frontend, encoder, decoder, CTCHead(tokenizer.vocab_size, encoder.output_dim))
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    args = (batch.waves, batch.wave_lens, batch.tokens, batch.token_lens)
    hyps: list[str] = []
    for step in range(1, 401):
        model.train()
        loss = model.loss(*args, ctc_weight=0.3).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step % 20 == 0:
            model.eval()
            enc, enc_lens = model.encode(batch.waves, batch.wave_lens)
            hyps = [tokenizer.decode(h.tokens) for h in greedy_search(decoder, enc, enc_lens)]
            if hyps == batch.texts:
                break
    assert hyps == batch.texts, f"after {step} steps: {hyps}"
