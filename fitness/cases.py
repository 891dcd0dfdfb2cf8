"""The throughput cases as traces: the contract's public three and the four seen in a
hidden evaluation. Data only, so the benchmark and the speed-of-light model share them."""
from fitness.traces import decode, prefill, remove

CASE_SETS = ("public", "hidden", "all", "small", "large", "long")


def prefill_events(num_requests: int, prompt_length: int) -> list:
    ids = range(num_requests)
    return [prefill(ids, [prompt_length] * num_requests), remove(ids)]


def decode_events(num_requests: int, prompt_length: int, num_steps: int) -> list:
    ids = range(num_requests)
    steps = [decode(ids) for _ in range(num_steps)]
    return [prefill(ids, [prompt_length] * num_requests), *steps, remove(ids)]


def mixed_events(first: int, second: int, third: int) -> list:
    """The contract's mixed schedule with prompts of `first` (ids 0-3), `second` (ids 4-5)
    and `third` (ids 6-9) tokens; decode and remove take the lowest-numbered live ids."""
    return [
        prefill(range(0, 4), [first] * 4),
        decode(range(0, 4)),
        decode(range(0, 4)),
        prefill([4, 5], [second] * 2),
        decode(range(0, 6)),
        remove([0, 1]),
        prefill(range(6, 10), [third] * 4),
        decode(range(2, 10)),
        decode(range(2, 10)),
        remove(range(2, 10)),
    ]


def public_cases() -> dict:
    """The contract's public cases, in its order."""
    return {
        "prefill": prefill_events(4, 128),
        "decode": decode_events(8, 32, 16),
        "mixed": mixed_events(64, 128, 32),
    }


def hidden_style_cases() -> dict:
    """The four cases seen in a hidden evaluation (named apart from the public ones)."""
    return {
        "prefill_4x128": prefill_events(4, 128),
        "decode_8x128x16": decode_events(8, 128, 16),
        "hidden_mixed": mixed_events(64, 128, 32),
        "mixed_128": mixed_events(128, 128, 128),
    }


def small_cases() -> dict:
    """The public schedules with a quarter of their tokens: a CPU times them in seconds
    where the public ones take a minute a judgement on 2 cores (a CPU run demonstrates
    the search; GPU runs time the contract's cases)."""
    return {
        "prefill_4x32": prefill_events(4, 32),
        "decode_8x8x8": decode_events(8, 8, 8),
        "mixed_small": mixed_events(16, 32, 8),
    }


def large_cases() -> dict:
    """The cases serving a 1B-class model costs: one request decoding (its time per step), a
    batch of 64 decoding, and a long packed prefill."""
    return {
        "decode_1x128x64": decode_events(1, 128, 64),
        "decode_64x256x64": decode_events(64, 256, 64),
        "prefill_16x1024": prefill_events(16, 1024),
    }


def long_cases() -> dict:
    """Long prompts (2,048 to 4,096 tokens), for a target whose engines must serve them: a
    packed prefill, decode over long K/V, and the mixed schedule at long lengths."""
    return {
        "prefill_2x4096": prefill_events(2, 4096),
        "decode_4x2048x16": decode_events(4, 2048, 16),
        "mixed_long": mixed_events(2048, 4096, 2048),
    }


def call_bounds(cases: dict) -> dict:
    """The largest call of any case: packed prefill tokens, prompts in a prefill, decode batch
    (what an engine's captured graphs must hold for no call of these cases to run eagerly)."""
    events = [ev for trace in cases.values() for ev in trace]
    prefills = [ev for ev in events if ev.kind == "prefill"]
    return {"prefill_tokens": max((sum(ev.lengths) for ev in prefills), default=0),
            "prefill_prompts": max((len(ev.request_ids) for ev in prefills), default=0),
            "decode_batch": max((len(ev.request_ids) for ev in events if ev.kind == "decode"), default=0)}


def select_cases(which: str) -> dict:
    """"public", "hidden", "all" (public first), "small", "large" or "long". In "all", a hidden-style case
    with the same events as a public one is left out: it would cost a second measurement
    of the same thing and count twice in a mean over cases."""
    if which not in CASE_SETS:
        raise ValueError(f"cases must be one of {CASE_SETS}, got {which!r}")
    if which == "small":
        return small_cases()
    if which == "large":
        return large_cases()
    if which == "long":
        return long_cases()
    cases = {}
    if which in ("public", "all"):
        cases.update(public_cases())
    if which in ("hidden", "all"):
        chosen = list(cases.values())
        cases.update({name: events for name, events in hidden_style_cases().items()
                      if events not in chosen})
    return cases
