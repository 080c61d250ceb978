"""What every benchmark part shares: the `asr` names it uses, settings, AN4 data, models built
from the YAML configs, timing, peak memory, FLOP counting and profiles."""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import math
import os
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import yaml
from torch import Tensor, nn

# Every `asr` import of the harness, so that a renamed module is changed here only.
from asr.audio import load_audio
from asr.checkpoint import instantiate
from asr.data.dataset import Batch, SpeechDataset, collate
from asr.data.manifest import read_manifest
from asr.frontends.normalize import CMVNStats
from asr.lightning import ASRDataModule, ASRModule
from asr.metrics import word_errors
from asr.models.seq2seq import Seq2Seq, add_sos_eos
from asr.precision import PRECISIONS, autocast
from asr.recognizer import Recognizer, load_model
from asr.search import SearchOptions, beam_search
from asr.segment import SegmenterOptions, segment_seconds_for
from asr.text import BLANK_ID, PAD_ID, SOS_EOS_ID, Tokenizer

__all__ = [  # the asr names the parts take from here
    "BLANK_ID", "PAD_ID", "PRECISIONS", "SOS_EOS_ID", "Batch", "CMVNStats", "Recognizer",
    "SearchOptions", "SegmenterOptions", "Seq2Seq", "SpeechDataset", "Tokenizer", "add_sos_eos",
    "autocast", "beam_search", "collate", "load_audio", "load_model", "read_manifest",
    "segment_seconds_for", "word_errors",
]  # fmt: skip

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = {
    "transformer": ROOT / "conf/an4/transformer.yaml",
    "conformer": ROOT / "conf/an4/conformer.yaml",
    "rnn": ROOT / "conf/an4/rnn.yaml",
}
CORPORA = Path(os.environ.get("ASR_CORPORA", ROOT.parent / "shared" / "corpora"))
SAMPLE_RATE = 16000


@dataclass(frozen=True)
class Settings:
    """Options shared by every part (see `python -m bench --help`)."""

    out: Path  # results folder
    quick: bool  # tiny sizes for a smoke run
    device: torch.device
    threads: int  # torch intra-op threads used for every measurement
    data: Path  # folder with {train,dev,test}.jsonl, tokenizer/ and cmvn.json
    checkpoint: Path | None  # trained recognizer for decoding; None: random initialisation
    seed: int = 0  # batch order, speed perturbation and weight initialisation
    max_len_ratio: float = 0.5  # search stops after this many tokens per encoder frame

    def pick(self, quick: Any, full: Any) -> Any:
        """`quick` in a smoke run, else `full`."""
        return quick if self.quick else full

    @property
    def on_gpu(self) -> bool:
        return self.device.type == "cuda"

    def passes(self, cpu: int) -> int:
        """Timed passes of a decode measurement, the fastest counting: `cpu` on a CPU (a shared
        machine stalls now and then); one in a smoke run, or on a GPU, where batch-1 beam
        searches are launch-bound and slow to repeat."""
        return 1 if self.quick or self.on_gpu else cpu


def device_option(name: str) -> str:
    """An argparse type: a torch device name, refused up front where it names CUDA and no
    CUDA device is available (rather than after minutes of CPU work)."""
    try:
        device = torch.device(name)
    except RuntimeError:
        raise argparse.ArgumentTypeError(f"not a torch device: {name!r}") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise argparse.ArgumentTypeError(f"{name}: no CUDA device is available")
    return name


# ---------------------------------------------------------------- data and models


def ensure_data(data: Path, out: Path) -> Path:
    """`data` when it holds manifests, tokenizer and CMVN statistics; else prepare AN4 from
    ../shared/corpora/an4 into `out/data` (once) and return that, saying so on stderr."""
    missing = _missing(data)
    if not missing:
        return data
    target = out / "data"
    lacks = f"lacks {', '.join(missing)}" if data.exists() else "does not exist"
    why = f"bench: --data {data} {lacks}; using {target}"
    if not _missing(target):
        print(f"{why} (AN4, prepared there by an earlier run)", file=sys.stderr, flush=True)
        return target
    source = CORPORA / "an4"
    if not source.exists():
        raise FileNotFoundError(
            f"no prepared data at {data} and no AN4 corpus at {source} to prepare it from"
        )
    print(f"{why}, preparing AN4 there from {source}", file=sys.stderr, flush=True)
    from asr.data.cmvn import compute_cmvn_stats
    from asr.data.prepare import prepare_corpus
    from asr.frontends import Frontend, LevelNormalizer, LogMelFilterbank
    from asr.text import train_tokenizer

    prepare_corpus("an4", source, target)
    train_tokenizer(target / "train.jsonl", "char", None, target / "tokenizer")
    features = Frontend(LogMelFilterbank(n_mels=80), level=LevelNormalizer(-26.0))  # as conf/an4
    compute_cmvn_stats(target / "train.jsonl", features, target / "cmvn.json")
    return target


def _missing(data: Path) -> list[str]:
    """What a prepared data folder needs and `data` lacks."""
    needed = ("train.jsonl", "dev.jsonl", "test.jsonl", "tokenizer", "cmvn.json")
    return [name for name in needed if not (data / name).exists()]


def read_config(name: str) -> dict[str, Any]:
    """The whole YAML config `conf/an4/<name>.yaml`."""
    return yaml.safe_load(CONFIGS[name].read_text())


def clip_value(name: str) -> float | None:
    """The gradient clipping value of config `name` (its `trainer.gradient_clip_val`)."""
    return read_config(name).get("trainer", {}).get("gradient_clip_val")


def model_config(name: str, data: Path, overrides: dict[str, Any] | None = None) -> dict:
    """`ASRModule` init args of config `name`, data paths pointed at `data`, with `overrides`
    merged in (nested dicts merge key by key)."""
    config = _merged(read_config(name)["model"]["init_args"], overrides or {})
    config = with_stats_path(config, data)
    config["tokenizer"] = str(data / "tokenizer")
    config["vocab_size"] = Tokenizer.load(data / "tokenizer").vocab_size
    return config


def _merged(base: dict, overrides: dict) -> dict:
    merged = copy.deepcopy(base)
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _merged(merged[key], value)
        else:
            merged[key] = value
    return merged


def with_stats_path(config: Any, data: Path) -> Any:
    """`config` (model init args) with every `stats_path` (CMVN statistics) under `data`."""
    if isinstance(config, dict):
        return {
            k: str(data / "cmvn.json") if k == "stats_path" else with_stats_path(v, data)
            for k, v in config.items()
        }
    if isinstance(config, list):
        return [with_stats_path(v, data) for v in config]
    return config


def build_module(config: dict[str, Any], seed: int = 0) -> ASRModule:
    """The `ASRModule` of `model_config` output, built as `asr fit` builds it (jsonargparse),
    with weights drawn from `seed`."""
    torch.manual_seed(seed)
    return instantiate(ASRModule, config)


def data_args(config: dict[str, Any], data: Path) -> dict[str, Any]:
    """A config's data module init args with its manifests and tokenizer under `data`."""
    args = dict(config["data"]["init_args"])
    for split in ("train", "val", "test"):
        key = f"{split}_manifest"
        if args.get(key):
            args[key] = str(data / Path(args[key]).name)
    return {**args, "tokenizer": str(data / "tokenizer")}


def train_batches(
    name: str, settings: Settings, count: int | None = None, max_batch_seconds: float | None = None
) -> list[Batch]:
    """The first `count` training batches of config `name` (its sampler or shape grid, speed
    perturbation and batch budget unless `max_batch_seconds`), seeded, on the device; `None`:
    every batch of the first epoch."""
    args = data_args(read_config(name), settings.data)
    args.update(num_workers=0, seed=settings.seed)
    if max_batch_seconds is not None:
        args["max_batch_seconds"] = max_batch_seconds
    module = instantiate(ASRDataModule, args)  # builds the nested augmentation config too
    module.setup("fit")
    if count is None:
        return [batch.to(settings.device) for batch in module.train_dataloader()]
    batches: list[Batch] = []
    while len(batches) < count:  # cycle when an epoch has fewer batches
        for batch in module.train_dataloader():
            batches.append(batch.to(settings.device))
            if len(batches) == count:
                break
    return batches


def audio_seconds(wave_lens: Tensor) -> float:
    """Seconds of audio in a batch, padding excluded."""
    return float(wave_lens.sum()) / SAMPLE_RATE


def count_parameters(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


# ---------------------------------------------------------------- timing and memory


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn: Callable[[], Any], device: torch.device) -> float:
    """Wall seconds of `fn()`, the device's queued work included."""
    return timed_call(fn, device)[0]


def timed_call(fn: Callable[[], Any], device: torch.device) -> tuple[float, Any]:
    """Wall seconds of `fn()`, the device's queued work included, and what it returned."""
    synchronize(device)
    start = time.perf_counter()
    value = fn()
    synchronize(device)
    return time.perf_counter() - start, value


def fastest(repeats: int, measure: Callable[[], tuple[float, Any]]) -> tuple[float, Any]:
    """The smallest time of `repeats` calls of `measure` (each returning seconds and a value),
    and the first call's value."""
    passes = [measure() for _ in range(repeats)]
    return min(seconds for seconds, _ in passes), passes[0][1]


def _reset_peak_memory(device: torch.device) -> None:
    """Start a new peak: the CUDA allocator's, or the process's RSS high-water mark (Linux
    resets VmHWM to the current RSS when 5 is written to clear_refs)."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        return
    with contextlib.suppress(OSError):
        Path("/proc/self/clear_refs").write_text("5")


def _memory_mb(device: torch.device, peak: bool) -> float | None:
    """MiB in use now, or at the peak since `_reset_peak_memory`: the CUDA allocator's, else
    the process RSS; None where it cannot be read."""
    if device.type == "cuda":
        used = torch.cuda.max_memory_allocated if peak else torch.cuda.memory_allocated
        return used(device) / 2**20
    field = "VmHWM" if peak else "VmRSS"
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    return None


@contextlib.contextmanager
def memory_window(device: torch.device) -> Iterator[dict[str, float | None]]:
    """Measure memory over a block: yields a dict that gets `start_mb` and `peak_mb`."""
    _reset_peak_memory(device)
    stats: dict[str, float | None] = {"start_mb": _memory_mb(device, peak=False)}
    yield stats
    stats["peak_mb"] = _memory_mb(device, peak=True)


def measure_steps(
    step: Callable[[Any], Any],
    batches: list[Any],
    audio: list[float],
    warmup: int,
    device: torch.device,
    passes: int = 1,
) -> dict[str, Any]:
    """Time `step(batch)` for each batch (`audio[i]` seconds of audio in batch i), `passes`
    times over the list, after `warmup` untimed steps on the first batches; throughput from
    each batch's fastest step (a shared machine stalls a step now and then), and peak memory."""
    for batch in batches[:warmup]:
        step(batch)
    with memory_window(device) as memory:
        times = [_timed_pass(step, batches, device) for _ in range(passes)]
    return {**_throughput(times, audio), "memory": memory}


def measure_alternating(
    steps: dict[str, Callable[[Any], Any]],
    batches: list[Any],
    audio: list[float],
    warmup: int,
    device: torch.device,
    passes: int,
) -> dict[str, dict[str, Any]]:
    """`measure_steps` of several step functions over the same batches, their passes
    alternating (A B, B A, ...) so that the machine's slow spells fall on all of them alike.
    No peak memory (one process high-water mark for all)."""
    for step in steps.values():
        for batch in batches[:warmup]:
            step(batch)
    times: dict[str, list[list[float]]] = {name: [] for name in steps}
    for index in range(passes):
        order = list(steps) if index % 2 == 0 else list(reversed(steps))
        for name in order:
            times[name].append(_timed_pass(steps[name], batches, device))
    return {name: _throughput(rows, audio) for name, rows in times.items()}


def _timed_pass(step: Callable[[Any], Any], batches: list[Any], device: torch.device) -> list:
    return [timed(lambda b=b: step(b), device) for b in batches]


def _throughput(times: list[list[float]], audio: list[float]) -> dict[str, Any]:
    """Rates from `times[pass][batch]` seconds, each batch counting its fastest step."""
    seconds = [min(column) for column in zip(*times, strict=True)]
    total = sum(seconds)
    return {
        "steps": len(seconds),
        "passes": len(times),
        "seconds": total,
        "audio_seconds": sum(audio),
        "audio_seconds_per_second": sum(audio) / total,
        "steps_per_second": len(seconds) / total,
    }


# ---------------------------------------------------------------- FLOPs and profiles


def count_flops(fn: Callable[[], Any]) -> int:
    """FLOPs of the matmuls, convolutions and attention `fn()` runs (torch's FlopCounterMode:
    the usual "model FLOPs"; elementwise work is not counted). Causal attention counts as full,
    as torch counts it."""
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False, custom_mapping=_extra_formulas())
    with counter:
        fn()
    return int(counter.get_total_flops())


def _extra_formulas() -> dict[Any, Callable[..., int]]:
    """FLOP formulas for kernels torch's counter lacks (it would count 0): CPU flash attention
    (the same as for the CUDA kernels), and the RNN encoder's LSTM/GRU kernels: oneDNN's, one
    per layer and direction, on CPU; cuDNN's, one per `nn.LSTM`/`nn.GRU` call, on CUDA."""
    from torch.utils.flop_counter import sdpa_backward_flop_count, sdpa_flop_count

    def forward(query, key, value, *args, out_shape=None, **kwargs) -> int:
        return sdpa_flop_count(query, key, value)

    def backward(grad_out, query, key, value, *args, out_shape=None, **kwargs) -> int:
        return sdpa_backward_flop_count(grad_out, query, key, value)

    aten = torch.ops.aten
    return {
        aten._scaled_dot_product_flash_attention_for_cpu: forward,
        aten._scaled_dot_product_flash_attention_for_cpu_backward: backward,
        aten.mkldnn_rnn_layer: _rnn_layer_flops,
        aten.mkldnn_rnn_layer_backward: _rnn_layer_backward_flops,
        aten._cudnn_rnn: _cudnn_rnn_flops,
        aten._cudnn_rnn_backward: _cudnn_rnn_backward_flops,
    }


def _rnn_flops(input: list[int], matrices: list[list[int]]) -> int:
    """An RNN's matmuls: each of its `matrices` (input, recurrent and projection weights) once
    per frame of `input`, an `(N, T, F)` or `(T, N, F)` batch or a packed `(frames, F)` one."""
    return 2 * math.prod(input[:-1]) * sum(math.prod(m) for m in matrices)


def _rnn_layer_flops(input, w_ih, w_hh, *args, out_shape=None, **kwargs) -> int:
    """oneDNN's RNN layer, one direction (the counter passes shapes)."""
    return _rnn_flops(input, [w_ih, w_hh])


def _rnn_layer_backward_flops(input, w_ih, w_hh, *args, out_shape=None, **kwargs) -> int:
    """Twice the forward: gradients of the inputs and of the weights."""
    return 2 * _rnn_layer_flops(input, w_ih, w_hh)


def _cudnn_rnn_flops(input, weight, *args, out_shape=None, **kwargs) -> int:
    """cuDNN's RNN: every layer and direction in one call, `weight` listing their weights
    (matrices) and biases (vectors). Each layer reads as many frames as the input has."""
    return _rnn_flops(input, [w for w in weight if len(w) == 2])


def _cudnn_rnn_backward_flops(input, weight, *args, out_shape=None, **kwargs) -> int:
    """Twice the forward, as for oneDNN's layer."""
    return 2 * _cudnn_rnn_flops(input, weight)


def profile_ops(
    fn: Callable[[], Any], device: torch.device, path: Path, title: str, rows: int = 30
) -> str:
    """Profile one call of `fn` and write torch.profiler's op table (top `rows` ops by self
    time) to `path`; returns the file's name."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(ProfilerActivity.CUDA)
    with profile(activities=activities) as prof:
        fn()
        synchronize(device)
    sort = "self_cuda_time_total" if device.type == "cuda" else "self_cpu_time_total"
    table = prof.key_averages().table(sort_by=sort, row_limit=rows)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"{title}\n\n{table}\n")
    return path.name


def write_json(path: Path, data: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1, default=str) + "\n")
