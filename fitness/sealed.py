"""A run's inputs on the device before its clock, sealed until each call is due.

The evaluator's protocol has every input on the device before it starts its clock; a judge
that writes each call's inputs when the call is due makes the device read them from host
memory inside the timed run, ~15 us a call on an H200 that the evaluator does not pay, so
the judge's ratios between programs part from the evaluator's by 3-6% on decode
(docs/log/2026-11-28-runner-call-cost.md). Handing the runner a run's plain inputs early
would let its engine read them ahead (fitness/adversaries/cheats.py). So the judge seals
them: each call's values XOR a pad drawn from Philox-4x32-10 under a key of its own. The
runner copies the sealed run to the device before the clock. When a call is due the judge
writes its cell (where its values lie, how many, its key) in the slot, and the runner
copies the cell to the device and unseals the values in place with one kernel; until then a call's
values are noise to anything in that process. Each call of a run has a cell of its own,
so a copy the device makes late never reads a later call's. On a GPU each cell's copy and
kernel are a CUDA graph captured before the clock: a Triton launch from Python cost the
host 17 us a call, more than the reads it saves (docs/log/2026-11-29-sealed-inputs.md).

Philox-4x32-10 (Salmon et al., SC'11: the counter-based generator of cuRAND, JAX and
Triton's `tl.rand`), counter = the value's index in its call, key = 62 random bits; a value's
pad is the first two words of its block. Here in numpy for the judge, and in Triton for the
runner; the two must agree bit for bit (tests/test_sealed.py; on a GPU, its GPU test).
"""
import secrets

import numpy as np
import torch

ROUNDS = 10
MULTIPLIERS = (0xD2511F53, 0xCD9E8D57)
KEY_STEPS = (0x9E3779B9, 0xBB67AE85)
KEY_BITS = 31  # each half of the key below 2**31
CELLS = 4096  # sealed calls a run may have (a longer run's go plain); the slot's first values
CELL_VALUES = 4  # a call's cell: its values' start and count, its key's two halves
BLOCK = 1024
GRID = 8  # the unsealing kernel's programs, striding over a call's blocks (a prefill of 16 x 1,024: 16)


def draw_key() -> tuple[int, int]:
    """A call's key: two halves of 31 bits."""
    return secrets.randbits(KEY_BITS), secrets.randbits(KEY_BITS)


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


def build_kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def unseal_kernel(cell, staged, GRID: tl.constexpr, BLOCK: tl.constexpr):
        """staged[start:start + count] ^= the pad under (key0, key1): the cell's four values."""
        A: tl.constexpr = 0xD2511F53  # MULTIPLIERS and KEY_STEPS: a kernel reads no module's names
        B: tl.constexpr = 0xCD9E8D57
        STEP0: tl.constexpr = 0x9E3779B9
        STEP1: tl.constexpr = 0xBB67AE85
        start = tl.load(cell)
        count = tl.load(cell + 1)
        key0 = tl.load(cell + 2).to(tl.uint32)
        key1 = tl.load(cell + 3).to(tl.uint32)
        for first in range(tl.program_id(0) * BLOCK, count, GRID * BLOCK):
            index = first + tl.arange(0, BLOCK)
            c0 = index.to(tl.uint32)
            c1 = tl.zeros_like(c0)
            c2 = tl.zeros_like(c0)
            c3 = tl.zeros_like(c0)
            k0 = key0
            k1 = key1
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
            where = staged + start + index
            tl.store(where, tl.load(where, mask=inside) ^ words, mask=inside)

    return unseal_kernel


class Unsealer:
    """Unseals call `i`'s values in `staged` (indexed as the slot's values) in place, as cell
    `i` of `cells` (the slot's first values) says: the cell copied to the device, then the
    kernel, both in the stream's order. On a GPU where the slot is pinned (`pinned`), cell
    i's copy and kernel are graph i, captured (`ready`) before a run that has an i-th call:
    the kernel reading the cell from host memory itself took ~65 us of the device a call on
    an H200 (docs/log/2026-11-29-sealed-inputs.md)."""

    def __init__(self, cells, staged, pinned: bool):
        self.cells, self.staged, self.pinned, self.graphs = cells, staged, pinned, []
        self.seen = torch.zeros(cells.shape, dtype=cells.dtype, device=staged.device) if staged.is_cuda else cells
        self.kernel = build_kernel()
        self.check()

    def launch(self, i: int) -> None:
        if self.seen is not self.cells:
            self.seen[i].copy_(self.cells[i], non_blocking=self.pinned)
        self.kernel[(GRID,)](self.seen[i], self.staged, GRID=GRID, BLOCK=BLOCK)

    def check(self) -> None:
        """Compiled now, and its pad the judge's: cell 0 opens the staged cells' own place
        (where no call's values lie) under a key of its own, before any call's cell is written."""
        count, key = BLOCK * GRID + 1, draw_key()
        self.cells[0] = torch.tensor([0, count, *key])
        self.staged[:count].zero_()
        self.launch(0)
        if not np.array_equal(self.staged[:count].cpu().numpy(), pad(count, key)):
            raise RuntimeError("the device's unsealing pad differs from the judge's")

    def ready(self, calls: int) -> None:
        """A graph for each of a run's first `calls` cells (a GPU; before the run's clock)."""
        while self.staged.is_cuda and self.pinned and len(self.graphs) < min(calls, CELLS):
            graph = torch.cuda.CUDAGraph()
            try:
                with torch.cuda.graph(graph, capture_error_mode="thread_local"):
                    self.launch(len(self.graphs))
            except RuntimeError:  # a copy CUDA would not capture: each call launched instead
                self.pinned, self.graphs = False, []
                torch.cuda.synchronize()
                return
            self.graphs.append(graph)

    def __call__(self, i: int, graph: bool = True) -> None:
        if graph and i < len(self.graphs):
            self.graphs[i].replay()
        else:
            self.launch(i)
