"""The look shared by every study figure: the figure itself, colours, log axes, error-bar
captions, saving.

Why a module: each figure should answer its question at a glance and say how to read it, so the
rules live in one place: colours are never reused for two series of one figure (the palette is
sized to the number of series), perplexity sits on a log axis with plain-number ticks, and the
error bars are always described ("± std over 3 seeds"). Figures are `matplotlib.figure.Figure`
objects on an Agg canvas, never pyplot's global state: thread-safe, no display needed.
"""

from __future__ import annotations

import io
import math
from pathlib import Path
from typing import Hashable, Iterable, Sequence

import numpy as np
import pandas as pd
from matplotlib import colormaps
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, LogLocator, MaxNLocator, NullFormatter

from prunelab.analysis.records import LABEL_PREFIX

MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*", "<", ">")
ERROR_BARS = ("std", "ci", "none")


def new_figure(ncols: int = 1, nrows: int = 1, width: float = 4.8, height: float = 3.6,
               extra_width: float = 0.0) -> Figure:
    """An empty figure of `nrows` x `ncols` panels' size (plus `extra_width` inches for a legend
    beside them), constrained layout, Agg canvas."""
    figure = Figure(figsize=(width * ncols + extra_width, height * nrows), layout="constrained")
    FigureCanvasAgg(figure)
    return figure


def palette(keys: Iterable[Hashable]) -> dict[Hashable, tuple]:
    """One distinct colour per key, in order of first appearance: tab10 up to 10 keys, tab20 up to
    20, evenly spaced turbo beyond; never the same colour for two keys."""
    keys = list(dict.fromkeys(keys))
    if len(keys) <= 10:
        colours = [colormaps["tab10"](i) for i in range(len(keys))]
    elif len(keys) <= 20:
        colours = [colormaps["tab20"](i) for i in range(len(keys))]
    else:
        colours = [colormaps["turbo"](v) for v in np.linspace(0.05, 0.95, len(keys))]
    return dict(zip(keys, colours))


def markers(keys: Iterable[Hashable]) -> dict[Hashable, str]:
    """A marker per key (cycling), so series stay apart in greyscale print too."""
    return {key: MARKERS[i % len(MARKERS)] for i, key in enumerate(dict.fromkeys(keys))}


def use_log_axis(axis: Axes, values: Sequence[float], which: str = "y") -> None:
    """A log axis labelled with plain numbers, not 10^0.3: within a decade, evenly spaced round
    ticks (2.4, 2.6, 2.8...); within two, 1-2-5 per decade; beyond, the decades."""
    finite = np.asarray([v for v in values if np.isfinite(v) and v > 0], dtype=float)
    span = math.log10(finite.max() / finite.min()) if len(finite) else 1.0
    target = axis.yaxis if which == "y" else axis.xaxis
    (axis.set_yscale if which == "y" else axis.set_xscale)("log")
    if span < 1.0:
        target.set_major_locator(MaxNLocator(nbins=6, steps=[1, 2, 2.5, 5, 10]))
    elif span < 2.5:
        target.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    target.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
    target.set_minor_formatter(NullFormatter())


def error_bars(frame: pd.DataFrame, error: str) -> np.ndarray | None:
    """Half-widths (2 x n: below, above) of the error bars of each row, never negative: a CI
    half-width of -1e-16 (seeds that agree) or a missing std becomes 0."""
    if error == "none":
        return None
    mean = frame["mean"].to_numpy(dtype=float)
    if error == "std":
        below = above = frame["std"].to_numpy(dtype=float)
    else:
        below = mean - frame["ci_low"].to_numpy(dtype=float)
        above = frame["ci_high"].to_numpy(dtype=float) - mean
    bars = np.vstack([below, above])
    return np.clip(np.nan_to_num(bars, nan=0.0, posinf=0.0, neginf=0.0), 0.0, None)


def error_caption(error: str, seeds: Iterable[int]) -> str:
    """How to read the bars: "mean ± std over 3 seeds", "mean, 95% CI (t) over 3-5 seeds"."""
    counts = sorted({int(n) for n in seeds if n == n})
    if not counts:
        over = "seeds"
    elif counts[0] == counts[-1]:
        over = f"{counts[0]} seed{'s' if counts[0] != 1 else ''}"
    else:
        over = f"{counts[0]}–{counts[-1]} seeds"
    what = {"std": "mean ± std", "ci": "mean, 95% CI of the mean (t)", "none": "mean"}[error]
    return f"{what} over {over}"


def save_figure(figure: Figure, path: str | Path, dpi: int = 150) -> Path:
    """Save a figure as PNG (Agg), creating the folder."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=dpi, bbox_inches="tight")
    return path


def figure_png(figure: Figure, dpi: int = 110) -> bytes:
    """The figure as PNG bytes (for `IPython.display.Image`: no inline backend needed)."""
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=dpi, bbox_inches="tight")
    return buffer.getvalue()


def slug(text: str) -> str:
    """A file-name-safe metric or label name: ppl/wikitext2/token -> ppl-wikitext2-token."""
    text = text.removeprefix(LABEL_PREFIX)
    cleaned = "".join(c if c.isalnum() or c in "-_." else "-" for c in text)
    return cleaned.strip("-") or "plot"
