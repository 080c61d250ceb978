"""The report: merge the part files of a results folder into results.json, results.md (an
environment block, then a table per part, measured figures only) and bench.png."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

from bench.common import PRECISIONS
from bench.peak import EXACT

PARTS = ("peak", "train", "loader", "decode", "scaling", "peer", "espnet")


class Peer(NamedTuple):
    """The peer system a part measures against ours."""

    system: str  # its key in the part's results
    label: str  # its name in the report
    search: str  # how it decodes the test batch


PEERS = {
    "peer": Peer("speechbrain", "SpeechBrain", "SpeechBrain's in one batch too"),
    "espnet": Peer("espnet", "ESPnet", "ESPnet's one utterance at a time, as its inference runs"),
}
LENGTH_COLUMNS = {  # decode-vs-length modes (bench.scaling.LENGTH_MODES) and their headings
    "encoder": "frontend + encoder",
    "greedy": "greedy",
    "beam10_ctc": "beam 10 + CTC",
    "transcribe_beam10_ctc": "beam 10 + CTC, segmented",
}
ENVIRONMENT = {  # machine keys shown in the environment block, and their labels
    "date": "date",
    "git": "git",
    "torch": "torch",
    "lightning": "lightning",
    "python": "python",
    "cpu": "CPU",
    "cpu_count": "cores",
    "threads": "torch threads",
    "gpu": "GPU",
    "checkpoint": "checkpoint",
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
    """MFU of the training configs and of the peer parts' systems, and ours / peer ratios."""
    res = {name: part.get("result", {}) for name, part in parts.items()}
    peaks = _get(res, "peak", "peak_gflops") or {}
    derived = {"mfu": mfu(res.get("train") or {}, peaks)}
    for part, peer in PEERS.items():
        found, system = res.get(part) or {}, peer.system
        derived[f"{part}_mfu"] = mfu({n: found[n] for n in ("ours", system) if n in found}, peaks)
        derived[part] = _peer_ratios(found, system)
    return derived


def mfu(trained: dict[str, Any], peaks: dict[str, float]) -> dict[str, Any]:
    """Achieved model GFLOP/s and its fraction of the same dtype's matmul peak, per config (or
    peer system) and precision: `{"transformer_bf16": {"gflops": ..., "mfu": ...}}`.

    >>> found = mfu({"m": {"flops_per_audio_second": 4e8, "bf16": {"audio_seconds_per_second":
    ...     500.0}}}, {"bf16": 1000.0})
    >>> found["m_bf16"]["gflops"], found["m_bf16"]["mfu"]
    (200.0, 0.2)
    """
    out = {}
    for name, data in trained.items():
        for precision in PRECISIONS:
            rate = _get(data, precision, "audio_seconds_per_second")
            flops = _get(data, "flops_per_audio_second")
            if rate and flops and peaks.get(precision):
                achieved = rate * flops / 1e9
                found = {"gflops": achieved, "mfu": achieved / peaks[precision]}
                out[f"{name}_{precision}"] = found
    return out


def _peer_ratios(peer: dict[str, Any], system: str) -> dict[str, float]:
    """Training throughput ours / peer; decoding speed-up (peer time / our time)."""
    out = {}
    for precision in PRECISIONS:
        ours = _get(peer, "ours", precision, "audio_seconds_per_second")
        theirs = _get(peer, system, precision, "audio_seconds_per_second")
        if ours and theirs:
            out[f"train_{precision}"] = ours / theirs
    for mode in ("beam10", "beam10_ctc"):
        ours = _get(peer, "ours", "decode", mode, "seconds")
        theirs = _get(peer, system, "decode", mode, "seconds")
        if ours and theirs:
            out[f"decode_{mode}"] = theirs / ours
    return out


# ---------------------------------------------------------------- markdown


def _table(header: list[str], rows: list[list[Any]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return lines + [""]


def _num(value: Any, fmt: str = "{:.3g}") -> str:
    return "n/a" if value is None else fmt.format(value)


def _speed(ratio: float | None) -> str:
    """Their time over ours, said as ours faster or slower.

    >>> _speed(4.4), _speed(0.842), _speed(None)
    ('4.4x faster', '1.2x slower', 'n/a')
    """
    if ratio is None:
        return "n/a"
    return f"{ratio:.1f}x faster" if ratio >= 1 else f"{1 / ratio:.1f}x slower"


def _percent(value: float | None) -> str:
    """One decimal, or two significant digits under 1 % (a GPU's MFU)."""
    if value is None:
        return "n/a"
    return f"{value:.1%}" if value >= 0.01 else f"{100 * value:.2g}%"


def _environment_md(parts: dict[str, Any]) -> list[str]:
    machines = {name: p["machine"] for name, p in parts.items() if "machine" in p}
    if not machines:
        return ["No results yet: run `python -m bench all`.", ""]
    last = max(machines.values(), key=lambda m: m["date"])
    lines = [f"- {label}: {last[key]}" for key, label in ENVIRONMENT.items() if last.get(key)]
    lines += [f"- command: {_commands(machines)}", ""]
    if any(m["quick"] for m in machines.values()):
        lines += ["**Smoke run (`--quick`): tiny sizes; the figures are not results.**", ""]
    settings = {(m["threads"], m["quick"], m["device"], m.get("git")) for m in machines.values()}
    if len(settings) > 1:
        lines += ["**The parts were run with different settings or code.**", ""]
    return lines


def _commands(machines: dict[str, dict[str, Any]]) -> str:
    """`python -m bench PART OPTIONS` for each part when the parts share OPTIONS, else each."""
    commands = {name: m["command"] for name, m in machines.items()}
    prefix = "python -m bench "
    options = {c.removeprefix(prefix + name) for name, c in commands.items()}
    if len(commands) > 1 and len(options) == 1:
        return f"`{prefix}PART{options.pop()}` for each part ({', '.join(commands)})"
    return "; ".join(f"`{c}`" for c in commands.values())


def _errors_md(res: dict[str, Any]) -> list[str]:
    failed = [(name, r["error"]) for name, r in res.items() if "error" in r]
    return [f"- part `{name}` failed: {error}" for name, error in failed] + ([""] if failed else [])


def _peak_md(res: dict[str, Any]) -> list[str]:
    peak = res.get("peak") or {}
    if "gflops" not in peak:
        return []
    sizes = peak["sizes"]
    rows = [
        [dtype] + [_num(rates[str(n)], "{:.1f}") for n in sizes]
        for dtype, rates in peak["gflops"].items()
    ]
    peaks = ", ".join(f"{d} {v:.1f}" for d, v in peak["peak_gflops"].items())
    note = f"Peak (what MFU divides by): {peaks} GFLOP/s."
    error = peak.get("onednn_fp32_error")
    if error is not None:
        counted = "counts" if error <= EXACT else "does not count"
        note += (
            f" fp32 via oneDNN differs from MKL's products by {error:.1e} of the largest entry, "
            f"so it {counted} towards the fp32 peak."
        )
    title = ["## Machine limit: GFLOP/s of (n x n) @ (n x n)", ""]
    return title + _table(["dtype", *(f"n={n}" for n in sizes)], rows) + [note, ""]


def _train_md(res: dict[str, Any], derived: dict[str, Any], device: str | None = None) -> list[str]:
    train = res.get("train") or {}
    if not train or "error" in train:
        return []
    rows = []
    for name, data in train.items():
        for precision in PRECISIONS:
            step, found = data[precision], derived["mfu"].get(f"{name}_{precision}", {})
            rows.append([
                data["config"], precision, step["steps"],
                _num(step["audio_seconds_per_second"], "{:.2f}"),
                _num(step["seconds"] / step["steps"], "{:.3f}"),
                _num(step["memory"].get("peak_mb"), "{:.0f}"),
                _num(data["flops_per_audio_second"] / 1e9, "{:.2f}"),
                _num(found.get("gflops"), "{:.1f}"), _percent(found.get("mfu")),
            ])  # fmt: skip
    header = [
        "config", "precision", "batches", "audio s / s", "s / step", _memory_label(train, device),
        "GFLOP / audio s", "GFLOP/s", "MFU",
    ]  # fmt: skip
    lines = ["## Training step (first epoch's batches, loaded beforehand)", ""]
    lines += _table(header, rows)
    epochs = [(data["config"], data["epochs"]) for data in train.values() if "epochs" in data]
    if epochs:
        shares = list(epochs[0][1]["shares"])  # steps, data, validation, other
        rows = [
            [config, e["epochs"], _num(e["seconds_per_epoch"], "{:.1f}"),
             _num(e["audio_per_second"], "{:.1f}"), _num(e["steps_audio_per_second"], "{:.1f}")]
            + [_percent(e["shares"][part]) for part in shares]
            for config, e in epochs
        ]  # fmt: skip
        header = ["config", "epochs timed", "s / epoch", "audio s / s", "steps: audio s / s"]
        lines += ["## Whole `asr fit` epochs (after the first)", ""]
        lines += _table(header + shares, rows)
    return lines


def _memory_label(train: dict[str, Any], device: str | None = None) -> str:
    """The train table's memory column: as the rows label it (each in its own process), else
    (part files of an older harness) the one process all rows ran in, on `device`."""
    labels = {data[p]["memory"].get("label") for data in train.values() for p in PRECISIONS}
    if len(labels) == 1 and None not in labels:
        return labels.pop()
    if device is not None and device.startswith("cuda"):  # the allocator's, not the process's
        return "peak CUDA MiB allocated (earlier rows' live tensors included)"
    return "process peak MiB (earlier rows' memory included)"


def _peer_md(res: dict[str, Any], derived: dict[str, Any], part: str) -> list[str]:
    peer, (system, label, search) = res.get(part), PEERS[part]
    if not peer:
        return []
    title = [f"## Ours vs {label}, same model (12/6 blocks, d 256, 4 heads, FFN 2048)", ""]
    if not peer.get("available", False):
        return title + [peer.get("reason") or peer.get("error", "unavailable"), ""]
    rows = []
    for name in ("ours", system):
        d = peer[name]
        rows.append([
            name, f"{d['parameters'] / 1e6:.1f} M",
            _num(d["flops_per_audio_second"] / 1e9, "{:.2f}"),
            _num(d["fp32"]["audio_seconds_per_second"], "{:.2f}"),
            _num(d["bf16"]["audio_seconds_per_second"], "{:.2f}"),
            _percent(_get(derived, f"{part}_mfu", f"{name}_bf16", "mfu")),
            _num(d["decode"]["beam10"]["seconds"], "{:.2f}"),
            _num(d["decode"]["beam10_ctc"]["seconds"], "{:.2f}"),
        ])  # fmt: skip
    ratio = derived[part]
    rows.append([
        f"ours / {label}", "", "", _num(ratio.get("train_fp32"), "{:.2f}x"),
        _num(ratio.get("train_bf16"), "{:.2f}x"), "",
        _speed(ratio.get("decode_beam10")),
        _speed(ratio.get("decode_beam10_ctc")),
    ])  # fmt: skip
    header = [
        "system", "params", "GFLOP / audio s", "train fp32 audio s / s",
        "train bf16 audio s / s", "bf16 MFU", "beam 10 s", "beam 10 + CTC s",
    ]  # fmt: skip
    batch = peer["decode_batch"]
    note = (
        f"{label} {peer[f'{system}_version']}. Decoding: {batch['utterances']} AN4 test "
        f"utterances ({batch['audio_seconds']:.1f} s), fp32, eos blocked so that both searches "
        f"run the same number of steps; ours in one batch, {search}."
    )
    return title + _table(header, rows) + [note, ""]


def _loader_md(res: dict[str, Any]) -> list[str]:
    loader = res.get("loader") or {}
    if not loader or "error" in loader:
        return []
    rows = [
        [name, r["utterances"], f"{r['plain']:.2f}", f"{r['augmented']:.2f}",
         f"{r['augmented'] - r['plain']:.2f}"]
        for name, r in loader.items()
    ]  # fmt: skip
    intro = [
        "## Loading the training set",
        "",
        "Seconds per epoch to read every training item in-process (audio cache warm), without "
        "and with the waveform augmentation of conf/an4/augment_strong.yaml:",
        "",
    ]
    return intro + _table(["config", "utterances", "plain s", "augmented s", "cost s"], rows)


def _decode_md(res: dict[str, Any]) -> list[str]:
    decode = res.get("decode") or {}
    if not decode or "error" in decode:
        return []
    sizes = [str(s) for s in decode["batch_sizes"]]
    rows = [
        [mode, *(f"{cells[s]['rtf']:.4f} ({cells[s]['utterances_per_second']:.1f})" for s in sizes),
         _num(cells[sizes[-1]].get("wer"), "{:.1f}")]
        for mode, cells in decode["grid"].items()
    ]  # fmt: skip
    encoder = decode["encoder"]
    rows.append(["frontend + encoder", *(f"{encoder[s]['rtf']:.4f}" for s in sizes), ""])
    header = ["search", *(f"batch {s}: RTF (utt / s)" for s in sizes), f"WER % (batch {sizes[-1]})"]
    intro = [
        "## Decoding AN4 test",
        "",
        f"{decode['utterances']} utterances, {decode['audio_seconds']:.0f} s, sorted by length; "
        f"fp32 unless `_bf16`. Model: {decode['model']}.",
        "",
    ]
    return intro + _table(header, rows)


def _scaling_md(res: dict[str, Any]) -> list[str]:
    scaling = res.get("scaling") or {}
    if not scaling or "error" in scaling:
        return []
    lines = ["## Scaling", ""]
    ddp = scaling.get("ddp", {})
    if "speedup" in ddp:
        rows = [
            [1, _num(ddp["one_process"]["audio_seconds_per_second"], "{:.2f}"), "1.00x"],
            [2, _num(ddp["two_processes"]["audio_seconds_per_second"], "{:.2f}"),
             _num(ddp["speedup"], "{:.2f}x")],
        ]  # fmt: skip
        lines += ["DDP training on CPU (gloo, one thread per process):", ""]
        lines += _table(["processes", "audio s / s", "ratio"], rows)
    length = scaling.get("decode_length", {})
    if "lengths" in length:
        modes = [m for m in LENGTH_COLUMNS if m in length]
        searches = [m for m in modes if m != "encoder"]
        rows = [
            [f"{n:g}", *(f"{length[m]['seconds'][i]:.3f}" for m in modes),
             " / ".join(_num(length[m]["wer"][i], "{:.1f}") for m in searches)
             if length[searches[0]]["wer"][i] is not None else ""]
            for i, n in enumerate(length["lengths"])
        ]  # fmt: skip
        rows.append(["growth exponent", *(f"{length[m]['exponent']:.2f}" for m in modes), ""])
        first = length[modes[0]]["exponent_from_seconds"]
        segment = _num(length.get("segment_seconds"), "{:g}")
        lines += [
            f"Decode seconds of one recording (AN4 test utterances repeated) by length, batch 1; "
            f"exponent fitted from {first:g} s up (1 = linear). Segmented: as `asr transcribe` "
            f"decodes it, in segments of at most {segment} s.",
            "",
        ]
        headings = [LENGTH_COLUMNS[m] for m in modes]
        lines += _table(["audio s", *headings, "WER % (the searches)"], rows)
    batch = scaling.get("train_batch", {})
    if "rows" in batch:
        rows = [
            [f"{r['batch_seconds']:.1f}", r["utterances"], f"{r['step_seconds']:.3f}",
             f"{r['batch_seconds'] / r['step_seconds']:.2f}"]
            for r in batch["rows"]
        ]  # fmt: skip
        lines += [f"bf16 training step by batch size (exponent {batch['exponent']:.2f}):", ""]
        lines += _table(["batch audio s", "utterances", "s / step", "audio s / s"], rows)
    return lines


def markdown(parts: dict[str, Any], derived: dict[str, Any]) -> str:
    res = {name: part.get("result", {}) for name, part in parts.items()}
    sections: list[Callable[[], list[str]]] = [
        lambda: _environment_md(parts),
        lambda: _errors_md(res),
        lambda: _peak_md(res),
        lambda: _train_md(res, derived, _get(parts, "train", "machine", "device")),
        lambda: _loader_md(res),
        lambda: _decode_md(res),
        lambda: _scaling_md(res),
        lambda: _peer_md(res, derived, "peer"),
        lambda: _peer_md(res, derived, "espnet"),
    ]
    lines = ["# asr benchmark", ""]
    for section in sections:
        lines += section()
    return "\n".join(lines).rstrip() + "\n"


# ---------------------------------------------------------------- plots


def plot(parts: dict[str, Any], path: Path) -> None:
    """Four panels: training throughput, decode RTF by batch size, decode time vs length, step
    time vs batch seconds (panels without data stay empty)."""
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
    sources = [(name, data) for name, data in (res.get("train") or {}).items()]
    for part, peer in PEERS.items():
        found = res.get(part) or {}
        sources += [(f"12/6 d256 {n} ({part})", found.get(n)) for n in ("ours", peer.system)]
    for label, data in sources:
        for precision in PRECISIONS:
            value = _get(data, precision, "audio_seconds_per_second")
            if value:
                labels.append(f"{label} {precision}")
                values.append(value)
    ax.barh(range(len(values)), values)
    ax.set_yticks(range(len(values)), labels, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("audio seconds trained / second")
    ax.set_title("Training throughput")


def _plot_decode(ax, res: dict[str, Any]) -> None:
    decode = res.get("decode") or {}
    curves = dict(decode.get("grid") or {})
    if decode.get("encoder"):
        curves["frontend + encoder"] = decode["encoder"]
    for mode, cells in curves.items():
        sizes = sorted(cells, key=int)
        ax.plot([int(s) for s in sizes], [cells[s]["rtf"] for s in sizes], "o-", label=mode)
    _log_axes(ax, "batch size", "real-time factor", "Decoding AN4 test")


def _plot_length(ax, res: dict[str, Any]) -> None:
    length = _get(res, "scaling", "decode_length") or {}
    if "lengths" not in length:
        return
    for mode in [m for m in LENGTH_COLUMNS if m in length]:
        label = f"{LENGTH_COLUMNS[mode]} (exponent {length[mode]['exponent']:.2f})"
        ax.plot(length["lengths"], length[mode]["seconds"], "o-", label=label)
    _log_axes(ax, "audio seconds", "decode seconds (batch 1)", "Decode time vs length")


def _plot_batch(ax, res: dict[str, Any]) -> None:
    batch = _get(res, "scaling", "train_batch") or {}
    if "rows" not in batch:
        return
    xs = [r["batch_seconds"] for r in batch["rows"]]
    ys = [r["step_seconds"] for r in batch["rows"]]
    ax.plot(xs, ys, "o-", label=f"exponent {batch['exponent']:.2f}")
    _log_axes(ax, "batch audio seconds", "bf16 training step seconds", "Step time vs batch size")


def _log_axes(ax, xlabel: str, ylabel: str, title: str) -> None:
    """Log axes labelled 0.5, 2, 10 rather than 2^-1, 2^1, 10^1."""
    from matplotlib.ticker import FuncFormatter

    ax.set_xscale("log")
    ax.set_yscale("log")
    plain = FuncFormatter(lambda v, _: f"{v:g}")
    for axis in (ax.xaxis, ax.yaxis):
        axis.set_major_formatter(plain)
        axis.set_minor_formatter(plain)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    if ax.lines:
        ax.legend(fontsize=8)


# ---------------------------------------------------------------- entry point


def write(out: Path) -> str:
    """Write results.json, results.md and bench.png from the part files in `out`; returns the
    markdown."""
    parts = load(out)
    derived = derive(parts)
    text = markdown(parts, derived)
    (out / "results.json").write_text(json.dumps({"parts": parts, "derived": derived}, indent=1))
    (out / "results.md").write_text(text)
    plot(parts, out / "bench.png")
    return text
