"""Live streams (`Recognizer.stream`) of a tiny chunk-streaming recognizer trained on four AN4
fixture utterances: what they decode, and that how audio arrives changes nothing."""

from __future__ import annotations

import contextlib
import functools
import io
import json
import os
import signal
import subprocess
import sys
import time
import warnings
from dataclasses import replace
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from conftest import page_data
from streaming_fixtures import RATE, UTTERANCES, streaming_recognizer

import asr.alignment
from asr.cli import main
from asr.ctc_beam import CTCPrefixBeam, EndpointOptions
from asr.frontends import Frontend, LevelNormalizer, LogMelFilterbank
from asr.search import SearchOptions
from asr.streaming import (
    SPEECH_TAIL,
    FeatureStream,
    StreamingEngine,
    StreamOptions,
    mask_chunks,
    stream_transcript,
)

WHOLE = StreamOptions(endpoint=None)


@pytest.fixture(scope="module")
def trained():
    return streaming_recognizer()


@pytest.mark.parametrize("chunk_ms", [160, 640])
def test_masked_chunks_decode_offline_as_the_live_beam_final(trained, chunk_ms) -> None:
    """`mask_chunks` (asr evaluate --chunk-ms): a batch decoded offline gives each recording's
    live beam final; None brings full context back."""
    recognizer, waves = trained
    options = StreamOptions(
        chunk_ms=chunk_ms, beam=4, ctc_weight=0.5, endpoint=None, final_search="beam"
    )
    live = {uid: stream_transcript(recognizer, wave, options) for uid, wave in waves.items()}
    search = recognizer.bounded(recognizer.search_options(beam_size=4, ctc_weight=0.5))
    mask_chunks(recognizer, chunk_ms)
    try:
        assert recognizer.model.encoder.chunk == StreamingEngine(recognizer, options).chunk
        decoded = recognizer.search(list(waves.values()), search)
    finally:
        mask_chunks(recognizer, None)
    assert recognizer.model.encoder.chunk is None
    for (uid, transcript), d in zip(live.items(), decoded):
        assert transcript.tokens and d.hypothesis.tokens == transcript.tokens, uid
        assert d.hypothesis.score == pytest.approx(transcript.score, abs=1e-3)


def test_masked_chunks_need_a_positive_size_or_none(trained) -> None:
    recognizer, _ = trained
    with pytest.raises(ValueError, match="positive"):
        mask_chunks(recognizer, -160)
    mask_chunks(recognizer, 160)
    mask_chunks(recognizer, 0)  # full context, as the live commands' --chunk-ms 0
    assert recognizer.model.encoder.chunk is None


@pytest.mark.parametrize("chunk_ms", [None, 160, 640])
def test_streams_transcribe_what_the_model_learnt(trained, chunk_ms) -> None:
    recognizer, waves = trained
    for uid, text in UTTERANCES.items():
        transcript = stream_transcript(recognizer, waves[uid], StreamOptions(chunk_ms=chunk_ms))
        assert transcript.text == text
        assert [w.text for w in transcript.words] == text.split()
        assert all(0 <= w.start <= w.end <= transcript.duration for w in transcript.words)


@pytest.mark.parametrize("packet", [0.01, 0.13, 0.5])
def test_how_audio_arrives_changes_nothing(trained, packet) -> None:
    recognizer, waves = trained
    wave = waves["an4_clstk/fash/an255-fash-b"]
    once = stream_transcript(recognizer, wave, StreamOptions(chunk_ms=320))
    pieces = stream_transcript(recognizer, wave, StreamOptions(chunk_ms=320), packet)
    assert pieces.tokens == once.tokens
    assert pieces.score == pytest.approx(once.score, abs=1e-4)


def test_features_arrive_as_the_whole_file_gives_them(trained) -> None:
    recognizer, waves = trained
    wave = waves["an4_clstk/fash/an255-fash-b"]
    frontend = recognizer.model.frontend
    whole = frontend(wave[None], torch.tensor([wave.numel()]))[0][0]
    stream = FeatureStream(frontend)
    parts = torch.cat([stream.push(wave[i : i + 777]) for i in range(0, wave.numel(), 777)])
    torch.testing.assert_close(parts, whole, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("hop", [160, 480])
def test_features_of_a_bare_module_and_any_hop_arrive_as_whole(hop) -> None:
    """A config's bare feature module (no `Frontend`) crashed streaming; a hop longer than the
    window (gaps between frames) shifted every frame after a piece that ended in a gap."""
    features = LogMelFilterbank(n_mels=40, win_length=400, hop_length=hop)
    wave = torch.randn(16000, generator=torch.Generator().manual_seed(0)) * 0.1
    whole = features(wave[None], torch.tensor([wave.numel()]))[0][0]
    for size in (37, 400, 777):  # 37: pieces within a gap (hop - window: 80)
        stream = FeatureStream(features)
        parts = torch.cat([stream.push(wave[i : i + size]) for i in range(0, wave.numel(), size)])
        torch.testing.assert_close(parts, whole, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("final_search", ["rescore", "beam"])
def test_a_full_context_final_has_the_no_speech_prob_of_offline(trained, final_search):
    """The CTC head's probability of an empty transcript, of the same frames: the stream's
    segments had none."""
    recognizer, waves = trained
    clipped = waves["an4_clstk/fash/an254-fash-b"][:4000]  # "GO", the rest of a second silent
    wave = torch.cat([clipped, torch.zeros(RATE)])
    options = StreamOptions(chunk_ms=None, endpoint=None, final_search=final_search)
    streamed = stream_transcript(recognizer, wave, options).segments[0].no_speech_prob
    offline = recognizer.transcribe(wave, sample_rate=RATE).segments[0].no_speech_prob
    assert offline > 1e-6 and streamed == pytest.approx(offline, rel=1e-4)


@pytest.mark.parametrize("chunk_ms", [160, None])
def test_a_bf16_recognizer_streams_its_encoder_under_autocast(trained, chunk_ms, monkeypatch):
    """`--precision bf16` was taken by offline decoding alone: a stream ran in fp32."""
    recognizer, waves = trained
    encoder, seen = recognizer.model.encoder, []
    for name in ("forward", "forward_chunk"):
        run = getattr(encoder, name)

        def spy(*args, run=run, **kwargs):
            seen.append(torch.is_autocast_enabled("cpu"))
            return run(*args, **kwargs)

        monkeypatch.setattr(encoder, name, spy)
    wave = waves["an4_clstk/fash/an255-fash-b"]
    for precision in ("fp32", "bf16"):
        stream = replace(recognizer, precision=precision).stream(chunk_ms=chunk_ms, endpoint=None)
        seen.clear()  # the model's timing, measured once, aside
        stream.accept(wave)
        assert stream.final().text and seen and set(seen) == {precision == "bf16"}


@pytest.mark.parametrize("first_chunk_ms", [None, 480])
def test_the_live_pass_reads_the_chunk_masked_encoder(trained, first_chunk_ms) -> None:
    """Partial results are the CTC prefix search over the encoder under the chunk mask (with
    a longer first chunk, the mask whose first chunk is as long)."""
    recognizer, waves = trained
    wave = waves["an4_clstk/fash/an255-fash-b"]
    stream = recognizer.stream(chunk_ms=160, first_chunk_ms=first_chunk_ms, endpoint=None)
    partials = []
    for start in range(0, wave.numel(), 1600):
        stream.accept(wave[start : start + 1600])
        partials.append(stream.partial)
    streamed_enc = torch.cat(stream.enc)
    model = recognizer.model
    assert stream.engine.first_chunk == (12 if first_chunk_ms else 4)  # encoder frames of 40 ms
    model.encoder.chunk, model.encoder.first_chunk = stream.engine.chunk, stream.engine.first_chunk
    try:
        enc, _ = model.encode(wave[None], torch.tensor([wave.numel()]))
    finally:
        model.encoder.chunk = model.encoder.first_chunk = None
    torch.testing.assert_close(streamed_enc, enc[0, : streamed_enc.size(0)], atol=1e-4, rtol=1e-4)
    model.encoder.chunk = stream.engine.chunk  # the plain chunk mask: other frames
    try:
        plain, _ = model.encode(wave[None], torch.tensor([wave.numel()]))
    finally:
        model.encoder.chunk = None
    same = torch.allclose(streamed_enc, plain[0, : streamed_enc.size(0)], atol=1e-4, rtol=1e-4)
    assert same == (first_chunk_ms is None)
    search = CTCPrefixBeam(10)
    search.advance(model.ctc(enc)[0, : streamed_enc.size(0)].detach().numpy())
    assert stream.partial == recognizer.tokenizer.decode(search.best)
    assert partials[-1] and len(set(partials)) > 2  # the text grew as the audio came
    assert stream.final().text == UTTERANCES["an4_clstk/fash/an255-fash-b"]


def test_streams_stepped_together_equal_each_alone(trained) -> None:
    recognizer, waves = trained
    engine = StreamingEngine(recognizer, StreamOptions(chunk_ms=160, endpoint=None))
    streams = [engine.stream() for _ in waves]
    for k, (stream, wave) in enumerate(zip(streams, waves.values())):
        stream.feed(torch.zeros(1600 * k))  # each stream at another point
        stream.feed(wave)
    engine.run(streams)
    for k, (stream, wave) in enumerate(zip(streams, waves.values())):
        audio = torch.cat([torch.zeros(1600 * k), wave])
        alone = stream_transcript(recognizer, audio, StreamOptions(chunk_ms=160, endpoint=None))
        final = stream.final()
        assert final.tokens == alone.tokens
        assert final.score == pytest.approx(alone.score, abs=1e-4)


def test_streams_at_their_first_chunk_and_the_others_step_together(trained) -> None:
    """With a longer first chunk, one step holds streams at both sizes (two batches): each
    stream still gives what it gives alone."""
    recognizer, waves = trained
    options = StreamOptions(chunk_ms=160, first_chunk_ms=480, endpoint=None)
    engine = StreamingEngine(recognizer, options)
    streams, sizes = [], []
    steps = engine.step
    engine.step = lambda ready: (sizes.append({s.next_chunk for s in ready}), steps(ready))
    for wave in waves.values():  # each new stream joins those already past their first chunk
        streams.append(engine.stream())
        streams[-1].feed(wave)
        engine.step([s for s in streams if s.ready])
    engine.run(streams)
    assert {4, 12} in sizes
    for stream, wave in zip(streams, waves.values()):
        alone = stream_transcript(recognizer, wave, options)
        final = stream.final()
        assert final.tokens == alone.tokens
        assert final.score == pytest.approx(alone.score, abs=1e-4)


@pytest.mark.parametrize(
    ("silence_from", "first_chunk_ms"), [("ctc", None), ("silero", None), ("ctc", 480)]
)
def test_an_endpoint_closes_each_utterance_and_the_next_starts_afresh(
    trained, silence_from, first_chunk_ms
) -> None:
    """Each utterance starts as a new stream would: without left context, and with the first
    chunk's size."""
    recognizer, waves = trained
    silence = 1e-4 * torch.randn(16000 * 2, generator=torch.Generator().manual_seed(0))
    first, second = waves["an4_clstk/fash/an253-fash-b"], waves["an4_clstk/fash/an255-fash-b"]
    audio = torch.cat([first, silence, second, silence])
    endpoint = EndpointOptions(trailing_silence=1.2, silence_from=silence_from)
    options = StreamOptions(chunk_ms=160, first_chunk_ms=first_chunk_ms, endpoint=endpoint)
    stream = recognizer.stream(options)
    finals, closed_at = [], []
    for start in range(0, audio.numel(), 1600):
        finals += stream.accept(audio[start : start + 1600])
        closed_at += [stream.decoded_seconds] * (len(finals) - len(closed_at))
    assert len(finals) >= 2 and finals[0].text == "GO"  # closed before the audio ended
    gap_start, second_start = first.numel() / 16000, first.numel() / 16000 + 2.0
    spans = [(f.segments[0].start, f.segments[0].end) for f in finals]
    assert spans[0][0] == 0.0 and gap_start < spans[0][1] < second_start
    assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:]))  # in order, not overlapping
    # its times count from the stream's start, its duration too: writers keep times within it
    assert all(f.duration >= f.segments[-1].end for f in finals)
    assert all(0 <= s.no_speech_prob <= 1 for f in finals for s in f.segments), "as offline"
    # its span (its last word's end with it) ends with its speech, not with the silence that
    # closed it
    assert spans[0][1] < gap_start + 0.35 < closed_at[0]
    if silence_from == "silero":  # the tail after Silero's speech, wherever a chunk ends
        heard = gap_start + 1.0 - stream.vad.silence(gap_start + 1.0)
        assert spans[0][1] == pytest.approx(heard + SPEECH_TAIL, abs=1e-6)
    at_once = recognizer.stream(options).accept(audio)  # the VAD reads far ahead of the decoder
    assert [(f.text, f.segments[0].start) for f in at_once] == [
        (f.text, f.segments[0].start) for f in finals
    ]
    # each utterance after an endpoint decodes as a stream that starts where it starts
    for final in finals[1:]:
        begin = final.segments[0].start
        again = recognizer.stream(options)
        rest = audio[round(begin * 16000) :]
        first_final = next(f for start in range(0, rest.numel(), 1600)
                           for f in again.accept(rest[start : start + 1600]))  # fmt: skip
        assert first_final.tokens == final.tokens
        assert [begin + w.start for w in first_final.words] == pytest.approx(
            [w.start for w in final.words], abs=1e-3
        )
    whole = stream.final()
    finals += stream.take_finals()  # what the end of the audio closed
    assert whole.text == " ".join(f.text for f in finals)
    assert stream.take_finals() == []


def test_an_utterance_decoded_as_a_word_separator_alone_gives_no_final(
    trained, monkeypatch
) -> None:
    """Clipped speech then silence: the tiny model decodes the utterance as a lone `▁`, which
    says nothing and must not be sent as a final with empty text."""
    recognizer, waves = trained
    made = []

    def recorded(*args, **kwargs):
        made.append(transcript(*args, **kwargs))
        return made[-1]

    transcript = asr.alignment.transcript
    monkeypatch.setattr(asr.alignment, "transcript", recorded)
    clipped = (waves["an4_clstk/fash/an255-fash-b"] * 1000).clamp(-1, 1)
    audio = torch.cat([clipped, torch.zeros(2 * RATE)])
    stream = recognizer.stream()
    finals = [f for start in range(0, audio.numel(), 1600)
              for f in stream.accept(audio[start : start + 1600])]  # fmt: skip
    whole = stream.final()
    assert any(t.tokens and not t.words for t in made), "the case this test is about"
    assert all(f.text for f in [*finals, *stream.take_finals()])
    assert all(s.text for s in whole.segments)


@pytest.mark.parametrize("chunk_ms", [None, 160])
def test_a_float64_model_streams_as_its_float32_self(trained, chunk_ms) -> None:
    """`model.double()`: features, chunks and the final's search follow the weights."""
    import copy

    recognizer, waves = trained
    wide = copy.deepcopy(recognizer)
    wide.model.double()
    options = StreamOptions(chunk_ms=chunk_ms, endpoint=None)
    for uid, wave in waves.items():
        narrow, double = (stream_transcript(r, wave, options) for r in (recognizer, wide))
        assert double.tokens == narrow.tokens, uid
        assert double.score == pytest.approx(narrow.score, abs=1e-4)


def test_at_full_context_an_utterance_is_cut_at_the_endpoints_longest(trained) -> None:
    """Nothing is decoded before an utterance ends there, and its memory grows as the square
    of its length: with endpoints, each is decoded once it holds `max_utterance` of audio, as
    a stream of that audio alone decodes it; without, the recording is one utterance."""
    recognizer, waves = trained
    audio = torch.cat([waves[uid] for uid in UTTERANCES])  # 8.7 s
    endpoint = EndpointOptions(max_utterance=2.0)
    options = StreamOptions(chunk_ms=None, endpoint=endpoint)
    stream = recognizer.stream(options)
    finals, held = [], 0
    for start in range(0, audio.numel(), 1600):
        finals += stream.accept(audio[start : start + 1600])
        held = max(held, stream.pending.size(0))
    longest = stream.engine.longest
    assert longest == 200 and held < longest, "10 ms frames: 2 s, and never more held"
    assert len(finals) >= 2, [f.text for f in finals]  # those of 4 cuts that say something
    spans = [(f.segments[0].start, f.segments[0].end) for f in finals]
    assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:]))
    hop, win = stream.features.hop, stream.features.win
    cuts = [start / (longest * hop / RATE) for start, _ in spans]
    assert cuts == pytest.approx([round(cut) for cut in cuts]), "each starts at a cut"
    # the first: the frames of its 2 s alone, at full context, as one utterance
    alone = recognizer.stream(replace(options, endpoint=None))
    alone.accept(audio[: (longest - 1) * hop + win])
    assert alone.final().tokens == finals[0].tokens and finals[0].segments[0].start == 0.0
    whole = stream.final()
    finals += stream.take_finals()
    assert whole.text == " ".join(f.text for f in finals)
    one = recognizer.stream(replace(options, endpoint=None))
    assert one.accept(audio) == [] and one.engine.longest is None
    assert len(one.final().segments) == 1


@pytest.mark.parametrize("final_search", ["beam", "rescore"])
def test_an_endpoint_with_no_speech_yet_gives_no_final(trained, final_search, monkeypatch) -> None:
    """A beam of prefixes over silence holds some token even where its best is none: the joint
    search ran on an utterance the endpoint closed as silence, and made a word of it. The end
    of the audio is no such endpoint: its final is the offline search's, as documented."""
    recognizer, waves = trained
    wave = waves["an4_clstk/fash/an255-fash-b"]
    options = StreamOptions(chunk_ms=160, final_search=final_search)
    monkeypatch.setattr(  # an endpoint each second
        EndpointOptions,
        "reached",
        lambda self, search, seconds, silence=None: search.frames * seconds >= 1.0,
    )
    closed = stream_transcript(recognizer, wave, options).segments
    assert len(closed) > 1, "endpoints, then the end of the audio"
    ranked = CTCPrefixBeam.nbest
    monkeypatch.setattr(  # CTC's best: nothing said; the next prefixes: something
        CTCPrefixBeam, "nbest", lambda self, n=None: [([], 0.0), *ranked(self, n)]
    )
    finals = stream_transcript(recognizer, wave, options).segments
    assert all(final.start == closed[-1].start for final in finals), "none at an endpoint"
    if final_search == "beam":  # the rescorer may take the empty prefix itself
        assert [final.text for final in finals] == [closed[-1].text]


@pytest.mark.parametrize("final_search", ["beam", "rescore"])
def test_a_silent_utterance_gives_no_final_as_offline_gives_no_text(trained, final_search):
    """This model's joint search makes "GO" of digital silence, where offline transcription
    hears no speech (quieter than SILENT_DB) and gives no text: a stream whose utterance is as
    silent gives no final either. Faint noise above it is decoded as offline decodes it."""
    recognizer, _ = trained
    noise = torch.randn(2 * RATE, generator=torch.Generator().manual_seed(0))
    for chunk_ms in (None, 160):
        options = StreamOptions(chunk_ms=chunk_ms, final_search=final_search, endpoint=None)
        for silence in (torch.zeros(2 * RATE), 1e-6 * noise):  # -120 dBFS
            assert recognizer.transcribe(silence).text == ""
            assert stream_transcript(recognizer, silence, options).segments == []
    faint = 1e-4 * noise  # -80 dBFS
    full = StreamOptions(final_search="beam", endpoint=None)
    assert stream_transcript(recognizer, faint, full).text == recognizer.transcribe(faint).text
    assert recognizer.transcribe(faint).text


@pytest.mark.parametrize("chunk_ms", [None, 160])
def test_a_beam_final_is_the_offline_search_over_the_same_frames(
    trained, chunk_ms, monkeypatch
) -> None:
    """final_search="beam": the final is the joint beam search `Recognizer.search` runs, over the
    stream's frames (at full context the offline frames, over chunks the chunk-masked ones),
    whatever the CTC prefix beam's n-best holds."""
    from asr.decoding import search_encoded

    recognizer, waves = trained
    options = StreamOptions(
        chunk_ms=chunk_ms, beam=4, ctc_weight=0.5, endpoint=None, final_search="beam"
    )
    offline = recognizer.bounded(recognizer.search_options(beam_size=4, ctc_weight=0.5))
    model = recognizer.model
    chunk = StreamingEngine(recognizer, options).chunk
    expected = {}
    for uid, wave in waves.items():
        rescored = stream_transcript(recognizer, wave, replace(options, final_search="rescore"))
        assert rescored.text == UTTERANCES[uid]  # this model: the same words either way
        model.encoder.chunk = chunk
        try:
            with torch.inference_mode():
                enc, lens = model.encode(wave[None], torch.tensor([wave.numel()]))
                nbests, _, _ = search_encoded(model.decoder, enc, lens, model.ctc(enc), offline)
        finally:
            model.encoder.chunk = None
        expected[uid] = nbests[0][0]
        if chunk is None:
            assert recognizer.search([wave], offline)[0].hypothesis.tokens == nbests[0][0].tokens
    # A wrong n-best: rescoring would return it; the search does not read it.
    monkeypatch.setattr(CTCPrefixBeam, "nbest", lambda self, n: [([4], 0.0)])
    for uid, wave in waves.items():
        live = stream_transcript(recognizer, wave, options)
        assert live.tokens == expected[uid].tokens, uid
        assert live.segments[0].score == pytest.approx(expected[uid].score, abs=1e-3), uid


class BigramLM:
    """A language model whose next-token log-probabilities depend on the last token only."""

    def __init__(self, table: torch.Tensor) -> None:
        self.table = table.log_softmax(-1)  # (V, V)

    def init_state(self, batch_size: int, device: torch.device) -> dict:
        return {}

    def step(self, tokens: torch.Tensor, state: dict) -> tuple[torch.Tensor, dict]:
        return self.table[tokens], state

    def reorder_state(self, state: dict, index: torch.Tensor) -> dict:
        return state


def test_a_language_model_rescores_the_finals(trained) -> None:
    from asr.streaming import _lm_scores
    from asr.text import SOS_EOS_ID

    recognizer, waves = trained
    vocab = recognizer.tokenizer.vocab_size
    lm = BigramLM(torch.randn(vocab, vocab, generator=torch.Generator().manual_seed(0)))
    tokens = [[5, 6, 7], [], [8]]
    expected = [
        sum(float(lm.table[a, b]) for a, b in zip([SOS_EOS_ID, *t], [*t, SOS_EOS_ID]))
        for t in tokens
    ]
    assert _lm_scores(lm, tokens, torch.device("cpu")) == pytest.approx(expected, abs=1e-5)
    wave = waves["an4_clstk/fash/an255-fash-b"]
    with pytest.raises(ValueError, match="no language model"):
        recognizer.stream(lm_weight=0.5)
    fused = stream_transcript(recognizer, wave, StreamOptions(lm_weight=0.5), lm=lm)
    plain = stream_transcript(recognizer, wave, StreamOptions())
    assert fused.segments[0].score != pytest.approx(plain.segments[0].score)


def test_models_that_cannot_stream_are_refused(trained) -> None:
    recognizer, _ = trained
    frontend = Frontend(LogMelFilterbank(n_mels=40), level=LevelNormalizer())
    with pytest.raises(ValueError, match="whole recording"):
        FeatureStream(frontend)
    with pytest.raises(ValueError, match="chunk_ms"):
        StreamOptions(chunk_ms=0)
    with pytest.raises(ValueError, match="first_chunk_ms"):
        StreamOptions(first_chunk_ms=-640)
    for bad in (0, -5, float("nan"), float("inf")):  # -5 kept one frame, nan failed deep inside
        with pytest.raises(ValueError, match="max_context_ms must be positive and finite"):
            StreamOptions(max_context_ms=bad)
        if bad:
            with pytest.raises(ValueError, match="chunk_ms must be positive and finite"):
                StreamOptions(chunk_ms=bad)
        for name in ("trailing_silence", "leading_silence", "max_utterance"):  # nan: rule off
            with pytest.raises(ValueError, match=f"{name} must be positive and finite"):
                EndpointOptions(**{name: bad})
    with pytest.raises(ValueError, match="at least chunk_ms"):
        StreamOptions(chunk_ms=640, first_chunk_ms=320)
    with pytest.raises(ValueError, match="final_search"):
        StreamOptions(final_search="greedy")
    stream = recognizer.stream()
    stream.final()
    with pytest.raises(ValueError, match="ended"):
        stream.accept(torch.zeros(10))


def test_a_frontend_that_cannot_stream_is_refused_first_naming_the_model(
    trained, monkeypatch
) -> None:
    """Said before the warning of chunks a full-context model loses in, which misled."""
    recognizer, _ = trained
    monkeypatch.setattr(recognizer.model.frontend, "level", LevelNormalizer())
    monkeypatch.setattr(recognizer.model.encoder, "chunk_training", None)
    for chunk_ms in (320, None):
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            with pytest.raises(ValueError, match="whole recording") as refused:
                recognizer.stream(chunk_ms=chunk_ms)
        assert str(refused.value).startswith(f"{recognizer.checkpoint}: ")
        assert "--chunk-ms 0" in str(refused.value)


def test_a_model_that_cannot_stream_is_refused_before_the_output_dir_is_written(
    trained, monkeypatch, tmp_path
) -> None:
    """The explorer's layout file would claim the folder for a run that never began."""
    from asr.cli import _parser
    from asr.cli.live import transcribe_streaming

    recognizer, _ = trained
    monkeypatch.setattr(recognizer.model.frontend, "level", LevelNormalizer())
    out = tmp_path / "out"
    args = ["transcribe", "--streaming", "--model", "in-memory", str(tmp_path / "a.wav"),
            "--output-dir", str(out), "--explorer"]  # fmt: skip
    with pytest.raises(ValueError, match="whole recording"):
        transcribe_streaming(_parser("transcribe").parse_args(args), recognizer)
    assert not out.exists()


def test_a_model_trained_at_full_context_only_is_said_to_lose_in_chunks(
    trained, monkeypatch
) -> None:
    recognizer, _ = trained
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        recognizer.stream(chunk_ms=320)  # dynamic chunk training: no warning
    monkeypatch.setattr(recognizer.model.encoder, "chunk_training", None)
    with pytest.warns(UserWarning, match="trained at full context only"):
        recognizer.stream(chunk_ms=320)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        recognizer.stream(chunk_ms=None)  # full context: as trained


def test_stream_takes_the_endpoint_settings_as_keywords(trained) -> None:
    recognizer, _ = trained
    options = recognizer.stream(
        chunk_ms=320, silence_from="silero", trailing_silence=0.5
    ).engine.options
    assert options.chunk_ms == 320
    assert options.endpoint == EndpointOptions(trailing_silence=0.5, silence_from="silero")
    with pytest.raises(TypeError, match=r"'silence_form' \(did you mean 'silence_from'\?\)"):
        recognizer.stream(silence_form="silero")
    with pytest.raises(ValueError, match="silence_from given with endpoint=None"):
        recognizer.stream(endpoint=None, silence_from="silero")


def test_16_bit_pcm_and_one_channel_columns_stream_as_their_float_samples(trained) -> None:
    """`accept` takes what audio APIs give: 16-bit PCM (scaled as offline transcription scales
    it) and `(S, 1)` columns (sounddevice's one channel); several channels or NaN are refused."""
    recognizer, waves = trained
    pcm = (waves["an4_clstk/fash/an255-fash-b"] * 32767).round().short().numpy()

    def streamed(pieces) -> tuple:
        stream = recognizer.stream(StreamOptions(chunk_ms=320))
        for piece in pieces:
            stream.accept(piece)
        final = stream.final()
        return final.text, [(w.start, w.end) for w in final.words]

    def cut(samples):
        return [samples[i : i + 1600] for i in range(0, len(samples), 1600)]

    floats = streamed(cut(pcm / np.float32(32768)))
    assert floats[0] == "U M N Y H SIX"
    assert streamed(cut(pcm)) == floats
    assert streamed(cut((pcm / np.float32(32768))[:, None])) == floats
    stream = recognizer.stream()
    with pytest.raises(ValueError, match=r"waveform \(S,\), \(S, 1\) or \(1, S\), got \(1600, 2\)"):
        stream.accept(np.zeros((1600, 2), dtype=np.float32))
    with pytest.raises(ValueError, match="NaN or infinite"):
        stream.accept(np.full(1600, np.nan, dtype=np.float32))
    with pytest.raises(ValueError, match=r"takes samples \(a numpy array or a tensor\), not a "):
        stream.accept("talk.wav")


@pytest.mark.usefixtures("ctrl_c")
def test_ctrl_c_ends_the_input_with_the_finals_of_what_was_heard(
    tiny_checkpoint, an4_fixture, monkeypatch, capsys, tmp_path
) -> None:
    """`arecord | asr transcribe --streaming -` stopped with Ctrl-C: the audio read so far gets
    its final (and its files, with --output-dir), the command exits 130 and gives SIGINT back;
    a Ctrl-C while the model loads does the same; a second Ctrl-C stops at once; an ignored
    SIGINT stays ignored."""
    import soundfile as sf

    import asr.cli
    import asr.cli.console
    from asr.audio import load_audio
    from asr.cli import main
    from asr.recognizer import load_model

    wave = load_audio(an4_fixture / "wav/an4_clstk/fash/an255-fash-b.wav", 16000).numpy()
    heard, silence = wave[:24000], np.zeros(1600, dtype=np.float32)

    def microphone(rate: int, interrupted: list, presses: int = 1, then: int = 50):
        """s16le PCM as `StdinPcm.pieces` gives it (the samples are 16-bit values already):
        `heard` was read before the Ctrl-C (as it waits while a final is searched)."""
        for _ in range(presses):
            os.kill(os.getpid(), signal.SIGINT)
        for piece in asr.cli.console.pieces(heard, rate):
            yield (piece * 32768).astype("<i2").tobytes()
        for _ in range(then):  # a source that does not end by itself, until Ctrl-C ends it
            if interrupted:
                return
            yield (silence * 32768).astype("<i2").tobytes()
        assert then < 50, "Ctrl-C did not end the input"

    command = ["transcribe", "--streaming", "--chunk-ms", "320", "--model",
               str(tiny_checkpoint["checkpoint"]), "-"]  # fmt: skip

    def stdin(pieces=microphone):
        return SimpleNamespace(pieces=pieces, cut=lambda: None)  # `StdinPcm`'s stand-in

    monkeypatch.setattr(asr.cli.console, "StdinPcm", stdin)
    assert main([*command, "--output-dir", str(tmp_path), "--explorer"]) == 130
    printed = capsys.readouterr()
    assert f"explorer: {tmp_path / 'explorer.html'}" in printed.err  # Ctrl-C too
    lines = [line for line in printed.out.splitlines() if line]
    recognizer = load_model(tiny_checkpoint["checkpoint"])
    default = StreamOptions(chunk_ms=320, final_search="beam")  # the command's
    expected = stream_transcript(recognizer, torch.from_numpy(heard), default)
    assert " ".join(line.split("] ", 1)[1] for line in lines) == expected.text
    assert (tmp_path / "stdin.txt").read_text().strip() == expected.text
    assert sf.info(tmp_path / "stdin.wav").frames == len(heard)
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler

    loads = asr.cli._load_model  # pressed while the model loads: what is heard meanwhile counts

    def pressed_while_loading(args):
        os.kill(os.getpid(), signal.SIGINT)
        return loads(args)

    monkeypatch.setattr(asr.cli, "_load_model", pressed_while_loading)
    silent = functools.partial(microphone, presses=0)
    monkeypatch.setattr(asr.cli.console, "StdinPcm", functools.partial(stdin, silent))
    assert main(command) == 130
    lines = [line for line in capsys.readouterr().out.splitlines() if line]
    assert " ".join(line.split("] ", 1)[1] for line in lines) == expected.text
    out = tmp_path / "with_a_file"  # a file first: it is not cut short and written as done
    wav = an4_fixture / "wav/an4_clstk/fash/an255-fash-b.wav"
    assert main([*command[:-1], str(wav), "-", "--output-dir", str(out)]) == 130
    assert capsys.readouterr().err.endswith("asr transcribe: interrupted; the files written "
                                            f"stay in {out}\n")  # fmt: skip
    assert not out.exists() or not list(out.iterdir())
    monkeypatch.setattr(asr.cli, "_load_model", loads)
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler

    twice = functools.partial(microphone, presses=2)
    monkeypatch.setattr(asr.cli.console, "StdinPcm", functools.partial(stdin, twice))
    assert main(command) == 130  # at once, with the line of any Ctrl-C
    assert capsys.readouterr().err.endswith("asr transcribe: interrupted\n")
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    once = functools.partial(microphone, then=3)
    monkeypatch.setattr(asr.cli.console, "StdinPcm", functools.partial(stdin, once))
    assert main(command) == 0  # the whole input
    assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.mark.timeout(60)  # without the poll it would wait for ever
def test_stdin_that_stays_open_ends_at_ctrl_c(monkeypatch) -> None:
    """A source that outlives the Ctrl-C and sends nothing more (its pipe still open) does
    not hold the command: what it sent is read, then the wait ends."""
    from asr.cli.console import StdinPcm

    read_end, write_end = os.pipe()
    try:
        os.write(write_end, bytes(range(256)) * 4 + b"\x07")  # 512 samples and half of one
        monkeypatch.setattr(sys, "stdin", open(read_end, "rb", closefd=False))
        interrupted: list[int] = []
        stdin = StdinPcm()
        pieces = stdin.pieces(16000, interrupted)
        assert next(pieces) == bytes(range(256)) * 4  # whole samples only
        interrupted.append(signal.SIGINT)
        start = time.monotonic()
        assert list(pieces) == []
        assert time.monotonic() - start < 2  # the poll's period, not the pipe's end
    finally:
        os.close(write_end)
        while not stdin._ended:  # its reader would take another test's pipe of this number
            time.sleep(0.01)
        os.close(read_end)


@contextlib.contextmanager
def piped_stdin(monkeypatch, data: bytes):
    """A `StdinPcm` reading `data` from a pipe that then ends; its reader thread is let end
    before the pipe closes (else it could read another test's pipe of the same number)."""
    from asr.cli.console import StdinPcm

    read_end, write_end = os.pipe()
    os.write(write_end, data)
    os.close(write_end)
    with open(read_end, "rb") as stdin:
        monkeypatch.setattr(sys, "stdin", stdin)
        pcm = StdinPcm()
        try:
            yield pcm
        finally:
            while not pcm._ended:
                time.sleep(0.01)


def wav_header(rate: int = 16000, channels: int = 1, bits: int = 16) -> bytes:
    """A WAV header as `arecord` writes one to a pipe: sizes unknown, so the largest."""
    import struct

    fmt = struct.pack("<HHIIHH", 1, channels, rate, rate * channels * bits // 8,
                      channels * bits // 8, bits)  # fmt: skip
    unknown = struct.pack("<I", 0x7FFFFFFF)
    return b"RIFF" + unknown + b"WAVEfmt " + struct.pack("<I", 16) + fmt + b"data" + unknown


@pytest.mark.timeout(60)
def test_what_stdin_read_before_ctrl_c_still_comes(monkeypatch) -> None:
    """Audio read while a final was searched was heard before the Ctrl-C: it still comes,
    then the input ends though the source goes on."""
    from asr.cli.console import StdinPcm

    first, waiting = np.random.default_rng(0).bytes(3200), np.random.default_rng(1).bytes(6400)
    read_end, write_end = os.pipe()
    os.write(write_end, first)
    monkeypatch.setattr(sys, "stdin", open(read_end, "rb", closefd=False))
    stdin, interrupted = StdinPcm(), []
    try:
        pieces = stdin.pieces(16000, interrupted)
        assert next(pieces) == first
        os.write(write_end, waiting)  # read while the piece before was decoded
        while stdin._size < len(waiting):
            time.sleep(0.01)
        interrupted.append(signal.SIGINT)
        assert b"".join(pieces) == waiting
    finally:
        os.close(write_end)
        while not stdin._ended:
            time.sleep(0.01)
        os.close(read_end)


@pytest.mark.timeout(60)
def test_what_the_source_sends_after_ctrl_c_does_not_come(monkeypatch) -> None:
    """Audio that arrives after the Ctrl-C, while the model still loads or a final is
    searched, was spoken after it: the transcript and `stdin.wav` kept it."""
    from asr.cli.console import StdinPcm, ctrl_c_ends_the_input

    before, after = np.random.default_rng(0).bytes(3200), np.random.default_rng(1).bytes(6400)
    read_end, write_end = os.pipe()
    os.write(write_end, before)
    monkeypatch.setattr(sys, "stdin", open(read_end, "rb", closefd=False))
    stdin = StdinPcm()
    try:
        while stdin._size < len(before):
            time.sleep(0.01)
        with ctrl_c_ends_the_input(stdin) as interrupted:
            signal.raise_signal(signal.SIGINT)
            os.write(write_end, after)
            while not stdin._ended:  # it read `after`, and ended there
                time.sleep(0.01)
            assert interrupted and b"".join(stdin.pieces(16000, interrupted)) == before
    finally:
        os.close(write_end)
        while not stdin._ended:
            time.sleep(0.01)
        os.close(read_end)


@pytest.mark.timeout(60)
def test_the_wav_header_arecord_writes_is_skipped(monkeypatch) -> None:
    """`arecord -f S16_LE -r 16000 -c 1 | asr ... -` (the documented microphone) sends a WAV
    header first: its samples follow it, and it is no audio."""
    data = np.random.default_rng(0).bytes(32000)
    with piped_stdin(monkeypatch, wav_header() + data) as stdin:
        assert b"".join(stdin.pieces(16000, [])) == data


@pytest.mark.timeout(60)
def test_what_follows_a_wav_files_samples_on_stdin_is_no_audio(monkeypatch) -> None:
    """`cat take.wav | asr ... -`: a file states its samples' size, and a LIST or id3 chunk
    after them (as Audacity writes) was decoded as a burst of noise, and kept as audio."""
    import struct

    data = np.random.default_rng(0).bytes(32000)
    header = wav_header()[:-4] + struct.pack("<I", len(data))
    info = b"LIST" + struct.pack("<I", 2000) + b"INFO" + bytes(1996)
    with piped_stdin(monkeypatch, header + data + info) as stdin:
        assert b"".join(stdin.pieces(16000, [])) == data


def test_a_wav_header_with_metadata_is_read_however_its_bytes_come() -> None:
    """A header with a LIST chunk of 5 kB before the samples: read whole when stdin gave it at
    once, refused as no WAV when the first 5,000 bytes came alone (a slow source)."""
    import struct

    from asr.cli.console import _header_length

    plain = wav_header()
    info = b"LIST" + struct.pack("<I", 5000) + bytes(5000)
    header = plain[:36] + info + plain[36:]  # before `data`, as broadcast recorders write it
    assert _header_length(header + bytes(640), 16000, complete=False) == len(header)
    for cut in (3000, 5000, len(header) - 1):
        assert _header_length(header[:cut], 16000, complete=False) is None, cut
    # what no WAV header holds is refused at once, not after a megabyte of a live source
    junk = b"JUNK" + struct.pack("<I", 0xFFFFFF00)  # a size past any header
    never = {"garbage size": plain[:36] + junk, "zeros": plain[:12] + bytes(64),
             "samples before their format": plain[:12] + b"data" + bytes(64),
             "a format of others": wav_header(rate=8000)[:36] + info[:8]}  # fmt: skip
    for what, head in never.items():
        with pytest.raises(ValueError, match="stdin (begins as a RIFF|is a WAV stream of)"):
            _header_length(head, 16000, complete=False)
            pytest.fail(what)


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("head", "said"),
    [(b"fLaC\x00\x00\x00\x22", "begins as a FLAC file does: give the"),
     (b"\x00\x00\x00\x20ftypM4A ", "begins as a MP4 file does: give the"),
     (wav_header(rate=8000), "a WAV stream of 16-bit samples, 1 channel\\(s\\) at 8000 Hz"),
     (wav_header(channels=2), "a WAV stream of 16-bit samples, 2 channel\\(s\\) at 16000 Hz")],
)  # fmt: skip
def test_an_audio_file_piped_as_raw_pcm_is_refused(monkeypatch, head, said) -> None:
    """`asr transcribe --streaming - < a.flac` decoded the file's bytes as PCM: noise, and a
    transcript of it, with status 0."""
    with piped_stdin(monkeypatch, head + bytes(64)) as stdin:
        with pytest.raises(ValueError, match=said):
            list(stdin.pieces(16000, []))


@pytest.mark.timeout(60)
def test_a_source_faster_than_the_decoding_is_held_back(monkeypatch) -> None:
    """`ffmpeg -i long.mp3 ... | asr transcribe --streaming -`: what waits to be decoded is
    bounded (the source then waits, as on a pipe), and none of it is lost."""
    import threading

    from asr.cli.console import BUFFER_BYTES, READ_BYTES, StdinPcm

    data = np.random.default_rng(0).bytes(8 * BUFFER_BYTES)
    read_end, write_end = os.pipe()
    written = [0]

    def source() -> None:
        with open(write_end, "wb", buffering=0) as pipe:
            for start in range(0, len(data), READ_BYTES):
                written[0] += pipe.write(data[start : start + READ_BYTES])

    with open(read_end, "rb") as stdin:
        monkeypatch.setattr(sys, "stdin", stdin)
        pieces = StdinPcm().pieces(16000, [])
        threading.Thread(target=source, daemon=True).start()
        before = -1
        while written[0] != before:  # until the source waits
            before = written[0]
            time.sleep(0.5)
        # the buffer, a read the thread holds, what the pipe takes: far from all of it
        assert written[0] <= BUFFER_BYTES + 3 * READ_BYTES < len(data)
        assert b"".join(pieces) == data


@pytest.mark.timeout(120)
def test_ctrl_c_to_a_real_process_reading_a_pipe(tiny_checkpoint, an4_fixture) -> None:
    """`arecord | asr transcribe --streaming -` in a process of its own, its source still open:
    the first utterance's final comes at its pause, then SIGINT ends the input and the command
    exits 130 at once (its stdin reader does not hold it)."""
    import json
    import select

    from asr.audio import load_audio
    from asr.recognizer import load_model

    wave = load_audio(an4_fixture / "wav/an4_clstk/fash/an255-fash-b.wav", 16000)
    heard = torch.cat([wave, torch.zeros(2 * 16000)])  # speech, then a pause that ends it
    pcm = (heard * 32767).round().short().numpy().astype("<i2").tobytes()
    checkpoint = str(tiny_checkpoint["checkpoint"])
    command = [sys.executable, "-m", "asr", "transcribe", "--streaming", "--model", checkpoint,
               "--silence-from", "silero", "--jsonl", "-"]  # fmt: skip
    process = subprocess.Popen(  # SIGINT as at a terminal, even under a background test run
        command,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        process.stdin.write(pcm)
        process.stdin.flush()  # and the pipe stays open, as a microphone's does
        assert select.select([process.stdout], [], [], 60)[0], "no final came at the pause"
        first = process.stdout.readline().decode()
        time.sleep(1.0)  # the rest decoded: the command now waits for more audio
        os.kill(process.pid, signal.SIGINT)
        try:  # stdin still open (communicate() would close it): a held reader never returns
            process.wait(timeout=30)  # a bound a busy machine's slow exit stays within
        except subprocess.TimeoutExpired:
            pytest.fail("the command waited for its source")
    finally:
        process.kill()
        process.stdin.close()
    assert process.returncode == 130, process.stderr.read().decode()
    silero = EndpointOptions(silence_from="silero")  # hears the pause whatever the model says
    options = StreamOptions(final_search="beam", endpoint=silero)
    expected = stream_transcript(load_model(checkpoint), heard, options)
    assert json.loads(first)["text"] == expected.segments[0].text


def test_without_stdin_or_from_a_terminal_dash_is_a_clear_error(monkeypatch) -> None:
    from asr.cli.console import StdinPcm

    monkeypatch.setattr(sys, "stdin", None)  # as Python leaves it when fd 0 is closed (`<&-`)
    with pytest.raises(ValueError, match="- is audio on stdin, and this process has no stdin"):
        StdinPcm()
    terminal, other_end = os.openpty()  # `asr transcribe --streaming -` with nothing piped
    try:
        monkeypatch.setattr(sys, "stdin", open(terminal, "rb", closefd=False))
        with pytest.raises(ValueError, match="which is a terminal here: pipe audio in"):
            StdinPcm()
    finally:
        os.close(terminal)
        os.close(other_end)


def test_stdin_is_read_while_the_model_loads(
    tiny_checkpoint, an4_fixture, monkeypatch, capsys
) -> None:
    """`arecord | asr transcribe --streaming -`: stdin is read from the start, so a source is not
    held while the command's parser imports torch and the model loads (a microphone's capture
    would overrun and drop audio); what it sent meanwhile is all decoded."""
    import fcntl
    import threading

    import asr.cli
    from asr.audio import load_audio
    from asr.recognizer import load_model

    # a recording the random model says something for
    wave = load_audio(an4_fixture / "wav/an4test_clstk/fcaw/an406-fcaw-b.wav", 16000)
    pcm = (wave * 32767).round().short().numpy().astype("<i2").tobytes()
    read_end, write_end = os.pipe()
    fcntl.fcntl(write_end, fcntl.F_SETPIPE_SZ, 4096)  # a page: each write waits for a read
    written = threading.Event()

    def microphone() -> None:
        with open(write_end, "wb") as pipe:  # its close is the end of the input
            pipe.write(pcm)
        written.set()

    def parsing(command):
        assert written.wait(10), "the source waited for the parser, which imports torch"
        return parser(command)

    parser = asr.cli._parser
    monkeypatch.setattr(asr.cli, "_parser", parsing)
    with open(read_end, "rb") as stdin:
        monkeypatch.setattr(sys, "stdin", stdin)
        threading.Thread(target=microphone, daemon=True).start()
        checkpoint = str(tiny_checkpoint["checkpoint"])
        assert asr.cli.main(["transcribe", "--streaming", "--model", checkpoint, "-"]) == 0
    default = StreamOptions(chunk_ms=640, final_search="beam")  # the command's default
    heard = torch.from_numpy(np.frombuffer(pcm, dtype="<i2") / np.float32(32768))
    expected = stream_transcript(load_model(checkpoint), heard, default)
    lines = [line.split("] ", 1)[1] for line in capsys.readouterr().out.splitlines() if line]
    assert " ".join(lines) == expected.text != ""


@pytest.mark.timeout(120)
def test_audio_after_a_ctrl_c_while_the_model_loads_is_not_kept(
    tiny_checkpoint, an4_fixture, monkeypatch, tmp_path
) -> None:
    """`arecord | asr transcribe --streaming - --output-dir OUT`, Ctrl-C while the model loads:
    what the microphone sends after it was spoken after it, and stdin.wav kept it."""
    import fcntl

    import asr.cli
    from asr.audio import audio_info, load_audio

    wave = load_audio(an4_fixture / "wav/an4test_clstk/fcaw/an406-fcaw-b.wav", 16000)
    pcm = (wave * 32767).round().short().numpy().astype("<i2").tobytes()
    before, after = pcm[:16000], pcm[16000:48000]  # half a second, then a second
    read_end, write_end = os.pipe()
    fcntl.fcntl(write_end, fcntl.F_SETPIPE_SZ, 1 << 16)
    os.write(write_end, before)

    def loading(args):
        while args.stdin_pcm._size < len(before):  # heard before the Ctrl-C
            time.sleep(0.01)
        signal.raise_signal(signal.SIGINT)
        os.write(write_end, after)
        deadline = time.monotonic() + 10
        while not args.stdin_pcm._ended and time.monotonic() < deadline:  # read `after`, ended
            time.sleep(0.01)
        return load(args)

    load = asr.cli._load_model
    monkeypatch.setattr(asr.cli, "_load_model", loading)
    monkeypatch.setattr(sys, "stdin", open(read_end, "rb", closefd=False))
    argv = ["transcribe", "--streaming", "--model", str(tiny_checkpoint["checkpoint"]), "-",
            "--output-dir", str(tmp_path / "out"), "--quiet"]  # fmt: skip
    try:
        assert asr.cli.main(argv) == 130
    finally:
        os.close(write_end)
        os.close(read_end)
    assert audio_info(tmp_path / "out" / "stdin.wav").duration == 0.5


@pytest.mark.parametrize("command", ["transcribe", "serve"])
def test_the_live_commands_pass_their_stream_options(command) -> None:
    from asr.cli import _parser
    from asr.cli.live import stream_options

    model = ["--model", "m.ckpt", *(["--streaming", "x.wav"] if command == "transcribe" else [])]
    line = [command, *model, "--chunk-ms", "320", "--first-chunk-ms", "960"]
    line += ["--max-context-ms", "5000", "--endpoint-silence", "0.5", "--final-search", "beam"]
    options = stream_options(_parser(command).parse_args(line))
    assert (options.chunk_ms, options.first_chunk_ms, options.max_context_ms) == (320, 960, 5000)
    assert options.endpoint.trailing_silence == 0.5 and options.final_search == "beam"
    plain = stream_options(_parser(command).parse_args([command, *model]))
    assert (plain.chunk_ms, plain.first_chunk_ms) == (640, None)


def test_a_stream_searches_with_the_models_stored_settings_unless_told(
    trained, monkeypatch
) -> None:
    """As offline decoding: a finalized model's beam and CTC weight, where the options leave
    them open; for a model that stores none, the streaming defaults, or with a beam final
    (offline's search) offline's."""
    recognizer, _ = trained
    open_ = recognizer.stream().engine.options
    assert (open_.beam, open_.ctc_weight) == (10, 0.5)
    offline = recognizer.default_options
    beam_final = recognizer.stream(final_search="beam").engine.options
    assert (beam_final.beam, beam_final.ctc_weight) == (offline.beam_size, offline.ctc_weight)
    monkeypatch.setattr(recognizer, "decoding", SearchOptions(beam_size=3, ctc_weight=0.2))
    stored = recognizer.stream().engine
    assert (stored.options.beam, stored.options.ctc_weight) == (3, 0.2)
    assert (stored.search_options.beam_size, stored.search_options.ctc_weight) == (3, 0.2)
    told = recognizer.stream(beam=4, ctc_weight=0.0).engine.options
    assert (told.beam, told.ctc_weight) == (4, 0.0)


@pytest.mark.parametrize(
    ("field", "value", "rule"),
    [("beam", 0, "at least 1"), ("ctc_weight", 1.5, r"in \[0, 1\]"),
     ("lm_weight", -1.0, r"lie in \[0, 100\]"), ("lm_weight", 1e38, r"lie in \[0, 100\]")],
)  # fmt: skip
def test_stream_options_out_of_range_are_refused(field, value, rule) -> None:
    """1e38 as the LM weight overflowed every final's scores to -inf: finals with no text."""
    with pytest.raises(ValueError, match=rf"^{field} must (be )?{rule}, got"):
        StreamOptions(**{field: value})


def test_stream_options_keep_numpy_numbers_as_pythons() -> None:
    """The server sends them in JSON messages, which take no numpy number."""
    from dataclasses import asdict

    endpoint = EndpointOptions(trailing_silence=np.float32(0.5))
    options = StreamOptions(chunk_ms=np.float32(320), beam=np.int64(4), endpoint=endpoint)
    fields = asdict(options)
    assert json.loads(json.dumps(fields))["endpoint"]["trailing_silence"] == 0.5
    assert (type(fields["chunk_ms"]), type(fields["beam"])) == (float, int)


def test_search_options_streaming_does_not_take_are_refused(capsys) -> None:
    """Refused, not ignored: each would have decoded as without it."""
    refused = ((["--nbest", "3"], "--nbest: not taken by --streaming"),
               (["--length-bonus", "0"], "--length-bonus: not taken by --streaming"),
               (["--no-repair"], "--[no-]repair: not taken by --streaming"),
               (["--vad", "silero"], "--vad: not taken by --streaming, which ends utterances"),
               (["--max-segment-seconds", "5", "--min-silence-seconds", "0.1"],
                "--max-segment-seconds, --min-silence-seconds: not taken by --streaming"),
               (["--silence-threshold-db", "-20"], "--silence-threshold-db: not taken by"),
               (["--timestamps", "ctc"], "--timestamps ctc: --streaming times words by attention"),
               (["--chunk-ms", "0", "--first-chunk-ms", "1280", "--max-context-ms", "320"],
                "--first-chunk-ms, --max-context-ms: settings of chunks; --chunk-ms 0 has none"),
               (["--endpoint-silence", "0", "--silence-from", "silero"],
                "--silence-from hears the silence of endpoints: --endpoint-silence 0 has none"),
               (["--chunk-ms", "0", "--endpoint-silence", "1.5", "--silence-from", "silero"],
                "--endpoint-silence, --silence-from: --chunk-ms 0 decodes nothing before an "
                "utterance ends, so hears no silence (an utterance is cut at 20 s; "
                "--endpoint-silence 0 makes the recording one)"),
               (["--chunk-ms", "0", "--silence-from", "silero"],
                "--silence-from: --chunk-ms 0 decodes nothing"),
               (["--first-chunk-ms", "320"],  # said as the options, not StreamOptions' fields
                "--first-chunk-ms (320) must be at least --chunk-ms (640)"))  # fmt: skip
    for option, said in refused:
        line = ["transcribe", "--model", "m.ckpt", "--streaming", "x.wav", *option]
        assert main(line) == 2
        err = capsys.readouterr().err
        assert f"asr transcribe: error: {said}" in err, err
    with pytest.raises(ValueError, match="first_chunk_ms: settings of chunks, and chunk_ms None"):
        StreamOptions(chunk_ms=None, first_chunk_ms=1280)
    with pytest.raises(ValueError, match="silence_from='silero' hears the silence between chunks"):
        StreamOptions(chunk_ms=None, endpoint=EndpointOptions(silence_from="silero"))
    serve = ["serve", "--model", "m.ckpt", "--chunk-ms", "0", "--first-chunk-ms", "1280"]
    assert main(serve) == 2  # before the model loads, as transcribe
    assert "--first-chunk-ms: settings of chunks" in capsys.readouterr().err
    from asr.cli import _parser
    from asr.cli.live import stream_options

    line = ["serve", "--model", "m.ckpt", "--endpoint-silence", "0", "--silence-from", "ctc"]
    assert stream_options(_parser("serve").parse_args(line)).endpoint is None  # the default
    for quiet in (["--endpoint-silence", "0"], ["--silence-from", "ctc"]):  # what is so anyway
        line = ["serve", "--model", "m.ckpt", "--chunk-ms", "0", *quiet]
        assert stream_options(_parser("serve").parse_args(line)).chunk_ms is None


def test_transcribe_streaming_explorer_keeps_each_finals_attention(tmp_path, capsys) -> None:
    """--explorer under --streaming: each final's cross-attention and CTC path, over the
    chunked encoder frames its decoder saw, beside the json, and the page with a row per
    final on its stretch of the audio."""
    import json

    import soundfile as sf

    from asr.cli import _parser
    from asr.cli.live import transcribe_streaming
    from asr.explore.records import read_maps

    recognizer, waves = streaming_recognizer()
    gap = torch.zeros(RATE)  # a pause the endpoint closes the first final at
    two = torch.cat(
        [waves["an4_clstk/fash/an251-fash-b"], gap, waves["an4_clstk/fash/an253-fash-b"]]
    )
    sf.write(tmp_path / "two.wav", two.numpy(), RATE)
    out = tmp_path / "out"
    args = ["transcribe", "--streaming", "--chunk-ms", "320", "--model", "in-memory",
            str(tmp_path / "two.wav"), "--output-dir", str(out), "--format", "txt",
            "--explorer"]  # fmt: skip
    parsed = _parser("transcribe").parse_args(args)
    assert transcribe_streaming(parsed, recognizer, out=io.StringIO()) == 0
    assert f"explorer: {out / 'explorer.html'}" in capsys.readouterr().err
    written = json.loads((out / "two.json").read_text())  # json whatever --format says
    assert written["text"] == "YES GO"
    finals = read_maps(out / "two.json")
    assert len(finals) == len(written["segments"]) == 2
    layout = json.loads((out / "explore.json").read_text())
    for maps, segment in zip(finals, written["segments"], strict=True):
        assert maps["span"] == pytest.approx((segment["start"], segment["end"]), abs=1e-3)
        rows = (layout["layers"] * layout["heads"], len(maps["pieces"]) + 1)
        assert maps["attention"].shape[:2] == rows
        assert maps["ctc"].shape == maps["attention"].shape[2:]
    pieces = [str(p) for p in finals[0]["pieces"]] + ["\u2581"]  # a space between finals
    pieces += [str(p) for p in finals[1]["pieces"]]
    assert pieces == [t["piece"] for t in written["tokens"]], "the finals' own tokens"
    page = page_data((out / "explorer.html").read_text())
    assert [u["id"] for u in page["utterances"]] == ["two#1", "two#2"]
    assert [u["hyp"] for u in page["utterances"]] == ["YES", "GO"]
    assert all("attention" in u["arrays"] for u in page["utterances"])
    clip = tmp_path / "clip.jsonl"  # manifest lines' stretches: each json names the file, and
    # where it starts (two lines of one file are named `two.wav@start-end`, which is no file)
    clip.write_text("".join(json.dumps({"audio_filepath": str(tmp_path / "two.wav"), **span})
                            + "\n" for span in ({"duration": 0.5}, {"offset": 0.5})))  # fmt: skip
    args[args.index(str(tmp_path / "two.wav"))] = str(clip)
    assert transcribe_streaming(_parser("transcribe").parse_args(args), recognizer,
                                out=io.StringIO()) == 0  # fmt: skip
    for name, offset in (("two@0-500", 0.0), ("two@500-end", 0.5)):
        written = json.loads((out / f"{name}.json").read_text())
        assert (written["audio"], written.get("offset", 0.0)) == (str(tmp_path / "two.wav"), offset)
    capsys.readouterr()
    clip.write_text(json.dumps({"audio_filepath": str(tmp_path / "two.wav"), "duration": 30.0}))
    assert transcribe_streaming(_parser("transcribe").parse_args(args), recognizer,
                                out=io.StringIO()) == 1  # fmt: skip
    assert "duration 30.000 s from offset 0.000 s exceeds the audio" in capsys.readouterr().err
    for folder in ("x", "y"):  # outputs below the folders the inputs share, as offline
        (tmp_path / folder).mkdir()
        sf.write(tmp_path / folder / "one.wav", waves["an4_clstk/fash/an251-fash-b"].numpy(), RATE)
    args = [*args[:6], str(tmp_path / "x/one.wav"), str(tmp_path / "y/one.wav"), *args[7:]]
    assert transcribe_streaming(_parser("transcribe").parse_args(args), recognizer,
                                out=io.StringIO()) == 0  # fmt: skip
    for folder in ("x", "y"):
        assert (out / folder / "one.explore.npz").is_file() and (out / folder / "one.txt").is_file()


def test_transcribe_streaming_output_dir_as_offline_writes_it(
    tiny_checkpoint, an4_fixture, tmp_path, capsys
) -> None:
    """As the offline paths: a file it cannot write is named and the others go on; an
    earlier --explorer run's maps of an input written again go; a spread run's
    transcripts.jsonl, which it would leave untrue, is refused up front."""
    import shutil

    for name in ("a", "b"):
        shutil.copy(an4_fixture / "wav/an4_clstk/fash/an255-fash-b.wav", tmp_path / f"{name}.wav")
    out = tmp_path / "out"
    args = ["transcribe", "--streaming", "--chunk-ms", "320", "--model",
            str(tiny_checkpoint["checkpoint"]), str(tmp_path / "a.wav"), str(tmp_path / "b.wav"),
            "--output-dir", str(out), "--format", "txt"]  # fmt: skip
    assert main([*args, "--explorer"]) == 0 and (out / "a.explore.npz").is_file()
    (out / "b.txt").unlink()
    (out / "b.txt").mkdir()  # a folder where b.txt goes
    assert main(args) == 1
    said = capsys.readouterr().err
    assert (
        f"{tmp_path / 'b.wav'}: cannot write its outputs ({out / 'b.txt'}: Is a directory)" in said
    )
    assert not (out / "a.explore.npz").exists() and not (out / "explorer.html").exists()
    assert not list(out.glob(".*.partial"))
    for records in ("transcripts.rank0.jsonl", "transcripts.jsonl"):  # a killed run's parts
        (out / records).write_text("")
        assert main(args) == 2
        said = capsys.readouterr().err
        assert "holds the transcripts.jsonl of a run spread over processes" in said


def test_transcribe_streaming_writes_each_input_to_the_output_dir(
    tiny_checkpoint, an4_fixture, tmp_path, monkeypatch, capsys
) -> None:
    """--output-dir: each input's whole transcript in the --format files offline transcribe
    writes, once it ends; the audio of `-` kept as stdin.wav (the samples received) and named
    in stdin.json, so that the explorer plays it."""
    import json

    import soundfile as sf
    from conftest import page_data

    from asr.audio import load_audio
    from asr.cli import main
    from asr.explore.build import explore
    from asr.recognizer import load_model

    wav = an4_fixture / "wav/an4_clstk/fash/an255-fash-b.wav"
    checkpoint = str(tiny_checkpoint["checkpoint"])
    default = StreamOptions(chunk_ms=320, final_search="beam")  # the command's default
    expected = stream_transcript(load_model(checkpoint), load_audio(wav, 16000), default)
    samples = sf.read(wav, dtype="int16")[0]
    (tmp_path / "pcm").write_bytes(samples.astype("<i2").tobytes())
    monkeypatch.setattr(sys, "stdin", open(tmp_path / "pcm", "rb"))  # noqa: SIM115
    out = tmp_path / "out"
    args = ["transcribe", "--streaming", "--chunk-ms", "320", "--model", checkpoint]
    assert main([*args, str(wav), "-", "--output-dir", str(out), "--format", "json", "srt"]) == 0
    assert capsys.readouterr().err.splitlines() == [
        f"asr transcribe: warning: {checkpoint}: trained at full context only (no dynamic_chunk)"
        ", so it loses accuracy in chunks; a streaming config trains for them (docs/streaming.md)",
        f"asr transcribe: {wav}: wrote {out / 'an255-fash-b'}.{{json,srt}}",
        f"asr transcribe: {out / 'stdin.wav'}: wrote {out / 'stdin'}.{{json,srt}}",
    ]
    assert sorted(p.name for p in out.iterdir()) == [
        "an255-fash-b.json", "an255-fash-b.srt", "stdin.json", "stdin.srt", "stdin.wav"
    ]  # fmt: skip
    for stem, audio in (("an255-fash-b", str(wav)), ("stdin", str(out / "stdin.wav"))):
        written = json.loads((out / f"{stem}.json").read_text())
        assert (written["text"], written["audio"]) == (expected.text, audio)
        assert [w["end"] for w in written["words"]] == [w.end for w in expected.words]
    np.testing.assert_array_equal(sf.read(out / "stdin.wav", dtype="int16")[0], samples)
    page = page_data(explore(out, tmp_path / "page.html", True, False).read_text())
    assert [u["audio"] is not None for u in page["utterances"]] == [True, True]
    assert main([*args, str(wav), "--format", "json"]) == 2
    assert "--format chooses the files written to --output-dir" in capsys.readouterr().err
    kept = (out / "stdin.wav").read_bytes()  # another session into the folder: the first kept
    monkeypatch.setattr(sys, "stdin", open(tmp_path / "pcm", "rb"))  # noqa: SIM115
    assert main([*args, "-", "--output-dir", str(out), "--explorer"]) == 2
    said = capsys.readouterr().err
    assert f"{out / 'stdin.wav'}: the recording of an earlier session from stdin would be" in said
    assert (out / "stdin.wav").read_bytes() == kept and not (out / "explore.json").exists()
    (tmp_path / "folder" / "stdin.wav").mkdir(parents=True)  # no recording: it cannot write one
    monkeypatch.setattr(sys, "stdin", open(tmp_path / "pcm", "rb"))  # noqa: SIM115
    assert main([*args, "-", "--output-dir", str(tmp_path / "folder")]) == 2
    said = capsys.readouterr().err
    assert f"error: {tmp_path / 'folder' / 'stdin.wav'}: cannot write the recording (" in said

    class FullDisk(sf.SoundFile):  # a recording that cannot be written, opened or in its course
        def __init__(self, *args, **kwargs):
            if failing == "open":
                raise sf.LibsndfileError(2, "Error opening: ")
            super().__init__(*args, **kwargs)

        def buffer_write(self, *args, **kwargs):
            raise sf.LibsndfileError(2)

    for failing in ("open", "write"):
        monkeypatch.setattr(sf, "SoundFile", FullDisk)
        monkeypatch.setattr(sys, "stdin", open(tmp_path / "pcm", "rb"))  # noqa: SIM115
        assert main([*args, "-", "--output-dir", str(tmp_path / failing)]) == 2
        said = capsys.readouterr().err
        assert f"error: {tmp_path / failing / 'stdin.wav'}: cannot write the recording (" in said
        assert "Traceback" not in said


def test_transcribe_streaming_reads_files_and_raw_pcm(
    tiny_checkpoint, an4_fixture, tmp_path
) -> None:
    from asr.audio import load_audio
    from asr.cli import main
    from asr.recognizer import load_model

    wav = an4_fixture / "wav/an4_clstk/fash/an255-fash-b.wav"
    recognizer = load_model(tiny_checkpoint["checkpoint"])
    default = StreamOptions(chunk_ms=320, final_search="beam")  # the command's default
    expected = stream_transcript(recognizer, load_audio(wav, 16000), default)
    args = [
        "transcribe",
        "--streaming",
        "--chunk-ms",
        "320",
        "--model",
        str(tiny_checkpoint["checkpoint"]),
    ]

    def printed(*extra: str) -> list[str]:
        out = io.StringIO()
        sys_stdout, sys.stdout = sys.stdout, out
        try:
            assert main([*args, *extra, str(wav)]) == 0
        finally:
            sys.stdout = sys_stdout
        return [line for line in out.getvalue().splitlines() if line]

    lines = printed()
    assert " ".join(line.split("] ", 1)[1] for line in lines) == expected.text
    vad = replace(default, endpoint=EndpointOptions(silence_from="silero"))
    expected_vad = stream_transcript(recognizer, load_audio(wav, 16000), vad)
    by_vad = printed("--silence-from", "silero")
    assert " ".join(line.split("] ", 1)[1] for line in by_vad) == expected_vad.text
    rescore = replace(default, final_search="rescore")
    expected_rescore = stream_transcript(recognizer, load_audio(wav, 16000), rescore)
    by_rescore = printed("--final-search", "rescore")
    assert " ".join(line.split("] ", 1)[1] for line in by_rescore) == expected_rescore.text
    pcm = (load_audio(wav, 16000) * 32767).round().short().numpy().tobytes()
    run = subprocess.run(
        [sys.executable, "-m", "asr", *args, "-"], input=pcm, capture_output=True, timeout=120
    )
    assert run.returncode == 0, run.stderr.decode()
    piped = [line for line in run.stdout.decode().splitlines() if line]
    assert len(piped) == len(lines)


def test_transcribe_streaming_says_a_bad_file_and_goes_on(
    tiny_checkpoint, an4_fixture, tmp_path, capsys
) -> None:
    from asr.cli import main

    wav = an4_fixture / "wav/an4_clstk/fash/an255-fash-b.wav"
    empty = tmp_path / "empty.wav"
    empty.write_bytes(b"")
    argv = ["transcribe", "--streaming", "--model", str(tiny_checkpoint["checkpoint"]),
            str(tmp_path / "missing.wav"), str(empty), str(wav)]  # fmt: skip
    assert main(argv) == 1
    out, err = capsys.readouterr()
    assert out.splitlines()[0] == str(wav)  # the good one is transcribed
    assert f"error: {tmp_path / 'missing.wav'}: file not found" in err
    assert f"error: {empty}: " in err and "2 of 3 inputs failed" in err


def test_transcribe_streaming_takes_folders_globs_and_manifests_each_once(
    tiny_checkpoint, an4_fixture, tmp_path, capsys
) -> None:
    from asr.cli import main

    folder = tmp_path / "talks" / "alice"
    folder.mkdir(parents=True)
    wav = folder / "1.wav"
    # a recording the random model says something for
    wav.write_bytes((an4_fixture / "wav/an4test_clstk/fcaw/an406-fcaw-b.wav").read_bytes())
    manifest = tmp_path / "m.jsonl"
    manifest.write_text(json.dumps({"audio_filepath": str(wav)}) + "\n")
    argv = ["transcribe", "--streaming", "--model", str(tiny_checkpoint["checkpoint"]),
            str(tmp_path / "talks"), f"{tmp_path}/talks/*/*.wav", str(manifest),
            "--output-dir", str(tmp_path / "out"), "--format", "txt"]  # fmt: skip
    assert main(argv) == 0
    [written] = (tmp_path / "out").rglob("*.txt")  # one input, named three ways
    [line] = capsys.readouterr().out.splitlines()  # no name line: one input
    assert line.startswith("[00:00.000 --> ") and line.endswith(f"] {written.read_text().strip()}")


def test_the_streaming_bench_checks_and_names_the_chunks_decoded() -> None:
    """A size that is no whole number of encoder frames (300 ms of 40 ms frames) is decoded as
    320 ms: the load bench's check of the steps between partials, its JSON and the WER rows'
    names take that size, or every stream reads as having lost a chunk."""
    from bench.streaming import decoded_ms

    recognizer, _ = streaming_recognizer()
    assert recognizer.frame_seconds == pytest.approx(0.04)
    assert decoded_ms(recognizer, StreamOptions(chunk_ms=300)) == (320.0, 320.0)
    assert decoded_ms(recognizer, StreamOptions(chunk_ms=300, first_chunk_ms=500)) == (320, 480)
    assert decoded_ms(recognizer, StreamOptions(chunk_ms=None)) == (None, None)
