"""`python -m bench {peak,train,loader,decode,scaling,peer,espnet,all,report} [options]`

Each part writes `<part>.json` into the results folder; after every run the report
(results.json, results.md, bench.png) is rebuilt from all the part files there.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import logging
import os
import platform
import subprocess
import sys
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from asr.cli.numbers import count
from bench import decode, espnet, loader, peak, peer, report, scaling, train
from bench.common import ROOT, Settings, device_option, ensure_data, write_json

EPILOG = """parts:
  peak     matmul GFLOP/s in fp32 and bf16: the machine limit MFU divides by
  train    training step throughput, memory and MFU of conf/an4/{transformer,conformer,rnn}.yaml,
           then whole `asr fit` epochs of each
  loader   seconds per epoch of loading the training set, with and without augmentation
  decode   RTF of greedy / beam 10 / beam 10 + CTC at batch 1, 8, 32 on AN4 test
  scaling  DDP 1 vs 2 CPU processes; decode time vs length; step time vs batch size
  peer     ours vs SpeechBrain's TransformerASR at the same size (pip install -e '.[bench]')
  espnet   ours vs ESPnet's Transformer ASR at its size (make espnet-env, then run with
           .venv-espnet/bin/python -m bench espnet)
  all      every part, each in a fresh process, then the report
  report   rebuild results.json, results.md and bench.png from the part files
"""

PARTS: dict[str, Callable[[Settings], dict[str, Any]]] = {
    "peak": peak.run,
    "train": train.run,
    "loader": loader.run,
    "decode": decode.run,
    "scaling": scaling.run,
    "peer": peer.run,
    "espnet": espnet.run,
}
DEFAULT_CHECKPOINT = ROOT / "exp/an4/transformer/avg.ckpt"
ESPNET_PYTHON = ROOT / ".venv-espnet/bin/python"  # `make espnet-env`


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench",
        description="Benchmarks of the asr package (see bench/README.md).",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("command", choices=[*PARTS, "all", "report"], help="part(s) to run")
    parser.add_argument("--out", type=Path, default=ROOT / "bench/results", help="results folder")
    parser.add_argument("--quick", action="store_true", help="tiny sizes: a smoke run")
    parser.add_argument("--threads", type=count, help="torch threads (default: torch's choice)")
    parser.add_argument("--device", type=device_option, default="cpu", help="cpu, cuda, cuda:1 ...")
    parser.add_argument(
        "--checkpoint",
        help=f"recognizer to decode with (default: {DEFAULT_CHECKPOINT.relative_to(ROOT)} if it "
        "exists, else a randomly initialised conf/an4/transformer.yaml model; 'random' forces "
        "the latter)",
    )
    parser.add_argument(
        "--data", type=Path, default=ROOT / "data/an4", help="prepared AN4 (asr prepare an4)"
    )
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args(argv)


def make_settings(args: argparse.Namespace) -> Settings:
    if args.threads:
        torch.set_num_threads(args.threads)
    checkpoint = None if args.checkpoint == "random" else args.checkpoint
    if args.checkpoint is None and DEFAULT_CHECKPOINT.exists():
        checkpoint = DEFAULT_CHECKPOINT
    if checkpoint is not None and not Path(checkpoint).exists():
        raise SystemExit(f"--checkpoint {checkpoint} does not exist")
    return Settings(
        out=args.out,
        quick=args.quick,
        device=torch.device(args.device),
        threads=torch.get_num_threads(),
        data=ensure_data(args.data, args.out),
        checkpoint=Path(checkpoint) if checkpoint else None,
        seed=args.seed,
    )


def machine(settings: Settings, argv: Sequence[str]) -> dict[str, Any]:
    """Where, with what and how the results were measured."""
    return {
        "command": "python -m bench " + " ".join(argv),
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "git": _git_version(),
        "torch": torch.__version__,
        "lightning": importlib.metadata.version("lightning"),
        "python": platform.python_version(),
        "cpu": _cpu_name(),
        "cpu_count": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "threads": settings.threads,
        "device": str(settings.device),
        "gpu": torch.cuda.get_device_name(settings.device) if settings.on_gpu else None,
        "quick": settings.quick,
        "data": str(settings.data),
        "checkpoint": str(settings.checkpoint) if settings.checkpoint else None,
    }


def _git_version() -> str | None:
    """The checkout's short commit hash, `-dirty` when it has uncommitted changes."""
    command = ["git", "describe", "--always", "--dirty", "--abbrev=7"]
    try:
        done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        return None
    return done.stdout.strip()


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def run_part(name: str, settings: Settings, meta: dict[str, Any]) -> bool:
    """Run part `name` and save its result with `meta`; a failing part saves its error.
    Returns whether it succeeded."""
    logging.info("bench: running %s", name)
    try:
        result, ok = PARTS[name](settings), True
    except Exception as err:  # still write the error, for the report
        traceback.print_exc()
        result, ok = {"error": f"{type(err).__name__}: {err}"}, False
    write_json(settings.out / f"{name}.json", {"machine": meta, "result": result})
    return ok


def python_for(part: str) -> str:
    """The interpreter of a part: ESPnet's environment for `espnet` where it exists."""
    if part == "espnet" and ESPNET_PYTHON.exists():
        return str(ESPNET_PYTHON)
    return sys.executable


def run_isolated(names: Sequence[str], argv: Sequence[str], out: Path) -> bool:
    """Run each part as its own `python -m bench PART` process with the options of `argv` (an
    `all` command), so that no part runs on the heap, caches or threads an earlier part left
    behind. A part whose process saves nothing is reported as an error, not by an earlier
    run's file."""
    options = list(argv)
    options.remove("all")
    ok = True
    for name in names:
        saved = out / f"{name}.json"
        saved.unlink(missing_ok=True)
        command = [python_for(name), "-m", "bench", name, *options]
        code = subprocess.run(command, stdout=subprocess.DEVNULL).returncode
        if not saved.exists():
            error = f"`python -m bench {name}` exited with {code} and saved no result"
            write_json(saved, {"result": {"error": error}})
        ok &= code == 0
    return ok


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    args = parse_args(argv)
    part = args.command not in ("all", "report")
    settings = make_settings(args) if part else None  # a missing checkpoint: no folder made
    args.out.mkdir(parents=True, exist_ok=True)
    ok = True
    if args.command == "all":
        ok = run_isolated(list(PARTS), argv, args.out)
    elif part:
        ok = run_part(args.command, settings, machine(settings, argv))
    print(report.write(args.out))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
