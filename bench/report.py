"""The report: merge the part files of a results folder into results.json, results.md
(tables, targets with PASS/MISS, where the time goes) and bench.png."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from asr.precision import PRECISIONS
from bench.peak import EXACT

PARTS = ("peak", "train", "epochs", "peer", "decode", "scaling")
SYSTEMS = ("ours", "speechbrain")  # the peer part's two systems
TOP_OPS = 8  # profile rows shown in results.md (the text files hold more)
LENGTH_COLUMNS = {  # decode-vs-length modes (bench.scaling.LENGTH_MODES) and their headings
    "encoder": "frontend + encoder alone",
    "greedy": "greedy",
    "beam10_ctc": "beam 10 + CTC",
    "transcribe_beam10_ctc": "beam 10 + CTC, segmented (asr transcribe)",
}


def load(out: Path) -> dict[str, Any]:
    """`{part: {"machine": ..., "result": ...}}` of the part files present in `out`."""
    parts = {}
    for name in PARTS:
        path = out / f"{name}.json"
        if path.exists():
            parts[name] = json.loads(path.read_text())
    return parts


def _get(data: Any, *keys: Any) -> Any:
    """`data[k1][k2]...`, or None where a key (or the part) is missing."""
    for key in keys:
        if not isinstance(data, dict) or key not in data:
            return None
        data = data[key]
    return data


# ---------------------------------------------------------------- derived figures


def derive(parts: dict[str, Any]) -> dict[str, Any]:
    """MFU, ours/peer ratios and greedy/encoder ratios from the raw measurements."""
    res = {name: part.get("result", {}) for name, part in parts.items()}
    peaks = _get(res, "peak", "peak_gflops") or {}
    return {
        "mfu": _mfu(res.get("train") or {}, peaks),
        "peer": _peer_ratios(res.get("peer") or {}),
        "greedy_over_encoder": _greedy_over_encoder(res.get("decode") or {}),
        "peer_mfu": _mfu(
            {name: res["peer"][name] for name in SYSTEMS if name in (res.get("peer") or {})},
            peaks,
        ),
    }


def _mfu(train: dict[str, Any], peaks: dict[str, float]) -> dict[str, Any]:
    """Achieved model GFLOP/s and its fraction of the matmul peak, per config (or peer-part
    system) and dtype."""
    out = {}
    for config, data in train.items():
        for precision in PRECISIONS:
            rate = _get(data, precision, "audio_seconds_per_second")
            flops = _get(data, "flops_per_audio_second")
            if rate and flops and peaks.get(precision):
                achieved = rate * flops / 1e9
                ceiling = _get(data, precision, "kernel_ceiling", "gflops")
                out[f"{config}_{precision}"] = {
                    "achieved_gflops": achieved,
                    "mfu": achieved / peaks[precision],
                    "kernel_ceiling_mfu": ceiling / peaks[precision] if ceiling else None,
                }
    return out


def _peer_ratios(peer: dict[str, Any]) -> dict[str, float]:
    """Training throughput ours / peer; decoding speed-up (peer time / our time)."""
    out = {}
    for precision in PRECISIONS:
        ours = _get(peer, "ours", precision, "audio_seconds_per_second")
        theirs = _get(peer, "speechbrain", precision, "audio_seconds_per_second")
        if ours and theirs:
            out[f"train_{precision}"] = ours / theirs
        ours, theirs = (whole_passes_rate(peer.get(n, {}).get(precision)) for n in SYSTEMS)
        if ours and theirs:
            out[f"train_{precision}_whole_passes"] = ours / theirs
    for mode in ("beam10", "beam10_ctc"):
        ours = _get(peer, "ours", "decode", mode, "seconds")
        theirs = _get(peer, "speechbrain", "decode", mode, "seconds")
        if ours and theirs:
            out[f"decode_{mode}_speedup"] = theirs / ours
    return out


def whole_passes_rate(steps: dict[str, Any] | None) -> float | None:
    """Audio seconds per second over every timed step (`measure_steps`), stalls included."""
    if not steps or not steps.get("pass_seconds"):
        return None
    return steps["audio_seconds"] * len(steps["pass_seconds"]) / sum(steps["pass_seconds"])


def _worst(values) -> float | None:
    """The largest of the values that were measured (None: none was)."""
    present = [v for v in values if v is not None]
    return max(present) if present else None


def _greedy_over_encoder(decode: dict[str, Any]) -> dict[str, float]:
    """Greedy decode time / frontend + encoder time, per batch size: from the passes that
    alternate the two (`greedy_alternating`), else from the grid."""
    out = {}
    for size, cell in (decode.get("encoder") or {}).items():
        greedy = _get(decode, "greedy_alternating", size, "seconds") or _get(
            decode, "grid", "greedy", size, "seconds"
        )
        if greedy:
            out[size] = greedy / cell["seconds"]
    return out


def targets(parts: dict[str, Any], derived: dict[str, Any]) -> list[dict[str, Any]]:
    """The issue's targets: what was measured against each threshold."""
    res = {name: part.get("result", {}) for name, part in parts.items()}
    decode = res.get("decode") or {}
    sizes = decode.get("batch_sizes") or []
    big = str(32 if 32 in sizes else (sizes[-1] if sizes else 32))
    lengths = _get(res, "scaling", "decode_length") or {}
    rows = [
        ("Transformer bf16 training MFU (of measured bf16 matmul peak)", ">=", 0.40,
         _get(derived, "mfu", "transformer_bf16", "mfu"), MFU),
        ("Transformer bf16 training throughput, ours / SpeechBrain (same size)", ">=", 1.5,
         _get(derived, "peer", "train_bf16"), "{:.2f}x"),
        (f"beam 10 + CTC on AN4 test at batch {big}: RTF", "<=", 0.02,
         _get(decode, "grid", "beam10_ctc", big, "rtf"), "{:.4f}"),
        ("beam 10 + CTC speed-up over SpeechBrain's S2STransformerBeamSearcher", ">=", 5.0,
         _get(derived, "peer", "decode_beam10_ctc_speedup"), "{:.1f}x"),
        (f"greedy decode time / frontend+encoder time (batch {big})", "<=", 1.5,
         _get(derived, "greedy_over_encoder", big), "{:.2f}x"),
        ("decode time growth exponent with length, 11-57 s (a repeated block), beam 10 + CTC "
         "as `asr transcribe` decodes (in segments of the training utterances' length; "
         "1 = linear)", "<=", 1.1,
         _get(lengths, "transcribe_beam10_ctc", "exponent"), "{:.2f}"),
        ("the same, one unsegmented utterance (worst of greedy and beam 10 + CTC)", "<=", 1.1,
         _worst(_get(lengths, m, "exponent") for m in ("greedy", "beam10_ctc")), "{:.2f}"),
    ]  # fmt: skip
    out = []
    for name, op, threshold, value, fmt in rows:
        ok = None if value is None else (value >= threshold if op == ">=" else value <= threshold)
        out.append(
            {
                "target": name,
                "goal": f"{op} {fmt.format(threshold)}",
                "value": value,
                "shown": "n/a" if value is None else fmt.format(value),
                "status": "n/a" if ok is None else ("PASS" if ok else "MISS"),
            }
        )
    return out


# ---------------------------------------------------------------- markdown


def _table(header: list[str], rows: list[list[Any]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return lines + [""]


class _Percent:
    """Formats like `"{:.1%}".format`, with two significant digits under 1 % (a GPU's MFU)."""

    @staticmethod
    def format(value: float) -> str:
        return f"{value:.1%}" if value >= 0.01 else f"{100 * value:.2g}%"


MFU = _Percent()


def _num(value: Any, fmt: str | _Percent = "{:.3g}") -> str:
    return "n/a" if value is None else fmt.format(value)


def _per_search(length: dict[str, Any], modes: list[str], row: int, key: str, form: str) -> str:
    """Row `row` of the decode-vs-length `key` ("wer", "characters"), "a / b / c" over
    `modes`; empty where a mode has none (WER of a part of a block, or results from before
    the key was recorded)."""
    values = [(length[m].get(key) or [None] * (row + 1))[row] for m in modes]
    return "" if None in values else " / ".join(form.format(v) for v in values)


def _machine_lines(parts: dict[str, Any]) -> list[str]:
    machines = [p["machine"] for p in parts.values() if "machine" in p]
    if not machines:
        return ["No results yet: run `python -m bench all`.", ""]
    last = max(machines, key=lambda m: m["date"])
    lines = [
        f"Measured {last['date']} on {last['cpu']} ({last['cpu_count']} cores), "
        f"torch threads: {last['threads']}, device {last['device']}"
        + (f" ({last['gpu']})" if last.get("gpu") else "")
        + f", torch {last['torch']}. {_commands(parts)}",
        "",
    ]
    if any(m["quick"] for m in machines):
        lines += ["**QUICK smoke run (`--quick`): tiny sizes; the figures are not results.**", ""]
    if len({(m["threads"], m["quick"], m["device"]) for m in machines}) > 1:
        lines += ["**Warning: the parts here were run with different settings:**", ""]
        lines += [f"- {n}: `{p['machine']['command']}`" for n, p in parts.items() if "machine" in p]
        lines += [""]
    return lines


def _commands(parts: dict[str, Any]) -> str:
    """Each part's command; as `python -m bench PART OPTIONS` when the parts share OPTIONS."""
    commands = {n: p["machine"]["command"] for n, p in parts.items() if "machine" in p}
    prefix = "python -m bench "
    options = {c.removeprefix(prefix + n) for n, c in commands.items()}
    if len(commands) > 1 and len(options) == 1:
        return f"Command: `{prefix}PART{options.pop()}` for each part ({', '.join(commands)})."
    label = "Command" if len(commands) == 1 else "Commands"
    return f"{label}: " + "; ".join(f"`{c}`" for c in commands.values()) + "."


def _errors(parts: dict[str, Any]) -> list[str]:
    failed = [(n, p["result"]["error"]) for n, p in parts.items() if "error" in p.get("result", {})]
    return [f"- part `{n}` failed: {e}" for n, e in failed] + ([""] if failed else [])


def _peak_md(res: dict[str, Any]) -> list[str]:
    peak = res.get("peak")
    if not peak or "gflops" not in peak:
        return []
    sizes = peak["sizes"]
    rows = [
        [d, _num(max(by_size.values()), "{:.1f}")]
        + [_num(by_size[str(n)], "{:.1f}") for n in sizes]
        for d, by_size in peak["gflops"].items()
    ]
    header = ["dtype", "best GFLOP/s"] + [f"n={n}" for n in sizes]
    peaks = ", ".join(f"{d} **{v:.1f}**" for d, v in peak["peak_gflops"].items())
    notes = [f"Peak GFLOP/s, which every MFU here divides by: {peaks}.", ""]
    error = peak.get("onednn_fp32_error")
    if error is not None:
        counted = "counts" if error <= EXACT else "does not count (not fp32 arithmetic)"
        notes[0] += (
            " torch runs fp32 matmuls on MKL and bf16 ones on oneDNN, and MKL may leave a CPU's "
            "widest vector units unused (on AMD processors it runs its AVX2 code), so fp32 is "
            "also timed through oneDNN "
            '(`torch.backends.mkldnn.matmul.fp32_precision = "bf16"` sends it there). Its '
            f"products differ from MKL's by {error:.1e} of the largest entry (bf16 arithmetic "
            f"gives ~1e-3), so it {counted} towards the fp32 peak."
        )
    title = ["## Machine limit: square matmul (n x n) @ (n x n)", ""]
    return title + _table(header, rows) + notes


def _train_md(res: dict[str, Any], derived: dict[str, Any]) -> list[str]:
    train = res.get("train")
    if not train or "error" in train:
        return []
    rows = []
    for config, data in train.items():
        for precision in PRECISIONS:
            run = data[precision]
            mfu = derived["mfu"].get(f"{config}_{precision}", {})
            step = run["seconds"] / run["steps"]
            rows.append(
                [
                    data["config"], precision, _num(run["audio_seconds_per_second"], "{:.2f}"),
                    _num(run["steps_per_second"], "{:.3f}"), _num(step, "{:.3f}"),
                    _num(run["memory"].get("peak_mb"), "{:.0f}"),
                    _num(data["flops_per_audio_second"] / 1e9, "{:.2f}"),
                    _num(mfu.get("achieved_gflops"), "{:.1f}"), _num(mfu.get("mfu"), MFU),
                    _num(mfu.get("kernel_ceiling_mfu"), MFU),
                ]
            )  # fmt: skip
    header = [
        "config", "precision", "audio s / s", "steps / s", "s / step", "peak RSS MiB",
        "model GFLOP / audio s", "achieved GFLOP/s", "MFU", "kernels-only MFU",
    ]  # fmt: skip
    passes = _get(next(iter(train.values())), "bf16", "passes") or 1
    counts = ", ".join(f"{data['config']} {data['bf16']['steps']}" for data in train.values())
    notes = [
        f"The batches are every batch of each config's first epoch ({counts}); each counts its "
        f"fastest step of {passes} passes over them. Model FLOPs: torch.utils.flop_counter over "
        "one forward + backward of each batch (matmuls, convolutions, attention, padding "
        "included), per second of audio; MFU divides the achieved rate by the measured matmul "
        "peak of the same dtype. Kernels-only MFU: the FLOP-counted ops of the first batch's "
        "forward + backward replayed alone, back to back, on random inputs of their shapes, "
        "dtypes and strides: the MFU bound at these shapes if everything between those kernels "
        "took no time. Peak RSS: the process high-water mark over the timed steps (data "
        "loaded beforehand).",
        "",
        *_lightning_md(train),
        *_kernels_md(train),
    ]
    return ["## Training throughput (AN4 configs)", ""] + _table(header, rows) + notes


def _kernels_md(train: dict[str, Any]) -> list[str]:
    """Where the kernels-only bound goes: the bf16 replay's kernels by op and dtype."""
    lines = []
    for data in train.values():
        ceiling = _get(data, "bf16", "kernel_ceiling") or {}
        groups = ceiling.get("by_kernel")
        if not groups:
            continue
        seconds, flops = sum(g["seconds"] for g in groups), sum(g["flops"] for g in groups)
        rows = [
            [g["op"], g["dtype"], g["calls"], _num(g["seconds"] / seconds, MFU),
             _num(g["flops"] / flops, MFU), _num(g["gflops"], "{:.0f}")]
            for g in groups
        ]  # fmt: skip
        header = ["kernel", "dtype", "calls", "share of kernel time", "share of FLOPs", "GFLOP/s"]
        lines += [
            f"Kernels of the kernels-only bound ({data['config']}, bf16, first batch), each call "
            f"timed alone ({seconds * 1e3:.1f} ms in all):",
            "",
            *_table(header, rows),
        ]
    return lines


def _lightning_md(train: dict[str, Any]) -> list[str]:
    """What `lightning.Trainer.fit` adds to the plain step above."""
    runs = [data["lightning_overhead"] for data in train.values() if "lightning_overhead" in data]
    lines = []
    for run in runs:
        lines += [
            f"Inside `lightning.Trainer.fit` (as `asr fit` steps, less data loading and "
            f"validation; bf16, {run['config']}, the same {run['steps']} batches, "
            f"{run['passes']} passes alternating with the plain step): {run['fit_seconds']:.3f} s "
            f"against {run['plain_seconds']:.3f} s of fastest steps, **{run['ratio']:.2f}x** the "
            "plain step.",
            "",
        ]
    return lines


def _epochs_md(res: dict[str, Any]) -> list[str]:
    """Whole `asr fit` epochs, split into where their wall time went."""
    epochs = res.get("epochs")
    if not epochs or "error" in epochs:
        return []
    parts = list(next(iter(epochs.values()))["shares"])  # steps, data, validation, other
    rows = [
        [data["config"], data["epochs"], _num(data["seconds_per_epoch"], "{:.1f}"),
         _num(data["audio_per_second"], "{:.1f}"), _num(data["steps_audio_per_second"], "{:.1f}")]
        + [_num(data["shares"][part], "{:.1%}") for part in parts]
        for data in epochs.values()
    ]  # fmt: skip
    header = [
        "config",
        "epochs timed",
        "s / epoch",
        "audio s / s",
        "audio s / s of the steps alone",
        *[f"{part} share" for part in parts],
    ]
    notes = [
        "`asr fit` on each config's YAML (its trainer settings, precision included) in a child "
        "process, as the recipe runs it, from an untrained model; the first epoch is not timed. "
        "Steps: forward, backward and optimizer (Lightning's batch start to batch end); data: "
        "fetching each batch (in-process loading, speed perturbation) and the loop between "
        "batches; validation: dev loss and greedy decoding; other: epoch-end checkpoints and "
        "hooks. The training table above times the same steps on batches loaded beforehand, "
        "each batch's fastest of its passes.",
        "",
    ]
    return ["## Whole `asr fit` epochs", ""] + _table(header, rows) + notes


def _peer_md(res: dict[str, Any], derived: dict[str, Any]) -> list[str]:
    peer = res.get("peer")
    if not peer:
        return []
    title = ["## Ours vs SpeechBrain (TransformerASR 12/6, d 256, 4 heads, FFN 2048)", ""]
    if not peer.get("available", False):
        return title + [peer.get("reason") or peer.get("error", "unavailable"), ""]
    rows = []
    for name in SYSTEMS:
        d = peer[name]
        rows.append(
            [
                name, f"{d['parameters'] / 1e6:.1f} M",
                _num(d["flops_per_audio_second"] / 1e9, "{:.2f}"),
                _num(d["fp32"]["audio_seconds_per_second"], "{:.2f}"),
                _num(d["bf16"]["audio_seconds_per_second"], "{:.2f}"),
                _num(_get(derived, "peer_mfu", f"{name}_bf16", "mfu"), MFU),
                _num(_get(derived, "peer_mfu", f"{name}_bf16", "kernel_ceiling_mfu"), MFU),
                _num(d["decode"]["beam10"]["seconds"], "{:.2f}"),
                _num(d["decode"]["beam10_ctc"]["seconds"], "{:.2f}"),
                _num(d["decode"]["beam10_ctc"]["mean_tokens"], "{:.1f}"),
            ]
        )  # fmt: skip
    p = derived["peer"]
    rows.append(
        [
            "**ours / peer**", "", "", _num(p.get("train_fp32"), "{:.2f}x"),
            _num(p.get("train_bf16"), "{:.2f}x"), "", "",
            _num(p.get("decode_beam10_speedup"), "{:.1f}x faster"),
            _num(p.get("decode_beam10_ctc_speedup"), "{:.1f}x faster"), "",
        ]
    )  # fmt: skip
    header = [
        "system", "params", "GFLOP / audio s", "train fp32 audio s/s", "train bf16 audio s/s",
        "bf16 MFU", "bf16 kernels-only MFU", "beam 10 s", "beam 10 + CTC s", "tokens / hyp",
    ]  # fmt: skip
    batch = peer["decode_batch"]
    notes = [
        f"SpeechBrain {peer['speechbrain_version']}. Same AN4 batches, both fed our log-mel + CMVN "
        "features (computed beforehand), so only model + loss + backward + AdamW step are "
        "timed; kernels-only MFU is the training table's bound, on each model's first batch. "
        f"Decoding: one batch of {batch['utterances']} AN4 test utterances "
        f"({batch['audio_seconds']:.1f} s), fp32; the models are only briefly trained, so eos "
        "is blocked until the maximum length in both searches and both run the same number "
        "of steps (tokens / hyp; SpeechBrain's limit is the batch's padded length).",
        "",
    ]
    whole = [whole_passes_rate(peer[n].get("bf16")) for n in SYSTEMS]
    if all(whole):
        notes[-1:] = [
            "Training: the two systems' passes alternate, and each batch counts its fastest "
            "step of its passes; over every step of every "
            f"pass (stalls included) bf16 gives ours {whole[0]:.2f}, SpeechBrain "
            f"{whole[1]:.2f} audio s/s: **{whole[0] / whole[1]:.2f}x**.",
            "",
        ]
    return title + _table(header, rows) + notes


def _decode_md(res: dict[str, Any], derived: dict[str, Any]) -> list[str]:
    decode = res.get("decode")
    if not decode or "error" in decode:
        return []
    sizes = [str(s) for s in decode["batch_sizes"]]
    rows = []
    for mode, cells in decode["grid"].items():
        rows.append(
            [mode]
            + [f"{cells[s]['rtf']:.4f} ({cells[s]['utterances_per_second']:.1f})" for s in sizes]
            + [_num(cells[sizes[-1]].get("wer"), "{:.1f}")]
        )
    enc = decode["encoder"]
    rows.append(["frontend + encoder only"] + [f"{enc[s]['rtf']:.4f}" for s in sizes] + [""])
    ratios = derived["greedy_over_encoder"]
    rows.append(["greedy / encoder time"] + [_num(ratios.get(s), "{:.2f}x") for s in sizes] + [""])
    header = (
        ["search"] + [f"batch {s}: RTF (utt/s)" for s in sizes] + [f"WER % (batch {sizes[-1]})"]
    )
    intro = [
        "## Decoding AN4 test",
        "",
        f"Model: {decode['model']}. {decode['utterances']} utterances, "
        f"{decode['audio_seconds']:.0f} s of audio, sorted by length; fp32 unless the search "
        "ends in `_bf16` (bf16 autocast, `asr transcribe --precision bf16`).",
        "",
    ]
    notes = []
    if decode.get("greedy_alternating"):
        notes = [
            "Greedy / encoder: fp32 greedy search and the fp32 frontend + encoder alone timed in "
            "alternating passes (fastest of each), not the grid's greedy row.",
            "",
        ]
    return intro + _table(header, rows) + notes


def _scaling_md(res: dict[str, Any]) -> list[str]:
    scaling = res.get("scaling")
    if not scaling or "error" in scaling:
        return []
    lines = ["## Scaling", ""]
    ddp = scaling.get("ddp", {})
    if "speedup" in ddp:
        rows = [
            ["1", _num(ddp["one_process"]["audio_seconds_per_second"], "{:.2f}"), "1.00x"],
            ["2", _num(ddp["two_processes"]["audio_seconds_per_second"], "{:.2f}"),
             _num(ddp["speedup"], "{:.2f}x")],
        ]  # fmt: skip
        lines += ["DDP on CPU (gloo, 1 thread per process, same per-process batches):", ""]
        lines += _table(["processes", "aggregate audio s / s", "ratio"], rows)
    length = scaling.get("decode_length", {})
    if "lengths" in length:
        modes = [m for m in LENGTH_COLUMNS if m in length]
        searches = [m for m in modes if m != "encoder"]
        rows = [
            [
                f"{n:g} s",
                *(f"{length[m]['seconds'][i]:.3f}" for m in modes),
                _per_search(length, searches, i, "characters", "{:d}"),
                _per_search(length, searches, i, "wer", "{:.1f}"),
            ]
            for i, n in enumerate(length["lengths"])
        ]
        rows.append(["growth exponent", *(f"{length[m]['exponent']:.2f}" for m in modes)])
        first = length["greedy"]["exponent_from_seconds"]
        lines += [
            f"Decode time (s) of one recording (a block of whole AN4 test utterances, repeated) "
            f"by length, batch 1 (exponent fitted from {first:g} s up), the characters of "
            f"each search's transcript, and its WER against the blocks' "
            f"transcripts (whole blocks only). The frontend + encoder alone is what an "
            f"unsegmented search spends before its first step; its self-attention is "
            f"quadratic in length. Segmented: `asr transcribe "
            f"--max-segment-seconds {_num(length.get('segment_seconds'), '{:g}')}` (the 95th "
            f"percentile of the training utterances' durations, rounded up: the default for "
            f"checkpoints `asr fit` writes now). "
            f"Model: {length['model']}.",
            "",
        ]
        headings = [LENGTH_COLUMNS[m] for m in modes]
        headings += ["characters (the searches)", "WER % (the searches)"]
        lines += _table(["length", *headings], rows)
    batch = scaling.get("train_batch", {})
    if "rows" in batch:
        rows = [
            [f"{r['batch_seconds']:.1f}", r["utterances"], f"{r['step_seconds']:.3f}",
             f"{r['batch_seconds'] / r['step_seconds']:.2f}"]
            for r in batch["rows"]
        ]  # fmt: skip
        lines += [
            f"Transformer bf16 training step by batch size (growth exponent "
            f"{batch['exponent']:.2f}):",
            "",
        ]
        lines += _table(["batch audio s", "utterances", "s / step", "audio s / s"], rows)
    return lines


def _targets_md(rows: list[dict[str, Any]]) -> list[str]:
    table = [[r["target"], r["goal"], r["shown"], f"**{r['status']}**"] for r in rows]
    return ["## Targets", ""] + _table(["target", "goal", "measured", "status"], table)


def _short(name: str, width: int = 80) -> str:
    """`name` cut to `width` characters (CUDA kernels' template names run to thousands)."""
    return name if len(name) <= width else name[: width - 1] + "…"


def _profiles_md(res: dict[str, Any]) -> list[str]:
    sections = []
    for config, data in (res.get("train") or {}).items():
        if isinstance(data, dict) and data.get("profile"):
            sections.append((f"one bf16 training step, {config}", data))
    decode = res.get("decode") or {}
    if decode.get("profile"):
        sections.append(("one beam 10 + CTC decode batch", decode))
    if not sections:
        return []
    lines = ["## Where the time goes (torch.profiler, self time)", ""]
    for title, data in sections:
        rows = [
            [f"`{_short(op['op'])}`", f"{op['percent']:.1f}%", f"{op['self_ms']:.1f}", op["calls"]]
            for op in data["profile"][:TOP_OPS]
        ]
        lines += [f"{title} (full table: `{data['profile_file']}`):", ""]
        lines += _table(["op", "self time", "ms", "calls"], rows)
    return lines


def markdown(parts: dict[str, Any], derived: dict[str, Any], goals: list[dict]) -> str:
    res = {name: part.get("result", {}) for name, part in parts.items()}
    sections: list[Callable[[], list[str]]] = [
        lambda: _machine_lines(parts),
        lambda: _errors(parts),
        lambda: _targets_md(goals),
        lambda: _peak_md(res),
        lambda: _train_md(res, derived),
        lambda: _epochs_md(res),
        lambda: _peer_md(res, derived),
        lambda: _decode_md(res, derived),
        lambda: _scaling_md(res),
        lambda: _profiles_md(res),
    ]
    lines = ["# asr benchmark", ""]
    for section in sections:
        lines += section()
    return "\n".join(lines).rstrip() + "\n"


# ---------------------------------------------------------------- plots


def plot(parts: dict[str, Any], derived: dict[str, Any], path: Path) -> None:
    """Four panels: training throughput, decode RTF grid, decode time vs length, step time vs
    batch seconds (panels without data stay empty)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    res = {name: part.get("result", {}) for name, part in parts.items()}
    fig, axes = plt.subplots(2, 2, figsize=(12, 9))
    _plot_train(axes[0][0], res)
    _plot_decode(axes[0][1], res)
    _plot_length(axes[1][0], res)
    _plot_batch(axes[1][1], res)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _plot_train(ax, res: dict[str, Any]) -> None:
    labels, values = [], []
    for config, data in (res.get("train") or {}).items():
        for precision in PRECISIONS:
            if isinstance(data, dict) and precision in data:
                labels.append(f"{config} {precision}")
                values.append(data[precision]["audio_seconds_per_second"])
    peer = res.get("peer") or {}
    for name in ("ours", "speechbrain"):
        for precision in PRECISIONS:
            value = _get(peer, name, precision, "audio_seconds_per_second")
            if value:
                labels.append(f"12/6 d256: {name} {precision}")
                values.append(value)
    ax.barh(range(len(values)), values)
    ax.set_yticks(range(len(values)), labels, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("audio seconds trained / second")
    ax.set_title("Training throughput")


def _plot_decode(ax, res: dict[str, Any]) -> None:
    decode = res.get("decode") or {}
    for mode, cells in (decode.get("grid") or {}).items():
        sizes = sorted(cells, key=int)
        ax.plot([int(s) for s in sizes], [cells[s]["rtf"] for s in sizes], "o-", label=mode)
    enc = decode.get("encoder") or {}
    if enc:
        sizes = sorted(enc, key=int)
        ax.plot(
            [int(s) for s in sizes], [enc[s]["rtf"] for s in sizes], "k--", label="encoder only"
        )
        ax.axhline(0.02, color="red", lw=0.8, label="target RTF 0.02")
        ax.legend(fontsize=8)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    _plain_ticks(ax)
    ax.set_xlabel("batch size")
    ax.set_ylabel("real-time factor")
    ax.set_title("Decoding AN4 test")


def _plot_length(ax, res: dict[str, Any]) -> None:
    length = _get(res, "scaling", "decode_length") or {}
    if "lengths" not in length:
        return
    xs = length["lengths"]
    for mode in [m for m in LENGTH_COLUMNS if m in length]:
        ys = length[mode]["seconds"]
        ax.plot(xs, ys, "o-", label=f"{mode} (exponent {length[mode]['exponent']:.2f})")
    ref = length["beam10_ctc"]["seconds"][-1]
    ax.plot(xs, [ref * x / xs[-1] for x in xs], "k:", label="linear")
    ax.set_xscale("log")
    ax.set_yscale("log")
    _plain_ticks(ax)
    ax.set_xlabel("utterance seconds")
    ax.set_ylabel("decode seconds (batch 1)")
    ax.legend(fontsize=8)
    ax.set_title("Decode time vs length")


def _plot_batch(ax, res: dict[str, Any]) -> None:
    batch = _get(res, "scaling", "train_batch") or {}
    if "rows" not in batch:
        return
    xs = [r["batch_seconds"] for r in batch["rows"]]
    ys = [r["step_seconds"] for r in batch["rows"]]
    ax.plot(xs, ys, "o-", label=f"exponent {batch['exponent']:.2f}")
    ax.set_xscale("log")
    ax.set_yscale("log")
    _plain_ticks(ax)
    ax.set_xlabel("batch audio seconds")
    ax.set_ylabel("training step seconds (bf16)")
    ax.legend(fontsize=8)
    ax.set_title("Training step vs batch size")


def _plain_ticks(ax) -> None:
    """Log axes labelled 0.5, 2, 10 rather than 2^-1, 2^1, 10^1."""
    from matplotlib.ticker import FuncFormatter

    plain = FuncFormatter(lambda v, _: f"{v:g}")
    for axis in (ax.xaxis, ax.yaxis):
        axis.set_major_formatter(plain)
        axis.set_minor_formatter(plain)


# ---------------------------------------------------------------- entry points


def write(out: Path) -> dict[str, Any]:
    """Write results.json, results.md and bench.png from the part files in `out`."""
    parts = load(out)
    derived = derive(parts)
    goals = targets(parts, derived)
    results = {"parts": parts, "derived": derived, "targets": goals}
    (out / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    (out / "results.md").write_text(markdown(parts, derived, goals))
    plot(parts, derived, out / "bench.png")
    return results


def summary(results: dict[str, Any]) -> str:
    """The targets table, for the terminal."""
    return "\n".join(_targets_md(results["targets"]))
