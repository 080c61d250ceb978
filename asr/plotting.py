"""Attention plots, reliability diagrams and training curves, built with matplotlib's object
API (never pyplot, so no global state). Import it only where a plot is drawn: it is slow."""

from __future__ import annotations

import csv
import functools
import logging
import math
import os
import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import matplotlib
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import FuncFormatter
from torch import Tensor

from asr.data.manifest import decode_line_of, manifest_lines
from asr.metrics import Calibration
from asr.timing import Word, check_seconds_per_frame

if TYPE_CHECKING:
    from asr.recognizer import Recognizer
    from asr.results import Alignment

log = logging.getLogger(__name__)
SHOWN_STEPS = 3  # steps of values that are not finite a warning names


def _literal(plot: Callable[..., Figure]) -> Callable[..., Figure]:
    """`plot` with its text drawn as given: ids, transcripts and run names may hold `$`,
    which matplotlib would parse as maths (garbled, or a parse error that stops the caller)."""

    @functools.wraps(plot)
    def literal(*args, **kwargs) -> Figure:
        with matplotlib.rc_context({"text.parse_math": False}):
            return plot(*args, **kwargs)

    return literal


@_literal
def plot_attention(
    attention: Tensor,
    labels: Sequence[str],
    features: Tensor | None = None,
    frame_shift: float = 0.01,
    title: str = "",
    seconds_per_frame: float | None = None,
    words: Sequence[Word] | None = None,
) -> Figure:
    """Spectrogram `(T_feat, D)` on top, attention `(K, L, T_enc)` averaged below, in seconds."""
    att = attention.detach().float().cpu()
    att = att.mean(0) if att.dim() == 3 else att  # (L, T_enc)
    num_steps, enc_frames = att.shape
    feat_seconds = features.size(0) * frame_shift if features is not None else None
    if seconds_per_frame is None:
        seconds_per_frame = (feat_seconds or enc_frames * frame_shift) / enc_frames
    duration = enc_frames * seconds_per_frame
    rows = 2 if features is not None else 1
    heights = [1, 2] if features is not None else [1]
    fig = Figure(figsize=(8, 2 + 0.18 * num_steps))
    axes = fig.subplots(rows, 1, sharex=True, height_ratios=heights)
    axes = list(axes) if rows > 1 else [axes]
    if features is not None:
        axes[0].imshow(
            features.detach().float().T.cpu().numpy(),
            origin="lower",
            aspect="auto",
            extent=(0, feat_seconds, 0, 1),
        )
        axes[0].set_yticks([])
        axes[0].set_ylabel("features")
    ax = axes[-1]
    _heatmap(ax, att, duration)
    ax.set_xlim(0, max(duration, feat_seconds or 0.0))
    ax.set_yticks(range(num_steps))
    ax.set_yticklabels(list(labels)[:num_steps], fontsize=7)
    ax.set_xlabel("time (s)")
    ax.set_ylabel("output token")
    if words:
        for panel in axes:
            _draw_words(panel, words, label=panel is axes[0])
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return fig


@_literal
def plot_attention_grid(
    attention: Tensor,
    num_layers: int,
    labels: Sequence[str],
    seconds_per_frame: float = 0.04,
    title: str = "",
    words: Sequence[Word] | None = None,
) -> Figure:
    """One heatmap per layer (rows) and head (columns) of `(layers * heads, L, T_enc)` maps."""
    if attention.dim() != 3 or num_layers < 1 or attention.size(0) % num_layers:
        raise ValueError(
            f"plot_attention_grid: attention {tuple(attention.shape)} is not "
            f"(layers * heads, L, T) with layers={num_layers}"
        )
    check_seconds_per_frame(seconds_per_frame)
    num_heads = attention.size(0) // num_layers
    maps = attention.detach().float().cpu()
    maps = maps.view(num_layers, num_heads, *maps.shape[1:])  # (layers, heads, L, T)
    num_steps, enc_frames = maps.shape[-2:]
    duration = enc_frames * seconds_per_frame
    fig = Figure(figsize=(2.6 * num_heads + 0.8, (1.2 + 0.08 * num_steps) * num_layers + 0.6))
    # Ticks only on the first column (tokens) and the last row (time): shared axes would give
    # every one of the layers * heads panels its own tick objects, the bulk of the drawing time.
    axes = fig.subplots(num_layers, num_heads, squeeze=False)
    for layer in range(num_layers):
        for head in range(num_heads):
            ax = axes[layer, head]
            _heatmap(ax, maps[layer, head], duration)
            ax.set_title(f"layer {layer} head {head}", fontsize=8)
            if head:
                ax.set_yticks([])
            if layer < num_layers - 1:
                ax.set_xticks([])
            if words:
                _draw_words(ax, words, label=False)
        axes[layer, 0].set_ylabel("output token", fontsize=8)
        axes[layer, 0].set_yticks(range(num_steps))
        axes[layer, 0].set_yticklabels(list(labels)[:num_steps], fontsize=6)
    for ax in axes[-1]:
        ax.set_xlabel("time (s)", fontsize=8)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return fig


def _heatmap(ax: Axes, att: Tensor, duration: float) -> None:
    """`(L, T)` weights over `[0, duration]` seconds, the first token on top."""
    num_steps = att.size(0)
    ax.imshow(
        att.numpy(),
        aspect="auto",
        cmap="Greys",
        interpolation="nearest",
        extent=(0, duration, num_steps - 0.5, -0.5),
    )


def _draw_words(ax: Axes, words: Sequence[Word], label: bool) -> None:
    """Word boundaries as vertical lines, the words above the axes if `label`."""
    for word in words:
        ax.axvline(word.start, color="tab:red", linewidth=0.8)
        ax.axvline(word.end, color="tab:blue", linewidth=0.8, linestyle="--")
        if label:
            middle = 0.5 * (word.start + word.end)
            ax.text(middle, 1.01, word.text, transform=ax.get_xaxis_transform(),
                    ha="center", va="bottom", fontsize=7)  # fmt: skip


@_literal
def plot_reliability(calibration: Calibration, title: str = "") -> Figure:
    """Reliability diagram: the share of right words per confidence bin, words per bin below."""
    fig = Figure(figsize=(5, 6))
    top, bottom = fig.subplots(2, 1, height_ratios=[3, 1], sharex=True)
    width = 1.0 / len(calibration.bins)
    filled = [b for b in calibration.bins if b.words]
    top.bar([b.lower for b in filled], [b.accuracy for b in filled], width=width, align="edge",
            edgecolor="black", label="share right")  # fmt: skip
    top.plot([0, 1], [0, 1], "k--", label="calibrated")
    top.set_ylabel("words right")
    top.set_ylim(0, 1)
    auc = "n/a" if calibration.auc is None else f"{calibration.auc:.3f}"
    top.set_title(title or f"ECE {calibration.ece:.3f}, ROC AUC {auc}, {calibration.words} words")
    top.legend(loc="upper left")
    bottom.bar([b.lower for b in calibration.bins], [b.words for b in calibration.bins],
               width=width, align="edge", edgecolor="black")  # fmt: skip
    bottom.set_yscale("symlog")  # its ticks in plain numbers: maths is not parsed here
    bottom.yaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
    bottom.set_xlabel("word confidence")
    bottom.set_ylabel("words")
    bottom.set_xlim(0, 1)
    fig.tight_layout()
    return fig


Curve = list[tuple[int, float]]  # (optimizer step, value)


def read_training_log(run: str | os.PathLike) -> dict[str, Curve]:
    """Every metric of a `metrics.csv` or run folder (all versions), as (step, value) pairs."""
    path = Path(run)
    files = [path] if path.is_file() else csv_logs(path)
    if not files:
        raise FileNotFoundError(f"{run}: no metrics.csv (nor logs/version_*/metrics.csv) there")
    curves: dict[str, dict[int, float]] = {}
    for file in files:
        for number, row in enumerate(csv.DictReader(log_lines(file)), start=2):
            try:
                for name, value in row.items():
                    if name not in ("epoch", "step") and value:
                        curves.setdefault(name, {})[int(row["step"])] = float(value)
            except (KeyError, TypeError, ValueError):
                raise ValueError(
                    f"{file}:{number}: not a training log (a metrics.csv with a step column "
                    "and numbers)"
                ) from None
    return {name: sorted(points.items()) for name, points in curves.items()}


def log_lines(file: Path) -> list[str]:
    """The lines of a metrics.csv; a last line cut short (a run killed as it wrote it: 0.42
    of 0.4243) left out, with a warning. ValueError names a file that is not UTF-8."""
    lines = _log_text(file)
    if lines and not lines[-1].endswith(("\n", "\r")):
        log.warning("%s:%d: a line cut short, left out", file, len(lines))
        lines.pop()
    return lines


def _log_text(file: Path) -> list[str]:
    """A metrics.csv's lines, ends kept; ValueError names the line of a byte not UTF-8."""
    data = Path(file).read_bytes()
    try:
        return data.decode("utf-8-sig").splitlines(keepends=True)  # a BOM, as spreadsheets save
    except UnicodeDecodeError:
        for number, line in manifest_lines(data):  # the line, as a manifest's is named
            decode_line_of(file, number, line)
        raise


def csv_logs(folder: Path, quiet: bool = False) -> list[Path]:
    """A run folder's logs/version_*/metrics.csv (in version order), a logs folder's, or its own;
    of versions, those that trained (`asr validate` and `asr test` of the run's checkpoints log
    there too, at step 0), unless none did, and of those, the last run's (`_latest_run`, which
    warns unless `quiet`)."""
    for pattern in ("logs/version_*/", "version_*/", ""):
        files = list(folder.glob(f"{pattern}metrics.csv"))
        if files:
            # the version folder's own name: a folder above may be named version_N too
            files.sort(key=lambda f: _version(f.parent.name))
            trained = [f for f in files if _of_training(f)]
            return _latest_run(trained, quiet) if trained else files
    return []


def _latest_run(files: list[Path], quiet: bool = False) -> list[Path]:
    """The versions of the last run among `files` (in version order), with a warning that
    names those left out. A version starts a new run (`asr fit` again in the folder) where it
    resumed no checkpoint, and goes on with its run where it resumed one; where it kept only
    `--ckpt_path last` (a fresh start where there was none) or no record, where its first
    step is at or before its run's first step, which a resumed run goes on past."""
    start, start_step = 0, None
    for k, file in enumerate(files):
        step = _first_step(file)
        resumed = _resumed(file.parent)
        if resumed is None or resumed == "last":
            afresh = step is not None and start_step is not None and step <= start_step
        else:
            afresh = not resumed
        if k and afresh:
            start, start_step = k, step
        elif start_step is None:
            start_step = step
    if start and not quiet:
        left_out = ", ".join(f.parent.name for f in files[:start])
        log.warning(
            "%s: a new run, from step %s: the curves leave out the earlier run's %s",
            files[start], start_step, left_out,
        )  # fmt: skip
    return files[start:]


RESUMED_FROM = "resumed_from.txt"  # beside config.yaml: the file a run resumed, else empty


def _resumed(version: Path) -> str | None:
    """The checkpoint the `asr fit` that logged into `version` resumed ("" where none), as it
    recorded it, else as its config.yaml names it (`last` where it kept that name, which may
    have been a fresh start); None where there is no such record."""
    import yaml

    try:
        return (version / RESUMED_FROM).read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError):
        pass  # a run from before the record, or none
    try:
        config = yaml.safe_load((version / "config.yaml").read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return None
    if not isinstance(config, dict) or "ckpt_path" not in config:
        return None
    return str(config["ckpt_path"] or "")


def _first_step(file: Path) -> int | None:
    """The step of a metrics.csv's first row; None where it has none or not a whole number."""
    row = next(csv.DictReader(_log_text(file)), None)
    try:
        return int(row["step"]) if row is not None else None
    except (KeyError, TypeError, ValueError):  # read_training_log names what is wrong
        return None


def _of_training(file: Path) -> bool:
    """Whether a metrics.csv is of training (a train/ value, or a step past 0), not of
    `asr validate` or `asr test`, which log at step 0."""
    rows = csv.DictReader(_log_text(file))
    train = [name for name in rows.fieldnames or () if name.startswith("train/")]
    return any(row.get("step") not in ("0", "", None) or any(row[n] for n in train)
               for row in rows)  # fmt: skip


def _version(folder: str) -> int:
    """N of a version_N folder (a folder above may be named so too), else 0."""
    match = re.fullmatch(r"version_(\d+)", folder)
    return int(match[1]) if match else 0


@_literal
def plot_training_curves(runs: Mapping[str, Mapping[str, Curve]], metrics: Sequence[str]) -> Figure:
    """One panel per metric against optimizer steps, one line per run; values that are not
    finite are gaps, each series with any named in a warning (a run that diverged to NaN must
    not pass for one that logged less)."""
    fig = Figure(figsize=(5.5, 2.6 * len(metrics)))
    axes = fig.subplots(len(metrics), 1, sharex=True, squeeze=False)[:, 0]
    # one colour per run in every panel, though a run may have logged only some metrics
    colours = [f"C{k % 10}" for k in range(len(runs))]
    for ax, metric in zip(axes, metrics):
        for colour, (label, curves) in zip(colours, runs.items()):
            if curves.get(metric):
                _warn_not_finite(label, metric, curves[metric])
                steps, values = zip(*curves[metric])
                alone = _isolated(values)  # a line needs two values: these get a dot
                ax.plot(steps, values, label=label, linewidth=1.2, color=colour,
                        marker="o", markersize=3, markevery=alone)  # fmt: skip
        ax.set_ylabel(metric)
        ax.grid(alpha=0.3)
    handles = [Line2D([], [], color=colour, linewidth=1.2) for colour in colours]
    axes[0].legend(handles, list(runs), fontsize=7)  # every run, drawn in the first panel or not
    axes[-1].set_xlabel("optimizer step")
    fig.tight_layout()
    return fig


def _warn_not_finite(label: str, metric: str, curve: Curve) -> None:
    """Log how many values of a run's series are NaN or infinite, at which steps (the first
    SHOWN_STEPS), or that none is finite (its panel shows nothing of the run)."""
    bad = [(step, value) for step, value in curve if not math.isfinite(value)]
    if not bad:
        return
    shown = ", ".join(f"{value} at step {step}" for step, value in bad[:SHOWN_STEPS])
    more = f" and {len(bad) - SHOWN_STEPS} more" if len(bad) > SHOWN_STEPS else ""
    if len(bad) == len(curve):
        said = "%s: %s: none of its %d values is finite (%s%s): nothing drawn"
        log.warning(said, label, metric, len(curve), shown, more)
    else:
        said = "%s: %s: %d of its %d values are not finite (%s%s): gaps in its line"
        log.warning(said, label, metric, len(bad), len(curve), shown, more)


def _isolated(values: Sequence[float]) -> list[int]:
    """Indices of finite values with no finite value beside them: no line segment shows them."""
    finite = [math.isfinite(v) for v in values]
    return [
        k
        for k, here in enumerate(finite)
        if here and not (k > 0 and finite[k - 1]) and not (k + 1 < len(finite) and finite[k + 1])
    ]


def save_figure(fig: Figure, path: str | os.PathLike) -> Path:
    """Write a PNG (`.png` added to a path without a suffix, as matplotlib adds it); the file
    written. The figure needs no closing."""
    path = Path(path)
    if path.is_dir():
        raise IsADirectoryError(f"{path}: a folder; name the picture file to write")
    if not path.suffix:
        path = path.with_suffix(".png")
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    return path


def save_alignment_plots(
    recognizer: Recognizer, alignment: Alignment, path: str | os.PathLike, title: str = ""
) -> list[Path]:
    """Write the attention plot to `path` (as `save_figure`; the mean of the maps that time
    words, as their boundaries are drawn) and every map to `<stem>_heads<suffix>`; the files
    written."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    labels = alignment.pieces + ["<eos>"]
    heads = recognizer.alignment_heads  # the maps the word times come from: drawn with them
    attention, heading = alignment.attention, title
    if heads is not None and attention.dim() == 3:
        attention = attention[list(heads)]
        heading = "\n".join(filter(None, [title, f"maps {list(heads)}"]))
    figure = plot_attention(
        attention,
        labels,
        alignment.features,
        frame_shift=alignment.feature_seconds,
        title=heading,
        seconds_per_frame=alignment.frame_seconds,
        words=alignment.words,
    )
    written = [save_figure(figure, path)]
    decoder = recognizer.model.decoder
    if decoder.num_attention_maps > 1:  # a Transformer's heads, on PyTorch or ONNX Runtime
        grid = plot_attention_grid(
            alignment.attention,
            decoder.attention_layers,
            labels,
            alignment.frame_seconds,
            title=title,
            words=alignment.words,
        )
        written.append(save_figure(grid, heads_plot_path(path)))
    return written


def heads_plot_path(path: str | os.PathLike) -> Path:
    """Where `save_alignment_plots` draws every map of a decoder of several."""
    path = Path(path)
    return path.with_name(f"{path.stem}_heads{path.suffix or '.png'}")
