"""Stand-ins for the evolve tests: a tiny operator module and a fake judge.

The operators provide what `mutations` will (`random_mutation`, `crossover`), so the
search is tested apart from the real rewrites; `python -m evolve run --operators
tests.test_evolve_stand_in` uses them from the command line. The fake judge answers
at once, with tokens/s drawn from the hash of the lines the stand-ins added, so loop logic
is tested in milliseconds; the real judge is used by the end-to-end tests.
"""
import hashlib
import random

from mutations.base import Applied, Declined

BROKEN = "return logits[last] * 2.0  # stand_in_break"


def random_mutation(source: str, rng: random.Random, device: str):
    roll = rng.random()
    if roll < 0.2 and "return logits[last]\n" in source:  # a wrong program: the gate must catch it
        return Applied(source.replace("return logits[last]\n", BROKEN + "\n"), "stand_in_break", {})
    if roll < 0.3:
        return Declined("stand_in_decline", "declines one time in ten")
    variant = rng.randrange(10**6)
    # A line of code (named "comment" as it once was): a child that differs from its parent
    # only in comments is its parent to the search.
    return Applied(source + f"stand_in_variant = {variant}\n", "stand_in_comment", {"variant": variant})


def added(source: str) -> str:
    """The lines the stand-in operators added to a source: the seed's own text is not in it,
    so a change to the seed leaves the tests' searches as they were."""
    return "".join(line for line in source.splitlines(True) if line.startswith("stand_in_"))


def crossover(a: str, b: str, rng: random.Random):
    tag = hashlib.sha256(added(b).encode()).hexdigest()[:8]
    return Applied(a + f"stand_in_crossed_with = {tag!r}\n", "stand_in_crossover", {"with": tag})


def stand_in_speed(path) -> float:
    """1,000 to 1,996 tokens/s, drawn from the hash of what the stand-in operators added."""
    digest = int(hashlib.sha256(added(open(path).read()).encode()).hexdigest()[:8], 16)
    return 1000.0 + digest % 997


def fake_judge(path, config_path, weight_dir, device, timeout=None, baseline=None, level="full", **options):
    """A verdict shaped like fitness.sandbox.judge's, without running anything: tokens/s
    from stand_in_speed, and beside a baseline its ratio with a 2% interval."""
    source = open(path).read()
    speed = stand_in_speed(path)
    verdict = {"status": "ok", "stage": "", "error": "", "worst_ratio": 0.01, "seconds": 0.01,
               "device": device, "path": str(path), "peak_memory_mb": speed % 100, "level": level,
               "tokens_per_second": {c: speed for c in ("prefill", "decode", "mixed")}, "rounds": 3,
               "fitness_cv": 0.01}
    if baseline:
        ratio = speed / stand_in_speed(baseline)
        verdict.update(ratio=ratio, ratio_low=ratio / 1.02, ratio_high=ratio * 1.02,
                       baseline_tokens_per_second={c: stand_in_speed(baseline) for c in ("prefill", "decode", "mixed")})
    if "stand_in_break" in source:
        verdict.update(status="incorrect", stage="target", error="logits off\nby a factor 2",
                       tokens_per_second={}, peak_memory_mb=None)
    return verdict


def test_stand_in_operators_are_deterministic():
    a = random_mutation("x = 1\n", random.Random(3), "cpu")
    b = random_mutation("x = 1\n", random.Random(3), "cpu")
    assert a == b
