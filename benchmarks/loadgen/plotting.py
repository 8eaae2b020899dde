"""matplotlib, headless, with small PNGs (the docs commit them)."""

from __future__ import annotations

from pathlib import Path

DPI = 100
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def subplots(ncols: int = 1, nrows: int = 1, width: float = 6.0, height: float = 4.0):
    """(figure, axes) of `ncols` x `nrows` panels of `width` x `height` inches each."""
    import matplotlib

    matplotlib.use("Agg")  # no display: render to files only
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(nrows, ncols, figsize=(width * ncols, height * nrows), squeeze=False)
    return fig, [ax for row in axes for ax in row]


def save(fig, path: str | Path) -> None:
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(path, dpi=DPI, format="png")
    plt.close(fig)
    print(f"wrote {path}")


def slo_line(ax, value_ms: float | None, label: str, horizontal: bool = True, style: str = "--") -> None:
    """A grey line at an SLO bound (nothing when the bound is not set)."""
    if value_ms is None:
        return
    draw = ax.axhline if horizontal else ax.axvline
    draw(value_ms, color="grey", linestyle=style, linewidth=1, label=label)
