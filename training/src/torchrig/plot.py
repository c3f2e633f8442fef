"""Loss and accuracy curves from the metrics records, as a PNG (matplotlib is optional)."""

from __future__ import annotations

from pathlib import Path

from .records import read_records


def plot_metrics(metrics_file: Path, out_png: Path) -> None:
    """Raises ImportError when matplotlib is missing; the caller logs it and goes on."""
    import matplotlib

    matplotlib.use("Agg")  # no display on a cluster node
    import matplotlib.pyplot as plt

    records, _ = read_records(metrics_file)
    train = [r for r in records if r["split"] == "train"]
    evals = [r for r in records if r["split"] == "eval"]
    fig, (ax_loss, ax_acc) = plt.subplots(1, 2, figsize=(10, 4))
    for rows, name in ((train, "train"), (evals, "held-out")):
        steps = [r["step"] for r in rows]
        ax_loss.plot(steps, [r["loss"] for r in rows], marker="." if rows is evals else None,
                     label=name)
        ax_acc.plot(steps, [r["accuracy"] for r in rows], marker="." if rows is evals else None,
                    label=name)
    ax_loss.set(xlabel="step", ylabel="loss", yscale="log", title="loss")
    ax_acc.set(xlabel="step", ylabel="accuracy", title="accuracy")
    for ax in (ax_loss, ax_acc):
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(out_png, dpi=100)
    plt.close(fig)
