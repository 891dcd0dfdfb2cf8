"""The final choice: the best few confirmed programs, each judged once more in full on
gate traces the search never saw, and timed beside the floor (the best program known before
the search, generation 0's first judgement; the seed when none passed), interleaved, for as
many rounds as the ratio needs (fitness.timing). The floor is kept unless a contender is
clearly faster than it: its ~95% interval above 1 (beside the seed, a ratio above 1: the
seed is no known good program, and the search exists to beat it), and, where the final
timed each case staged too (RunConfig.staged_final: every input on the device before the
clock, as the evaluator's protocol has them), not slower so: its staged ratio at least 1.
The judge delivers each call's inputs when due, so that no engine can read ahead; that costs
a host-bound program 23-58 us a call on an H200 and a device-bound one little, and so its
ratios part from the evaluator's by up to ~10% a case (docs/log/2026-11-30-runner-path-staged-final.md).
The staged ratio is the evaluator's, but an engine could read ahead there; so it only ever
keeps the floor, and never makes a winner. Of those left, the best fitted speed
(evolve.scores: every paired comparison, this one included) wins. A contender that fails
this fresh judgement is out. A 5-minute H100 search's screens ranked three library programs
above fastest.txt's, which the evaluator has 0.91-0.95x it, and returned one of them; held
to the floor head to head, a run returns no less than what it started from.

Beside them, when the time allows, the closing merge: the best with every gain it lacks
(`merge_every_gain`), a child no generation had time to confirm. Its judgement here is in
full (derived configs and churn too, as a confirmation), so the gate it passes is the one
every winner passes.

What results.log gets about the winner: its ratio to the seed (from the final beside the
seed, or the fitted speeds beside another floor), the final's ratio to the floor with a ~95%
interval, the confidence that it is faster at all, and the coefficient of variation of its
fitness over the rounds (how much one program's own measurements spread).
"""
import functools
import math

from evolve.history import FINAL
from evolve.judging import Judging
from evolve.program import made
from fitness.timing import t95, t_cdf


def choose_winner(judging: Judging, seed, floor, contenders: list, final_top: int, generation: int, fits,
                  staged: bool = False):
    """(winner, its ratio to the seed, [(case, winner tok/s, seed tok/s)], how it was chosen):
    of `contenders` (confirmed, best first) the first `final_top`, as many as `fits(n)` allows
    (whether a final of n contenders fits the time left), judged beside `floor` in
    `generation`'s rows. `staged`: the final is staged too (RunConfig.staged_final), and
    with no final a floor other than the seed is kept (`unmeasured_choice`)."""
    unmeasured = functools.partial(unmeasured_choice, staged=staged)
    scores = judging.scores
    contenders = [p for p in contenders if scores.is_confirmed(p.id)][:final_top]
    floor_confirmed = scores.is_confirmed(floor.id)
    if floor_confirmed:
        # The best with the gains it lacks; the floor's, when it is the best.
        closing = closing_merge(judging.toolbox, scores, contenders[0] if contenders else floor)
        if closing is not None:  # second: more likely to win than the best's runner-up
            contenders.insert(1, closing)
    if not contenders or not floor_confirmed:
        return unmeasured(scores, seed, floor, contenders,
                          f"no confirmed program fitted faster than {name_of(floor, seed)} to compare with it")
    # As many contenders as the time left can compare, best first.
    fitting = [p for i, p in enumerate(contenders) if fits(i + 1)]
    if not fitting:
        return unmeasured(scores, seed, floor, contenders, "not compared with the floor again (out of budget)")
    results = judging.run(generation, [(p, FINAL, "full", floor.id) for p in fitting])
    measured = [(verdict, p) for p, _, verdict in results if verdict["status"] == "ok" and verdict.get("ratio")]
    if not measured:
        return unmeasured(scores, seed, floor, [p for p in fitting if scores.is_ok(p.id)],
                          "no contender passed its fresh judgement beside the floor")
    beside_seed = floor.id == seed.id
    beat = [(verdict, p) for verdict, p in measured if beats(verdict, beside_seed)]
    if not beat:
        verdict = max(measured, key=lambda vp: vp[0]["ratio"])[0]
        vetoed = beats({**verdict, "staged_ratio": math.inf}, beside_seed)
        why = "its best contender beat it in the judge's runs, not with its inputs staged as the evaluator's protocol " \
              "has them" if vetoed else f"no contender {'beat' if beside_seed else 'clearly beat'} it"
        return floor, ratio_to_seed(scores, floor, seed, None), \
            table_of(verdict["baseline_tokens_per_second"], seed_tps(scores, seed, floor, verdict)), \
            f"{name_of(floor, seed)} kept: {why} in a fresh judgement beside it ({describe(verdict, floor, seed)})"
    # Among those that beat the floor, the best fitted speed, this judgement included: it
    # weighs the contenders' own paired comparisons, where their ratios to the seed alone
    # drew a 1.2x program level with its parent (docs/log/2026-11-23-8-minute-search-adjacent-heads-fix.md).
    verdict, winner = max(beat, key=lambda vp: scores.speed(vp[1].id))
    return winner, ratio_to_seed(scores, winner, seed, verdict["ratio"] if floor.id == seed.id else None), \
        table_of(verdict["tokens_per_second"], seed_tps(scores, seed, floor, verdict)), \
        f"compared with {name_of(floor, seed)} in a fresh judgement: {describe(verdict, floor, seed)}"


def beats(verdict: dict, beside_seed: bool) -> bool:
    """Faster than the floor: clearly (its ~95% interval above 1), or beside the seed at all;
    and, timed staged too, not slower so."""
    judged = verdict["ratio"] > 1.0 if beside_seed else verdict["ratio_low"] > 1.0
    return judged and verdict.get("staged_ratio", math.inf) >= 1.0


def ratio_to_seed(scores, program, seed, final_ratio: float | None) -> float:
    """The final's ratio when it was beside the seed, else the fitted speeds' (NaN when the
    budget left the seed unjudged)."""
    if program.id == seed.id:
        return 1.0
    if final_ratio is not None:
        return final_ratio
    return scores.gain(program.id, seed.id) if scores.is_ok(seed.id) else float("nan")


def seed_tps(scores, seed, floor, verdict: dict) -> dict:
    """The seed's tokens/s per case: timed beside the winner in the final when it was the
    floor, else from its judgements."""
    return verdict["baseline_tokens_per_second"] if floor.id == seed.id else scores.mean_tps(seed.id)


def name_of(program, seed) -> str:
    """How results.log names the program a final was beside."""
    return "the seed" if program.id == seed.id else f"the floor {program.id} ({program.operator})"


def closing_merge(toolbox, scores, best):
    """`best` with the gains it lacks, in one child never confirmed, or None: a short
    search's last generation screens gains with no time left to merge them (gains of 2-11%
    so lost, docs/log/2026-11-24-merging-a-generations-gains.md). The last generation's own
    merge of them is that child when it was bred but not screened for lack of time, or
    screened but not confirmed (one at 1.08x the best in its screen, unconfirmed, left the
    winner at 0.68-0.82x the recipe)."""
    child = toolbox.merge_every_gain(best, scores)
    twin = getattr(child, "twin", None)
    if twin is not None:
        child = toolbox.memo.program(twin)
    if not made(child):
        return None
    never_confirmed = child.id not in scores or (scores.is_ok(child.id) and not scores.is_confirmed(child.id))
    return child if never_confirmed else None


def describe(verdict: dict, baseline, seed) -> str:
    """Ratio, interval, confidence and CV of a judgement beside `baseline`, in words."""
    ratio, low, high = verdict["ratio"], verdict["ratio_low"], verdict["ratio_high"]
    cv = verdict.get("fitness_cv")
    cv_text = f"{cv:.1%}" if cv is not None else "n/a (one round)"
    beside = "the seed" if baseline.id == seed.id else "the floor"
    staged = ""
    if "staged_ratio" in verdict:
        staged = (f"; with its inputs staged (the evaluator's protocol) {verdict['staged_ratio']:.3f}x "
                  f"({verdict['staged_ratio_low']:.3f}-{verdict['staged_ratio_high']:.3f}x)")
    return (f"{ratio:.3f}x {beside} over {verdict.get('rounds')} interleaved rounds, ~95% interval "
            f"{low:.3f}-{high:.3f}x, {confidence_faster(ratio, low, high, verdict.get('rounds') or 1):.1%} "
            "confident it is faster; "
            f"CV of its fitness over the rounds {cv_text}{staged}")


def confidence_faster(ratio: float, low: float, high: float, rounds: int) -> float:
    """One-sided confidence that the true ratio exceeds 1: Student's t with the standard
    error behind the interval (fitness.timing: +-t95 standard errors over `rounds`)."""
    if rounds < 2 or not high > low:
        return float("nan")
    dof = int(rounds) - 1
    se = math.log(high / low) / (2 * t95(dof))
    return t_cdf(math.log(ratio) / se, dof)


def unmeasured_choice(scores, seed, floor, contenders, why: str, staged: bool = False):
    """No fresh comparison (`why`): the best fitted speed of the contenders and the floor.
    A floor other than the seed is kept unless a contender was clearly faster beside it
    already (Scores.held_to); where finals are `staged`, kept: only a final's staged runs
    tell whether the evaluator would have it slower, and the judge's own comparisons favour
    a device-bound program by up to ~10% (docs/log/2026-11-30-runner-path-staged-final.md)."""
    holds_floor = floor.id != seed.id and scores.is_ok(floor.id)
    if holds_floor and staged:
        ratio = scores.gain(floor.id, seed.id) if scores.is_ok(seed.id) else float("nan")
        return floor, ratio, table_of(scores.mean_tps(floor.id), scores.mean_tps(seed.id)), \
            f"{name_of(floor, seed)} kept: {why}; only a final that also times it staged, as the evaluator " \
            "does, may replace it"
    if holds_floor:
        held = set(scores.held_to(floor.id, [p.id for p in contenders]))
        contenders = [p for p in contenders if p.id in held]
    candidates = [p for p in contenders + [floor] + ([] if holds_floor else [seed]) if scores.is_ok(p.id)]
    if not candidates:
        return seed, float("nan"), [], "nothing judged correct"
    winner = max(candidates, key=lambda p: scores.speed(p.id))
    ratio = scores.gain(winner.id, seed.id) if scores.is_ok(seed.id) else float("nan")
    if len({p.id for p in candidates}) > 1:
        how = f"{why}: best fitted speed of the floor and those clearly faster beside it" if holds_floor else \
            f"{why}: best fitted speed from the search's comparisons"
    elif holds_floor and winner.id == floor.id:
        how = f"{name_of(floor, seed)} kept: {why}, and no contender was clearly faster beside it"
    else:
        how = "the only correct program"
    return winner, ratio, table_of(scores.mean_tps(winner.id), scores.mean_tps(seed.id)), how


def table_of(winner_tps: dict, seed_tps: dict) -> list:
    return [(case, tps, seed_tps[case]) for case, tps in winner_tps.items() if seed_tps.get(case)]
