"""Error-ratio plots from the records' `samples`, as base64 PNGs the HTML page embeds.

The question a reader asks is whether an implementation's error grows with sequence length or head
dimension faster than the tolerance model allows; the dashed line at ratio 1 is that allowance.
"""

from __future__ import annotations

import base64
import io
import math
from typing import Any

PLOT_AXES = (("Lk", "key sequence length Lk"), ("Dk", "head dimension Dk"))


def _label(text: str) -> str:
    # matplotlib parses $...$ as mathtext; a kernel name must stay plain text
    return text.replace("$", r"\$")


def ratio_plot(samples: list[dict[str, Any]], x_key: str, x_label: str) -> tuple[str, int] | None:
    """One figure, a panel per dtype, points per implementation: (base64 PNG, points left out)."""
    points = [s for s in samples if isinstance(s.get(x_key), int) and s[x_key] > 0]
    if not points:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    dtypes = sorted({s["dtype"] for s in points})
    impls = sorted({s["impl"] for s in points})
    colors = plt.get_cmap("tab10")
    ncols = min(len(dtypes), 3)
    nrows = math.ceil(len(dtypes) / ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(4.2 * ncols, 3.2 * nrows), squeeze=False)
    skipped = 0
    for ax, dtype in zip(axes.flat, dtypes):
        for i, impl in enumerate(impls):
            xs, ys = [], []
            for s in points:
                ratio = s.get("ratio_max")
                if s["dtype"] != dtype or s["impl"] != impl:
                    continue
                if not isinstance(ratio, (int, float)) or not math.isfinite(ratio):
                    skipped += 1
                    continue
                xs.append(s[x_key])
                ys.append(ratio)
            if xs:
                ax.scatter(xs, ys, s=14, alpha=0.75, color=colors(i % 10), label=_label(impl))
        ax.axhline(1.0, color="black", linestyle="--", linewidth=0.8)
        ax.set_xscale("log", base=2)
        ax.minorticks_off()
        ax.set_ylim(bottom=0)
        ax.set_title(_label(dtype), fontsize=10)
        ax.set_xlabel(x_label, fontsize=9)
        ax.set_ylabel("worst error ratio", fontsize=9)
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(dtypes):]:
        ax.axis("off")
    handles, labels = [], []
    for ax in axes.flat:
        for h, lab in zip(*ax.get_legend_handles_labels()):
            if lab not in labels:
                handles.append(h)
                labels.append(lab)
    if handles:
        fig.legend(handles, labels, loc="lower center", ncol=min(len(labels), 3), fontsize=8,
                   bbox_to_anchor=(0.5, 0.0))
    # fixed margins: tight_layout measured every tick label and doubled the drawing time
    legend_rows = math.ceil(len(labels) / 3)
    fig.subplots_adjust(left=0.07, right=0.98, top=1 - 0.3 / (3.2 * nrows), wspace=0.28, hspace=0.45,
                        bottom=(0.55 + 0.18 * legend_rows) / (3.2 * nrows))
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90)
    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode("ascii"), skipped


def ratio_plots(samples: list[dict[str, Any]]) -> list[tuple[str, str, int]]:
    """(title, base64 PNG, points left out as non-finite) for ratio vs Lk and vs Dk."""
    out = []
    for key, label in PLOT_AXES:
        made = ratio_plot(samples, key, label)
        if made is not None:
            out.append((f"Error ratio vs {label}", made[0], made[1]))
    return out
