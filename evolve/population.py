"""The first population: the seed engine, earlier winners named by --seed-from, and the
library's recipes for the target (evolve/library.py; not with --from-seed-only).

--seed-from takes engine files, an earlier run's directory (its winner and hall of
fame), or a history.csv (its best correct programs by mean fitness; their sources are
at source_path). The population is filled up with copies, which cost nothing to judge:
a source is judged once.
"""
from pathlib import Path

from contract.loader import source_hash
from evolve import checkpoint, history, library
from evolve.config import SettingsError
from mutations import Declined


def seed_sources(config) -> list[tuple[str, dict]]:
    """(source, operator args) of every --seed-from program, best first, no duplicates."""
    found = []
    for origin in config.seed_from:
        origin = Path(origin)
        if not origin.exists():
            raise SettingsError(f"--seed-from {origin}: no such engine file, run directory or history")
        if origin.is_dir():
            found += [(s, {"from": str(origin), **({"made_here": True} if made else {})})
                      for s, made in run_dir_sources(origin)[:config.seed_from_top]]
        elif origin.suffix == ".csv":
            found += [(s, {"from": str(origin), "candidate_id": cid})
                      for cid, s in history_sources(origin)[:config.seed_from_top]]
        else:
            found.append((origin.read_text(), {"from": str(origin)}))
    unique = {}
    for source, args in found:
        unique.setdefault(source, args)
    return list(unique.items())


def run_dir_sources(run_dir: Path) -> list[tuple[str, bool]]:
    """An earlier run's winner, then its hall of fame, best first, each with whether that
    run found its code the repository's (evolve.program.made_here). Only a finished run's
    checkpoint is taken at its word: the run held it to what it last wrote until the end,
    and no candidate of it runs since. The others' programs count as code from outside,
    whose kernels each runner compiles anew: an H200 judged the recipe's program in 28 s
    from the shared cache, and it with one kernel edited in 99 s."""
    sources = []
    if (run_dir / "winner.py").is_file():
        sources.append((run_dir / "winner.py").read_text())
    try:
        state = checkpoint.load(run_dir)
    except (FileNotFoundError, ValueError) as err:
        if not sources:
            raise SettingsError(f"--seed-from {run_dir}: {err}") from None
        return [(s, False) for s in sources]
    made_here = set(state.get("made_here", ())) if state.get("finished") else set()
    sources += [p["source"] for p in state.get("hall_of_fame", [])]
    return [(s, source_hash(s) in made_here) for s in sources]


def history_sources(path: Path) -> list[tuple[str, str]]:
    """(candidate id, source) of a history's correct programs, best mean fitness first."""
    frame = history.read(path)
    judged = frame[frame["status"].isin(history.JUDGED_STATUSES) & (frame["candidate_id"] != "")]
    failed = set(judged.loc[judged["status"] != "ok", "candidate_id"])
    ok = judged[(judged["status"] == "ok") & ~judged["candidate_id"].isin(failed)]
    ranked = ok.groupby("candidate_id").agg(fitness=("fitness", "mean"), source_path=("source_path", "first"))
    ranked = ranked.sort_values("fitness", ascending=False)
    found = []
    for candidate_id, row in ranked.iterrows():
        source_path = Path(row.source_path)
        if not source_path.is_file():  # a history moved with its runs directory
            source_path = path.parent / row.source_path
        if source_path.is_file():
            found.append((candidate_id, source_path.read_text()))
    if not found:
        raise SettingsError(f"--seed-from {path}: no correct program with a readable source")
    return found


def initial_population(config, make) -> tuple[list, list]:
    """(programs, declines): the seed, the --seed-from programs, the library's for the
    target, then copies of them up to the population size; a Declined for each recipe of
    the library not taken, with the reason."""
    seed = Path(config.seed_engine).read_text()
    from_library, not_taken = library.seed_programs(config, seed)
    programs, sources = [make(seed, (), "seed", {})], {seed}
    # A --seed-from program a recipe also makes is the repository's code (evolve.program.made_here)
    # and its lineage a recipe (evolve.recipe): its args name the recipe and its steps.
    recipes = dict(from_library)
    for operator, found in (("seed_from", seed_sources(config)), (library.LIBRARY, from_library)):
        for source, args in found:
            if source not in sources:
                sources.add(source)
                programs.append(make(source, (), operator, {**args, **recipes.get(source, {})}))
    distinct = len(programs)
    while len(programs) < config.population:
        original = programs[len(programs) % distinct]
        programs.append(make(original.source, original.parent_ids, original.operator, original.operator_args))
    return programs, [Declined(library.LIBRARY, f"{name}: {why}") for name, why in not_taken]
