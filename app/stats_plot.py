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


# ---------------------------------------------------------------------------- tttr compare

def write_compare_png(c, path: str) -> None:
    """Two panels: per task and overall, A - B with its 95% interval; pass@k and pass^k of
    both suites against k."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    best = c.best
    names = [t.task for t in c.tasks] + [f"overall ({best.how})"]
    diffs = [t.diff for t in c.tasks] + [best.mean]
    lows = [t.interval.low for t in c.tasks] + [best.interval.low]
    highs = [t.interval.high for t in c.tasks] + [best.interval.high]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    ys = list(range(len(names)))[::-1]
    ax1.errorbar(diffs, ys, xerr=[[d - lo for d, lo in zip(diffs, lows)], [hi - d for d, hi in zip(diffs, highs)]],
                 fmt="o", capsize=3, color="tab:blue")
    ax1.axvline(0, color="grey", lw=0.8)
    ax1.set_yticks(ys)
    ax1.set_yticklabels(names)
    ax1.set_xlim(-1.05, 1.05)
    ax1.set_title("pass rate A - B (95% interval)", fontsize=10)
    ks = [k for k, _, _ in c.pass_at_k]
    for series, style in ((c.pass_at_k, "-"), (c.pass_hat_k, "--")):
        name = "pass@k" if series is c.pass_at_k else "pass^k"
        ax2.plot(ks, [x for _, x, _ in series], style, marker="o", color="tab:red", label=f"A {name}")
        ax2.plot(ks, [y for _, _, y in series], style, marker="s", color="tab:green", label=f"B {name}")
    ax2.set_xticks(ks)
    ax2.set_ylim(-0.05, 1.05)
    ax2.set_xlabel("k")
    ax2.set_title("pass@k (some of k runs pass) and pass^k (all k pass)", fontsize=10)
    ax2.legend(fontsize=8)
    for ax in (ax1, ax2):
        ax.grid(alpha=0.3)
    fig.suptitle(f"tttr compare: A {c.a.suite_id} vs B {c.b.suite_id}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def compare_terminal_plot(c, width: int = PLOT_WIDTH) -> str:
    """Per task, the pass rates of A and B side by side, as text `width` columns wide."""
    import plotext as plt

    from tttr.sessions.safe_text import visible

    names = [visible(t.task, newlines=False) for t in c.tasks]
    a = [t.passed_a / t.runs_a for t in c.tasks]
    b = [t.passed_b / t.runs_b for t in c.tasks]
    plt.clf()
    plt.simple_multiple_bar(names, [a, b], labels=["A", "B"], width=width, title="pass rate per task (free runs)")
    out = plt.build()
    plt.clf()
    return out
