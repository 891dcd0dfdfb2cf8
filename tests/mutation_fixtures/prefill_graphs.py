"""The cuda_graphs_prefill engine (with the Triton RoPE) against the seed, on CPU through
Triton's interpreter: there it runs the captured path's static buffers eagerly, so bucket
padding, prompt slots, last rows and the eager fallbacks are all exercised.

    TRITON_INTERPRET=1 python tests/mutation_fixtures/prefill_graphs.py CONFIG.json WEIGHT_DIR

Runs it over `paged`, over `paged_chunks` with chunks of 2 pages (the pool grows a chunk at
a time under it; with fused q/k/v and gate/up weights, under programmatic_launch) and over `slab` with 4 slots at first (it grows, moves, and the engine
captures again, zeroing its static buffers, as on a GPU); then every request is removed (the
chunked pool gives back all its chunks but one) and the pool grows again. Prints "ok <what>" per check; exits non-zero on the
first mismatch.
"""
import json
import os
import random
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
assert os.environ.get("TRITON_INTERPRET") == "1", "set TRITON_INTERPRET=1"

import torch  # noqa: E402

import mutations  # noqa: E402
from contract.loader import load_engine_module  # noqa: E402
from tests import triton_interpreter  # noqa: E402

triton_interpreter.install()  # the same interpreter, its per-launch cost cut

OPERATORS = ("allele.Engine.cuda_graphs_prefill", "allele.apply_rope.triton")


def child_module(cache):
    source = (REPO / "seed_engine" / "engine.py").read_text()
    # Over the chunked pool, fused weights too: q, k and v are then views of one projection,
    # rotated (with k and v stored) in one launch and read through their strides.
    # and every kernel launched as under programmatic dependent launch (off in the interpreter:
    # the flag and launch argument must still reach each kernel).
    fused = ("allele.load_weights.fused_both", "allele.attention_inputs.triton", "programmatic_launch") \
        if cache == "paged_chunks" else ()
    for name in (f"allele.KVCache.{cache}", *OPERATORS, *fused):
        source = mutations.get_operator(name).apply(source, random.Random(0)).source
    path = Path(tempfile.mkdtemp()) / "child.py"
    path.write_text(source)
    return load_engine_module(path)


def main(config_path, weight_dir, *caches) -> int:
    for cache in caches or ("paged", "paged_chunks", "slab"):
        module = child_module(cache)
        module.CHUNK_PAGES, module.SLAB_SLOTS = 2, 4  # both grow under the engine
        module.EAGER_PREFILL_TOKENS = 8  # the eager prefill below runs in groups of prompts
        module.DECODE_PROGRAMS = module.PREFETCH_PROGRAMS = 64  # a few splits a request: interpreted, each program costs
        compare(module, json.loads(Path(config_path).read_text()), weight_dir, cache)
    return 0


def compare(module, config, weight_dir, cache):
    seed = load_engine_module(REPO / "seed_engine" / "engine.py").create_engine(config, weight_dir, "cpu")
    engine = module.create_engine(config, weight_dir, "cpu")
    largest = module.MAX_PREFILL_PROMPTS
    generator = torch.Generator().manual_seed(5)

    def prompts(lengths):
        return [torch.randint(0, config["vocab_size"], (n,), generator=generator) for n in lengths]

    def same(what, a, b):
        err = (a - b).abs().max().item()
        assert a.shape == b.shape and err < 1e-3, f"{what}: shape {tuple(a.shape)} vs {tuple(b.shape)}, error {err}"
        print(f"ok {cache}: {what} (max error {err:.1e})", flush=True)

    calls = [
        ("prefill of 3 prompts, 13 tokens in the bucket of 16", [0, 1, 2], [5, 7, 1]),
        ("prefill of exactly one bucket, 16 tokens", [3], [16]),
        ("prefill of 17 tokens, the bucket of 24", [4, 5], [9, 8]),
        ("re-prefill of a live id", [1], [11]),
        ("prefill of 2 prompts over 3 and 2 pages, the bucket of 64", [6, 7], [40, 21]),
        (f"prefill of {largest + 1} prompts, eager, in groups (one prompt longer than a group)",
         list(range(10, 11 + largest)), [2] * largest + [11]),
    ]
    for what, ids, lengths in calls:
        inputs = prompts(lengths)
        same(what, engine.prefill(ids, inputs), seed.prefill(ids, inputs))
    live = [0, 1, 2, 3, 4, 5, 10, 11]
    for step, batch in enumerate((8, 5, 8, 3)):  # 5 and 3 leave padding rows in buckets of 8 and 4
        tokens = torch.randint(0, config["vocab_size"], (batch,), generator=generator)
        same(f"decode {step} of {batch} requests after the prefills", engine.decode(live[:batch], tokens),
             seed.decode(live[:batch], tokens))
    everyone = live + [6, 7] + list(range(12, 11 + largest))
    engine.remove(everyone)
    seed.remove(everyone)
    if cache == "paged_chunks":
        assert len(engine.cache.chunks) == 1, f"an empty pool kept {len(engine.cache.chunks)} chunks"
    inputs = prompts([40, 3] + [1] * largest)  # eager; the pool grows again
    same("prefill after every request was removed", engine.prefill(everyone[:largest + 2], inputs),
         seed.prefill(everyone[:largest + 2], inputs))
    tokens = torch.randint(0, config["vocab_size"], (3,), generator=generator)
    same("decode after it", engine.decode(everyone[:3], tokens), seed.decode(everyone[:3], tokens))


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
