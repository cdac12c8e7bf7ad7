"""Turn measurements into the markdown table, the JSON file and the bar chart."""

from __future__ import annotations

import json
import statistics
import textwrap
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.machine import machine_line
from benchmarks.registry import CEILING, IN_PROCESS, KINDS, RAY, SUBPROCESS, WITH_POLICY
from benchmarks.workloads import WORKLOADS
from benchmarks.wrappers import WRAPPERS

KIND_MEANING = {
    IN_PROCESS: "envs stepped one after another in the caller's process",
    SUBPROCESS: "envs stepped in parallel off the caller's thread: local worker processes (EnvPool: its C++ threads)",
    RAY: "envs in Ray actors",
    WITH_POLICY: "VecWorker.collect, a policy choosing the actions, envs in local worker processes",
    CEILING: "no wrapper: one bare process per core stepping its share of the envs, no caller, no messages",
}
KIND_COLOURS = {IN_PROCESS: "#8da0cb", SUBPROCESS: "#66c2a5", RAY: "#fc8d62", WITH_POLICY: "#e78ac3",
                CEILING: "#b3b3b3"}
COLUMNS = ("workload", "wrapper", "kind", "N", "steps/s median (min..max)", "us/env-step",
           "parent CPU us/env-step", "x best peer", "parallel efficiency", "start-up s", "peak RSS MiB (PSS)")
AGAINST_COLUMNS = ("workload", "wrapper", "steps/s: tree / {rev}", "per round (min..max)",
                   "parent CPU/step: tree / {rev}")
BASELINE_COLUMNS = ("workload", "wrapper", "baseline", "steps/s: wrapper / baseline", "per round (min..max)",
                    "parent CPU/step: wrapper / baseline")
CALLER_COLUMNS = ("workload", "wrapper", "workers x envs", "cores seen", "caller CPU us/batch step",
                  "per worker", "env step ms", "efficiency", "x ceiling")
TWIN_COLUMNS = ("workload", "wrapper", "twin", "steps/s: workload / twin", "per round (min..max)",
                "parent CPU/step: workload / twin")


def summarize(measurements: list[dict[str, Any]], cores: int | None = None) -> list[dict[str, Any]]:
    """Add medians, us per env-step, the ratio to the best peer, the parallel efficiency on ``cores``
    and, with --against, the ratio to REV."""
    rows = [{**m, **_spread(m["rates"]), **_parent_cpu(m)} for m in measurements]
    # The ceiling is nobody's peer: it is what every wrapper is over, in the table of the caller's cost.
    best = _fastest(rows, lambda row: (row["workload"], row["kind"]),
                    lambda row: not row["ours"] and row["kind"] != CEILING)
    serial = _fastest(rows, lambda row: row["workload"], lambda row: row["kind"] == IN_PROCESS)
    for row in rows:
        peer = best.get((row["workload"], row["kind"]))
        row["best_peer"] = peer[0] if peer else None
        row["ratio_to_best_peer"] = row["median"] / peer[1] if peer and row["median"] else None
        reference = serial.get(row["workload"])
        row["serial_reference"] = reference[0] if reference else None
        row["parallel_efficiency"] = (parallel_efficiency(row["median"], reference[1], cores)
                                      if reference and row["median"] and cores else None)
    _compare_with_revision(rows)
    _compare_with_baseline(rows)
    _compare_with_twin(rows)
    _caller_cost(rows)
    return rows


def _caller_cost(rows: list[dict[str, Any]]) -> None:
    """Per row: the caller's CPU per batch step per worker, the efficiency of a workload whose envs wait
    (``wait_efficiency``) and the rate over the ceiling measured on the same workload (``against_ceiling``)."""
    ceilings = _fastest(rows, lambda row: row["workload"], lambda row: row["kind"] == CEILING)
    for row in rows:
        workers, cpu = row.get("workers"), row["parent_cpu_us_per_step_median"]
        row["parent_cpu_us_per_worker"] = cpu / workers if cpu is not None and workers else None
        row["wait_efficiency"] = None
        if row.get("env_step_s") and workers and row["median"]:
            row["wait_efficiency"] = wait_efficiency(row["median"], row["num_envs"], workers, row["env_step_s"])
        ceiling = ceilings.get(row["workload"])
        row["against_ceiling"] = None
        if ceiling and row["median"] and row["kind"] != CEILING:
            row["against_ceiling"] = {"ceiling": ceiling[0], "ratio": row["median"] / ceiling[1]}


def wait_efficiency(rate: float, num_envs: int, workers: int, step_s: float) -> float:
    """Env-steps/s over N / (k x the step's length): 1.0 when each of the workers steps its k envs
    back to back and never waits for the caller."""
    envs_per_worker = -(-num_envs // workers)
    return rate / (num_envs / (envs_per_worker * step_s))


def parallel_efficiency(rate: float, serial_rate: float, cores: int) -> float:
    """Env-steps/s over what ``cores`` processes would do, each as fast as one stepping the envs alone.

    1.0: every core as busy with envs as one process stepping them one after
    another is; a backend at 0.9 leaves a tenth of the machine on the table.
    One process stepping alone scores 1 / cores.
    """
    return rate / (cores * serial_rate)


def _parent_cpu(measurement: dict[str, Any]) -> dict[str, float | None]:
    """The parent's CPU time per batch step and per env-step, medians of the repeats."""
    per_step = _median(measurement["parent_cpu_us_per_step"])
    return {"parent_cpu_us_per_step_median": per_step,
            "parent_cpu_us_per_env_step_median": None if per_step is None else per_step / measurement["num_envs"]}


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def _compare_with_twin(rows: list[dict[str, Any]]) -> None:
    """``against_twin`` of each row whose workload has a twin measured with the same wrapper (infos8 / noinfos8)."""
    measured = {(row["workload"], row["wrapper"]): row for row in rows}
    for row in rows:
        workload = WORKLOADS.get(row["workload"])
        twin = measured.get((workload.twin, row["wrapper"])) if workload and workload.twin else None
        row["against_twin"] = None
        if twin and row["median"] and twin["median"]:
            row["against_twin"] = {"twin": twin["workload"], **_ratios(row, twin)}


def _compare_with_revision(rows: list[dict[str, Any]]) -> None:
    """``against_revision`` of each working-tree row whose wrapper was also run on REV."""
    twins = {(row["workload"], row["wrapper"]): row for row in rows if row["revision"]}
    revisions = {row["revision"] for row in twins.values()}
    for row in rows:
        row["against_revision"] = None
        if row["revision"] is not None:
            continue
        for revision in revisions:
            twin = twins.get((row["workload"], f"{row['wrapper']}@{revision}"))
            if twin and row["median"] and twin["median"]:
                row["against_revision"] = {"revision": twin["revision"], **_ratios(row, twin)}


def _compare_with_baseline(rows: list[dict[str, Any]]) -> None:
    """``against_baseline`` of each row whose wrapper is a variant of another measured on its workload."""
    measured = {(row["workload"], row["wrapper"]): row for row in rows}
    for row in rows:
        spec = WRAPPERS.get(row["wrapper"])
        baseline = measured.get((row["workload"], spec.baseline)) if spec and spec.baseline else None
        row["against_baseline"] = None
        if baseline and row["median"] and baseline["median"]:
            row["against_baseline"] = {"baseline": baseline["wrapper"], **_ratios(row, baseline)}


def _ratios(row: dict[str, Any], twin: dict[str, Any]) -> dict[str, Any]:
    """``row`` / ``twin`` (REV's, or a baseline): of the medians, and of each round's pair measured side by side."""
    cpu, twin_cpu = row["parent_cpu_us_per_step_median"], twin["parent_cpu_us_per_step_median"]
    paired = len(row["rates"]) == len(twin["rates"])  # else a round failed on one side
    return {
        "steps_per_s_ratio": row["median"] / twin["median"],
        "round_ratios": [a / b for a, b in zip(row["rates"], twin["rates"], strict=True)] if paired else [],
        "parent_cpu_ratio": cpu / twin_cpu if cpu is not None and twin_cpu else None,
    }


def _spread(rates: list[float]) -> dict[str, float | None]:
    if not rates:
        return {"median": None, "min": None, "max": None, "us_per_env_step": None}
    median = statistics.median(rates)
    return {"median": median, "min": min(rates), "max": max(rates),
            "us_per_env_step": 1e6 / median}


def _fastest(rows: list[dict[str, Any]], key: Callable[[dict[str, Any]], Any],
             counts: Callable[[dict[str, Any]], bool]) -> dict[Any, tuple[str, float]]:
    """key(row) -> (wrapper, median) of the fastest row that ``counts``: the best peer of a kind,
    or the fastest in-process wrapper, the serial reference of parallel efficiency."""
    best: dict[Any, tuple[str, float]] = {}
    for row in rows:
        if not counts(row) or not row["median"]:
            continue
        if key(row) not in best or row["median"] > best[key(row)][1]:
            best[key(row)] = (row["wrapper"], row["median"])
    return best


def markdown(rows: list[dict[str, Any]], meta: dict[str, Any]) -> str:
    """The full report: header, table and the notes that make it readable."""
    lines = [
        "# parallelenv benchmarks",
        "",
        f"{meta['machine']['date']}; {machine_line(meta['machine'])}",
        "",
        _run_summary(meta["settings"], meta["machine"]["cores"]),
        "",
        *_table(COLUMNS, [_cells(row) for row in rows], left=3),
    ]
    tables = (_pair_table(rows, "against_baseline", "baseline", BASELINE_COLUMNS,
                          "Variants / their baseline, medians, each round's pair measured side by side; above 1 "
                          "the variant steps faster, or spends more of the caller's CPU per step:")
              + _pair_table(rows, "against_twin", "twin", TWIN_COLUMNS,
                            "Workloads / their twin (infos8 / noinfos8: the same envs with and without infos), "
                            "the same wrapper, medians, each round's pair measured side by side; below 1 the "
                            "workload steps slower, above 1 it costs the caller more CPU per step:")
              + _caller_table(rows, meta["machine"]["cores"])
              + _against_table(rows, meta["settings"]))
    return "\n".join(wrapped(line) for line in lines + [""] + tables + _notes(rows)) + "\n"


def wrapped(line: str, width: int = 100) -> str:
    """A long line of prose or a list item folded at ``width`` (markdown renders it the same), so that the
    report reads in a terminal or a log; a table row stays one line, as markdown needs it."""
    if len(line) <= width or line.startswith("|"):
        return line
    indent = " " * (len(line) - len(line.lstrip(" -")))  # a list item's text goes on under its first word
    return textwrap.fill(line, width, subsequent_indent=indent, break_long_words=False, break_on_hyphens=False)


def _pair_table(rows: list[dict[str, Any]], field: str, other: str, columns: tuple[str, ...],
                title: str) -> list[str]:
    """Each row / the row ``field`` names (its baseline wrapper, its twin workload); empty when no pair ran."""
    compared = [row for row in rows if row[field]]
    if not compared:
        return []
    cells = [[row["workload"], row["wrapper"], row[field][other]] + _ratio_cells(row[field]) for row in compared]
    return [title, "", *_table(columns, cells, left=3), ""]


def _caller_table(rows: list[dict[str, Any]], cores: int) -> list[str]:
    """The caller's cost per batch step, on the workloads whose envs wait and those with a ceiling measured."""
    shown = [row for row in rows if row["median"] and (row.get("env_step_s") or row["against_ceiling"]
                                                         or row["kind"] == CEILING)]
    if not shown:
        return []
    lines = ["The caller's cost per batch step (CPU time of the process that owns the vector env), per worker, "
             "and the share of the machine left to the envs: efficiency = steps/s over N / (k x the env's "
             "step, measured alone) where the envs wait; x ceiling = steps/s over the ceiling's, same run:", "",
             *_table(CALLER_COLUMNS, [_caller_cells(row, cores) for row in shown], left=4)]
    slopes = added_worker_costs(rows)
    if slopes:
        lines += ["", "What each added worker costs the caller per batch step: (caller CPU per batch step at the "
                  "most workers - at the fewest) / (the workers added), the same wrapper, envs each and step: " + "; ".join(
                      f"{wrapper} {k} env(s) each, {step_ms:g} ms steps, {low} -> {high} workers: {cost:,.1f} us"
                      for (wrapper, step_ms, k), (low, high, cost) in slopes.items())]
    return lines + [""]


def added_worker_costs(rows: list[dict[str, Any]]) -> dict[tuple[str, float, int], tuple[int, int, float]]:
    """(wrapper, step ms, envs per worker) -> (fewest workers, most, caller us per batch step per added
    worker), where the many-worker workloads measured it at two sizes or more."""
    sizes: dict[tuple[str, float, int], dict[int, float]] = defaultdict(dict)
    for row in rows:
        workload = WORKLOADS.get(row["workload"])
        cpu, workers = row["parent_cpu_us_per_step_median"], row.get("workers")
        if workload and workload.wait_s and workers and cpu is not None:
            sizes[(row["wrapper"], workload.wait_s * 1e3, -(-row["num_envs"] // workers))][workers] = cpu
    slopes = {}
    for key, cpu_by_workers in sizes.items():
        low, high = min(cpu_by_workers), max(cpu_by_workers)
        if high > low:
            slopes[key] = (low, high, (cpu_by_workers[high] - cpu_by_workers[low]) / (high - low))
    return slopes


def _caller_cells(row: dict[str, Any], real_cores: int) -> list[str]:
    workers, cpu = row.get("workers"), row["parent_cpu_us_per_step_median"]
    layout = f"{workers} x {-(-row['num_envs'] // workers)}" if workers else f"in caller x {row['num_envs']}"
    cores = f"{row['cores_seen']} (made to see)" if row.get("cores_seen") is not None else str(real_cores)
    per_worker, step, efficiency = row["parent_cpu_us_per_worker"], row.get("env_step_s"), row["wait_efficiency"]
    ceiling = row["against_ceiling"]
    return [row["workload"], f"**{row['wrapper']}**" if row["ours"] else row["wrapper"], layout, cores,
            "" if cpu is None else f"{cpu:,.0f}", "" if per_worker is None else f"{per_worker:,.1f}",
            "" if step is None else f"{step * 1e3:.2f}", "" if efficiency is None else f"{efficiency:.2f}",
            "" if ceiling is None else f"{ceiling['ratio']:.2f}x"]


def _ratio_cells(ratios: dict[str, Any]) -> list[str]:
    """The median ratio, the spread of the rounds' ratios, and the parent-CPU ratio, as table cells."""
    rounds, cpu = ratios["round_ratios"], ratios["parent_cpu_ratio"]
    return [f"{ratios['steps_per_s_ratio']:.3f}x", f"{min(rounds):.3f}..{max(rounds):.3f}" if len(rounds) > 1 else "",
            "" if cpu is None else f"{cpu:.3f}x"]


def _against_table(rows: list[dict[str, Any]], settings: dict[str, Any]) -> list[str]:
    """With --against: working tree / REV for each of our wrappers, as its own table."""
    compared = [row for row in rows if row["against_revision"]]
    against = settings.get("against")
    if not compared or not against:
        return []
    rev = against["revision"]
    lines = [f"Working tree / {rev} ({against['commit'][:10]}), medians; above 1 the working tree "
             f"steps faster, or spends more of the caller's CPU per step:", "",
             *_table(tuple(column.format(rev=rev) for column in AGAINST_COLUMNS),
                     [[row["workload"], row["wrapper"]] + _ratio_cells(row["against_revision"]) for row in compared],
                     left=2)]
    return lines + [""]


def _table(columns: tuple[str, ...], rows: list[list[str]], left: int) -> list[str]:
    """A markdown table, its first ``left`` columns aligned left, without the columns empty in every row
    (a quick run measures no memory, and its single repeat has no spread of rounds)."""
    kept = [i for i in range(len(columns)) if not rows or any(cells[i] for cells in rows)]
    return ["| " + " | ".join(columns[i] for i in kept) + " |",
            "| " + " | ".join("---" if i < left else "---:" for i in kept) + " |",
            *("| " + " | ".join(cells[i] for i in kept) + " |" for cells in rows)]


def _run_summary(settings: dict[str, Any], cores: int) -> str:
    steps = ", ".join(f"{name} {count}" for name, count in settings["steps"].items())
    load = settings["load_average"]
    against = settings.get("against")
    versus = f" against {against['revision']} ({against['commit'][:10]})" if against else ""
    summary = (f"Run: {settings['mode']}{versus}, {settings['repeats']} repeat(s), "
               f"{settings['wall_s']:.0f} s; "
               f"batch steps per repeat: {steps}; 1-min load average {load['start']} at start, "
               f"{load['end']} at end (on {cores} cores).")
    plan = settings.get("plan") or {}
    idle = plan.get("idle_wait") or {}
    if idle.get("runs_waited"):
        summary += (f" Waited {idle['waited_s']:.0f} s for an idle CPU before {idle['runs_waited']} runs, "
                    f"{idle['gave_up']} times in vain after {idle['patience_s']:g} s: those measured beside "
                    "other work.")
    if plan.get("stopped"):
        summary += (f" **Stopped early ({plan['stopped']}) after {plan['runs']} of {plan['planned']} runs: "
                    "the rows hold what finished.**")
    return summary


def _cells(row: dict[str, Any]) -> list[str]:
    name = f"**{row['wrapper']}**" if row["ours"] else row["wrapper"]
    if row["median"] is None:
        status = "skipped" if row["skipped"] else "failed"
        cells = [row["workload"], name, row["kind"], str(row["num_envs"]), f"{status} (see notes)"]
        return cells + [""] * (len(COLUMNS) - len(cells))
    speed = f"{row['median']:,.0f}"
    if len(row["rates"]) > 1:
        speed += f" ({row['min']:,.0f}..{row['max']:,.0f})"
    ratio = "" if row["ratio_to_best_peer"] is None else f"{row['ratio_to_best_peer']:.2f}x"
    memory = ""
    if row["peak_rss_mib"] is not None:
        memory = f"{row['peak_rss_mib']:,.0f} ({row['peak_pss_mib']:,.0f})"
    cpu, efficiency = row["parent_cpu_us_per_env_step_median"], row["parallel_efficiency"]
    return [row["workload"], name, row["kind"], str(row["num_envs"]), speed,
            f"{row['us_per_env_step']:.1f}", "" if cpu is None else f"{cpu:,.2f}", ratio,
            "" if efficiency is None else f"{efficiency:.2f}", f"{row['startup_s']:.2f}", memory]


def _notes(rows: list[dict[str, Any]]) -> list[str]:
    kinds = "; ".join(f"{kind} = {KIND_MEANING[kind]}" for kind in KINDS)
    notes = [
        "steps/s: env-steps of all envs per wall-clock second after a warm-up, median of the "
        "repeats (min..max); us/env-step = 1e6 / median. Every wrapper replays the same "
        "pre-sampled actions on the same envs, each repeat in a fresh Python process. The "
        "repeats are interleaved: each round measures every wrapper of a workload once (A B C, "
        "A B C, ...), so that the host's drift hits them alike.",
        "parent CPU us/env-step: CPU time (user + sys) of the measuring process alone, the one that "
        "owns the vector env, per env-step (a batch step's over N), median of the repeats; its worker "
        "processes are not counted, its threads are (EnvPool's). It is what the caller's core pays for "
        "the wrapper. The JSON has it per batch step too.",
        f"x best peer: median / the best median among the other libraries' wrappers of the same "
        f"kind on the same workload ({kinds}). Bold rows are parallelenv.",
        "parallel efficiency: median / (cores x the fastest in-process median on the workload: the same "
        "envs stepped one after another in one process). 1.00 = every core as busy with envs as that one "
        "process; one process alone scores 1 / cores. EnvPool steps its own C++ build of the env, cheaper "
        "a step than the Python one the reference steps, so it can pass 1.",
        "start-up s: construction + first reset, median of the repeats; imports, and for Ray "
        "wrappers starting the Ray instance, are excluded.",
    ]
    if any(row.get("cores_seen") is not None for row in rows):
        notes.append(
            "cores seen (made to see): the measuring process reported that many cores to parallelenv "
            "(os.sched_getaffinity and os.cpu_count replaced in it alone, benchmarks/machine.py seen_cores), so "
            "that the subproc backend takes the path of a machine with a core per worker. Its workers see "
            "the real cores; the caller's CPU per batch step is what carries over to such a machine, the "
            "wall-clock rate still shares the real cores.")
    if any(row["revision"] for row in rows):
        notes.append(
            "WRAPPER@REV: the same wrapper, run by the same harness, importing the parallelenv "
            "package of git revision REV instead of the working tree's; measured in the same "
            "rounds, each right after the working tree's.")
    if any(row["peak_rss_mib"] is not None for row in rows):
        notes.append(
            "peak RSS MiB: RSS summed over the benchmark process and all its descendant "
            "processes, sampled every 0.1 s outside the timed loops; RSS counts a page shared "
            "by forked workers once per process, so PSS (shared pages split between "
            "processes) is in parentheses.")
    wrappers = [f"  - {name}: {WRAPPERS[name].note}"
                for name in dict.fromkeys(row["wrapper"] for row in rows)
                if name in WRAPPERS and WRAPPERS[name].note]
    return ([f"- {note}" for note in notes]
            + ["- Wrappers, and how each auto-resets:"] + wrappers
            + [f"- {problem}" for problem in _problems(rows)])


def _problems(rows: list[dict[str, Any]]) -> list[str]:
    """Skips, failures and leftover processes, one line per wrapper and reason."""
    seen: dict[tuple[str, str], list[str]] = defaultdict(list)
    for row in rows:
        if row["skipped"]:
            seen[(row["wrapper"], f"skipped: {row['skipped']}")].append(row["workload"])
        elif row["error"]:
            seen[(row["wrapper"], f"failed: {row['error']}")].append(row["workload"])
        if row["leftover_processes"]:
            reason = f"left {row['leftover_processes']} child process(es) alive after close()"
            seen[(row["wrapper"], reason)].append(row["workload"])
    return [f"{wrapper} on {', '.join(workloads)}: {reason}"
            for (wrapper, reason), workloads in seen.items()]


def write_json(path: Path, rows: list[dict[str, Any]], meta: dict[str, Any]) -> None:
    slopes = [{"wrapper": wrapper, "step_ms": step_ms, "envs_per_worker": k, "from_workers": low,
               "to_workers": high, "caller_us_per_added_worker": cost}
              for (wrapper, step_ms, k), (low, high, cost) in added_worker_costs(rows).items()]
    path.write_text(json.dumps({**meta, "rows": rows, "added_worker_costs": slopes}, indent=2) + "\n")


def plot(path: Path, rows: list[dict[str, Any]], title: str) -> None:
    """Horizontal bars of median steps/s, one panel per workload, written to ``path``."""
    import matplotlib.pyplot as plt

    fig = figure(rows, title)
    if fig is not None:
        fig.savefig(path, dpi=120)
        plt.close(fig)


def figure(rows: list[dict[str, Any]], title: str) -> Any:
    """The chart as a matplotlib Figure (None when nothing was measured): one panel per workload, every
    panel on a linear axis from zero, so that a bar twice as long steps twice as fast in every panel."""
    import matplotlib

    matplotlib.use("Agg")  # no display here, and none needed for a PNG
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    panels = defaultdict(list)
    for row in rows:
        if row["median"]:
            panels[row["workload"]].append(row)
    if not panels:
        return None
    heights = [len(panel) + 2.5 for panel in panels.values()]  # the bars, the title and the axis label
    fig, axes = plt.subplots(len(panels), 1, figsize=(9, 0.32 * sum(heights) + 1.2),
                             gridspec_kw={"height_ratios": heights}, squeeze=False)
    for ax, (workload, panel) in zip(axes[:, 0], panels.items(), strict=True):
        _draw_panel(ax, workload, panel)
    present = {row["kind"] for panel in panels.values() for row in panel}
    handles = [Patch(color=KIND_COLOURS[kind], label=kind) for kind in KINDS if kind in present]
    handles.append(Patch(facecolor="white", edgecolor="black", linewidth=2,
                         label="parallelenv (ours)"))
    fig.legend(handles=handles, loc="lower center", ncol=len(handles), frameon=False)
    fig.suptitle(title, fontsize=9)
    height = fig.get_figheight()
    # tight_layout places the panels only: keep 0.3 inch clear for the title above them, 0.5 for the legend.
    fig.tight_layout(rect=(0, 0.5 / height, 1, 1 - 0.3 / height))
    return fig


def steps_label(value: float, _position: Any = None) -> str:
    """A tick's value as few characters as it needs: 0, 950, 12k, 1.5M."""
    for size, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= size:
            return f"{value / size:.3g}{suffix}"
    return f"{value:.3g}"


def _draw_panel(ax: Any, workload: str, panel: list[dict[str, Any]]) -> None:
    from matplotlib.ticker import FuncFormatter, MaxNLocator

    medians = [row["median"] for row in panel]
    errors = [[row["median"] - row["min"] for row in panel],
              [row["max"] - row["median"] for row in panel]]
    positions = range(len(panel))
    ax.barh(positions, medians, xerr=errors, capsize=2,
            color=[KIND_COLOURS[row["kind"]] for row in panel],
            edgecolor=["black" if row["ours"] else "none" for row in panel],
            linewidth=[2 if row["ours"] else 0 for row in panel])
    ax.set_yticks(list(positions), labels=[row["wrapper"] for row in panel], fontsize=8)
    ax.invert_yaxis()
    # Labels past the error bar's end, so the two never overlap; a bar too short to see still has its number.
    for position, row in zip(positions, panel, strict=True):
        ax.text(row["max"], position, f"  {row['median']:,.0f}", va="center", fontsize=7)
    ax.set_xlim(0, max(row["max"] for row in panel) * 1.25)
    # A few round ticks, each a short label: Matplotlib's default for large numbers ran them into each other.
    ax.xaxis.set_major_locator(MaxNLocator(nbins=5))
    ax.xaxis.set_major_formatter(FuncFormatter(steps_label))
    ax.tick_params(axis="x", labelsize=7)
    ax.set_xlabel("env-steps per second (linear scale, from 0)", fontsize=7)
    ax.set_title(f"{workload} (N={panel[0]['num_envs']})", fontsize=9, loc="left")
