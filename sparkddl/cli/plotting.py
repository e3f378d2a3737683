"""Training curves as a PNG: loss and each metric per epoch, train and validation."""
from __future__ import annotations

import io
from typing import Any


def plot_history(history: list[dict[str, Any]], best_epoch: int | None = None,
                 title: str = "") -> bytes:
    """The curves as PNG bytes (written by the caller wherever the run's outputs go)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    metrics = ["loss"] + sorted({k[len("train_"):] for row in history for k in row
                                 if k.startswith("train_") and k != "train_loss"})
    fig, axes = plt.subplots(1, len(metrics), figsize=(5 * len(metrics), 3.6), squeeze=False)
    epochs = [row["epoch"] for row in history]
    for ax, name in zip(axes[0], metrics):
        for split, style in (("train", "-o"), ("val", "-s")):
            key = f"{split}_{name}"
            points = [(e, row[key]) for e, row in zip(epochs, history) if row.get(key) is not None]
            if points:
                ax.plot(*zip(*points), style, markersize=3, label=split)
        if best_epoch:
            ax.axvline(best_epoch, color="grey", linestyle=":",
                       label=f"chosen (epoch {best_epoch})")
        ax.set_xlabel("epoch")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_title(name)
        ax.grid(alpha=0.3)
        ax.legend()
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    return buf.getvalue()
