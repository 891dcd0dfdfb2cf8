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
    """(winner, its ratio to the seed, [(case, winner tok/s, seed tok/s)], how it was chosen)."""
    seed, scores, config = search.seed, search.scores, search.config
    contenders = [p for p in search.hall_of_fame if p.id != seed.id and scores.is_ok(p.id)][:config.final_top]
    pair_s = 2 * scores.mean_judge_seconds(ok_only=True)
    pairs = {p.id: [] for p in contenders}  # (ratio, winner tps, seed tps) per round
    for _ in range(config.final_rounds if scores.is_ok(seed.id) else 0):
        for program in contenders:
            if pairs[program.id] is None or search.clock.left() < pair_s:
                continue  # failed a fresh judgement, or no budget left for a pair
            seed_fitness, seed_verdict = measure(search, seed)
            fitness, verdict = measure(search, program)
            if seed_verdict is None or verdict is None:
                continue  # the budget ran out between the two
            if not fitness > 0:
                pairs[program.id] = None  # failed a fresh judgement: not a winner
            elif seed_fitness > 0:
                pairs[program.id].append((fitness / seed_fitness, verdict["tokens_per_second"],
                                          seed_verdict["tokens_per_second"]))
    ratios = {pid: statistics.median(r for r, _, _ in got) for pid, got in pairs.items() if got}
    if not ratios:
        return unmeasured_choice(search, [p for p in contenders if pairs[p.id] is not None])
    best = max(ratios, key=ratios.get)
    if ratios[best] <= 1.0:
        return seed, 1.0, table_of(scores.mean_tps(seed.id), scores.mean_tps(seed.id)), "re-measured: none beat the seed"
    winner = next(p for p in contenders if p.id == best)
    return winner, ratios[best], table_of(mean_cases([w for _, w, _ in pairs[best]]),
                                          mean_cases([s for _, _, s in pairs[best]])), \
        f"re-measured against the seed in the same round, {len(pairs[best])} round(s)"


def unmeasured_choice(search, contenders):
    """No pair was measured (no budget left, or nothing to compare): the best mean fitness."""
    seed, scores = search.seed, search.scores
    candidates = [p for p in contenders + [seed] if scores.is_ok(p.id)]
    if not candidates:
        return seed, float("nan"), [], "nothing judged correct"
    winner = max(candidates, key=lambda p: scores.values(p.id, False)[0])
    ratio = scores.values(winner.id, False)[0] / scores.values(seed.id, False)[0] if scores.is_ok(seed.id) else float("nan")
    how = "the only correct program" if len(candidates) == 1 else "not re-measured (out of budget): best mean fitness"
    return winner, ratio, table_of(scores.mean_tps(winner.id), scores.mean_tps(seed.id)), how


def measure(search, program) -> tuple:
    """One fresh judgement, on its own (nothing else runs beside it), as a "final" row."""
    fitness, verdict = search.toolbox.map(search.toolbox.evaluate, [program], [search.generation], [FINAL])[0] \
        or (None, None)
    return fitness or 0.0, verdict


def mean_cases(runs: list) -> dict:
    return {case: statistics.fmean(r[case] for r in runs) for case in runs[0]}


def table_of(winner_tps: dict, seed_tps: dict) -> list:
    return [(case, tps, seed_tps[case]) for case, tps in winner_tps.items() if seed_tps.get(case)]
