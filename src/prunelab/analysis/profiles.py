"""Per-layer profiles from the records: the sparsity each layer was given, or the score each layer
got from the depth scorer, mean over seeds with a ± std band.

Why panels: layer scores of different scorers live on unrelated scales (Shortened-LLaMA's
magnitude near 5e5, block influence below 1), and per-layer sparsity targets cluster around
each target sparsity, so one axis flattens all but the largest series. Scores get a panel per
scorer (and model), sparsity a panel per target (and model), each with its own y-axis and
every series its own colour. Settings whose profile is identical (the scores do not depend on how
many layers are then removed, or on the recovery) are drawn once.
"""

from __future__ import annotations

import json
import math
from typing import Any, Iterable, Mapping, Sequence

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from prunelab.analysis.names import display_name
from prunelab.analysis.records import AnalysisError, RunRecord
from prunelab.analysis.style import new_figure, palette

PANEL_LABEL = {"scores": "scorer", "sparsity": "sparsity"}
MAX_COLUMNS = 3
SAME_PROFILE_RTOL = 1e-5


def layer_profiles(records: Iterable[RunRecord], kind: str = "sparsity",
                   field: str = "target") -> pd.DataFrame:
    """Per-layer values, mean and std over seeds, one row per (signature, layer).

    kind="sparsity" reads `sparsity.per_layer[*][field]` (field: target or actual);
    kind="scores" reads `pruning.layer_scores` (a list, a {layer: score} dict, or a list of
    {layer, score} dicts). Columns: signature, label, layer, mean, std, n, then one column per
    record label (model, scorer, sparsity...).
    """
    records = list(records)
    names = _record_names(records)
    rows = [{"signature": record.signature, "label": names[record.signature], "layer": layer,
             "value": value, **{f"_{k}": _text(v) for k, v in record.labels.items()}}
            for record in records for layer, value in _layer_values(record, kind, field)]
    if not rows:
        return pd.DataFrame(columns=["signature", "label", "layer", "mean", "std", "n"])
    frame = pd.DataFrame(rows)
    keys = ["signature", "label", "layer"] + [c for c in frame.columns if c.startswith("_")]
    grouped = frame.fillna({c: "" for c in keys}).groupby(keys, sort=True)["value"]
    profiles = grouped.agg(mean="mean", std="std", n="count").reset_index()
    return profiles.rename(columns={c: c[1:] for c in keys if c.startswith("_")})


def plot_layer_profile(records: Iterable[RunRecord], kind: str = "sparsity",
                       field: str = "target") -> Figure:
    """Per-layer sparsity targets (or layer scores) per setting, mean over seeds with a ± std
    band, a panel per target sparsity (or scorer); raises AnalysisError when no record has
    such data."""
    profiles = layer_profiles(records, kind, field)
    if profiles.empty:
        raise AnalysisError(f"no per-layer {kind} in the records")
    panel_keys = [k for k in ("model", PANEL_LABEL[kind]) if k in profiles
                  and (k != "model" or profiles[k].nunique() > 1)]
    panels = list(profiles.groupby(panel_keys, sort=True)) if panel_keys else [((), profiles)]
    lines = [(_panel_title(key, panel_keys), line_label, line)
             for key, panel in panels
             for line_label, line in sorted(_distinct_profiles(panel, panel_keys),
                                            key=lambda item: _number_first(item[0]))]
    shared = kind == "sparsity"  # the same series in every panel: one legend beside them
    colour_of = palette((title, label) if kind == "scores" else label
                        for title, label, _ in lines)
    ncols = 2 if len(panels) == 4 else min(MAX_COLUMNS, len(panels))  # 2 x 2 over 3 + 1
    nrows = math.ceil(len(panels) / ncols)
    figure = new_figure(ncols=ncols, nrows=nrows, width=4.4, height=3.2,
                        extra_width=1.6 if shared else 0.0)
    axes = figure.subplots(nrows, ncols, squeeze=False).ravel()
    for axis, (key, _) in zip(axes, panels):
        title = _panel_title(key, panel_keys)
        mine = [(label, line) for panel, label, line in lines if panel == title]
        for label, line in mine:
            colour = colour_of[(title, label) if kind == "scores" else label]
            std = line["std"].fillna(0.0)
            axis.plot(line["layer"], line["mean"], marker=".", color=colour, label=label or None)
            axis.fill_between(line["layer"], line["mean"] - std, line["mean"] + std,
                              color=colour, alpha=0.2, linewidth=0)
        axis.set_title(title, fontsize="medium")
        axis.xaxis.set_major_locator(MaxNLocator(integer=True))
        axis.ticklabel_format(axis="y", style="sci", scilimits=(-3, 4), useOffset=False)
        axis.set_xlabel(display_name("layer"))
        axis.set_ylabel("Layer score" if kind == "scores" else f"Sparsity ({field})")
        axis.grid(alpha=0.3)
        if not shared and any(label for label, _ in mine):
            axis.legend(fontsize="x-small")
    for axis in axes[len(panels):]:
        axis.set_visible(False)
    if shared and any(label for _, label, _ in lines):
        handles = {}
        for axis in axes[:len(panels)]:
            for handle, label in zip(*axis.get_legend_handles_labels()):
                handles.setdefault(label, handle)
        order = sorted(handles, key=_number_first)
        figure.legend([handles[k] for k in order], order, loc="outside right center",
                      fontsize="small")
    what = "Per-layer score by scorer" if kind == "scores" else f"Per-layer sparsity ({field})"
    seeds = sorted({int(n) for n in profiles["n"]})
    over = f"{seeds[0]}" if seeds[0] == seeds[-1] else f"{seeds[0]}–{seeds[-1]}"
    figure.suptitle(f"{what}: mean over {over} seeds, band ± std")
    return figure


# --------------------------------------------------------------------------- helpers


def _distinct_profiles(panel: pd.DataFrame, panel_keys: Sequence[str]):
    """(label, profile) per distinct mean profile in a panel; settings with the same profile
    share one line, labelled by the labels that tell its settings from the panel's others."""
    label_keys = [c for c in panel.columns if c not in {"signature", "label", "layer", "mean",
                                                        "std", "n", *panel_keys}]
    varying = [k for k in label_keys if panel[k].nunique() > 1]
    groups: list[tuple[pd.DataFrame, list[str]]] = []
    for signature, profile in panel.groupby("signature", sort=False):
        profile = profile.sort_values("layer")
        for representative, members in groups:
            if _same_profile(representative, profile):
                members.append(signature)
                break
        else:
            groups.append((profile, [signature]))
    for representative, members in groups:
        chosen = panel[panel["signature"].isin(members)]
        parts = []
        for key in varying:
            values = sorted(set(chosen[key]), key=_number_first)
            if len(groups) > 1 and len(values) < panel[key].nunique():
                numbers = all(_number_first(v)[0] == 0 for v in values)
                parts.append(f"{display_name(key).lower()} {'/'.join(values)}"
                             if numbers or len(varying) > 1 else "/".join(values))
        if not parts and len(groups) > 1:  # told apart by no label: name the first setting
            parts = [str(chosen["label"].iloc[0])]
        yield ", ".join(parts), representative.sort_values("layer")


def _same_profile(a: pd.DataFrame, b: pd.DataFrame) -> bool:
    if list(a["layer"]) != list(b["layer"]):
        return False
    # Same to 5 significant digits: a re-run on another machine moves float32 scores by ~1e-8.
    return bool(np.allclose(a["mean"], b["mean"], rtol=SAME_PROFILE_RTOL, atol=0,
                            equal_nan=True))


def _panel_title(key: Any, panel_keys: Sequence[str]) -> str:
    """"smollm2_135m · block_influence", "sparsity 0.5"."""
    key = key if isinstance(key, tuple) else (key,)
    return " · ".join(f"{name} {part}" if name == "sparsity" else str(part)
                      for name, part in zip(panel_keys, key) if part != "")


def _number_first(text: str) -> tuple:
    try:
        return (0, float(text), "")
    except ValueError:
        return (1, 0.0, text)


def _text(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float) and value.is_integer() and abs(value) >= 1:
        return str(int(value))
    return value if isinstance(value, str) else json.dumps(value, default=str)


def _record_names(records: Sequence[RunRecord]) -> dict[str, str]:
    keys = sorted({key for record in records for key in record.labels})
    varying = [k for k in keys if len({json.dumps(r.labels.get(k), default=str)
                                       for r in records}) > 1]
    shown = varying or [k for k in ("method",) if k in keys]
    return {r.signature: " ".join(str(r.labels.get(k, "")) for k in shown) or r.signature
            for r in records}


def _layer_values(record: RunRecord, kind: str, field: str) -> list[tuple[int, float]]:
    if kind == "sparsity":
        per_layer = (record.data.get("sparsity") or {}).get("per_layer") or []
        return [(int(item["layer"]), float(item[field])) for item in per_layer
                if isinstance(item, Mapping) and item.get(field) is not None]
    if kind == "scores":
        return _scores(record.data.get("pruning") or {})
    raise AnalysisError(f"unknown profile kind {kind!r}; use sparsity or scores")


def _scores(pruning: Mapping[str, Any]) -> list[tuple[int, float]]:
    scores = pruning.get("layer_scores")
    if isinstance(scores, Mapping):
        return sorted((int(layer), float(score)) for layer, score in scores.items())
    if isinstance(scores, list):
        pairs = []
        for i, item in enumerate(scores):
            if isinstance(item, Mapping):
                value = item.get("score", item.get("value"))
                if value is not None:
                    pairs.append((int(item.get("layer", i)), float(value)))
            elif item is not None:
                pairs.append((i, float(item)))
        return pairs
    return []
