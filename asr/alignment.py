"""Cross-attention alignments: plots (Chorowski et al. 2015, Fig. 1 style)."""

from __future__ import annotations

from collections.abc import Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from torch import Tensor  # noqa: E402


def plot_attention(
    attention: Tensor,
    labels: Sequence[str],
    features: Tensor | None = None,
    frame_shift: float = 0.01,
    title: str = "",
) -> Figure:
    """Spectrogram on top, head-averaged attention heatmap below.

    Args:
        attention: `(K, L, T_enc)` or `(L, T_enc)` weights; K maps are averaged.
        labels: one label per decoder step (the y-axis), e.g. token pieces plus `<eos>`.
        features: optional `(T_feat, D)` features of the same utterance for the top panel.
        frame_shift: seconds per feature frame; encoder frames span the same duration.
        title: figure title.

    Returns:
        A matplotlib Figure (caller saves or logs it, then closes it).
    """
    att = attention.float().mean(0) if attention.dim() == 3 else attention.float()
    num_steps, enc_frames = att.shape
    duration = (features.size(0) if features is not None else enc_frames) * frame_shift
    rows = 2 if features is not None else 1
    heights = [1, 2] if features is not None else [1]
    fig, axes = plt.subplots(
        rows, 1, figsize=(8, 2 + 0.18 * num_steps), sharex=True, height_ratios=heights
    )
    axes = list(axes) if rows > 1 else [axes]
    if features is not None:
        axes[0].imshow(
            features.float().T.cpu(), origin="lower", aspect="auto", extent=(0, duration, 0, 1)
        )
        axes[0].set_yticks([])
        axes[0].set_ylabel("features")
    ax = axes[-1]
    ax.imshow(
        att.cpu(),
        aspect="auto",
        cmap="Greys",
        interpolation="nearest",
        extent=(0, duration, num_steps - 0.5, -0.5),
    )
    ax.set_yticks(range(num_steps))
    ax.set_yticklabels(list(labels)[:num_steps], fontsize=7)
    ax.set_xlabel("time (s)")
    ax.set_ylabel("output token")
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return fig


def save_figure(fig: Figure, path: str) -> None:
    """Write a PNG and free the figure."""
    fig.savefig(path, dpi=100)
    plt.close(fig)
