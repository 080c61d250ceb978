"""The `asr` command: a thin layer over the library.

asr prepare CORPUS --data-dir DIR --out DIR     manifests (JSONL) + summary
asr tokenizer --manifest M --kind char|bpe|unigram [--vocab-size N] --out DIR
asr cmvn --manifest M --out stats.json          global CMVN statistics
asr validate-data --manifest M [--tokenizer DIR] check audio and text up front
asr shard --manifest M --out DIR [--shard-hours H]   WebDataset shards that training streams
asr fit|validate|test --config conf/...yaml     training (LightningCLI)
asr average --last exp/.../checkpoints/last.ckpt --best 5 --out avg.ckpt
asr finalize --checkpoint CKPT --manifest dev.jsonl --beam-size 10 --ctc-weight 0.5
                                                its default search, confidence, alignment maps
asr export --checkpoint CKPT --out DIR          a shareable folder (safetensors, model card)
asr export --checkpoint CKPT --out DIR --format onnx   also ONNX graphs (--backend onnx)
asr transcribe AUDIO|DIR|GLOB|M.jsonl|-... --checkpoint CKPT [--output-dir DIR --format ...]
                                                [--workers N]: spread over processes (or torchrun)
asr serve --model CKPT [--port 8765]            live recognition: WebSocket and microphone page
asr connect ws://HOST:8765/ AUDIO|-             stream audio to an asr serve, print its results
asr evaluate --checkpoint CKPT --manifest test.jsonl --out DIR   WER/CER, reports, plots
asr robustness --checkpoint CKPT --manifest test.jsonl --out DIR  WER under noise, level...
asr align AUDIO --checkpoint CKPT --text "..." --out plot.png      word times of a transcript
asr explore DIR [--out FILE.html]    an interactive page of a decode, transcription or run folder
asr choose-heads --checkpoint CKPT --manifest dev.jsonl   how well attention maps time words
asr calibrate --checkpoint CKPT --manifest dev.jsonl      how well word confidences fit dev
asr curves RUN_DIR --out curves.png             training curves of a run

Batch commands (prepare, validate-data, transcribe, evaluate) go on past bad inputs, list
each with the reason, and exit with status 1 when any failed (2: the command could not run).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import re
import signal
import sys
from collections.abc import Sequence
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

from asr.cli.console import warnings_said_by
from asr.cli.numbers import (
    count,
    decibels_below,
    lm_weight,
    non_negative,
    number,
    port,
    positive,
    weight,
    whole,
)

if TYPE_CHECKING:
    from asr.cli.inputs import Input
    from asr.recognizer import Recognizer

LIGHTNING_COMMANDS = ("fit", "validate", "test")
CURVES = ("val/loss", "val/ctc_loss", "val/wer")  # `asr curves` plots those logged
MAX_LISTED = 20  # failures spelled out on stderr by batch commands
DEFAULT_BEST = 5  # checkpoints `asr average --last` averages
# `SearchOptions` fields that the decoding commands take as --options (None: not given).
DECODING_ARGUMENTS = ("beam_size", "ctc_weight", "length_bonus", "max_len_ratio", "repair")


def _prepare(args: argparse.Namespace) -> int:
    from asr.data.prepare import left_out, prepare_corpus

    _check_folder_to_write(args.out, "--out")
    options = {}
    if args.splits:
        options["splits"] = args.splits
    if args.dev_size is not None:
        options["dev_size"] = args.dev_size
    prepare_corpus(args.corpus, args.data_dir, args.out, **options)
    broken = left_out(args.out)
    if broken:
        summary = Path(args.out) / "summary.json"
        _print_failures(f"asr prepare: {len(broken)} input(s) left out (see {summary})", broken)
    return 1 if broken else 0


def _print_failures(title: str, failures: Sequence[str]) -> None:
    """`title:` and the first `MAX_LISTED` failures on stderr, one per line."""
    print(f"{title}:", file=sys.stderr)
    for failure in failures[:MAX_LISTED]:
        print(f"  {failure}", file=sys.stderr)
    if len(failures) > MAX_LISTED:
        print(f"  ... and {len(failures) - MAX_LISTED} more", file=sys.stderr)


def _tokenizer(args: argparse.Namespace) -> int:
    from asr.text import TextNormalizer, train_tokenizer

    _check_folder_to_write(args.out, "--out")
    if args.kind == "char" and args.vocab_size is not None:
        raise ValueError("--vocab-size sizes bpe and unigram vocabularies; char takes each "
                         "character of the text: leave it out, or give --kind bpe")  # fmt: skip
    if args.kind != "char" and args.vocab_size is None:
        raise ValueError(f"--kind {args.kind} needs --vocab-size (128 for Mini LibriSpeech, say)")
    normalizer = TextNormalizer(case=args.case, punctuation=args.punctuation)
    manifests = [Path(m) for m in args.manifest]
    tok = train_tokenizer(manifests, args.kind, args.vocab_size, args.out, normalizer)
    print(f"{args.kind} tokenizer with {tok.vocab_size} tokens written to {args.out}")
    return 0


def _cmvn(args: argparse.Namespace) -> int:
    from asr.data.cmvn import compute_cmvn_stats, config_frontend
    from asr.frontends import Frontend, LevelNormalizer, LogMelFilterbank, features_of

    # before the features of every utterance
    _check_file_to_write(
        args.out, "--out", {"--manifest": [args.manifest], "--config": args.config or []}
    )
    own = {"--sample-rate": args.sample_rate, "--n-mels": args.n_mels,
           "--target-dbfs": args.target_dbfs}  # fmt: skip
    if args.config is not None:
        from asr.config_check import config_problems

        given = [name for name, value in own.items() if value is not None]
        if given:
            raise ValueError(f"{' and '.join(given)}: the features are --config's; give either")
        if len(args.config) > 1:  # not laid over one another, as asr fit does
            raise ValueError("--config given twice: give the one config whose model names the "
                             "frontend")  # fmt: skip
        config = args.config[0]
        if not Path(config).is_file():
            raise ValueError(f"--config {config}: no such file")
        problems = config_problems(config, within="model.init_args.frontend")
        if problems:
            raise ValueError("\n".join(problems))
        frontend = config_frontend(config)
    else:
        rate, n_mels = args.sample_rate or 16000, args.n_mels or 80
        try:  # the modules' messages name their arguments; say which option set them
            level = None if args.target_dbfs is None else LevelNormalizer(args.target_dbfs)
        except ValueError as error:
            raise ValueError(f"--target-dbfs {args.target_dbfs}: {error}") from None
        try:
            features = LogMelFilterbank(sample_rate=rate, n_mels=n_mels)
        except ValueError as error:
            raise ValueError(f"--sample-rate {rate} --n-mels {n_mels}: {error}") from None
        frontend = Frontend(features, level=level)
    rate = features_of(frontend).sample_rate
    stats = compute_cmvn_stats(
        args.manifest, frontend, args.out, rate, max_utterances=args.max_utterances
    )
    print(f"CMVN statistics over {int(stats.count)} frames written to {args.out}")
    return 0


def _validate_data(args: argparse.Namespace) -> int:
    from asr.data.manifest import ManifestError, validate_manifest
    from asr.text import Tokenizer

    if args.report:  # before the manifests are checked, which may take long
        _check_file_to_write(args.report, "--report", {"--manifest": args.manifest})
        Path(args.report).parent.mkdir(parents=True, exist_ok=True)
    tokenizer = Tokenizer.load(args.tokenizer, option="--tokenizer") if args.tokenizer else None
    failed, lines = 0, []
    for manifest in args.manifest:
        try:  # each on its own: one missing stops neither the others nor the report
            check = "full" if args.full else True
            report = validate_manifest(
                manifest, tokenizer, check_audio=check, min_duration=args.min_duration
            )
        except ManifestError as error:
            print(str(error))
            lines.append(str(error))
            failed += 1
            continue
        if not report.good and not report.bad:  # as fit, evaluate, shard and cmvn refuse it
            said = f"{manifest}: no utterances to validate"
            print(said)
            lines.append(said)
            failed += 1
            continue
        print(f"{manifest}: {len(report.good)} good, {len(report.bad)} bad")
        for entry in report.bad:
            print(f"  {entry.location}: {entry.reason}")
        lines += report.lines()
        failed += len(report.bad)
    if args.report:
        Path(args.report).write_text("\n".join(lines) + "\n", encoding="utf-8")
    return 1 if failed else 0


def _shard(args: argparse.Namespace) -> int:
    import threading

    from asr.data.shards import INDEX_NAME, write_shards

    _check_folder_to_write(args.out, "--out")
    # SIGTERM unwinds as Ctrl-C does, so the shard being written is removed, not left .partial
    main_thread = threading.current_thread() is threading.main_thread()
    received: list[int] = []
    previous = (
        signal.signal(signal.SIGTERM, partial(_raise_terminated, received)) if main_thread else None
    )
    try:
        try:
            index = write_shards(args.manifest, args.out, args.shard_hours, progress=not args.quiet)
        except Exception:
            if received:  # what a terminated read or write left behind
                raise _Terminated from None
            raise
        if received:  # raised inside a C library's callback, which swallows exceptions
            (Path(args.out) / INDEX_NAME).unlink()  # what it wrote meanwhile is not trusted
            raise _Terminated
    except _Terminated:
        print(f"asr shard: terminated; the same command writes {args.out} again", file=sys.stderr)
        return 128 + signal.SIGTERM
    finally:
        if main_thread:
            signal.signal(signal.SIGTERM, previous)
    hours = sum(shard.seconds for shard in index.shards) / 3600
    count = sum(shard.count for shard in index.shards)
    print(f"{count} utterances ({hours:.2f} h) in {len(index.shards)} shards written to "
          f"{args.out}; train on them with data.train_manifest: {args.out}")  # fmt: skip
    print(f"index: {Path(args.out) / INDEX_NAME}", file=sys.stderr)
    return 0


class _Terminated(BaseException):
    """SIGTERM as an exception; not an Exception, so that no `except Exception` swallows it."""


def _raise_terminated(received: list[int], signum: int, frame: object) -> None:
    received.append(signum)
    raise _Terminated


def _average(args: argparse.Namespace) -> int:
    from asr.checkpoint import average_checkpoints, best_checkpoints

    if args.checkpoints and args.best is not None:
        raise ValueError("--best chooses among what --last records; with --checkpoints, name them")
    reads = {"--last": [args.last]} if args.last else {}  # average_checkpoints checks the others
    _check_file_to_write(args.out, "--out", reads)  # before reading every checkpoint
    paths = args.checkpoints or best_checkpoints(args.last, args.best or DEFAULT_BEST)
    if args.best is not None and len(paths) < args.best:
        print(
            f"{args.last} records {len(paths)} best checkpoints, not {args.best}", file=sys.stderr
        )
    average_checkpoints(paths, args.out)
    print(f"averaged {len(paths)} checkpoint{'s' * (len(paths) != 1)} into {args.out}:")
    for path in paths:
        print(f"  {path}")
    return 0


def _finalize(args: argparse.Namespace) -> int:
    from asr.checkpoint import CheckpointError
    from asr.finalize import finalize, store
    from asr.package import folder_refusal

    refusal = folder_refusal(args.checkpoint, "finalize its checkpoint, then export it again")
    if refusal:  # before decoding the manifest
        raise CheckpointError(refusal)
    recognizer = _load_model(args)
    finished = finalize(
        recognizer,
        args.manifest,
        _search_options(args, recognizer),
        batch_size=args.batch_size,
        progress=not args.quiet,
    )
    print(f"decoding: {finished.decoding}")
    if finished.confidence is not None:
        print(_calibration_report(finished.confidence))
    if finished.heads is not None:
        print(f"alignment maps {finished.heads.chosen}:\n{finished.heads.table()}", end="")
    for part, why in finished.skipped.items():
        print(f"{part}: not fitted ({why})")
    store(args.checkpoint, finished)
    fitted = {"confidence": finished.confidence, "alignment maps": finished.heads}
    stored = ", ".join(["decoding", *(part for part, value in fitted.items() if value is not None)])
    cleared = f"; {', '.join(finished.skipped)} cleared" if finished.skipped else ""
    print(f"{args.checkpoint}: {stored} stored{cleared}", file=sys.stderr)
    return _left_out("finalize", finished.failures)


def _export(args: argparse.Namespace) -> int:
    from asr.checkpoint import CheckpointError
    from asr.finalize import stored_decoding
    from asr.package import ModelCard, folder_refusal, write_package
    from asr.recognizer import load_model

    _check_folder_to_write(args.out, "--out")  # before the model is read
    refusal = folder_refusal(args.checkpoint, "exported already: export a checkpoint")
    if refusal:
        raise CheckpointError(refusal)
    if args.calibration and args.format != "onnx":
        raise ValueError("--calibration sets the int8 graphs' ranges: it needs --format onnx")
    if args.calibration_size is not None and not args.calibration:
        raise ValueError("--calibration-size is the number of --calibration recordings: give both")
    recognizer = load_model(args.checkpoint)
    calibration = _calibration_waves(args, recognizer) if args.calibration else None
    # None stays None: the library's defaults, offline and live, as the checkpoint decodes
    decoding = None if recognizer.decoding is None else stored_decoding(recognizer.decoding)
    card = ModelCard(
        args.repo_id,
        args.license,
        args.data,
        args.training_command,
        tuple(args.metrics or ()),
        sum(p.numel() for p in recognizer.model.parameters()),
        onnx=args.format == "onnx",
    )
    written = write_package(args.checkpoint, args.out, decoding, card)
    if args.format == "onnx":
        from asr.onnx_runtime import export_onnx

        written += export_onnx(recognizer.model, args.out, recognizer.sample_rate)
        if calibration is not None:
            from asr.onnx_int8 import calibrate_int8

            try:
                calibrate_int8(recognizer, args.out, calibration, progress=not args.quiet)
            except (ValueError, OSError) as err:
                raise ValueError(
                    f"{err}; the package in {args.out} was written, its int8 graphs taking "
                    "their ranges per batch (export it again to calibrate)"
                ) from None
    print(f"model package written to {args.out}: {' '.join(written)}")
    if calibration is not None:
        print(f"int8 activation ranges calibrated on {len(calibration)} recordings")
    return 0


def _calibration_waves(args: argparse.Namespace, recognizer: Recognizer) -> list:
    """`--calibration-size` recordings spread over the `--calibration` manifest, read (each
    line's span); those too short to encode are left out, and said."""
    from asr.audio import load_audio
    from asr.data.manifest import read_manifest
    from asr.onnx_int8 import CALIBRATION_SIZE

    utterances = read_manifest(args.calibration)
    size = min(args.calibration_size or CALIBRATION_SIZE, len(utterances))
    chosen = [i * len(utterances) // size for i in range(size)]  # spread over all of them
    waves = [
        load_audio(u.audio_filepath, recognizer.sample_rate, u.offset, u.duration)
        for u in (utterances[i] for i in chosen)
    ]
    kept = [w for w in waves if len(w) >= recognizer.shortest_input]
    if len(kept) < len(waves):
        print(f"asr export: {len(waves) - len(kept)} of {len(waves)} --calibration recordings "
              "are too short to encode: left out", file=sys.stderr)  # fmt: skip
    if not kept:
        raise ValueError(f"--calibration {args.calibration}: no recording long enough to encode")
    return kept


def _load_model(args: argparse.Namespace) -> Recognizer:
    """The recognizer `--checkpoint` names (checkpoint, package or hf://), on `--device`."""
    from asr.recognizer import load_model

    device = _device(getattr(args, "device", None))
    precision, backend = getattr(args, "precision", "fp32"), getattr(args, "backend", "torch")
    if backend != "torch" and getattr(args, "device", None) is None:
        device = "cpu"  # ONNX Runtime runs here on the CPU
    return load_model(args.checkpoint, device, precision, backend)


def _device(name: str | None) -> str:
    import torch

    if name is None:
        return "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda: no CUDA device is available")
    return name


def _search_options(args: argparse.Namespace, recognizer: Recognizer):
    """The recognizer's default search settings, with the decoding arguments given on top."""
    from asr.cli.numbers import check_search_arguments
    from asr.search import DEFAULT_LM_WEIGHT

    check_search_arguments(args)
    lm = getattr(args, "lm", None)
    given = {name: getattr(args, name, None) for name in DECODING_ARGUMENTS}
    if lm:
        given["lm_weight"] = DEFAULT_LM_WEIGHT if args.lm_weight is None else args.lm_weight
    given = {k: v for k, v in given.items() if v is not None}
    return replace(recognizer.default_options, **given)


def _language_model(args: argparse.Namespace, recognizer):
    """The `--lm` checkpoint, checked to share the recognizer's vocabulary; None without it
    and with `--lm-weight 0` (a weight sweep's first point: the same as no LM)."""
    from asr.cli.numbers import check_search_arguments

    check_search_arguments(args)  # an empty --lm is not "no LM"
    lm = recognizer.load_lm(args.lm) if args.lm else None
    return None if args.lm_weight == 0 else lm


def _transcribe(args: argparse.Namespace) -> int:
    import tempfile

    from asr.cli.inputs import (
        DEFAULT_FORMATS,
        expand_inputs,
        refuse_references_in_the_way,
        write_explorer,
        written_formats,
    )
    from asr.cli.parallel import (
        MERGED,
        holds_records,
        listed,
        read_records,
        rewrite_merged,
        spreads,
        transcribe_spread,
        writing,
    )
    from asr.writers import CUE_FORMATS, expand_formats

    if not args.audio and not args.manifest:
        raise ValueError("nothing to transcribe: give audio, folders, globs, or --manifest")
    if args.format is not None and args.output_dir is None:
        raise ValueError("--format chooses the files written to --output-dir: give that too")
    if args.output_dir is not None:
        _check_folder_to_write(args.output_dir, "--output-dir")
    written = expand_formats(args.format or DEFAULT_FORMATS) if args.output_dir else []
    written += ["json"] if args.explorer else []  # the page reads the json files
    if args.nbest is not None and not args.streaming and "json" not in written:
        raise ValueError(
            "--nbest: the alternatives are kept in the json files alone; give --output-dir "
            "with json among --format (the default: txt and json)"
        )
    if args.vad == "silero" and args.silence_threshold_db is not None:
        raise ValueError(
            "--silence-threshold-db: a level for --vad energy; with --vad silero, Silero's "
            "speech probability says what is speech"
        )
    if args.words_per_cue and not set(expand_formats(args.format or [])) & set(CUE_FORMATS):
        raise ValueError(
            f"--words-per-cue sets the cues of {', '.join(CUE_FORMATS)} files: give --output-dir "
            "and --format with one of them"
        )
    if args.explorer and args.output_dir is None:
        raise ValueError(
            "--explorer keeps its maps in --output-dir: give that too (`asr explore OUT` "
            "builds the page of any output folder)"
        )
    if args.jsonl and not args.streaming:
        raise ValueError("--jsonl prints a live stream's finals: give --streaming too")
    if args.live_options and not args.streaming:
        raise ValueError(f"{', '.join(args.live_options)}: options of --streaming; give it too")
    if args.streaming:
        from asr.cli.console import StdinPcm, ctrl_c_ends_the_input
        from asr.cli.live import stream_options, transcribe_streaming

        if args.workers is not None:
            raise ValueError("--streaming decodes one input after the other: no --workers")
        if args.output_dir and holds_records(Path(args.output_dir)):
            raise ValueError(
                f"{args.output_dir} holds the {MERGED} of a run spread over processes (or its "
                "parts), which --streaming does not keep true: give another --output-dir"
            )
        unread = {"nbest": "--nbest", "length_bonus": "--length-bonus",
                  "max_len_ratio": "--max-len-ratio", "repair": "--[no-]repair"}  # fmt: skip
        given = [option for name, option in unread.items() if getattr(args, name) is not None]
        if given:
            raise ValueError(
                f"{', '.join(given)}: not taken by --streaming, whose finals keep up to 5 "
                "alternatives and take the model's own length settings (asr finalize)"
            )
        cutting = {"vad": "--vad", "max_segment_seconds": "--max-segment-seconds",
                   "min_silence_seconds": "--min-silence-seconds",
                   "silence_threshold_db": "--silence-threshold-db"}  # fmt: skip
        given = [option for name, option in cutting.items() if getattr(args, name) is not None]
        if given:
            raise ValueError(
                f"{', '.join(given)}: not taken by --streaming, which ends utterances at "
                "endpoints (--endpoint-silence, --silence-from silero)"
            )
        if args.timestamps == "ctc":  # no torch import yet: stdin is read first
            raise ValueError("--timestamps ctc: --streaming times words by attention alone")
        stream_options(args)  # its errors before the model loads
        _set_threads(args.threads)
        stdin = None
        if "-" in args.audio:  # the microphone is heard meanwhile (from before the parse)
            stdin = getattr(args, "stdin_pcm", None) or StdinPcm()
        # stdin alone: a Ctrl-C while loading ends what was said; with files, it stops all
        alone = args.audio == ["-"] and not args.manifest
        with ctrl_c_ends_the_input(stdin) if alone else contextlib.nullcontext() as interrupted:
            recognizer = _load_model(args)
            lm = _language_model(args, recognizer)
            return transcribe_streaming(args, recognizer, lm, stdin=stdin, interrupted=interrupted)
    if spreads(args):
        from asr.package import is_package

        if not is_package(args.checkpoint) and not os.path.exists(args.checkpoint):
            raise FileNotFoundError(f"{args.checkpoint}: no such checkpoint")  # once, not per rank
        if args.lm and not os.path.exists(args.lm):
            raise FileNotFoundError(f"{args.lm}: no such checkpoint")
        if args.nbest is not None and args.beam_size is None:  # else refused by every process
            _check_nbest_by_stored_beam(args.nbest, args.checkpoint)
        outcome = transcribe_spread(args, _transcribe_inputs)
        # Rank 0 or the --workers parent, once every share is written; other ranks count none.
        if args.explorer and not outcome.status and outcome.total > len(outcome.failures):
            write_explorer(args.output_dir, not args.quiet)
        if outcome.failures:
            title = f"asr transcribe: {len(outcome.failures)} of {outcome.total} files failed"
            _print_failures(title, outcome.failures)
        return outcome.status or (1 if outcome.failures else 0)
    with tempfile.TemporaryDirectory(prefix="asr-transcribe-") as scratch:
        written = args.output_dir is not None
        inputs, failures = expand_inputs(
            args.audio, scratch, unique_stems=written, manifests=args.manifest
        )
        if written:
            outputs = [(item.audio.path, item.stem) for item in inputs]
            formats, out = written_formats(args.format, args.explorer), Path(args.output_dir)
            ours = listed(read_records(out)) if holds_records(out) else set()
            refuse_references_in_the_way(outputs, out, formats, ours)
        for failure in failures:
            print(f"asr transcribe: error: {failure}", file=sys.stderr)
        if not inputs:
            failed = 0
        elif written:
            with writing(Path(args.output_dir)):  # another run into it meanwhile is refused
                if holds_records(Path(args.output_dir)):
                    failed = rewrite_merged(args, _transcribe_inputs, inputs)
                else:
                    failed = len(_transcribe_inputs(args, inputs))
        else:
            failed = len(_transcribe_inputs(args, inputs))
    if args.explorer and failed < len(inputs):  # a page of at least one transcript
        write_explorer(args.output_dir, not args.quiet)
    if failures or failed:
        total = len(failures) + len(inputs)
        print(f"asr transcribe: {len(failures) + failed} of {total} files failed", file=sys.stderr)
    return 1 if failures or failed else 0


def _check_folder_to_write(path: str, option: str, given: str | None = None) -> None:
    """Refuse a folder to write that a file stands in the way of (itself, or a folder above);
    `given`: the option's value, where `path` is the folder of the file it names."""
    blocked = _file_in_the_way(Path(path))
    if blocked is not None:
        kind = "a file" if blocked.exists() else "a broken link"
        raise ValueError(f"{option} {given or path}: {blocked} is {kind}, not a folder")


def _check_file_to_write(path: str, option: str, reads: dict[str, list[str]] | None = None) -> None:
    """Refuse a file to write where a folder is, where a file stands in the way of its folder
    (itself, or one above), or where it is a file the command reads (`reads`: its option and
    paths)."""
    if not path or Path(path).is_dir():  # "" is the working folder
        raise ValueError(f"{option} {path or repr(path)} is a folder: name the file to write")
    for given, paths in (reads or {}).items():
        if any(_same_file(path, other) for other in paths):
            raise ValueError(f"{option} {path} is the {given} this command reads: writing it "
                             "would overwrite it")  # fmt: skip
    _check_folder_to_write(str(Path(path).parent), option, path)


def _same_file(path: str, other: str) -> bool:
    """Whether `path` and `other` name one file (through links too)."""
    try:
        return os.path.samefile(path, other)
    except OSError:  # one of them is not there (yet)
        return Path(path).resolve() == Path(other).resolve()


def _file_in_the_way(folder: Path) -> Path | None:
    """The file that stands where `folder`, or a folder above it, would be; None if none does."""
    here = next(
        p for p in (folder, *folder.parents) if p.exists() or p.is_symlink() or p == p.parent
    )  # a broken link too: nothing can be made where it is
    return None if here.is_dir() else here


def _check_nbest_by_stored_beam(nbest: int, checkpoint: str) -> None:
    """`--nbest` checked against the beam `checkpoint` stores, or asr's default beam."""
    from asr.cli.numbers import check_nbest
    from asr.recognizer import stored_search
    from asr.search import SearchOptions

    stored = stored_search(checkpoint)
    beam = (stored or SearchOptions()).beam_size
    check_nbest(nbest, beam, stored=True, default=stored is None)


def _transcribe_inputs(args: argparse.Namespace, inputs: list[Input], on_result=None) -> list[str]:
    """`transcribe_files` with the command's options; the names of the inputs that failed."""
    from asr.cli.inputs import DEFAULT_FORMATS, transcribe_files
    from asr.cli.numbers import check_nbest
    from asr.transcribe import TRANSCRIBE_BATCH_SIZE

    _set_threads(args.threads)
    recognizer = _load_model(args)
    if getattr(args, "warns", True):  # False on the ranks after the first
        _warn_if_longer_than_trained(recognizer, args.max_segment_seconds)
    given = {
        "max_segment_seconds": args.max_segment_seconds,
        "min_silence_seconds": args.min_silence_seconds,
        "silence_threshold_db": args.silence_threshold_db,
        "vad": args.vad,
    }
    options = _search_options(args, recognizer)
    check_nbest(args.nbest, options.beam_size, stored=args.beam_size is None,
                default=recognizer.decoding is None)  # fmt: skip
    return transcribe_files(
        recognizer,
        inputs,
        args.output_dir,
        formats=args.format or DEFAULT_FORMATS,
        options=replace(options, nbest=args.nbest),
        lm=_language_model(args, recognizer),
        timestamps=args.timestamps,
        batch_size=args.batch_size or TRANSCRIBE_BATCH_SIZE,
        segmenter=replace(
            recognizer.segmenter(), **{k: v for k, v in given.items() if v is not None}
        ),
        words_per_cue=args.words_per_cue,
        progress=not args.quiet,
        on_result=on_result,
        explorer=args.explorer,
    )


def _set_threads(threads: int | None) -> None:
    """PyTorch's intra-op threads, and so ONNX Runtime's (None: as they are)."""
    import torch

    if threads is not None:
        torch.set_num_threads(threads)


def _connect(args: argparse.Namespace) -> int:
    from asr.cli.connect import connect

    return connect(args)


def _serve(args: argparse.Namespace) -> int:
    import torch

    from asr.cli.live import serve

    if args.keyfile and not args.certfile:
        raise ValueError("--keyfile needs --certfile")
    if args.certfile:  # before the model loads: a bad certificate fails at once
        from asr.serve.server import tls_context

        tls_context(args.certfile, args.keyfile)
    from asr.cli.live import stream_options

    stream_options(args)  # its errors before the model loads
    torch.set_num_threads(args.threads)
    recognizer = _load_model(args)
    return serve(args, recognizer, _language_model(args, recognizer))


def _warn_if_longer_than_trained(recognizer: Recognizer, max_segment_seconds: float | None) -> None:
    """Warn when segments may be longer than the model's training utterances."""
    trained = recognizer.segment_seconds
    if max_segment_seconds is not None and trained is not None and max_segment_seconds > trained:
        print(
            f"asr transcribe: warning: --max-segment-seconds {max_segment_seconds:g} is longer "
            f"than 95% of this model's training utterances ({trained:g} s, its default); "
            "attention decoders often fail on longer input",
            file=sys.stderr,
        )


def _evaluate(args: argparse.Namespace) -> int:
    from asr.evaluate import evaluate

    _check_folder_to_write(args.out, "--out")  # before the model is read
    recognizer = _load_model(args)
    if args.chunk_ms is not None:
        from asr.streaming import mask_chunks

        mask_chunks(recognizer, args.chunk_ms)
    metrics = evaluate(
        recognizer,
        args.manifest,
        args.out,
        options=_search_options(args, recognizer),
        lm=_language_model(args, recognizer),
        batch_size=args.batch_size,
        plots=args.plots,
        plot_ids=args.plot_ids,
        progress=not args.quiet,
        extra={"lm": _fused_lm(args), "chunk_ms": args.chunk_ms or None},
        skip_bad=True,
    )
    print(
        f"WER {metrics['wer']:.2f}%  CER {metrics['cer']:.2f}%  over {metrics['utterances']} "
        f"utterances, RTF {metrics['real_time_factor']:.3f}; reports in {args.out}"
    )
    if args.explorer:
        from asr.explore.build import explore

        print(f"explorer: {explore(args.out, progress=not args.quiet)}")
    return _left_out("evaluate", metrics["failures"], "not scored")


def _robustness(args: argparse.Namespace) -> int:
    from asr.robustness import (
        DEFAULT_CONDITIONS,
        Condition,
        not_scored,
        robustness,
        robustness_table,
    )

    conditions = [Condition.parse(text) for text in args.conditions or DEFAULT_CONDITIONS]
    _check_folder_to_write(args.out, "--out")  # before the model is read
    recognizer = _load_model(args)
    rows = robustness(
        recognizer,
        args.manifest,
        args.out,
        conditions,
        options=_search_options(args, recognizer),
        lm=_language_model(args, recognizer),
        seed=args.seed,
        batch_size=args.batch_size,
        progress=not args.quiet,
        extra={"lm": _fused_lm(args)},
        skip_bad=True,
    )
    print(robustness_table(rows), end="")
    print(f"reports in {args.out} (robustness.md, robustness.json, <condition>/decode/)")
    return _left_out("robustness", not_scored(rows), "not scored")


def _explore(args: argparse.Namespace) -> int:
    from asr.explore.build import explore

    out = explore(args.folder, args.out, args.link_audio, not args.quiet, args.max_mb, args.compare)
    size = out.stat().st_size / 1e6
    print(f"explorer: {out} ({size:.1f} MB)")
    return 0


def _align(args: argparse.Namespace) -> int:
    import shutil
    import tempfile

    if args.audio != "-":
        return _align_file(args, args.audio)
    if sys.stdin.isatty():
        raise ValueError("-: stdin is a terminal; pipe audio in (asr align - ... < talk.wav)")
    with tempfile.TemporaryDirectory(prefix="asr-align-") as scratch:
        path = Path(scratch) / "stdin"
        with open(path, "wb") as file:
            shutil.copyfileobj(sys.stdin.buffer, file)
        try:
            return _align_file(args, str(path))
        except ValueError as err:  # named as given
            raise ValueError(str(err).replace(str(path), "-")) from None


def _align_file(args: argparse.Namespace, audio: str) -> int:
    from asr.plotting import heads_plot_path, save_alignment_plots

    recognizer = _load_model(args)
    heads = heads_plot_path(args.out)
    if recognizer.model.decoder.num_attention_maps > 1 and heads.is_dir():  # as --out is
        raise ValueError(f"{heads}: a folder where the plot of every attention map goes")
    try:
        alignment = recognizer.align(audio, args.text)
    except ValueError as err:  # too short, text outside the vocabulary...: name the recording
        raise ValueError(str(err) if audio in str(err) else f"{audio}: {err}") from None
    trained = recognizer.segment_seconds
    if trained is not None and alignment.duration > trained:
        ctc = "; the CTC columns do not rely on attention" if alignment.ctc_words else ""
        print(f"asr align: warning: {args.audio} lasts {alignment.duration:.1f} s, longer than "
              f"95% of this model's training utterances ({trained:g} s): attention decoders "
              f"often lose their place on longer input{ctc}", file=sys.stderr)  # fmt: skip
    ctc = alignment.ctc_words
    print("# word\tattention_start\tattention_end" + ("\tctc_start\tctc_end" if ctc else ""))
    for k, word in enumerate(alignment.words):
        times = f"{word.start:.3f}\t{word.end:.3f}"
        if ctc:
            times += f"\t{ctc[k].start:.3f}\t{ctc[k].end:.3f}"
        print(f"{word.text}\t{times}", flush=True)  # said, whatever becomes of the plots
    written = save_alignment_plots(recognizer, alignment, args.out, title=alignment.text)
    print(f"plots: {', '.join(str(p) for p in written)}", file=sys.stderr)
    return 0


def _curves(args: argparse.Namespace) -> int:
    from asr.plotting import plot_training_curves, read_training_log, save_figure

    labels = args.labels or _run_names(args.runs)
    if len(labels) != len(args.runs) or len(set(labels)) != len(labels):
        if not args.labels:
            raise ValueError(f"runs named twice: {args.runs}")
        raise ValueError(f"--labels: {len(args.runs)} distinct names needed, got {labels}")
    runs = {label: read_training_log(run) for label, run in zip(labels, args.runs)}
    logged = {metric for curves in runs.values() for metric in curves}
    metrics = args.metrics or [m for m in CURVES if m in logged]
    missing = [m for m in metrics if m not in logged]
    if missing or not metrics:
        raise ValueError(f"no run logged {missing or CURVES}; logged: {sorted(logged)}")
    written = save_figure(plot_training_curves(runs, metrics), args.out)
    print(f"curves: {written}", file=sys.stderr)
    return 0


def _run_names(runs: Sequence[str]) -> list[str]:
    """Legend names: each run folder's name, past its logs/, version_N/ and metrics.csv (the
    whole paths where those names repeat)."""
    names = []
    for run in runs:
        parts = [p for p in Path(run).resolve().parts if p != "metrics.csv"]
        while len(parts) > 1 and (parts[-1] == "logs" or parts[-1].startswith("version_")):
            parts.pop()
        names.append(parts[-1])
    return names if len(set(names)) == len(names) else list(runs)


def _choose_heads(args: argparse.Namespace) -> int:
    from asr.heads import (
        check_choosable,
        check_maps,
        choose_heads,
        reference_alignments,
        score_heads,
    )

    recognizer = _load_model(args)
    if args.heads is not None:  # before aligning the manifest
        check_maps(recognizer, args.heads)
    else:
        check_choosable(recognizer)
    failures: list[str] = []
    alignments = reference_alignments(recognizer, args.manifest, not args.quiet, failures)
    if args.heads is not None:
        print(score_heads(recognizer, alignments, args.heads).table(), end="")
    else:
        print(choose_heads(recognizer, alignments).table(), end="")
    return _left_out("choose-heads", failures)


def _calibrate(args: argparse.Namespace) -> int:
    from asr.evaluate import fit_confidence

    recognizer = _load_model(args)
    failures: list[str] = []
    fit = fit_confidence(
        recognizer,
        args.manifest,
        _search_options(args, recognizer),
        _language_model(args, recognizer),
        args.batch_size,
        progress=not args.quiet,
        failures=failures,
    )
    print(_calibration_report(fit))
    return _left_out("calibrate", failures)


def _picture_file(text: str) -> str:
    """A plot file to write, checked before any work: a format matplotlib writes (PNG where no
    suffix says), in a folder that is no file."""
    from matplotlib.backend_bases import FigureCanvasBase

    text = os.path.expanduser(text)  # a quoted ~/: checked where it will be written
    path = Path(text)
    # pgf needs a LaTeX install, which the plot would fail on after all the work
    formats = set(FigureCanvasBase.get_supported_filetypes()) - {"pgf"}
    if path.suffix and path.suffix[1:].lower() not in formats:
        known = ", ".join(f".{f}" for f in sorted(formats))
        raise argparse.ArgumentTypeError(f"{text}: asr writes no {path.suffix} plots ({known})")
    png = path.with_name(f"{path.name}.png")  # what matplotlib writes for a name without suffix
    for written in (path, *(() if path.suffix else (png,))):
        if written.is_dir():
            raise argparse.ArgumentTypeError(f"{written}: a folder; name the picture file to write")
    blocked = _file_in_the_way(path.parent)
    if blocked is not None:
        raise argparse.ArgumentTypeError(f"{text}: {blocked} is a file, not a folder")
    return text


def _left_out(command: str, failures: list[str], what: str = "left out") -> int:
    """List the manifest lines and utterances left out: exit status 1."""
    if not failures:
        return 0
    _print_failures(f"asr {command}: {len(failures)} manifest line(s) or utterance(s) {what}",
                    failures)  # fmt: skip
    return 1


def _fused_lm(args: argparse.Namespace) -> str | None:
    """The LM a decode's reports name: --lm, unless --lm-weight 0 leaves it out."""
    return args.lm if args.lm_weight != 0 else None


def _calibration_report(fit) -> str:
    """The fitted map, and ECE and ROC area before and after it; a caution where it was fitted
    on too few words to trust."""
    from asr.confidence import FEWEST_CALIBRATION_WORDS

    scaling = fit.scaling
    ctc = f" + {scaling.ctc_scale:.4f} * log(ctc_probability)" if scaling.ctc_scale else ""
    bias = f"{'-' if scaling.bias < 0 else '+'} {abs(scaling.bias):.4f}"
    lines = [f"confidence = sigmoid({scaling.scale:.4f} * log(probability){ctc} {bias})"]
    if not scaling.scale and not scaling.ctc_scale:
        lines.append("(the probabilities rank right words no better than wrong ones: every word "
                     "gets the share right)")  # fmt: skip
    for name, c in (("probability", fit.before), ("confidence", fit.after)):
        auc = "n/a" if c.auc is None else f"{c.auc:.3f}"
        lines.append(f"{name:>11}: ECE {c.ece:.3f}, ROC AUC {auc} over {c.words} words "
                     f"({100 * c.accuracy:.1f} % right)")  # fmt: skip
    if fit.before.words < FEWEST_CALIBRATION_WORDS:
        lines.append(
            f"caution: fitted on only {fit.before.words} words, a map to distrust; calibrate "
            f"on a dev set of {FEWEST_CALIBRATION_WORDS} words or more"
        )
    return "\n".join(lines)


def _longest_segment(text: str) -> float:
    """An argparse type: --max-segment-seconds, over twice the overlap of fixed windows."""
    from asr.segment import SegmenterOptions

    value = number(text)
    least = 2 * SegmenterOptions.window_overlap_seconds
    if not value > least:
        raise argparse.ArgumentTypeError(
            f"must be more than {least:g} s (twice the overlap of the windows that cut speech "
            f"without pauses), got {value:g}"
        )
    return value


def _repo_id(text: str) -> str:
    """An argparse type: a Hub repository name, owner/name (what hf:// takes)."""
    from asr.package import check_repo_id

    try:
        check_repo_id(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(
            f"must be owner/name as the Hub takes it: {error}"
        ) from None
    return text


def _licence(text: str) -> str:
    """An argparse type: a Hub licence id (apache-2.0, cc-by-4.0, openrail++, other), which the
    model card's YAML front matter takes as it is."""
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9.+_-]*", text):
        raise argparse.ArgumentTypeError(f"must be a licence id such as apache-2.0, got {text!r}")
    return text


JSONL_HELP = (
    "print each final as a JSON line: the message `asr serve` sends for it (text, start, end, "
    "words with their times and confidences; docs/streaming.md) and `audio`, the input it "
    "came from; no partial line"
)
MODEL_HELP = (
    "a checkpoint of `asr fit` or average, a model package folder (asr export), "
    "or hf://owner/name[@revision]"
)


def _add_model_argument(p: argparse.ArgumentParser, text: str = MODEL_HELP) -> None:
    """`--checkpoint` (alias `--model`): the recognizer a command runs."""
    p.add_argument(
        "--checkpoint", "--model", dest="checkpoint", metavar="MODEL", required=True, help=text
    )


def _add_search_arguments(
    p: argparse.ArgumentParser, model_help: str = MODEL_HELP, streaming: bool = False
) -> None:
    """The search's options; `streaming`: a command that also decodes live (its defaults)."""
    from asr.search import DEFAULT_CTC_WEIGHT, STREAM_CTC_WEIGHT, SearchOptions

    _add_model_argument(p, model_help)
    own = "default: the checkpoint's own (asr finalize), else"
    beam, ctc, ratio = SearchOptions.beam_size, DEFAULT_CTC_WEIGHT, SearchOptions.max_len_ratio
    p.add_argument(
        "--beam-size",
        type=count,
        help=f"hypotheses kept; 1 without CTC or LM = greedy ({own} {beam})",
    )
    rescoring = f"; --streaming --final-search rescore: {STREAM_CTC_WEIGHT}" if streaming else ""
    p.add_argument(
        "--ctc-weight", type=weight, help=f"CTC weight ({own} {ctc} with a CTC head{rescoring})"
    )
    p.add_argument("--length-bonus", type=number, help=f"score per output token ({own} 0)")
    p.add_argument(
        "--max-len-ratio", type=positive, help=f"tokens per encoder frame ({own} {ratio})"
    )
    p.add_argument(
        "--repair",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="in searches without --ctc-weight, decode again, CTC-weighted, hypotheses that "
        "loop, reach the length bound or outrun the CTC head (json marks them `repaired`); "
        f"--no-repair keeps them as searched ({own} repair)",
    )


def _add_decoding_arguments(
    p: argparse.ArgumentParser,
    model_help: str = MODEL_HELP,
    fusion: bool = True,
    backend: bool = True,
    streaming: bool = False,
) -> None:
    """The search arguments, with (`fusion`) `--lm` and `--lm-weight`, and the device's (with
    `backend`, --backend); `streaming` as `_add_search_arguments`."""
    from asr.search import DEFAULT_LM_WEIGHT

    _add_search_arguments(p, model_help, streaming)
    if fusion:
        p.add_argument("--lm", help="language model checkpoint for shallow fusion")
        p.add_argument(
            "--lm-weight",
            type=lm_weight,
            help=f"fusion weight ({DEFAULT_LM_WEIGHT} with --lm; 0 decodes as without it)",
        )
    _add_device_arguments(p, backend)
    p.add_argument("--batch-size", type=count, default=8, help="utterances or segments per batch")
    p.add_argument("--quiet", action="store_true", help="no progress bars")


def _add_device_arguments(p: argparse.ArgumentParser, backend: bool = True) -> None:
    from asr.loading import BACKENDS
    from asr.precision import BF16_STEP_ROWS, PRECISIONS

    p.add_argument("--device", choices=["cpu", "cuda"], help="default: cuda when available")
    p.add_argument(
        "--precision",
        choices=PRECISIONS,
        default="fp32",
        help=f"bf16: the encoder (and the search steps from {BF16_STEP_ROWS} hypotheses, batch x "
        "beam) under bf16 autocast: faster on GPUs and on CPUs with AVX-512 bf16 or AMX (fp32)",
    )
    if not backend:
        return
    p.add_argument(
        "--backend",
        choices=BACKENDS,
        default="torch",
        help="what runs the encoder, CTC head and decoder: PyTorch (torch), or ONNX Runtime on "
        "the CPU from a package exported with `asr export --format onnx` (onnx; onnx-int8: its "
        "quantised graphs)",
    )


def _version() -> str:
    """The installed distribution's version; a source tree run without installing has none."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("asr")
    except PackageNotFoundError:
        return "unknown (not installed: `pip install -e .` records the version)"


def _parser(command: str | None = None) -> argparse.ArgumentParser:
    """The `asr` parser; only `command`'s arguments are added, so a command imports what it
    needs alone (`asr prepare` no torch) and `asr --help` lists the commands."""
    parser = argparse.ArgumentParser(
        prog="asr",
        description="Attention-based speech recognition. Training commands "
        "(fit, validate, test) take LightningCLI options: `asr fit --help`.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__,
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser(
        "prepare",
        help="write train/dev/test JSONL manifests for a corpus",
        description="Read a corpus from --data-dir and write OUT/<split>.jsonl manifests (train, "
        "dev, test; LibriSpeech: one per split folder, also pooled into train, dev and test) "
        "and OUT/summary.json: each split's utterances, hours and speakers, and the inputs left "
        "out. Broken audio or transcripts are also listed on stderr (exit status 1).",
        epilog="example: asr prepare an4 --data-dir an4_sphere.tar.gz --out data/an4",
    )
    if command == "prepare":
        from asr.data.prepare import CORPORA

        p.add_argument(
            "corpus",
            choices=sorted(CORPORA),
            help="an4: CMU AN4 (its folder or .tar.gz); librispeech: a LibriSpeech folder; "
            "yesno: the 60 yes/no recordings; folder: audio files, each with a same-stem .txt "
            "transcript, split at random",
        )
        p.add_argument("--data-dir", required=True, help="corpus root (or .tar.gz for an4)")
        p.add_argument("--out", required=True, help="output directory for the manifests")
        p.add_argument(
            "--splits",
            nargs="+",
            action="extend",
            help="librispeech: split names (default: all found); those prepared into --out "
            "before from the same folder stay",
        )
        p.add_argument("--dev-size", type=int, help="an4: training utterances held out (100)")
    p.set_defaults(run=_prepare)

    p = sub.add_parser(
        "tokenizer",
        help="train a character or SentencePiece tokenizer",
        description="Train a tokenizer on the texts of one or more manifests and write "
        "OUT/tokenizer.json (and, for bpe and unigram, SentencePiece's OUT/tokenizer.model). "
        "The text normalisation (--case, --punctuation) is stored with it and applied to every "
        "text it encodes.",
        epilog="example: asr tokenizer --manifest data/an4/train.jsonl --out tokenizer",
    )
    if command == "tokenizer":
        from asr.text import CASES, PUNCTUATION, TOKENIZER_KINDS, TextNormalizer

        p.add_argument(
            "--manifest", nargs="+", action="extend", required=True, help="training manifest(s)"
        )
        p.add_argument(
            "--kind",
            choices=TOKENIZER_KINDS,
            default="char",
            help="char (the default): the characters of the normalised texts; bpe, unigram: "
            "SentencePiece subwords, a vocabulary of --vocab-size",
        )
        p.add_argument("--vocab-size", type=int, help="bpe/unigram vocabulary size")
        p.add_argument(
            "--case",
            choices=CASES,
            default=TextNormalizer.case,
            help="upper-case or lower-case the texts, or keep their case (%(default)s)",
        )
        p.add_argument(
            "--punctuation",
            choices=PUNCTUATION,
            default=TextNormalizer.punctuation,
            help="remove punctuation (apostrophes inside words stay), or keep it (%(default)s)",
        )
        p.add_argument("--out", required=True, help="output directory")
    p.set_defaults(run=_tokenizer)

    p = sub.add_parser(
        "cmvn",
        help="global mean/variance statistics of a frontend's features",
        description="Statistics for a config's GlobalCMVN. With --config they are taken through "
        "that config's level normaliser and features, as training sees them; without it, "
        "through --n-mels log-mel bands at --sample-rate after --target-dbfs. The file records "
        "the level, and training refuses statistics taken at another level than its config's.",
    )
    if command == "cmvn":
        p.add_argument(
            "--manifest",
            required=True,
            help="JSONL manifest whose audio the statistics are taken over (the training set's)",
        )
        p.add_argument("--out", required=True, help="output JSON file")
        p.add_argument(
            "--config",
            action="append",
            help="a training config (conf/...yaml): its frontend's features",
        )
        p.add_argument("--sample-rate", type=count, help="without --config (default: 16000)")
        p.add_argument("--n-mels", type=count, help="without --config (default: 80)")
        p.add_argument("--max-utterances", type=count, help="use only the first N utterances")
        p.add_argument(
            "--target-dbfs",
            type=number,
            help="without --config: bring each utterance to this RMS level first, as a "
            "frontend with `level: LevelNormalizer` does (default: no level change)",
        )
    p.set_defaults(run=_cmvn)

    p = sub.add_parser(
        "validate-data",
        help="check manifests: audio readable, text in vocab",
        description="Check every line of each manifest before training: its JSON, keys and "
        "types, a unique id, a non-empty text, a duration `asr fit` takes (--min-duration), "
        "and an audio file whose header reads and covers the line's offset and duration "
        "(--full decodes the audio too). Prints each manifest's "
        "count of good and bad lines, then each bad line with the reason (exit status 1). A "
        "manifest without utterances is refused.",
        epilog="example: asr validate-data --manifest data/an4/*.jsonl --full",
    )
    if command == "validate-data":
        p.add_argument(
            "--manifest",
            nargs="+",
            action="extend",
            required=True,
            help="JSONL manifests, each checked on its own",
        )
        p.add_argument("--tokenizer", help="tokenizer directory: also check out-of-vocabulary text")
        from asr.data.manifest import MIN_DURATION

        p.add_argument("--full", action="store_true", help="decode all audio (checks NaN/inf too)")
        p.add_argument(
            "--min-duration",
            type=non_negative,
            default=MIN_DURATION,
            help="seconds: shorter utterances are bad lines, as `asr fit` refuses them "
            "(data.min_duration, %(default)g by default; 0: any length)",
        )
        p.add_argument("--report", help="write the list of bad entries to this file")
    p.set_defaults(run=_validate_data)

    p = sub.add_parser(
        "shard",
        help="write a manifest's audio as WebDataset tar shards, streamed in training",
        description="Write the utterances of a manifest, in its order, into WebDataset tar "
        "shards of at most --shard-hours of audio: each utterance is <key>.<suffix>, its audio "
        "file's bytes unchanged (FLAC, Opus, WAV, SPHERE...; a segment of a longer file is cut "
        "and stored as FLAC of its bit depth, float WAV for float samples; a format "
        "libsndfile cannot read, such as m4a, as 16-bit FLAC), and <key>.json "
        "(id, text, duration, speaker). OUT/shards.json "
        "indexes them (files, sizes, durations). Name the folder as the training data, "
        "`data.train_manifest: OUT`, and `asr fit` streams it: shards split over ranks and "
        "loader workers, a shuffle buffer (data.shuffle_buffer), length-bucketed batches, "
        "exact resume (docs/training.md, Sharded data).",
    )
    if command == "shard":
        from asr.data.shards import DEFAULT_SHARD_HOURS

        p.add_argument("--manifest", required=True, help="JSONL manifest of the training set")
        p.add_argument("--out", required=True, help="shard folder (shard-NNNNNN.tar, shards.json)")
        p.add_argument(
            "--shard-hours",
            type=positive,
            default=DEFAULT_SHARD_HOURS,
            help="most audio per shard, hours (%(default)s); write at least one shard per "
            "rank, better several per loader worker",
        )
        p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(run=_shard)

    # `main` hands these to LightningCLI (asr.train); here they are listed in help and errors.
    for name, text in (
        ("fit", "train a model from a config (LightningCLI: asr fit --help)"),
        ("validate", "losses (and greedy WER) of --ckpt_path on data.val_manifest (LightningCLI)"),
        ("test", "the same on data.test_manifest (LightningCLI)"),
    ):
        sub.add_parser(name, help=text, add_help=False)

    p = sub.add_parser(
        "average",
        help="average the weights of several checkpoints",
        description="Average the floating-point weights of checkpoints of one model into --out "
        "(everything else, the model config and tokenizer among it, comes from the first, but "
        "what asr finalize stored, fitted on its weights alone: finalize the average; no "
        "optimizer state): the checkpoints named, each once, or the --best N that a run's "
        "last.ckpt records as best by its monitored metric.",
    )
    if command == "average":
        group = p.add_mutually_exclusive_group(required=True)
        group.add_argument(
            "--checkpoints", nargs="+", action="extend", help="checkpoint files to average"
        )
        group.add_argument("--last", help="a run's last.ckpt: average the best ones it records")
        p.add_argument("--best", type=count, help=f"with --last: how many best ({DEFAULT_BEST})")
        p.add_argument("--out", required=True, help="output checkpoint")
    p.set_defaults(run=_average)

    p = sub.add_parser(
        "export",
        help="write a shareable model package (safetensors, config, tokenizer, model card)",
        description="Write a recognizer checkpoint as a folder that huggingface_hub's "
        "upload_folder pushes as it is: model.safetensors (loading it runs no code), "
        "config.json (model config, decoding defaults), tokenizer/, CMVN statistics and a "
        "README.md model card. asr.load_model(DIR) and `asr transcribe --model DIR` read it; "
        "after an upload, so do hf://owner/name.",
    )
    if command == "export":
        _add_model_argument(p, "a recognizer checkpoint of `asr fit` or average")
        p.add_argument(
            "--out",
            required=True,
            help="the package folder (files a package does not name are kept)",
        )
        p.add_argument(
            "--format",
            choices=["package", "onnx"],
            default="package",
            help="package: the folder above; onnx: the package plus onnx/, the encoder, CTC head "
            "and decoder step as ONNX graphs and their int8 copies, for --backend onnx / onnx-int8",
        )
        p.add_argument(
            "--calibration",
            metavar="MANIFEST",
            help="with --format onnx: recordings (a manifest, e.g. the training one) on which the "
            "int8 graphs' activation ranges are measured once, so that each utterance's result "
            "no longer depends on the batch it is decoded in (default: ranges taken per batch at "
            "run time)",
        )
        p.add_argument(
            "--calibration-size",
            type=count,
            metavar="N",
            help="recordings taken, spread over the --calibration manifest (32)",
        )
        p.add_argument("--quiet", action="store_true", help="no progress bar")
        p.add_argument(
            "--metrics",
            action="append",
            metavar="METRICS_JSON",
            help="an `asr evaluate` metrics.json: a row of the card's WER/CER tables, named by its "
            "folder (decode_test); repeatable",
        )
        p.add_argument(
            "--repo-id", type=_repo_id, help="owner/name on the Hub: the card's title and examples"
        )
        p.add_argument(
            "--license",
            type=_licence,
            default="other",
            help="Hub licence id, e.g. apache-2.0 (other)",
        )
        p.add_argument("--data", help="the training data, in words (default: its manifests)")
        p.add_argument("--training-command", help="the command that trained the model")
    p.set_defaults(run=_export)

    p = sub.add_parser(
        "finalize",
        help="store a model's default search, word confidences and alignment maps",
        description="Finish a trained model on a dev set, in one rewrite of the checkpoint: "
        "the search settings asr.load_model(CKPT).transcribe(...) and asr transcribe/evaluate "
        "decode with by default (unset options keep the checkpoint's own), the word-confidence "
        "scaling fitted under them (as asr calibrate reports it), and the cross-attention maps "
        "that time words best (as asr choose-heads reports them; Transformer decoders with a "
        "CTC head). A part the model or data cannot give is said and left out. The search is "
        "stored without a language model (a checkpoint keeps none): --lm is given when "
        "decoding. Lines and audio that cannot be used are listed and left out (exit status 1).",
    )
    if command == "finalize":
        _add_decoding_arguments(
            p,
            "a recognizer checkpoint of `asr fit` or average (not a package: finalize "
            "its checkpoint, then export it again)",
            fusion=False,
            backend=False,  # it rewrites a checkpoint; ONNX graphs come from a package
        )
        p.add_argument("--manifest", required=True, help="JSONL manifest with references (dev)")
    p.set_defaults(run=_finalize)

    p = sub.add_parser(
        "transcribe",
        help="transcribe audio of any length, format and container",
        description="Transcribe audio files (any format libsndfile or FFmpeg reads: WAV, FLAC, "
        "MP3, m4a/AAC, MP4 video, WebM/Opus, AMR...). Without --output-dir, each input's "
        "segments are printed as `[MM:SS.mmm --> MM:SS.mmm] text` (after its name where there "
        "are several) and nothing is written. With it, --format files are written there, "
        "mirroring the inputs' paths below the deepest folder they share (alice/001.wav and "
        "bob/001.wav give alice/001.txt and bob/001.txt), and `path<TAB>text` is printed. "
        "Inputs that fail are named with the reason; the others go on (exit status 1).",
    )
    if command == "transcribe":
        from asr.alignment import TIMESTAMP_METHODS
        from asr.levels import ENERGY_FLOOR_DB
        from asr.writers import ALL, FORMATS

        p.add_argument(
            "audio",
            nargs="*",
            help="audio files; folders (searched recursively for audio suffixes); glob patterns, "
            "quoted ('data/**/*.m4a'); .jsonl manifests (audio_filepath, optional offset and "
            "duration); - for audio bytes on stdin",
        )
        p.add_argument(
            "--manifest",
            action="append",
            default=[],
            metavar="M.jsonl",
            help="a JSONL manifest to transcribe, whatever its suffix (as a .jsonl input is); "
            "repeatable; after the positional inputs",
        )
        _add_decoding_arguments(p, streaming=True)
        p.set_defaults(batch_size=None)  # asr.transcribe.TRANSCRIBE_BATCH_SIZE
        p.add_argument(
            "--format",
            nargs="+",
            action="extend",
            choices=[*FORMATS, ALL],
            help="files to write to --output-dir (txt json); all: every one",
        )
        p.add_argument("--output-dir", help="write <path>.<format> files here (default: print)")
        p.add_argument(
            "--explorer",
            action="store_true",
            help="also keep the cross-attention and CTC path of each segment (each final "
            "under --streaming) beside its input's json, and write OUTPUT_DIR/explorer.html: the "
            "page of `asr explore`, a row per segment of long recordings (docs/explorer.md)",
        )
        p.add_argument(
            "--timestamps",
            choices=TIMESTAMP_METHODS,
            default=TIMESTAMP_METHODS[0],
            help="word times: attention, DTW over the decoder's cross-attention (the mean of the "
            "maps asr finalize chose, else of all); ctc, CTC forced alignment of the hypothesis "
            "(needs a CTC head; where it fails, attention's, with a warning) (%(default)s)",
        )
        p.add_argument(
            "--nbest",
            type=count,
            metavar="N",
            help="keep the N best hypotheses of each segment, at most --beam-size: the json file "
            "lists the others, with their scores, under segments[].alternatives",
        )
        p.add_argument(
            "--max-segment-seconds",
            type=_longest_segment,
            help="longer audio is split on silence; more than 2, twice the overlap of the "
            "fixed windows cut where there is none (default: the model's training utterance "
            "length, 95th percentile rounded up, as stored by asr fit; 20 for older checkpoints)",
        )
        p.add_argument(
            "--min-silence-seconds", type=non_negative, help="shortest silence cut (0.3)"
        )
        p.add_argument(
            "--silence-threshold-db",
            type=decibels_below(ENERGY_FLOOR_DB),
            help="silence: dB below the loudest 0.1 s within 5-6 s (-35; digital silence is "
            "-100, always silent; a stretch whose loudest is under -90 has no speech)",
        )
        p.add_argument(
            "--vad",
            choices=["energy", "silero"],
            help="what finds speech to cut long audio at: frame energy (default), or Silero VAD, "
            "which also skips inputs without speech",
        )
        p.add_argument(
            "--words-per-cue", type=whole(0), default=0, help="srt/vtt/tsv: 0 = one per segment"
        )
        spread = p.add_argument_group(
            "several processes",
            "With --workers N, or under `torchrun --standalone --nproc-per-node N -m asr "
            "transcribe ...`, the inputs are dealt to N processes, balanced by duration, and "
            "--output-dir is needed. Each input's files are written whole or not at all, and "
            "OUT/transcripts.jsonl lists every input written there: its manifest fields, "
            "audio_filepath, offset, duration, id, the hypothesis as pred_text, and its files. "
            "A re-run skips the inputs whose files and line are there (and says how many), so "
            "an interrupted run is finished by running it again; use a new --output-dir to "
            "transcribe again with another model. Failures on every process are listed at the "
            "end (exit status 1).",
        )
        spread.add_argument(
            "--workers",
            type=count,
            metavar="N",
            help="start N processes here and share the inputs out to them; this one shows "
            "the progress and writes transcripts.jsonl",
        )
        spread.add_argument(
            "--threads",
            type=count,
            metavar="N",
            help="intra-op threads per process (default: PyTorch's, OMP_NUM_THREADS where set, "
            "and with --workers the cores shared out; torchrun sets OMP_NUM_THREADS=1 unless "
            "it is set)",
        )
        from asr.cli.live import add_stream_arguments

        live = p.add_argument_group(
            "live decoding",
            "--streaming decodes each input as a live stream, chunk by chunk, as `asr serve` "
            "does (a chunk-streaming model: docs/streaming.md). Finals are printed as lines as "
            "their utterance ends; on a terminal the partial is rewritten below them. `-` is "
            "then raw 16-bit mono PCM at the model's rate on stdin, e.g. "
            "`arecord -f S16_LE -r 16000 -c 1 | asr transcribe --streaming --model M -`; Ctrl-C "
            "ends the input there, and what was heard still gets its final. With --output-dir, "
            "each input's transcript is also written there in the --format files when it ends, "
            "and the audio of - as stdin.wav beside stdin.json (for `asr explore`).",
        )
        live.add_argument("--streaming", action="store_true", help="decode as a live stream")
        live.add_argument("--jsonl", action="store_true", help=JSONL_HELP)
        add_stream_arguments(live, final_search="beam")  # one stream: the most accurate final
    p.set_defaults(run=_transcribe)

    p = sub.add_parser(
        "serve",
        help="live recognition over WebSocket, with a microphone page",
        description="Serve a chunk-streaming model: a WebSocket endpoint taking 16-bit PCM and "
        "answering with partial and final transcripts (protocol: docs/streaming.md), and at "
        "http://HOST:PORT/ (https with --certfile) a page that streams the microphone to it. "
        "The chunks of all connected streams go through the model together.",
    )
    if command == "serve":
        from asr.cli.live import add_stream_arguments, origin

        _add_model_argument(p)
        p.add_argument(
            "--beam-size",
            type=count,
            help="CTC prefixes kept and rescored, or the final search's (default: the model's "
            "own, asr finalize, else 10)",
        )
        p.add_argument(
            "--ctc-weight",
            type=weight,
            help="CTC share of a final's score, the rest the attention decoder's (default: the "
            "model's own, else 0.5 rescoring, 0.3 with --final-search beam as offline)",
        )
        p.add_argument("--lm", help="a language model checkpoint that rescores the finals too")
        p.add_argument(
            "--lm-weight", type=lm_weight, help="its weight (0.3 with --lm; 0: not used)"
        )
        _add_device_arguments(p)
        add_stream_arguments(p, final_search="rescore")  # many streams share the model's thread
        p.add_argument(
            "--host",
            default="127.0.0.1",
            help="address to listen on (127.0.0.1: this machine only; 0.0.0.0: the network)",
        )
        p.add_argument("--port", type=port, default=8765, help="port (8765)")
        p.add_argument(
            "--certfile",
            metavar="PEM",
            help="serve https and wss with this certificate (chain): browsers give the "
            "microphone only to https pages and to localhost, so the page opened on other "
            "machines needs it, or an ssh -L tunnel (docs/streaming.md)",
        )
        p.add_argument("--keyfile", metavar="PEM", help="its private key, if not in --certfile")
        p.add_argument(
            "--max-connections", type=count, default=32, help="streams at once; more are refused"
        )
        p.add_argument(
            "--max-per-address",
            type=count,
            metavar="N",
            help="streams one client address may hold at once (any, up to --max-connections): "
            "keeps one machine from taking every place; behind a reverse proxy all streams come "
            "from the proxy's address",
        )
        p.add_argument(
            "--max-backlog",
            type=positive,
            default=30.0,
            metavar="SECONDS",
            help="audio a stream may send ahead of the model (30): past it the server waits "
            "before reading more of it; at full context (--chunk-ms 0) without endpoints "
            "(--endpoint-silence 0) the longest recording",
        )
        p.add_argument(
            "--idle-timeout",
            type=positive,
            default=30.0,
            metavar="SECONDS",
            help="a stream that sends nothing for this long is closed, freeing its place (30)",
        )
        p.add_argument(
            "--allow-origin",
            type=origin,
            action="append",
            default=[],
            metavar="ORIGIN",
            help="browsers may open the socket only from the server's own page, or from a page "
            "at an ORIGIN given here (https://HOST[:PORT]; repeatable): needed behind a reverse "
            "proxy or where the page's address is a host name (docs/streaming.md)",
        )
        p.add_argument(
            "--threads",
            type=count,
            default=1,
            metavar="N",
            help="intra-op threads of the model (1): the other cores are left to the network "
            "and the streams' audio, which more model threads starve (docs/streaming.md)",
        )
    p.set_defaults(run=_serve)

    p = sub.add_parser(
        "connect",
        help="stream audio to a running asr serve and print its results",
        description="A client of `asr serve` (docs/streaming.md): each input is streamed to it "
        "as a recording of its own, and its finals are printed as lines as their utterance "
        "ends, as `asr transcribe --streaming` prints them; on a terminal the partial is "
        "rewritten below them. `-` is raw 16-bit mono PCM at --sample-rate on stdin, e.g. "
        "`arecord -f S16_LE -r 16000 -c 1 | asr connect ws://SERVER:8765/ -`; Ctrl-C ends "
        "the input there, and what was sent still gets its final. Exit status 1 where the "
        "server refused or dropped a stream (its reason is printed).",
    )
    if command == "connect":
        p.add_argument("url", help="the server's WebSocket address: ws://HOST:PORT/ or wss://")
        p.add_argument("audio", nargs="+", help="audio files (any format asr reads), or -")
        p.add_argument(
            "--sample-rate",
            type=count,
            default=16000,
            help="the rate the server's model takes (16000): files are resampled to it",
        )
        p.add_argument("--cafile", metavar="PEM", help="trust this certificate for wss://")
        p.add_argument(
            "--realtime",
            action="store_true",
            help="send files at the pace of speech, as a microphone would (default: at once)",
        )
        p.add_argument("--timeout", type=positive, default=10.0, help="seconds to connect (10)")
        p.add_argument("--quiet", action="store_true", help="no partial line on a terminal")
        p.add_argument("--jsonl", action="store_true", help=JSONL_HELP)
    p.set_defaults(run=_connect)

    p = sub.add_parser(
        "evaluate",
        help="WER/CER of a manifest, error reports, attention plots",
        description="Decode each utterance of a JSONL manifest and score it against its text. "
        "OUT gets metrics.json (WER, CER, error counts, real-time factor), hyp.txt and ref.txt "
        "(`id text` lines), errors.txt (each utterance's word alignment, then the most frequent "
        "errors), attention plots (--plots) in OUT/alignments/ and explorer.html. Lines and "
        "audio that cannot be used are listed and left out (exit status 1).",
    )
    if command == "evaluate":
        _add_decoding_arguments(p)
        p.add_argument("--manifest", required=True, help="JSONL manifest with references")
        p.add_argument("--out", required=True, help="output directory")
        p.add_argument("--plots", type=whole(0), default=5, help="plot the first N utterances (5)")
        p.add_argument(
            "--plot-ids", nargs="+", action="extend", help="plot these utterance ids instead"
        )
        p.add_argument(
            "--chunk-ms",
            type=non_negative,
            help="a chunk-streaming model decoded as it streams: self-attention in chunks of "
            "this many ms (rounded to whole encoder frames), every chunk before in view; the "
            "search gives the finals of `asr transcribe --streaming --final-search beam` "
            "(default, or 0: full context)",
        )
        p.add_argument(
            "--no-explorer",
            dest="explorer",
            action="store_false",
            help="do not write OUT/explorer.html (`asr explore OUT` writes it later)",
        )
    p.set_defaults(run=_evaluate)

    p = sub.add_parser(
        "robustness",
        help="WER/CER under level, noise, reverberation, telephone and speed changes",
        description="Build perturbed copies of a test manifest (16-bit WAV, from a fixed seed: "
        "rebuilt identically anywhere), evaluate the model on each, and print one table. "
        "Babble is made of other utterances of the same manifest; reverberation uses "
        "simulated rooms of the given RT60.",
    )
    if command == "robustness":
        from asr.robustness import DEFAULT_CONDITIONS

        _add_decoding_arguments(p)
        p.add_argument("--manifest", required=True, help="JSONL manifest with references")
        p.add_argument("--out", required=True, help="output directory (copies, reports, table)")
        p.add_argument(
            "--conditions",
            nargs="+",
            action="extend",
            help="KIND or KIND:VALUE among clean, level:DB (-120 to 120), "
            "white|pink|brown|babble:SNR_DB (-60 to 120), reverb:RT60_S (at most 10), "
            "telephone, speed:FACTOR (0.1 to 10), pad:SECONDS (at most 60); + before a "
            "kind chains them in order, e.g. pad:10+white:10 (level:+6 is a sign) (default: all "
            f"of {' '.join(DEFAULT_CONDITIONS)})",
        )
        p.add_argument(
            "--seed", type=whole(0), default=0, help="seed of the noise, talkers, rooms (0)"
        )
    p.set_defaults(run=_robustness)

    p = sub.add_parser(
        "choose-heads",
        help="choose the cross-attention maps that time words (Transformers)",
        description="Align each reference of a manifest (dev) by teacher forcing, compare each "
        "cross-attention map's DTW word boundaries with CTC forced alignment, and choose the "
        "best maps: a table of the mean and 90th-percentile boundary difference (ms) of all "
        "maps averaged, the chosen ones, and each map (asr finalize stores the choice); "
        "--heads scores given maps instead (e.g. the stored ones on test).",
    )
    if command == "choose-heads":
        _add_model_argument(p)
        p.add_argument("--manifest", required=True, help="JSONL manifest with references (dev)")
        p.add_argument(
            "--heads",
            type=int,
            nargs="+",
            action="extend",
            help="score these maps (layer * heads + head)",
        )
        p.add_argument("--quiet", action="store_true", help="no progress bar")
        _add_device_arguments(p)
    p.set_defaults(run=_choose_heads)

    p = sub.add_parser(
        "calibrate",
        help="fit word confidences to the share of words right on a dev set",
        description="Decode a manifest (dev) with the given search settings (default: the "
        "checkpoint's own), label each hypothesis word right or wrong by its alignment with "
        "the reference, and fit confidence = sigmoid(scale * log(probability) + ctc_scale * "
        "log(ctc_probability) + bias) by logistic regression (ctc_scale 0 without a CTC "
        "head). Prints the expected calibration error (ECE) and ROC area before and after on "
        "those words (asr finalize stores the scaling: its words then carry it as "
        "`confidence`). With one probability the map keeps the words' order (the ROC area "
        "stays); with both, it ranks the words anew. Lines and audio that cannot be used are "
        "listed and left out (exit status 1).",
    )
    if command == "calibrate":
        _add_decoding_arguments(p)
        p.add_argument("--manifest", required=True, help="JSONL manifest with references (dev)")
    p.set_defaults(run=_calibrate)

    p = sub.add_parser(
        "curves",
        help="plot training curves (dev loss, CTC loss, WER...) of one or more runs",
        description="Read each run's CSV log (an `asr fit` run folder, its logs/version_*/ "
        "folders in order, or a metrics.csv) and plot the chosen metrics against optimizer "
        "steps, one panel per metric and one line per run.",
    )
    if command == "curves":
        p.add_argument(
            "runs", nargs="+", help="run folders (trainer.default_root_dir) or metrics.csv"
        )
        p.add_argument(
            "--out",
            required=True,
            type=_picture_file,
            help="plot file to write (PNG, or another suffix matplotlib writes)",
        )
        p.add_argument(
            "--metrics",
            nargs="+",
            action="extend",
            help=f"names to plot (default: those of {CURVES} logged)",
        )
        p.add_argument(
            "--labels",
            nargs="+",
            action="extend",
            help="legend names, one per run (default: folder names)",
        )
    p.set_defaults(run=_curves)

    p = sub.add_parser(
        "align",
        help="align a known transcript: word times and a plot",
        description="Align a known transcript to an audio file by teacher forcing the decoder. "
        "Prints each word's start and end in seconds, from the cross-attention and, with a CTC "
        "head, from CTC forced alignment, and plots the spectrogram, the attention and the word "
        "boundaries to --out.",
    )
    if command == "align":
        p.add_argument("audio", help="an audio file, or - for audio piped to stdin")
        _add_model_argument(p)
        p.add_argument("--text", required=True, help="the transcript")
        p.add_argument(
            "--out",
            required=True,
            type=_picture_file,
            help="plot file (PNG, or another suffix matplotlib writes); decoders of several "
            "attention maps (Transformers) add _heads, one map per layer and head",
        )
        _add_device_arguments(p)
    p.set_defaults(run=_align)

    p = sub.add_parser(
        "explore",
        help="one self-contained HTML page of a decode, transcription or training run folder",
        description="Write an interactive page (no network needed to open it): for a decode "
        "folder of `asr evaluate`, the WER table of its utterances, each with its audio, "
        "spectrogram, words against the reference and cross-attention of every head; for an "
        "output folder of `asr transcribe`, its transcripts, a row per segment of long "
        "recordings (with attention where --explorer kept it); for a training run folder, the "
        "curves by epoch and the attention plots forming over epochs.",
    )
    if command == "explore":
        from asr.explore import MAX_MEGABYTES

        p.add_argument("folder", help="decode, transcription or training run folder")
        p.add_argument("--out", help="the HTML file (default: FOLDER/explorer.html)")
        p.add_argument(
            "--link-audio",
            action="store_true",
            help="link the audio files by relative path instead of embedding them as Opus "
            "(a smaller page that plays while the files stay where they are)",
        )
        p.add_argument(
            "--max-mb",
            type=float,
            default=MAX_MEGABYTES,
            help="megabytes of pictures, cross-attention maps and embedded audio the page may "
            "hold, given to the worst utterances first (by WER; a transcription folder's rows "
            "in order): the rows past it keep their text and a link to their audio, flagged "
            "'maps left out'; a training run's page keeps the attention plots of evenly "
            "spread epochs (default %(default)g; 0: no limit)",
        )
        p.add_argument(
            "--compare",
            metavar="DECODE_DIR",
            help="another decode of the same utterances (B) beside FOLDER's (A): its WER, each "
            "utterance's WER, difference and hypothesis against the reference, how many "
            "utterances have fewer or more errors, and WER(B) - WER(A) with a 95 %% paired "
            "bootstrap interval",
        )
        p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(run=_explore)
    return parser


def _stdin_read_at_once(command: str | None, argv: Sequence[str]):
    """A `StdinPcm` reading now where the command streams stdin (`transcribe --streaming -`):
    the parser imports torch, seconds in which a microphone's full pipe drops audio. None
    otherwise, and where stdin cannot be read (the command then says why)."""
    valued = ("--manifest", "--output-dir", "--model", "--checkpoint", "--lm")  # `-` a file

    def a_value(i: int) -> bool:  # of one of those, however abbreviated (`--out -`)
        before = argv[i - 1]
        return len(before) > 2 and any(option.startswith(before) for option in valued)

    named = [a for i, a in enumerate(argv) if a == "-" and (i == 0 or not a_value(i))]
    if command != "transcribe" or "--streaming" not in argv or not named:
        return None
    from asr.cli.console import StdinPcm

    try:
        return StdinPcm()
    except ValueError:
        return None


# Options that name files or folders. A quoted `~/...` is read as a shell gives it: an input
# as load_model reads it and as written back (finalize), an output not as a folder named `~`
# that the next command, given the same `~/...`, would not find.
PATH_OPTIONS = ("audio", "runs", "folder", "checkpoint", "checkpoints", "last", "lm", "manifest",
                "tokenizer", "data_dir", "calibration", "metrics", "compare", "config", "out",
                "output_dir", "report", "certfile", "keyfile", "cafile")  # fmt: skip


def _home_expanded(value: str | list) -> str | list:
    """`value` (or each of a list's strings) with a leading `~` read as the home folder."""
    if isinstance(value, list):
        return [_home_expanded(v) if isinstance(v, str) else v for v in value]
    return os.path.expanduser(value) if value.startswith("~") else value


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in LIGHTNING_COMMANDS:
        from asr.train import run_lightning_cli

        run_lightning_cli(argv)
        return 0
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    command = next((a for a in argv if not a.startswith("-")), None)
    stdin = _stdin_read_at_once(command, argv)
    try:
        args = _parser(command).parse_args(argv)  # imports torch: seconds on a cold start
    except KeyboardInterrupt:
        print(f"asr {command}: interrupted" if command else "asr: interrupted", file=sys.stderr)
        return 130
    if stdin is not None:
        args.stdin_pcm = stdin
    for name in PATH_OPTIONS:
        value = getattr(args, name, None)
        if isinstance(value, (str, list)):
            setattr(args, name, _home_expanded(value))
    try:
        with warnings_said_by(args.command):
            return args.run(args)
    except BrokenPipeError:  # the reader of stdout went away (`| head`): end quietly, as tools do
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no error at exit flush
        return 128 + signal.SIGPIPE
    except (ValueError, OSError) as err:  # OSError: a path that is missing, a folder, ...
        print(f"asr {args.command}: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # Ctrl-C: no traceback, the shell's status for SIGINT
        more = ""
        if args.command == "transcribe" and getattr(args, "output_dir", None):
            from asr.cli.parallel import spreads

            more = f"; the files written stay in {args.output_dir}"
            with contextlib.suppress(ValueError):  # options it refuses: no run to resume
                if not args.streaming and spreads(args):
                    more += " (a re-run resumes where it stopped)"
        print(f"asr {args.command}: interrupted{more}", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
