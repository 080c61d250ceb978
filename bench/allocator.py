"""Interleaved A/B of `asr.malloc.retain_freed_memory` on the peer part's bf16 training step.

    .venv/bin/python -m bench.allocator [--rounds 3] [--steps 8]

Each round runs ours and SpeechBrain's model (bench/peer.py: same size, same AN4 batches as
features) in fresh processes, under glibc's malloc defaults (`ASR_KEEP_MALLOC_DEFAULTS=1`) and
tuned, in turn. A process trains one untimed pass over the batches, then 3 timed passes, and
reports audio seconds per second over whole passes (every step, as a training run sees them)
and its minor page faults per pass. Not part of `bench all` (~1 min per process).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys

import torch

from asr.malloc import OPT_OUT, retain_freed_memory
from bench import peer
from bench.common import ROOT, Settings, measure_steps, train_batches
from bench.report import whole_passes_rate

MODES = ("default", "tuned")


def child(system_name: str, steps: int) -> dict[str, float]:
    """One process's measurement; `retain_freed_memory` honours the opt-out `main` sets."""
    tuned = retain_freed_memory()
    cpu, data = torch.device("cpu"), ROOT / "data/an4"
    settings = Settings(ROOT / "bench/results", False, cpu, torch.get_num_threads(), data, None)
    ours, speechbrain, frontend = peer.build_systems(settings)
    system = ours if system_name == "ours" else speechbrain
    raw = train_batches("transformer", settings, steps, None)
    batches = [peer.features(frontend, b.waves, b.wave_lens, b.tokens, b.token_lens) for b in raw]
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    step, audio = peer.training_step(system, "bf16", settings), [b.audio_seconds for b in batches]
    result = measure_steps(step, batches, audio, len(batches), cpu, settings.pick(1, 3))
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults
    return {
        "tuned": tuned,
        "audio_seconds_per_second": whole_passes_rate(result),
        "minor_faults_per_pass": faults / (result["passes"] + 1),  # the warm-up pass included
    }


def run_child(system: str, mode: str, steps: int) -> dict[str, float]:
    env = {k: v for k, v in os.environ.items() if k != OPT_OUT}
    if mode == "default":
        env[OPT_OUT] = "1"
    command = [sys.executable, "-m", "bench.allocator", "--child", system, "--steps", str(steps)]
    proc = subprocess.run(command, env=env, cwd=ROOT, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed:\n{proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3, help="A/B rounds (3)")
    parser.add_argument("--steps", type=int, default=8, help="training batches per pass (8)")
    parser.add_argument("--child", choices=["ours", "speechbrain"], help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    os.environ.setdefault("SB_DISABLE_QUIRKS", "allow_tf32,disable_jit_profiling")
    if args.child:
        print(json.dumps(child(args.child, args.steps)))
        return 0
    runs: dict[tuple[str, str], list[dict[str, float]]] = {}
    for round_ in range(args.rounds):
        for system in ("ours", "speechbrain"):
            for mode in MODES:
                result = run_child(system, mode, args.steps)
                runs.setdefault((system, mode), []).append(result)
                print(f"round {round_ + 1} {system:11s} {mode:7s} {json.dumps(result)}", flush=True)
    print("\n| system | malloc | bf16 audio s / s (mean of rounds) | minor faults / pass |")
    print("|---|---|---|---|")
    for (system, mode), results in runs.items():
        rate = statistics.mean(r["audio_seconds_per_second"] for r in results)
        faults = statistics.mean(r["minor_faults_per_pass"] for r in results)
        print(f"| {system} | {mode} | {rate:.1f} | {faults:.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
