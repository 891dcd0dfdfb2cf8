"""The final choice: re-measure the best few in fresh processes, each right after the
seed (seed, A, seed, B, ...), and keep the best ratio to the seed measured in the same
round. Survivors keep lucky timings otherwise, and a machine's speed drifts over a run;
a ratio to a neighbouring seed measurement cancels the drift. A contender that fails
this fresh judgement (new random inputs) is out. The seed wins unless beaten.
"""
import statistics

from evolve.history import REMEASURE_OPERATORS

FINAL = REMEASURE_OPERATORS[1]


def choose_winner(search):
    """(winner, its ratio to the seed, [(case, winner tok/s, seed tok/s)])."""
    seed, scores, config = search.seed, search.scores, search.config
    contenders = [p for p in search.hall_of_fame if p.id != seed.id and scores.is_ok(p.id)][:config.final_top]
    if not contenders or not scores.is_ok(seed.id):
        winner = search.hall_of_fame[0] if len(search.hall_of_fame) else seed
        return winner, float("nan"), table_of(scores.mean_tps(winner.id), scores.mean_tps(seed.id))
    pairs = {p.id: [] for p in contenders}  # (ratio, winner tps, seed tps) per round
    for _ in range(config.final_rounds):
        for program in contenders:
            if pairs[program.id] is None:
                continue
            if search.clock.left() <= 0 and any(pairs.values()):
                break  # out of budget: choose from the pairs measured so far
            seed_fitness, seed_verdict = measure(search, seed)
            fitness, verdict = measure(search, program)
            if not fitness > 0:
                pairs[program.id] = None  # failed a fresh judgement: not a winner
            elif seed_fitness > 0:
                pairs[program.id].append((fitness / seed_fitness, verdict["tokens_per_second"],
                                          seed_verdict["tokens_per_second"]))
    ratios = {pid: statistics.median(r for r, _, _ in got) for pid, got in pairs.items() if got}
    best = max(ratios, key=ratios.get, default=None)
    if best is None or ratios[best] <= 1.0:
        return seed, 1.0, table_of(scores.mean_tps(seed.id), scores.mean_tps(seed.id))
    winner = next(p for p in contenders if p.id == best)
    return winner, ratios[best], table_of(mean_cases([w for _, w, _ in pairs[best]]),
                                          mean_cases([s for _, _, s in pairs[best]]))


def measure(search, program) -> tuple:
    """One fresh judgement, on its own (nothing else runs beside it), as a "final" row."""
    (fitness, verdict), = search.toolbox.map(search.toolbox.evaluate, [program], [search.generation], [FINAL])
    return fitness or 0.0, verdict


def mean_cases(runs: list) -> dict:
    return {case: statistics.fmean(r[case] for r in runs) for case in runs[0]}


def table_of(winner_tps: dict, seed_tps: dict) -> list:
    return [(case, tps, seed_tps[case]) for case, tps in winner_tps.items() if seed_tps.get(case)]
