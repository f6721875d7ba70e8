"""C7's figure: step time with cudnn.benchmark on and off, per variant and GPU count.
"""
from __future__ import annotations

import math

import pandas as pd
import seaborn as sns
from matplotlib.figure import Figure

from dpbench.claims.figure_data import Section, data, missing
from dpbench.report.figstyle import new_figure


def c7_figure(s: Section) -> Figure:
    title = "C7: step time, cudnn.benchmark on vs off\n(median step over repeats{})"
    training = data(s, "training")
    if not training:
        return missing(s, title)
    df = pd.DataFrame(training)
    df = df[(df["p50_on_ms"] > 0) & (df["p50_off_ms"] > 0)]   # NaN where a run timed no step
    if df.empty:
        return missing(s, title)
    df["run"] = [f"{v}\n{g} GPU{'s' if g > 1 else ''}" for v, g in zip(df["variant"], df["gpus"])]
    long = df.melt(id_vars="run", value_vars=["p50_on_ms", "p50_off_ms"], var_name="benchmark",
                   value_name="step_ms")
    long["benchmark"] = long["benchmark"].map({"p50_on_ms": "on", "p50_off_ms": "off"})
    fig, axes = new_figure(1, 1, legend=False)
    ax = axes[0][0]
    sns.barplot(long, x="run", y="step_ms", hue="benchmark", hue_order=["off", "on"],
                palette={"off": "0.6", "on": "tab:red"}, ax=ax)
    # A log axis only where the times span more than a decade (DataParallel's re-tuning), and
    # then from a decade under the power of ten below the shortest bar: a log axis cut just
    # under the bars would turn a 1% difference into a bar and its stub.
    low, high = long["step_ms"].min(), long["step_ms"].max()
    wide = high / low > 10
    if wide:
        ax.set_yscale("log")
        ax.set_ylim(bottom=10 ** math.floor(math.log10(low)) / 10)
    else:
        ax.set_ylim(bottom=0)
    ax.set(xlabel="", ylabel="step time p50 (ms)")
    ax.legend(frameon=False, title="cudnn.benchmark", loc="upper left", bbox_to_anchor=(1.0, 1.0))   # beside the bars
    fig.suptitle(title.format(", log scale" if wide else ""))
    return fig
