"""The first population: the seed engine, earlier winners named by --seed-from, and the
library's recipes for the target (evolve/library.py; not with --from-seed-only).

--seed-from takes engine files, an earlier run's directory (its winner and hall of
fame), or a history.csv (its best correct programs by mean fitness; their sources are
at source_path). The population is filled up with copies, which cost nothing to judge:
a source is judged once.
"""
import pickle
from pathlib import Path

from contract.loader import source_hash
from evolve import checkpoint, history, library
from evolve.config import SettingsError
from evolve.program import made_here
from mutations import Declined


def seed_sources(config) -> list[tuple[str, dict]]:
    """(source, operator args) of every --seed-from program, best first, no duplicates."""
    found = []
    for origin in config.seed_from:
        origin = Path(origin)
        if not origin.exists():
            raise SettingsError(f"--seed-from {origin}: no such engine file, run directory or history")
        if origin.is_dir():
            found += [(s, origin_args(origin, made)) for s, made in run_dir_sources(origin)[:config.seed_from_top]]
        elif origin.suffix == ".csv":
            found += [(s, origin_args(origin, made, candidate_id=cid))
                      for cid, s, made in history_sources(origin)[:config.seed_from_top]]
        else:
            found.append((origin.read_text(), origin_args(origin, False)))
    unique = {}
    for source, args in found:
        unique.setdefault(source, args)
    return list(unique.items())


def origin_args(origin: Path, made: bool, **more) -> dict:
    """A --seed-from program's operator args: where it came from, and `made_here` when the
    run that judged it found its code the repository's (evolve.program.made_here)."""
    return {"from": str(origin), **more, **({"made_here": True} if made else {})}


def made_here_ids(state: dict) -> set:
    """The ids a run's checkpoint says it found made here, if the run finished. Only a
    finished run is taken at its word: it held its checkpoint to what it last wrote until
    the end, and no candidate of it runs since (one stopped because a candidate wrote its
    records leaves one). The others' programs count as code from outside, whose kernels
    each runner compiles anew: an H200 judged the recipe's program in 28 s from the shared
    cache, and it with one kernel edited in 99 s."""
    return set(state.get("made_here", ())) if state.get("finished") else set()


def run_dir_sources(run_dir: Path) -> list[tuple[str, bool]]:
    """An earlier run's winner, then its hall of fame, best first, each with whether that
    run found it made here (made_here_ids)."""
    sources = []
    if (run_dir / "winner.py").is_file():
        sources.append((run_dir / "winner.py").read_text())
    try:
        state = checkpoint.load(run_dir)
    except (FileNotFoundError, ValueError) as err:
        if not sources:
            raise SettingsError(f"--seed-from {run_dir}: {err}") from None
        return [(s, False) for s in sources]
    made_here = made_here_ids(state)
    sources += [p["source"] for p in state.get("hall_of_fame", [])]
    return [(s, source_hash(s) in made_here) for s in sources]


def history_sources(path: Path) -> list[tuple[str, str, bool]]:
    """(candidate id, source, whether the run it was judged in found it made here) of a
    history's correct programs, best mean fitness first. The run is the folder above its
    source's (runs/RUN_ID/candidates/ID.py)."""
    frame = history.read(path)
    judged = frame[frame["status"].isin(history.JUDGED_STATUSES) & (frame["candidate_id"] != "")]
    failed = set(judged.loc[judged["status"] != "ok", "candidate_id"])
    ok = judged[(judged["status"] == "ok") & ~judged["candidate_id"].isin(failed)]
    ranked = ok.groupby("candidate_id").agg(fitness=("fitness", "mean"), source_path=("source_path", "first"))
    ranked = ranked.sort_values("fitness", ascending=False)
    found, runs = [], {}
    for candidate_id, row in ranked.iterrows():
        source_path = Path(row.source_path)
        if not source_path.is_file():  # a history moved with its runs directory
            source_path = path.parent / row.source_path
        if source_path.is_file():
            source, run_dir = source_path.read_text(), source_path.parent.parent
            if run_dir not in runs:
                runs[run_dir] = checkpoint_made_here(run_dir)
            found.append((candidate_id, source, source_hash(source) in runs[run_dir]))
    if not found:
        raise SettingsError(f"--seed-from {path}: no correct program with a readable source")
    return found


def checkpoint_made_here(run_dir: Path) -> set:
    """made_here_ids of the run's checkpoint; none where there is none to read."""
    try:
        return made_here_ids(checkpoint.load(run_dir))
    except (OSError, ValueError, EOFError, pickle.UnpicklingError):
        return set()


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


def outside_code_line(programs: list) -> str | None:
    """What a GPU run says when --seed-from brought code from outside the repository: why
    the judgements of those programs' lineages cost more; None when it brought none."""
    origins = sorted({p.operator_args.get("from", "?") for p in programs
                      if p.operator == "seed_from" and not made_here(p, {}.get)})
    if not origins:
        return None
    return (f"--seed-from {', '.join(origins)}: code from outside the repository's lineage (a file of its own, "
            "or a run that did not finish): each judgement of it or a program bred from it compiles its Triton "
            "kernels anew, never shared (an H200: 99 s for a full judgement against 28 s shared; fitness/README.md)")
