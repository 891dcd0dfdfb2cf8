"""A run's inputs on the device before its clock, sealed until each call is due.

The evaluator's protocol has every input on the device before it starts its clock; a judge
that writes each call's inputs when the call is due makes the device read them from host
memory inside the timed run, ~15 us a call on an H200 that the evaluator does not pay, so
the judge's ratios between programs part from the evaluator's by 3-6% on decode
(docs/log/2026-11-28-runner-call-cost.md). Handing the runner a run's plain inputs early
would let its engine read them ahead (fitness/adversaries/cheats.py). So the judge seals
them: each call's values XOR a pad drawn from Philox-4x32-10 under a key of its own, drawn
fresh by the judge and sent in the call's header when the call is due. The runner copies
the sealed run to the device before the clock and unseals each call in place with one
kernel; until its key comes, a call's values are noise to anything in that process.

Philox-4x32-10 (Salmon et al., SC'11: the counter-based generator of cuRAND, JAX and
Triton's `tl.rand`), counter = the value's index in its call, key = 62 random bits; a value's
pad is the first two words of its block. Here in numpy for the judge, and in Triton for the
runner; the two must agree bit for bit (tests/test_sealed.py; on a GPU, its GPU test).
"""
import secrets

import numpy as np

ROUNDS = 10
MULTIPLIERS = (0xD2511F53, 0xCD9E8D57)
KEY_STEPS = (0x9E3779B9, 0xBB67AE85)
KEY_BITS = 31  # each half of the key below 2**31: Triton types it int32 whatever its value, one compiled kernel
BLOCK = 1024


def draw_key() -> tuple[int, int]:
    """A call's key: two halves of 31 bits, never (0, 0) (the header's mark of plain values)."""
    while True:
        key = (secrets.randbits(KEY_BITS), secrets.randbits(KEY_BITS))
        if key != (0, 0):
            return key


def philox(counter: tuple, key: tuple[int, int]) -> tuple:
    """Philox-4x32 blocks: the counter's four words (arrays or ints) in, four uint32 arrays out."""
    c0, c1, c2, c3 = np.broadcast_arrays(*(np.asarray(word, dtype=np.uint32) for word in counter))
    k0, k1 = np.uint64(key[0]), np.uint64(key[1])
    a, b = np.uint64(MULTIPLIERS[0]), np.uint64(MULTIPLIERS[1])
    low = np.uint64(0xFFFFFFFF)
    for _ in range(ROUNDS):
        product_a, product_b = c0.astype(np.uint64) * a, c2.astype(np.uint64) * b
        c0, c1, c2, c3 = (((product_b >> np.uint64(32)) ^ c1 ^ k0).astype(np.uint32), (product_b & low).astype(np.uint32),
                          ((product_a >> np.uint64(32)) ^ c3 ^ k1).astype(np.uint32), (product_a & low).astype(np.uint32))
        k0, k1 = (k0 + np.uint64(KEY_STEPS[0])) & low, (k1 + np.uint64(KEY_STEPS[1])) & low
    return c0, c1, c2, c3


def pad(count: int, key: tuple[int, int]) -> np.ndarray:
    """`count` int64 words of pad under `key`."""
    c0, c1, _, _ = philox((np.arange(count, dtype=np.uint32), 0, 0, 0), key)
    return (c0.astype(np.uint64) | (c1.astype(np.uint64) << np.uint64(32))).view(np.int64)


def seal(values: np.ndarray, key: tuple[int, int]) -> np.ndarray:
    return values ^ pad(len(values), key)


class Unsealer:
    """Unseals a call's values in place on the device: one Triton kernel, compiled here
    (outside every run) for the one signature it is ever called with."""

    def __init__(self, device):
        import triton
        import triton.language as tl

        @triton.jit(do_not_specialize=["count", "key0", "key1"])
        def unseal_kernel(values, count, key0, key1, BLOCK: tl.constexpr):
            A: tl.constexpr = 0xD2511F53  # MULTIPLIERS and KEY_STEPS: a kernel reads no module's names
            B: tl.constexpr = 0xCD9E8D57
            STEP0: tl.constexpr = 0x9E3779B9
            STEP1: tl.constexpr = 0xBB67AE85
            index = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
            c0 = index.to(tl.uint32)
            c1 = tl.zeros_like(c0)
            c2 = tl.zeros_like(c0)
            c3 = tl.zeros_like(c0)
            k0 = key0.to(tl.uint32)
            k1 = key1.to(tl.uint32)
            for _ in tl.static_range(10):
                old0, old2 = c0, c2
                c0 = tl.umulhi(B, old2) ^ c1 ^ k0
                c2 = tl.umulhi(A, old0) ^ c3 ^ k1
                c1 = B * old2
                c3 = A * old0
                k0 = k0 + STEP0
                k1 = k1 + STEP1
            words = (c0.to(tl.uint64) | (c1.to(tl.uint64) << 32)).to(tl.int64, bitcast=True)
            inside = index < count
            tl.store(values + index, tl.load(values + index, mask=inside) ^ words, mask=inside)

        import torch
        self.kernel, self.cdiv = unseal_kernel, triton.cdiv
        warm = torch.zeros(BLOCK + 1, dtype=torch.int64, device=device)
        self(warm, (1, 1))  # compiled now; values under (1, 1) then, not under any call's key
        if not np.array_equal(warm.cpu().numpy(), pad(BLOCK + 1, (1, 1))):
            raise RuntimeError("the device's unsealing pad differs from the judge's")

    def __call__(self, values, key: tuple[int, int]) -> None:
        count = values.numel()
        self.kernel[(self.cdiv(count, BLOCK),)](values, count, key[0], key[1], BLOCK=BLOCK)
