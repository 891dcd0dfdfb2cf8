"""python -m evolve report [history.csv] [--out DIR] [--recipe OUT.txt]: what a history says.

A per-generation table, the operators that paid off (how often each made a correct child,
and one faster than its parent), the winner's lineage, and PNG plots: best and median
fitness over time, pass rate, tokens/s against peak memory. The winner is the one the
search's final chose (or, without a final, the best fitted speed of the confirmed programs),
on the target of the latest run. With --recipe, the winner's lineage is written as a
recipe that makes it from the seed (evolve/recipe.py).
"""
from pathlib import Path

import pandas as pd
from matplotlib.figure import Figure  # the object API: no pyplot state, no display backend to choose
from matplotlib.ticker import MaxNLocator

from evolve import history
from evolve.final import FINAL, beats
from evolve.recipe import LineageError, lineage_recipe
from evolve.scores import Scores
from evolve.workspace import format_lineage


def report(path, out_dir=None, recipe_path=None) -> int:
    """Print the tables, write the plots (and the winner's recipe); 1 when the recipe asked
    for cannot be written."""
    frame = history.read(path)  # warns about damaged lines on stderr
    if frame.empty:
        print(f"{path}: no rows")
        return 0
    latest = frame.iloc[-1]
    if "target" in frame.columns and latest.get("target", ""):
        frame = frame[frame["target"] == latest["target"]]
    per_generation = generation_table(frame)
    operators = operator_table(frame)
    winner = winner_of(frame)
    print("per generation\n" + per_generation.to_string(index=False, float_format="{:,.1f}".format))
    print("\noperators\n" + operators.to_string(index=False, float_format="{:.2f}".format))
    if winner:
        print(f"\nwinner {winner}\nlineage: {format_lineage(history.lineage(frame, winner))}")
    out_dir = Path(out_dir) if out_dir else Path(path).resolve().parent / "report"
    for plot in write_plots(frame, per_generation, out_dir, winner):
        print(f"wrote {plot}")
    return write_recipe(frame, winner, path, recipe_path) if recipe_path else 0


def write_recipe(frame: pd.DataFrame, winner: str, history_path, recipe_path) -> int:
    if not winner:
        print("no recipe: no program was judged correct")
        return 1
    try:
        text = lineage_recipe(frame, winner, history_path)
    except LineageError as err:
        print(f"no recipe for {winner}: {err}")
        return 1
    Path(recipe_path).write_text(text)
    print(f"wrote {recipe_path}: the recipe of {winner} (python -m mutations recipe {recipe_path} -o engine.py)")
    return 0


def generation_table(frame: pd.DataFrame) -> pd.DataFrame:
    """Per run and generation: judged, passed, pass rate, best and median fitness, best so far."""
    judged = history.judged_rows(frame)
    rows = []
    for (run_id, gen), group in judged.groupby(["run_id", "generation"], sort=False):
        ok = group[group["status"] == "ok"]
        rows.append({"run_id": run_id, "generation": int(gen), "judged": len(group), "passed": len(ok),
                     "pass_rate": len(ok) / len(group), "best": ok["fitness"].max() if len(ok) else 0.0,
                     "median": ok["fitness"].median() if len(ok) else 0.0})
    table = pd.DataFrame(rows, columns=["run_id", "generation", "judged", "passed", "pass_rate", "best", "median"])
    table["best_so_far"] = table["best"].cummax()
    return table


def operator_table(frame: pd.DataFrame) -> pd.DataFrame:
    """Per operator: children judged, correct, and faster than their (first) parent."""
    judged = history.judged_rows(frame)
    parent_fitness = mean_fitness(frame)
    rows = []
    for operator, group in judged.groupby("operator"):
        ok = group[group["status"] == "ok"]
        first_parents = ok["parent_ids"].str.split(";").str[0]
        improved = sum(1 for child, parent in zip(ok["fitness"], first_parents)
                       if parent in parent_fitness and child > parent_fitness[parent])
        rows.append({"operator": operator, "children": len(group), "correct": len(ok),
                     "correct_rate": len(ok) / len(group), "improved": improved,
                     "improved_rate": improved / len(group)})
    declined = frame[frame["status"] == "declined"].groupby("operator").size()
    table = pd.DataFrame(rows, columns=["operator", "children", "correct", "correct_rate", "improved",
                                        "improved_rate"])
    table["declined"] = table["operator"].map(declined).fillna(0).astype(int)
    return table.sort_values(["improved", "correct"], ascending=False)


def mean_fitness(frame: pd.DataFrame) -> dict:
    """candidate id -> mean fitness over its ok judgements, for programs never judged failing."""
    judged = frame[frame["status"].isin(history.JUDGED_STATUSES) & (frame["candidate_id"] != "")]
    failed = set(judged.loc[judged["status"] != "ok", "candidate_id"])
    ok = judged[(judged["status"] == "ok") & ~judged["candidate_id"].isin(failed)]
    return ok.groupby("candidate_id")["fitness"].mean().to_dict()


def final_rows(frame: pd.DataFrame) -> pd.DataFrame:
    """The final's judgements: its rows labelled FINAL, and the closing merge's, which names the
    operator that made it (a program's first row does) and is told by where it was judged:
    the final's generation, in full, beside the final's baseline (the floor)."""
    labelled = frame["operator"] == FINAL
    batches = set(zip(*(frame.loc[labelled, key] for key in ("run_id", "generation", "baseline_id"))))
    in_batch = [row in batches for row in zip(frame["run_id"], frame["generation"], frame["baseline_id"])]
    return frame[labelled | (pd.Series(in_batch, index=frame.index) & (frame["level"] == "full"))]


def winner_of(frame: pd.DataFrame) -> str:
    """As the search chose (evolve.final): of the last final's contenders that beat its floor
    (clearly, or beside the seed at all), the best fitted speed (evolve.scores), else the
    floor; with no final (or one of a layout that kept no baseline), the best fitted speed of
    the programs a full judgement confirmed, or of all correct ones; of those, when the run
    had a floor other than the seed, the floor and the programs clearly faster beside it.
    (Best mean fitness, a screen's single noisy figure, once named a winner the search had
    not chosen; so did the fit over the whole history, which the final's own rows can tip
    towards the winner's parent: a CPU run's 392.0 against 391.9 tok/s.)"""
    scores = Scores.from_frame(frame)
    finals = final_rows(frame)
    finals = finals[(finals["status"] == "ok") & (finals["baseline_id"] != "")]
    if len(finals):
        finals = finals[finals["run_id"] == finals["run_id"].iloc[-1]]
        floor = finals["baseline_id"].iloc[-1]
        beside_seed = floor in set(frame.loc[frame["operator"] == "seed", "candidate_id"])
        won = [row["candidate_id"] for _, row in finals.iterrows()
               if scores.is_ok(row["candidate_id"]) and beats(row, beside_seed)]
        return max(won, key=scores.speed) if won else floor
    correct = [cid for cid in scores.by_id if cid and scores.is_ok(cid)]
    pool = [cid for cid in correct if scores.is_confirmed(cid)] or correct
    floor = floor_of(frame)
    if floor and scores.is_ok(floor):  # kept unless a program was clearly faster beside it
        pool = scores.held_to(floor, pool)
    return max(pool, key=scores.speed) if pool else ""


def floor_of(frame: pd.DataFrame) -> str:
    """The last run's floor when it was not the seed: what its generation 0 was judged beside."""
    run = frame[frame["run_id"] == frame["run_id"].iloc[-1]]
    beside = run.loc[(run["generation"] == 0) & (run["baseline_id"] != ""), "baseline_id"]
    seeds = set(frame.loc[frame["operator"] == "seed", "candidate_id"])
    return "" if beside.empty or beside.iloc[0] in seeds else beside.iloc[0]


def write_plots(frame: pd.DataFrame, per_generation: pd.DataFrame, out_dir: Path, winner: str = "") -> list:
    out_dir.mkdir(parents=True, exist_ok=True)
    step = range(len(per_generation))  # generations of every run, one after another
    ok = history.judged_rows(frame)
    ok = ok[ok["status"] == "ok"]
    plots = {"fitness_over_time.png": plot_fitness(per_generation, step),
             "pass_rate.png": plot_pass_rate(per_generation, step),
             "tps_vs_memory.png": plot_tps_vs_memory(ok)}
    if winner:
        plots["lineage.png"] = plot_lineage(frame, winner)
    for name, fig in plots.items():
        fig.tight_layout()
        fig.savefig(out_dir / name, dpi=100)
    return [out_dir / name for name in plots]


def generation_axis(ax) -> None:
    ax.set_xlabel("generation (runs in order)")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # generations are whole


def plot_fitness(per_generation: pd.DataFrame, step) -> Figure:
    fig = Figure(figsize=(7, 4))
    ax = fig.subplots()
    ax.plot(step, per_generation["best_so_far"], label="best so far")
    ax.plot(step, per_generation["best"], label="best of generation", alpha=0.6)
    ax.plot(step, per_generation["median"], label="median of correct", alpha=0.6)
    ax.set_ylabel("fitness (geometric mean tokens/s)")
    generation_axis(ax)
    ax.legend()
    return fig


def plot_pass_rate(per_generation: pd.DataFrame, step) -> Figure:
    fig = Figure(figsize=(7, 3))
    ax = fig.subplots()
    ax.bar(step, per_generation["pass_rate"])
    ax.set(ylabel="pass rate", ylim=(0, 1))
    generation_axis(ax)
    return fig


def plot_tps_vs_memory(ok: pd.DataFrame) -> Figure:
    """Fitness against peak memory; a device that measures no memory (CPU) is said so,
    not drawn as zeros."""
    fig = Figure(figsize=(6, 4))
    ax = fig.subplots()
    ax.set(xlabel="peak memory (MB)", ylabel="fitness (geometric mean tokens/s)")
    measured = ok[ok["peak_memory_mb"].fillna(0) > 0]
    if measured.empty:
        ax.text(0.5, 0.5, f"no peak memory measured on {devices_of(ok)} runs", ha="center", va="center",
                transform=ax.transAxes)
        ax.set(xticks=[], yticks=[])
    else:
        ax.scatter(measured["peak_memory_mb"], measured["fitness"], s=12)
    return fig


def devices_of(rows: pd.DataFrame) -> str:
    """The devices that judged `rows` ("cuda:0" counted as cuda), or "these" when unknown."""
    names = sorted({str(d).split(":")[0] for d in rows.get("device", pd.Series(dtype=str)).dropna() if str(d)})
    return " and ".join(names) if names else "these"


def ancestry(found: dict, winner: str) -> dict:
    """candidate id -> its depth (0 for a program with no known parent) over every parent,
    of the winner and all it came from."""
    depth = {}

    def visit(cid: str, path: frozenset) -> int:
        if cid not in depth:
            parents = [p for p in found.get(cid, ([],))[0] if p in found and p not in path]
            depth[cid] = 1 + max((visit(p, path | {cid}) for p in parents), default=-1)
        return depth[cid]
    visit(winner, frozenset())
    return depth


def plot_lineage(frame: pd.DataFrame, winner: str) -> Figure:
    """The winner's lineage as a tree: every ancestor by depth, an edge from each parent, each
    node its id and the operator that made it; the first parents' line (the text's lineage) in
    colour."""
    found = history.origins(frame)
    depth = ancestry(found, winner)
    layers = {}
    for cid in sorted(depth, key=lambda c: (depth[c], c)):
        layers.setdefault(depth[cid], []).append(cid)
    place = {cid: (d, i - (len(ids) - 1) / 2) for d, ids in layers.items() for i, cid in enumerate(ids)}
    main = {step["candidate_id"] for step in history.lineage(frame, winner)}
    fig = Figure(figsize=(max(4.0, 2.6 * len(layers)), max(2.0, 0.9 * max(map(len, layers.values())) + 1)))
    ax = fig.subplots()
    for cid, (x, y) in place.items():
        for parent in found.get(cid, ([],))[0]:
            if parent in place:
                on_line = cid in main and parent in main
                ax.annotate("", xy=(x, y), xytext=place[parent], arrowprops=dict(
                    arrowstyle="->", color="tab:blue" if on_line else "0.6", lw=1.6 if on_line else 0.8,
                    shrinkA=28, shrinkB=28))  # the arrow ends at the label's edge, not under it
        label = f"{cid[:8]}\n{short_operator(found.get(cid, ([], ''))[1])}"
        ax.text(x, y, label, ha="center", va="center", fontsize=7,
                bbox=dict(boxstyle="round", fc="gold" if cid == winner else "white",
                          ec="tab:blue" if cid in main else "0.6"))
    ax.set(xlim=(-0.6, len(layers) - 0.4), xticks=range(len(layers)), xlabel="steps from the first programs",
           yticks=[], title=f"lineage of {winner[:8]}")
    ax.set_ylim(min(y for _, y in place.values()) - 0.8, max(y for _, y in place.values()) + 0.8)
    return fig


def short_operator(operator: str, width: int = 24) -> str:
    """An operator as a node's label: an allele swap by its gene and allele."""
    text = operator.removeprefix("allele.")
    return text if len(text) <= width else text[:width - 1] + "~"
