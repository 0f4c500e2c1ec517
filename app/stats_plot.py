"""The plots of `tttr stats`: per-task pass rate with its 95% interval per condition, and
action agreement per condition; as a PNG (matplotlib) or drawn in the terminal (plotext)."""

from __future__ import annotations

from tttr.engine.replay.variance import CONDITIONS

PLOT_WIDTH = 60  # columns of the terminal plot (`tttr stats`; the app's stats screen at most)
COLOURS = {"free": "tab:red", "token-pinned": "tab:orange", "trace-pinned": "tab:blue", "pinned": "tab:green"}


def write_png(stats, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")  # no display: a file only
    import matplotlib.pyplot as plt

    rows = [*stats.tasks, stats.overall]
    names = [t.task for t in rows]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    width = 0.8 / len(CONDITIONS)
    for k, cond in enumerate(CONDITIONS):
        xs, ys, lo, hi, agree = [], [], [], [], []
        for i, t in enumerate(rows):
            o = t.by_condition.get(cond)
            if o is None or o.interval is None:
                continue
            x = i + (k - (len(CONDITIONS) - 1) / 2) * width
            xs.append(x)
            ys.append(o.pass_rate)
            lo.append(o.pass_rate - o.interval.low)
            hi.append(o.interval.high - o.pass_rate)
            agree.append(o.agreement.fraction if o.agreement.fraction is not None else 0.0)
        ax1.errorbar(xs, ys, yerr=[lo, hi], fmt="o", capsize=3, color=COLOURS[cond], label=cond)
        ax2.bar(xs, agree, width=width, color=COLOURS[cond], label=cond)
    for ax, title in ((ax1, "pass rate (95% Wilson interval)"),
                      (ax2, "action agreement (pairs with the same state-modifying actions)")):
        ax.set_xticks(range(len(names)))
        ax.set_xticklabels(names, rotation=20, ha="right")
        ax.set_ylim(-0.05, 1.05)
        ax.set_title(title, fontsize=10)
        ax.grid(axis="y", alpha=0.3)
    handles, labels = ax2.get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=len(CONDITIONS), fontsize=9, frameon=False)
    fig.suptitle(f"tttr stats: suite {stats.suite_id}", fontsize=10)
    fig.tight_layout(rect=(0, 0.07, 1, 1))  # room for the legend below both panels
    fig.savefig(path, dpi=100)
    plt.close(fig)


def terminal_plot(stats, width: int = PLOT_WIDTH) -> str:
    """Two bar charts as text, `width` columns wide: overall agreement per condition, and the
    free condition's pass rate per task."""
    import plotext as plt

    from tttr.sessions.safe_text import visible

    charts = []
    conds = [c for c in CONDITIONS if c in stats.overall.by_condition]
    tasks = [t for t in stats.tasks if "free" in t.by_condition]
    for labels, values, title in (
        (conds, [stats.overall.by_condition[c].agreement.fraction or 0.0 for c in conds],
         "action agreement per condition (overall)"),
        ([t.task for t in tasks], [t.by_condition["free"].pass_rate or 0.0 for t in tasks],
         "pass rate, free condition"),
    ):
        if not labels:  # e.g. a suite without free runs: nothing to draw for this chart
            continue
        plt.clf()
        plt.simple_bar([visible(x, newlines=False) for x in labels], values, width=width, title=title)  # names from the file
        charts.append(plt.build())
    plt.clf()
    return "\n".join(charts)
