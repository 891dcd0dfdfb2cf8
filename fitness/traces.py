"""Request traces as data: the public correctness sequence and the randomised gate traces
(the benchmark's are in fitness/cases.py). A trace is a list of `Event`s; `materialize`
draws its tokens and `replay` drives an engine through it. A judge sends each call to a
runner process as a header and its int64 values (`call_message`)."""
import random
from dataclasses import dataclass

import numpy as np
import torch

from fitness.wire import CallHeader


@dataclass(frozen=True)
class Event:
    kind: str  # "prefill" | "decode" | "remove"
    request_ids: tuple
    lengths: tuple = ()  # prompt lengths, prefill only
    ids_as_tensor: bool = False  # pass request_ids as a 1-D tensor, as the contract allows
    name: str = ""  # the step's name in reports


@dataclass
class Call:
    """One engine call with its inputs drawn."""
    event: Event
    request_ids: object  # list of ints or a 1-D tensor
    tokens: object  # list of 1-D tensors (prefill), a 1-D tensor (decode) or None


def prefill(ids, lengths, **kw):
    return Event("prefill", tuple(ids), tuple(lengths), **kw)


def decode(ids, **kw):
    return Event("decode", tuple(ids), **kw)


def remove(ids, **kw):
    return Event("remove", tuple(ids), **kw)


def materialize(events, vocab_size: int, seed: int, device) -> list:
    """Draw every prompt and decode token from one seeded generator, on `device`."""
    gen = torch.Generator(device="cpu").manual_seed(seed)
    calls = []
    for ev in events:
        ids = torch.tensor(ev.request_ids, device=device) if ev.ids_as_tensor else list(ev.request_ids)
        if ev.kind == "prefill":
            tokens = [torch.randint(0, vocab_size, (n,), generator=gen).to(device) for n in ev.lengths]
        elif ev.kind == "decode":
            tokens = torch.randint(0, vocab_size, (len(ev.request_ids),), generator=gen).to(device)
        else:
            tokens = None
        calls.append(Call(ev, ids, tokens))
    return calls


def replay(engine, call: Call):
    """Make one call on the engine; returns its output (None for remove)."""
    if call.event.kind == "prefill":
        return engine.prefill(call.request_ids, call.tokens)
    if call.event.kind == "decode":
        return engine.decode(call.request_ids, call.tokens)
    engine.remove(call.request_ids)
    return None


def call_message(call: Call) -> tuple:
    """A call as the judge sends it: its header (not the event's name: a step's name would
    tell a gate trace from a timed case; where its values go is the slot's to say) and its
    values, int64 on the CPU: the request ids when they go as a tensor, then every token."""
    event = call.event
    parts = [torch.tensor(event.request_ids, dtype=torch.long)] if event.ids_as_tensor else []
    if call.tokens is not None:
        parts += [t.cpu() for t in call.tokens] if isinstance(call.tokens, list) else [call.tokens.cpu()]
    values = torch.cat(parts).numpy() if parts else np.empty(0, dtype=np.int64)
    header = CallHeader(event.kind, list(event.request_ids), list(event.lengths), event.ids_as_tensor, 0, len(values))
    return header, values


def count_tokens(events) -> tuple:
    """(prefill tokens, decode tokens) of a trace."""
    prefill_tokens = sum(sum(ev.lengths) for ev in events if ev.kind == "prefill")
    decode_tokens = sum(len(ev.request_ids) for ev in events if ev.kind == "decode")
    return prefill_tokens, decode_tokens


# --- correctness traces ------------------------------------------------------------------

def public_sequence() -> list:
    """The contract's public correctness sequence."""
    return [
        prefill([0], [11], name="single_prefill"),
        decode([0], name="single_decode"),
        prefill([1, 2], [7, 13], name="multi_prefill"),
        decode([0, 1, 2], name="multi_decode"),
        remove([1]),
        prefill([3], [5], name="insert_after_remove"),
        decode([0, 2, 3], name="decode_after_remove"),
        remove([0, 2, 3]),
    ]


def long_prompt_length(max_positions: int, decode_steps: int) -> int:
    """A prompt near max_position_embeddings or 1500 tokens, whichever is smaller."""
    return max(1, min(max_positions, 1500) - decode_steps - 1)


def edge_trace(rng: random.Random, max_positions: int) -> list:
    """A length-1 prompt beside a long one, decoded together, ids given as a tensor."""
    steps = 3
    long_id, short_id = rng.sample(range(1000, 2000), 2)
    events = [prefill([short_id, long_id], [1, long_prompt_length(max_positions, steps)],
                      name="short_and_long_prefill")]
    for s in range(steps):
        events.append(decode([long_id, short_id], ids_as_tensor=s % 2 == 0, name=f"long_decode_{s}"))
    return events + [remove([long_id, short_id])]


def batch_trace(rng: random.Random, batch: int = 64) -> list:
    """A batch of `batch` short prompts, decoded in shuffled order, half removed between."""
    ids = rng.sample(range(10_000), batch)
    lengths = [rng.randint(1, 24) for _ in ids]
    events = [prefill(ids, lengths, name=f"prefill_{batch}")]
    for s in range(2):
        events.append(decode(rng.sample(ids, batch), ids_as_tensor=s == 1, name=f"decode_{batch}_{s}"))
    kept = ids[: batch // 2]
    events.append(remove(ids[batch // 2:] + [10_001]))  # plus an unknown id, to be ignored
    events.append(decode(rng.sample(kept, len(kept)), name=f"decode_{batch}_after_remove"))
    return events + [remove(kept)]


def serving_trace(rng: random.Random, num_steps: int = 14, max_prompt: int = 48) -> list:
    """Random prefills, re-prefills of live ids, shuffled partial decodes and removes."""
    live, next_id, events = [], rng.randint(0, 50), []
    for s in range(num_steps):
        choice = rng.random()
        if not live or choice < 0.25:
            n = rng.randint(1, 4)
            ids = list(range(next_id, next_id + n))
            next_id += n + rng.randint(0, 3)
            events.append(prefill(ids, [rng.randint(1, max_prompt) for _ in ids], name=f"prefill_{s}"))
            live += ids
        elif choice < 0.35:
            rid = rng.choice(live)  # re-prefill: its old K/V must be forgotten
            events.append(prefill([rid], [rng.randint(1, max_prompt)], name=f"reprefill_{s}"))
        elif choice < 0.85:
            subset = rng.sample(live, rng.randint(1, len(live)))
            events.append(decode(subset, ids_as_tensor=rng.random() < 0.3, name=f"decode_{s}"))
        else:
            gone = rng.sample(live, rng.randint(1, len(live)))
            live = [r for r in live if r not in gone]
            events.append(remove(gone))
    return events + [remove(live)] if live else events


def lifecycle_trace(rng: random.Random) -> list:
    """Every state change once, for certain: a re-prefill of a live id (its old K/V must
    be forgotten), a reversed decode, a remove, and a removed id coming back."""
    a, b, c = rng.sample(range(100, 1000), 3)
    return [
        prefill([a, b], [rng.randint(2, 30), rng.randint(2, 30)], name="prefill_ab"),
        decode([a, b], name="decode_ab"),
        prefill([a], [rng.randint(2, 30)], name="reprefill_a"),
        decode([b, a], name="decode_ba"),
        remove([b]),
        prefill([c, b], [rng.randint(1, 30), rng.randint(1, 30)], name="prefill_cb"),
        decode([a, c, b], ids_as_tensor=True, name="decode_acb"),
        remove([a, b, c]),
    ]


def churn_round(rng: random.Random, num_requests: int = 4, length: int = 16) -> list:
    """Fresh ids, the same shapes every round: an engine that frees what remove names
    holds the same memory after every round."""
    ids = rng.sample(range(20_000, 30_000), num_requests)
    return [prefill(ids, [length] * num_requests, name="churn_prefill"),
            decode(ids, name="churn_decode"), remove(ids)]


def gate_traces(seed: int, max_positions: int, full: bool = True) -> dict:
    """The traces of one judgement; `full=False` keeps the cheap ones (derived configs)."""
    rng = random.Random(seed)
    traces = {"public": public_sequence(), "lifecycle": lifecycle_trace(rng),
              "serving": serving_trace(rng)}
    if full:
        traces["edge"] = edge_trace(rng, max_positions)
        traces["batch64"] = batch_trace(rng)
        traces["serving_2"] = serving_trace(rng)
    return traces
