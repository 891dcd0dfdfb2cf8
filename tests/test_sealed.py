"""fitness.sealed: a run's inputs handed over before its clock, each call's readable only once
its key comes. The judge's pad (numpy) is Philox-4x32-10 as published, and the runner's
kernel (Triton; here its interpreter, in a process of its own) unseals what the judge sealed."""
import json
import os
import subprocess
import sys

import numpy as np

from fitness import sealed
from fitness.wire import FIRST_VALUE, CallHeader, Slot, decode_call, encode_call
from tests.conftest import REPO


def test_the_pad_is_philox_4x32_10_as_random123_publishes_it():
    """Random123's known-answer vectors for philox4x32_10 (its kat_vectors file)."""
    vectors = [((0, 0, 0, 0), (0, 0), (0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8)),
               ((0xffffffff,) * 4, (0xffffffff,) * 2, (0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd)),
               ((0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344), (0xa4093822, 0x299f31d0),
                (0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1))]
    for counter, key, want in vectors:
        assert tuple(int(word) for word in sealed.philox(counter, key)) == want


def test_a_sealed_value_tells_nothing_without_its_key():
    values = np.arange(5000, dtype=np.int64) % 7  # few distinct values, as a prompt's tokens may be
    key = sealed.draw_key()
    shut = sealed.seal(values, key)
    assert np.array_equal(sealed.seal(shut, key), values)
    assert not np.any(shut == values) and len(np.unique(shut)) == len(values)
    assert not np.any(sealed.seal(shut, (key[0] ^ 1, key[1])) == values)  # a key one bit off opens nothing


def test_a_call_header_carries_its_cell():
    header = CallHeader("decode", [3, 1], [], True, 20_480, 66, 4095)
    assert decode_call(encode_call(header)) == header


def calls(seed: int = 0) -> list:
    """Three calls' headers (values unplaced) and values: a prefill of two prompts, a decode
    whose request ids go as a tensor, a remove."""
    rng = np.random.default_rng(seed)
    prompts = rng.integers(0, 50_000, 300), rng.integers(0, 50_000, 5)
    return [(CallHeader("prefill", [0, 1], [300, 5], False, 0, 305), np.concatenate(prompts)),
            (CallHeader("decode", [0, 1], [], True, 0, 4), np.array([0, 1, 17, 4], dtype=np.int64)),
            (CallHeader("remove", [0], [], False, 0, 0), np.empty(0, dtype=np.int64))]


def test_a_sealed_plan_writes_every_call_before_the_run_and_each_key_when_it_is_due():
    slot = Slot()
    try:
        planned = slot.plan(calls(), sealed=True)
        wake, headers = decode_call(planned[0][0]), [decode_call(payload) for payload, _, _ in planned[1:-1]]
        assert (wake.kind, decode_call(planned[-1][0]).kind) == ("wake", "end")
        assert (wake.start, wake.count, wake.lengths) == (FIRST_VALUE, headers[-1].start - FIRST_VALUE, [3])
        assert [h.cell for h in headers] == [0, 1, 2]
        assert not slot.inputs[:FIRST_VALUE].any()  # no cell written before its call is due
        for header, (_, start, cell), (_, values) in zip(headers, planned[1:-1], calls()):
            assert start == header.cell * sealed.CELL_VALUES and list(cell[:2]) == [header.start, header.count]
            written = slot.inputs[header.start:header.start + header.count].copy()
            assert not np.any(written == values) and np.array_equal(sealed.seal(written, tuple(cell[2:])), values)
        assert len({tuple(cell[2:]) for _, _, cell in planned[1:-1]}) == 3
        plain = slot.plan(calls(), sealed=False)
        assert decode_call(plain[0][0]).lengths == [0] and all(decode_call(p).cell == -1 for p, _, _ in plain)
        assert all(np.array_equal(v, c[1]) for (_, _, v), c in zip(plain[1:-1], calls()))  # written when due
        assert all(decode_call(p).cell == -1 for p, _, _ in slot.plan(calls() * 1400, sealed=True))  # over CELLS
    finally:
        slot.close()


UNSEALED_BY_THE_RUNNER = """
import json
import numpy as np
from fitness.runner import Inputs
from fitness.wire import Slot, decode_call
from tests.test_sealed import calls
slot = Slot()
planned = slot.plan(calls(1), sealed=True)
wake = decode_call(planned[0][0])
inputs = Inputs(slot.inputs, "cpu")
inputs.stage(wake.start, wake.count, wake.lengths[0])
seen = []
for i, ((payload, start, cell), (_, values)) in enumerate(zip(planned[1:-1], calls(1))):
    header = decode_call(payload)
    later = [(decode_call(p), v) for (p, _, _), (_, v) in zip(planned[2 + i:-1], calls(1)[i + 1:]) if len(v)]
    shut = all(not np.any(inputs.staged[h.start:h.start + h.count].numpy() == v) for h, v in later)
    slot.send(payload, start, cell)  # the call is due: its cell, then its header
    got = inputs.view(header.start, header.count, header.cell).numpy()
    seen.append({"equal": bool(np.array_equal(got, values)), "later_still_sealed": shut})
print(json.dumps(seen))
"""


def test_the_runner_unseals_each_call_in_place_and_nothing_later():
    """Triton's interpreter runs the runner's kernel on the CPU: each call's values come out
    as the judge drew them once its cell is written, while every later call's stay sealed."""
    env = dict(os.environ, TRITON_INTERPRET="1", OMP_NUM_THREADS="1")
    run = subprocess.run([sys.executable, "-c", UNSEALED_BY_THE_RUNNER], cwd=REPO, env=env, capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    seen = json.loads(run.stdout.splitlines()[-1])
    assert seen == [{"equal": True, "later_still_sealed": True}] * 3
