"""The `asr` command: a thin layer over the library.

asr prepare CORPUS --data-dir DIR --out DIR     manifests (JSONL) + summary
asr tokenizer --manifest M --kind char|bpe|unigram [--vocab-size N] --out DIR
asr cmvn --manifest M --out stats.json          global CMVN statistics
asr validate-data --manifest M [--tokenizer DIR] check audio and text up front
asr fit|validate|test --config conf/...yaml     training (LightningCLI)
asr average --last exp/.../checkpoints/last.ckpt --best 5 --out avg.ckpt
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from pathlib import Path

LIGHTNING_COMMANDS = ("fit", "validate", "test", "predict")


def _prepare(args: argparse.Namespace) -> int:
    from asr.data.prepare import prepare_corpus

    options = {}
    if args.splits:
        options["splits"] = args.splits
    if args.dev_size is not None:
        options["dev_size"] = args.dev_size
    prepare_corpus(args.corpus, args.data_dir, args.out, **options)  # logs its summary
    return 0


def _tokenizer(args: argparse.Namespace) -> int:
    from asr.text import TextNormalizer, train_tokenizer

    normalizer = TextNormalizer(case=args.case, punctuation=args.punctuation)
    manifests = [Path(m) for m in args.manifest]
    tok = train_tokenizer(manifests, args.kind, args.vocab_size, args.out, normalizer)
    print(f"{args.kind} tokenizer with {tok.vocab_size} tokens written to {args.out}")
    return 0


def _cmvn(args: argparse.Namespace) -> int:
    from asr.frontends import LogMelFilterbank, compute_cmvn_stats

    frontend = LogMelFilterbank(sample_rate=args.sample_rate, n_mels=args.n_mels)
    stats = compute_cmvn_stats(
        args.manifest, frontend, args.out, args.sample_rate, max_utterances=args.max_utterances
    )
    print(f"CMVN statistics over {int(stats.count)} frames written to {args.out}")
    return 0


def _validate_data(args: argparse.Namespace) -> int:
    from asr.data.manifest import validate_manifest
    from asr.text import Tokenizer

    tokenizer = Tokenizer.load(args.tokenizer) if args.tokenizer else None
    failed = 0
    for manifest in args.manifest:
        report = validate_manifest(manifest, tokenizer, check_audio="full" if args.full else True)
        print(f"{manifest}: {len(report.good)} good, {len(report.bad)} bad")
        for entry in report.bad:
            print(f"  {entry.location}: {entry.reason}")
        if args.report:
            report.write(args.report)
        failed += len(report.bad)
    return 1 if failed else 0


def _average(args: argparse.Namespace) -> int:
    from asr.checkpoint import average_checkpoints, best_checkpoints

    paths = args.checkpoints or best_checkpoints(args.last, args.best)
    average_checkpoints(paths, args.out)
    print(f"averaged {len(paths)} checkpoints into {args.out}:")
    for path in paths:
        print(f"  {path}")
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="asr",
        description="Attention-based speech recognition. Training commands "
        "(fit, validate, test) take LightningCLI options: `asr fit --help`.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__,
    )
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("prepare", help="write train/dev/test JSONL manifests for a corpus")
    p.add_argument("corpus", choices=["an4", "librispeech", "yesno", "folder"])
    p.add_argument("--data-dir", required=True, help="corpus root (or .tar.gz for an4)")
    p.add_argument("--out", required=True, help="output directory for the manifests")
    p.add_argument("--splits", nargs="+", help="librispeech: split names (default: all found)")
    p.add_argument("--dev-size", type=int, help="an4: training utterances held out (100)")
    p.set_defaults(run=_prepare)

    p = sub.add_parser("tokenizer", help="train a character or SentencePiece tokenizer")
    p.add_argument("--manifest", nargs="+", required=True, help="training manifest(s)")
    p.add_argument("--kind", choices=["char", "bpe", "unigram"], default="char")
    p.add_argument("--vocab-size", type=int, help="bpe/unigram vocabulary size")
    p.add_argument("--case", choices=["upper", "lower", "keep"], default="upper")
    p.add_argument("--punctuation", choices=["remove", "keep"], default="remove")
    p.add_argument("--out", required=True, help="output directory")
    p.set_defaults(run=_tokenizer)

    p = sub.add_parser("cmvn", help="global mean/variance statistics of log-mel features")
    p.add_argument("--manifest", required=True)
    p.add_argument("--out", required=True, help="output JSON file")
    p.add_argument("--sample-rate", type=int, default=16000)
    p.add_argument("--n-mels", type=int, default=80)
    p.add_argument("--max-utterances", type=int, help="use only the first N utterances")
    p.set_defaults(run=_cmvn)

    p = sub.add_parser("validate-data", help="check manifests: audio readable, text in vocab")
    p.add_argument("--manifest", nargs="+", required=True)
    p.add_argument("--tokenizer", help="tokenizer directory: also check out-of-vocabulary text")
    p.add_argument("--full", action="store_true", help="decode all audio (checks NaN/inf too)")
    p.add_argument("--report", help="write the list of bad entries to this file")
    p.set_defaults(run=_validate_data)

    p = sub.add_parser("average", help="average the weights of several checkpoints")
    group = p.add_mutually_exclusive_group(required=True)
    group.add_argument("--checkpoints", nargs="+", help="checkpoint files to average")
    group.add_argument("--last", help="a run's last.ckpt: average the best ones it records")
    p.add_argument("--best", type=int, default=5, help="with --last: how many best (5)")
    p.add_argument("--out", required=True, help="output checkpoint")
    p.set_defaults(run=_average)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in LIGHTNING_COMMANDS:
        from asr.train import run_lightning_cli

        run_lightning_cli(argv)
        return 0
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    args = _parser().parse_args(argv)
    try:
        return args.run(args)
    except (ValueError, FileNotFoundError) as err:
        print(f"asr {args.command}: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
