"""The live commands that run a model: `asr transcribe --streaming` and `asr serve` (its client,
`asr connect`, is `asr.cli.connect`)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ipaddress
import itertools
import json
import logging
import os
import re
import signal
import sys
from pathlib import Path, PurePath
from typing import IO

from asr.cli.console import Lines, StdinPcm, ctrl_c_ends_the_input, pieces, samples
from asr.cli.numbers import check_search_arguments, non_negative, positive
from asr.ctc_beam import EndpointOptions
from asr.search import DEFAULT_LM_WEIGHT
from asr.streaming import FINAL_SEARCHES, StreamOptions


class _Noted(argparse.Action):
    """Stores the value and notes the option in `live_options`: a command where streaming is
    optional refuses them without it, rather than ignore them."""

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        setattr(namespace, self.dest, values)
        namespace.live_options = [*namespace.live_options, option_string]


def add_stream_arguments(p: argparse.ArgumentParser, final_search: str) -> None:
    """The options of a live stream (`StreamOptions`); `final_search` is the command's default."""
    p.set_defaults(live_options=[])
    p.add_argument(
        "--chunk-ms",
        action=_Noted,
        type=non_negative,
        default=640.0,
        help="audio per encoder chunk, in ms, rounded to whole encoder frames (40 ms at 4x "
        "subsampling of 10 ms): the latency of partial results (640); 0 decodes at full "
        "context, finals only",
    )
    p.add_argument(
        "--first-chunk-ms",
        action=_Noted,
        type=positive,
        help="audio in each utterance's first chunk, in ms (default: --chunk-ms); longer, the "
        "opening word is read with more of itself (fewer errors on it), and the utterance's "
        "first partial comes that much later",
    )
    p.add_argument(
        "--endpoint-silence",
        action=_Noted,
        type=non_negative,
        default=EndpointOptions.trailing_silence,
        help="seconds of silence after speech that end an utterance "
        f"({EndpointOptions.trailing_silence:g}); 0: one utterance until the audio ends",
    )
    p.add_argument(
        "--silence-from",
        action=_Noted,
        choices=["ctc", "silero"],
        default=EndpointOptions.silence_from,
        help="what hears that silence: the model's CTC blank frames (ctc, the default), or "
        "Silero VAD (silero), which does not end an utterance in speech the model gives no "
        "tokens for",
    )
    p.add_argument(
        "--final-search",
        action=_Noted,
        choices=FINAL_SEARCHES,
        default=final_search,
        help="how each utterance's final is found at its endpoint: the CTC prefix beam's n-best "
        "rescored by the attention decoder (rescore), or a joint CTC/attention beam search over "
        "the utterance's encoder frames, as offline decoding searches (beam: more accurate, a "
        f"search's time added to each final, fewer streams a server holds); default {final_search}",
    )
    p.add_argument(
        "--max-context-ms",
        action=_Noted,
        type=positive,
        help="left context attention keeps, in ms (default: the whole utterance)",
    )


def origin(text: str) -> str:
    """An `asr serve --allow-origin` value, checked before the model loads."""
    from asr.serve.server import allowed_origin

    try:
        return allowed_origin(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def stream_options(args: argparse.Namespace) -> StreamOptions:
    check_search_arguments(args)
    endpoint = None
    if args.endpoint_silence > 0:
        endpoint = EndpointOptions(
            trailing_silence=args.endpoint_silence, silence_from=args.silence_from
        )
    elif args.silence_from != EndpointOptions.silence_from:  # the default restated is no harm
        raise ValueError("--silence-from hears the silence of endpoints: --endpoint-silence 0 "
                         "has none")  # fmt: skip
    lm_weight = args.lm_weight
    if lm_weight is None and args.lm:
        lm_weight = DEFAULT_LM_WEIGHT
    chunked = [o for o in ("--first-chunk-ms", "--max-context-ms") if o in args.live_options]
    if not args.chunk_ms and chunked:
        raise ValueError(f"{', '.join(chunked)}: settings of chunks; --chunk-ms 0 has none")
    unheard = ["--endpoint-silence"] if "--endpoint-silence" in args.live_options else []
    unheard += ["--silence-from"] if args.silence_from != EndpointOptions.silence_from else []
    if not args.chunk_ms and endpoint is not None and unheard:
        raise ValueError(
            f"{', '.join(unheard)}: --chunk-ms 0 decodes nothing before an utterance ends, so "
            f"hears no silence (an utterance is cut at {EndpointOptions.max_utterance:g} s; "
            "--endpoint-silence 0 makes the recording one)"
        )
    given = {"beam": args.beam_size, "ctc_weight": args.ctc_weight, "lm_weight": lm_weight}
    try:
        return StreamOptions(
            chunk_ms=args.chunk_ms or None,
            first_chunk_ms=args.first_chunk_ms,
            max_context_ms=args.max_context_ms,
            endpoint=endpoint,
            final_search=args.final_search,
            **{k: v for k, v in given.items() if v is not None},
        )
    except ValueError as err:  # said of the options given, not of StreamOptions' fields
        fields = r"\b(chunk_ms|first_chunk_ms|max_context_ms)\b"
        said = re.sub(fields, lambda m: "--" + m[1].replace("_", "-"), str(err))
        raise ValueError(said) from None


def transcribe_streaming(
    args: argparse.Namespace,
    recognizer,
    lm=None,
    out: IO[str] | None = None,
    stdin: StdinPcm | None = None,
    interrupted: list[int] | None = None,
) -> int:
    """Decode each input as a live stream; `-` is raw 16-bit mono PCM on stdin (read by
    `stdin`, made here if not given: the CLI starts reading before the model loads, and hands
    on the `ctrl_c_ends_the_input` list it installed meanwhile as `interrupted`). Each final
    is printed as a line; on a terminal the partial is rewritten in place below them. With
    `--output-dir`, each input's whole transcript is also written there when it ends (and the
    audio of `-`, as `stdin.wav`, for the explorer to play)."""
    from asr.audio import AudioError
    from asr.cli.inputs import (
        DEFAULT_FORMATS,
        refuse_references_in_the_way,
        start_explorer,
        write_explorer,
        written_formats,
    )
    from asr.streaming import StreamingEngine
    from asr.writers import expand_formats, timed_lines, unwritten

    out = out or sys.stdout
    # a model that cannot stream is refused here, before anything is written
    engine = StreamingEngine(recognizer, stream_options(args), lm)
    lines = Lines(out, out.isatty() and not args.quiet and not args.jsonl)
    rate = recognizer.sample_rate
    if stdin is None and "-" in args.audio:
        stdin = StdinPcm()
    inputs, unnamed = _streamed_inputs(args.audio, args.manifest or [], bool(args.output_dir))
    formats = args.format or DEFAULT_FORMATS
    if args.output_dir:  # refused before the explorer's layout is written there
        outputs = [(clip.path, PurePath(stem)) for _, clip, stem in inputs if clip is not None]
        refuse_references_in_the_way(
            outputs, args.output_dir, written_formats(formats, args.explorer)
        )
        for stem in (stem for _, clip, stem in inputs if clip is None):  # stdin's recording
            kept = Path(args.output_dir) / f"{stem}.wav"
            if kept.is_file() or kept.is_symlink():
                raise ValueError(
                    f"{kept}: the recording of an earlier session from stdin would be "
                    "overwritten: move it (and its transcripts), or give another --output-dir"
                )
    if args.explorer:
        formats = start_explorer(args.output_dir, recognizer, formats, [s for *_, s in inputs])
    formats = expand_formats(formats)
    for failure in unnamed:  # arguments that name no audio
        print(f"asr transcribe: error: {failure}", file=sys.stderr)
    failed = len(unnamed)
    ended = (
        ctrl_c_ends_the_input(stdin) if interrupted is None else contextlib.nullcontext(interrupted)
    )
    with ended as interrupted:
        for name, clip, stem in inputs:
            try:  # a bad file is said and the others go on; spans checked as offline
                wave = None if clip is None else _clip_samples(clip, rate)
            except AudioError as error:
                print(f"asr transcribe: error: {error}", file=sys.stderr)
                failed += 1
                continue
            stream = engine.stream()
            said = _finals_as_json_lines(name) if args.jsonl else timed_lines
            maps = _kept_maps(stream) if args.explorer else []
            if len(inputs) > 1 and not args.jsonl:
                print(name, file=out)
            # what the written transcript names as its audio: a manifest line's file, whose
            # name is `path@start-end`
            audio = name if clip is None else clip.path
            with contextlib.ExitStack() as recording:
                if name == "-":
                    data = stdin.pieces(rate, interrupted)
                    if args.output_dir:
                        audio = os.path.join(args.output_dir, f"{stem}.wav")
                        data = recording.enter_context(_recorded(data, audio, rate))
                    audio_pieces = samples(data)
                else:
                    audio_pieces = pieces(wave, rate)
                for piece in audio_pieces:
                    for final in stream.accept(piece):
                        lines.final(said(final))
                    lines.partial(stream.partial)
                    if interrupted and name != "-":  # stdin's pieces end with what was heard
                        break
            transcript = stream.final()
            for final in stream.take_finals():
                lines.final(said(final))
            lines.clear()
            if args.output_dir:
                try:
                    offset = 0.0 if clip is None else clip.offset  # a manifest line's clip
                    _write_streamed(args, transcript, stem, audio, formats, maps, offset)
                except OSError as error:  # a name too long, a folder in a file's place...
                    print(f"asr transcribe: error: {name}: {unwritten(error)}", file=sys.stderr)
                    failed += 1
            if interrupted:
                break
    if args.explorer:  # Ctrl-C too: it is how a session from the microphone ends
        write_explorer(args.output_dir, progress=False)
    if failed and not interrupted:
        total = len(inputs) + len(unnamed)
        print(f"asr transcribe: {failed} of {total} inputs failed", file=sys.stderr)
    return 130 if interrupted else 1 if failed else 0


def _clip_samples(clip, rate: int):
    """A file's or a manifest line's samples at `rate`, as offline transcription reads them (a
    span running past the end of its audio refused)."""
    from asr.segment import FileSource

    source = FileSource(clip.path, rate, clip.offset, clip.duration)
    return source.read(0.0, source.duration).numpy()


def _finals_as_json_lines(audio: str):
    """The finals of the input `audio` as the JSON lines `asr serve` sends for them (numbered
    from 0), each with `audio` added."""
    from asr.serve.server import final_message

    count = itertools.count()
    return lambda final: json.dumps(final_message(final, next(count)) | {"audio": audio}) + "\n"


def _kept_maps(stream) -> list:
    """The list `stream` now adds each final's span and maps to (`segment_maps`)."""
    from asr.explore.records import segment_maps

    maps = []
    stream.on_decoded = lambda span, part, decoded: maps.append((span, segment_maps(part, decoded)))
    return maps


def _streamed_inputs(
    arguments: list[str], manifests: list[str], unique: bool
) -> tuple[list[tuple], list[str]]:
    """`(name, clip, output stem)` of each input the arguments name, as offline `transcribe`
    expands them (folders, globs, manifests; each once), `-` (stdin, clip None, stem `stdin`)
    where it is given; and `name: reason` of what names nothing."""
    import tempfile

    from asr.cli.inputs import expand_inputs

    files = [a for a in arguments if a != "-"]
    with tempfile.TemporaryDirectory() as scratch:  # holds nothing: `-` is not among `files`
        expanded, failures = expand_inputs(files, scratch, unique_stems=unique, manifests=manifests)
        before = arguments[: arguments.index("-")] if "-" in arguments else []
        at = len(expand_inputs(before, scratch, unique_stems=False)[0])  # where `-` was given
    found = [(item.name, item.audio, str(item.stem)) for item in expanded]
    if "-" in arguments:
        if unique and "stdin" in (stem for _, _, stem in found):
            raise ValueError("- and a file named stdin would write the same output files")
        found.insert(at, ("-", None, "stdin"))
    return found, failures


@contextlib.contextmanager
def _recorded(data, path: str, rate: int):
    """`data` (s16le PCM bytes), written to the WAV file `path` as they pass."""
    import soundfile as sf

    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    written = [0]
    try:
        wav = sf.SoundFile(path, "w", samplerate=rate, channels=1, subtype="PCM_16")
    except sf.LibsndfileError as error:  # a folder in its place, a folder not writable
        raise _unwritable(path, error) from None
    try:
        with wav:

            def passing():
                for block in data:
                    try:
                        wav.buffer_write(block, dtype="int16")
                    except sf.LibsndfileError as error:  # a full disk
                        raise _unwritable(path, error) from None
                    written[0] += len(block)
                    yield block

            yield passing()
    except ValueError:  # stdin refused before any audio (a file piped in): no empty recording
        if not written[0]:
            os.remove(path)
        raise


def _unwritable(path: str, error: Exception) -> OSError:
    return OSError(f"{path}: cannot write the recording ({error})")


def _write_streamed(
    args: argparse.Namespace,
    transcript,
    stem: str,
    audio: str,
    formats: list[str],
    maps: list,
    offset: float = 0.0,
) -> None:
    """The `formats` files of a stream (of `audio` from `offset` seconds); with --explorer its
    finals' maps first."""
    from asr.cli.inputs import keep_explorer_maps
    from asr.writers import write_outputs

    path = os.path.join(args.output_dir, stem)
    keep_explorer_maps(Path(path), args.output_dir, maps if args.explorer else None)
    write_outputs(transcript, path, formats, audio, args.words_per_cue, offset)
    suffixes = formats[0] if len(formats) == 1 else "{" + ",".join(formats) + "}"
    print(f"asr transcribe: {audio}: wrote {path}.{suffixes}", file=sys.stderr)


def _loopback(host: str) -> bool:
    try:
        return host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name
        return False


def serve(args: argparse.Namespace, recognizer, lm=None) -> int:
    """Run `asr serve` until interrupted."""
    import torch

    from asr.serve.server import CannotListen, ServeOptions, serve_forever

    options = ServeOptions(
        host=args.host,
        port=args.port,
        max_connections=args.max_connections,
        max_per_address=args.max_per_address,
        max_backlog_seconds=args.max_backlog,
        idle_timeout=args.idle_timeout,
        allow_origins=tuple(args.allow_origin),
        certfile=args.certfile,
        keyfile=args.keyfile,
    )
    # websockets' own line per connection says less than the server's (who, how much audio,
    # why a stream closed)
    logging.getLogger("websockets.server").setLevel(logging.WARNING)
    secure = "s" if args.certfile else ""

    serving = []  # the server, for a second Ctrl-C

    def ready(live) -> None:
        serving.append(live)
        chunk = live.engine.chunk_seconds
        where = f"[{args.host}]:{live.port}" if ":" in args.host else f"{args.host}:{live.port}"
        threads = torch.get_num_threads()
        print(
            f"asr serve: http{secure}://{where}/ (the microphone page); WebSocket on "
            f"ws{secure}://{where}/, {recognizer.sample_rate} Hz, chunks of "
            f"{'full context' if chunk is None else f'{chunk * 1000:.0f} ms'}, {threads} model "
            f"thread{'s' if threads > 1 else ''}; Ctrl-C stops",
            flush=True,
        )
        if not secure and not _loopback(args.host):
            print(
                "asr serve: browsers give the microphone only to https pages and to localhost: "
                "for the page on other machines give --certfile (and --keyfile), or open it "
                f"there through `ssh -L {live.port}:localhost:{live.port} THIS_HOST`",
                flush=True,
            )

    async def until_stopped() -> None:
        # Ctrl-C or SIGTERM (a service manager's stop) finishes the open streams; again, at once
        stop, loop = asyncio.Event(), asyncio.get_running_loop()

        # a signal started ignored (SIGINT of a background job) stays so
        signals = [
            s for s in (signal.SIGINT, signal.SIGTERM) if signal.getsignal(s) != signal.SIG_IGN
        ]

        def stopping() -> None:
            for sig in signals:
                loop.add_signal_handler(sig, at_once)
            print(
                "asr serve: stopping: the open streams get their finals (Ctrl-C again: at once)",
                flush=True,
            )
            stop.set()

        def at_once() -> None:
            for live in serving:  # no closing handshakes: a peer that answers none holds 10 s
                live.abort()
            raise KeyboardInterrupt  # out of the loop: main says "interrupted"

        for sig in signals:
            loop.add_signal_handler(sig, stopping)
        await serve_forever(recognizer, stream_options(args), options, lm, ready, stop)

    try:
        asyncio.run(until_stopped())  # a second Ctrl-C raises: main says "interrupted"
    except CannotListen as err:
        raise ValueError(f"{err.strerror} (--host, --port)") from None
    print("asr serve: stopped", flush=True)
    return 0
