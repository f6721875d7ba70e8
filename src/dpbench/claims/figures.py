"""One figure per claim whose evidence is a comparison of numbers (C1, C6, C7, C8), drawn from the
ledger's own section data, so a figure shows exactly what decided the verdict.

Every figure is always written (the pipeline declares them as outputs); a claim that did not run
gets a figure that says why, like dpbench.plots' placeholders.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import pandas as pd
import seaborn as sns
from matplotlib.figure import Figure

from dpbench import results
from dpbench.plots import new_figure, palette, placeholder, save, style

Section = dict[str, Any]
ESTIMATE_PARTS = {"summed_grads": "summed gradients", "momentum": "momentum buffer",
                  "input_batch": "input batch kept\nfor the others", "gathered_logits": "gathered logits"}


def _data(s: Section, key: str) -> list | None:
    """One entry of a section's data; None where the claim did not run."""
    return (s.get("data") or {}).get(key)


def _missing(s: Section, title: str) -> Figure:
    return placeholder(title, s.get("not_run") or "no runs of this claim in the results")


def c1_figure(s: Section) -> Figure:
    title = "C1: what device 0 holds beyond the other devices (peak allocated, training steps)"
    runs = _data(s, "runs")
    if not runs:
        return _missing(s, title)
    df = pd.DataFrame(runs)
    df["config"] = [f"batch {b}\non {g} GPUs" for b, g in zip(df["global_batch"], df["gpus"])]
    order = list(dict.fromkeys(df.sort_values(["gpus", "global_batch"])["config"]))
    variants = list(dict.fromkeys(df["variant"]))
    fig, axes = new_figure(1, 2, legend=False)
    left, right = axes[0]
    sns.barplot(df, x="config", y="excess_mib", hue="variant", order=order, hue_order=variants,
                palette=palette(variants), ax=left)
    estimate = df.drop_duplicates("config").set_index("config")["estimate_total_mib"].reindex(order)
    left.scatter(range(len(order)), estimate, marker="_", s=900, color="black", zorder=3,
                 label="estimate from sizes")
    left.set(xlabel="", ylabel="device 0 minus mean of the others (MiB)", title="measured")
    top = max(df["excess_mib"].max(), estimate.max(), 0) * 1.7 or None   # room for the legend above the bars
    left.set_ylim(top=top)
    left.legend(loc="upper left", fontsize="small", framealpha=0.9, ncol=2)
    parts = pd.DataFrame([r["estimate_mib"] for r in runs], index=df["config"]).groupby(level=0).first()
    parts = parts.reindex(order).rename(columns=ESTIMATE_PARTS)
    parts.plot.bar(stacked=True, ax=right, rot=0, color=sns.color_palette("colorblind", len(parts.columns)))
    right.set(xlabel="", ylabel="MiB", title="estimate from sizes (fp32)", ylim=left.get_ylim())
    right.legend(loc="upper left", fontsize="small", framealpha=0.9, ncol=2)
    fig.suptitle(title)
    return fig


def c6_figure(s: Section) -> Figure:
    title = "C6: |loss - single's loss| per step, mean of means vs sum/N"
    training = _data(s, "training")
    if not training:
        return _missing(s, title)
    fig, axes = new_figure(1, len(training))
    for ax, t in zip(axes[0], training):
        curves = pd.concat([pd.DataFrame({"step": range(len(t[f"{v}_vs_single"]["by_step"])),
                                          "gap": t[f"{v}_vs_single"]["by_step"], "variant": v})
                            for v in ("dp_mean", "dp_sum")])
        curves = curves[curves["gap"] > 0]   # log scale: an exact match has no place on it
        sns.lineplot(curves, x="step", y="gap", hue="variant", palette=palette(["dp_mean", "dp_sum"]),
                     lw=1, ax=ax, legend=ax is axes[0][-1])
        split = "uneven" if t["uneven"] else "even"
        bn = ", BatchNorm eval" if t["bn_eval"] else ""
        ax.set(yscale="log", xlabel="optimizer step", ylabel="|loss_global - single|",
               title=f"{t['group']}: {t['gpus']} GPUs, {split} split{bn}")
    sns.move_legend(axes[0][-1], "center left", bbox_to_anchor=(1.02, 0.5), frameon=False)
    fig.suptitle(title)
    return fig


def c7_figure(s: Section) -> Figure:
    title = "C7: step time, cudnn.benchmark on vs off\n(median step, log scale)"
    training = _data(s, "training")
    if not training:
        return _missing(s, title)
    df = pd.DataFrame(training)
    df = df[(df["p50_on_ms"] > 0) & (df["p50_off_ms"] > 0)]   # NaN where a run timed no step
    if df.empty:
        return _missing(s, title)
    df["run"] = [f"{v}\n{g} GPU{'s' if g > 1 else ''}" for v, g in zip(df["variant"], df["gpus"])]
    long = df.melt(id_vars="run", value_vars=["p50_on_ms", "p50_off_ms"], var_name="benchmark",
                   value_name="step_ms")
    long["benchmark"] = long["benchmark"].map({"p50_on_ms": "on", "p50_off_ms": "off"})
    fig, axes = new_figure(1, 1, legend=False)
    ax = axes[0][0]
    sns.barplot(long, x="run", y="step_ms", hue="benchmark", hue_order=["off", "on"],
                palette={"off": "0.6", "on": "tab:red"}, ax=ax)
    ax.set(yscale="log", xlabel="", ylabel="step time p50 (ms)")
    ax.legend(frameon=False, title="cudnn.benchmark")
    fig.suptitle(title)
    return fig


def c8_figure(s: Section) -> Figure:
    title = "C8: images/s against one GPU (single), per recipe"
    rows = _data(s, "rows")
    if not rows:
        return _missing(s, title)
    df = pd.DataFrame(rows)
    single = df.drop_duplicates("group").assign(variant="single", gpus=1)
    single["images_per_s"] = single["single_images_per_s"]
    df = pd.concat([single, df], ignore_index=True)
    variants = list(dict.fromkeys(df["variant"]))
    groups = list(dict.fromkeys(df["group"]))
    titles = df.drop_duplicates("group").set_index("group")["options"].to_dict()
    fig, axes = new_figure(1, len(groups))
    for ax, g in zip(axes[0], groups):
        panel = df[df["group"] == g]
        sns.barplot(panel, x="gpus", y="images_per_s", hue="variant", hue_order=variants,
                    palette=palette(variants), ax=ax, legend=ax is axes[0][-1])
        ax.set(title=f"{g.removeprefix('c8_')}: {titles[g]}", xlabel="GPUs", ylabel="images/s")
    sns.move_legend(axes[0][-1], "center left", bbox_to_anchor=(1.02, 0.5), frameon=False)
    fig.suptitle(title)
    return fig


DRAW: dict[str, Callable[[Section], Figure]] = {"C1": c1_figure, "C6": c6_figure, "C7": c7_figure,
                                                "C8": c8_figure}


def figure_name(cid: str) -> str:
    return f"claim_{cid.lower()}.png"


def draw(results_dir: Path | str, tag: str, sections: list[Section]) -> dict[str, str]:
    """Writes every claim figure under results/<tag>/figures; returns claim id -> the path
    relative to the tag's folder, which is how claims.md links it."""
    out = results.figures_dir(results_dir, tag)
    by_id = {s["id"]: s for s in sections}
    written = {}
    with style():
        for cid, draw_one in DRAW.items():
            save(draw_one(by_id.get(cid, {"id": cid})), out / figure_name(cid))
            written[cid] = f"{out.name}/{figure_name(cid)}"
    return written
