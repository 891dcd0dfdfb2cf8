"""fitness.wire's pipes: messages of large tensors (a run's logits) arrive whole and in order,
and a sender that stalls or goes away mid-tensor ends in the errors the judge reads."""
import os
import threading
import time

import pytest
import torch

from fitness import wire
from fitness.runner import OutputCopies, joined_checksum, output_checksum, rows_joined
from fitness.wire import END, RUN_STAGED, CallHeader, decode_call, encode_call, staged


def pipe_pair():
    read_fd, write_fd = os.pipe()
    return wire.Channel(read_fd, -1), wire.Channel(-1, write_fd), write_fd


def test_large_tensors_and_the_next_message_arrive_whole():
    receiver, sender, write_fd = pipe_pair()
    big = torch.randn(64, 40_000).to(torch.bfloat16)  # 5 MB: read straight into its own buffer
    # A strided tensor is sent from a contiguous copy that only the message's view holds.
    tensors = [big, torch.arange(7, dtype=torch.float16), None, torch.randn(3, 3), torch.randn(2000, 600).T]
    thread = threading.Thread(target=lambda: (sender.send({"ok": True, "n": 1}, tensors),
                                              sender.send({"ok": True, "n": 2}, [big[:2]])))
    thread.start()  # a pipe holds at most a MiB: the sender blocks until the receiver reads
    first, got = receiver.receive(deadline=time.monotonic() + 60)
    second, tail = receiver.receive(deadline=time.monotonic() + 60)
    thread.join()
    os.close(write_fd)
    assert (first["n"], second["n"]) == (1, 2)
    assert torch.equal(got[0], big) and torch.equal(got[1], tensors[1]) and torch.equal(got[3], tensors[3])
    assert got[2] == "NoneType" and torch.equal(got[4], tensors[4]) and torch.equal(tail[0], big[:2])


def message_cut_short(write_fd, close: bool) -> None:
    """A header for a 4 MB tensor, then only half of its bytes."""
    header, text, data = wire.encoded_parts({"ok": True}, [torch.zeros(1 << 20, dtype=torch.float32)])
    os.write(write_fd, bytes(header) + bytes(text))
    half = memoryview(data).cast("B")[: 2 << 20]
    while half:
        half = half[os.write(write_fd, half):]
    if close:
        os.close(write_fd)


@pytest.mark.parametrize("close", [False, True])
def test_a_sender_that_stalls_or_leaves_mid_tensor_is_an_error(close):
    receiver, _, write_fd = pipe_pair()
    thread = threading.Thread(target=message_cut_short, args=(write_fd, close))
    thread.start()
    with pytest.raises(wire.WireError) as caught:
        receiver.receive(deadline=time.monotonic() + 2)
    thread.join()
    if close:
        assert "closed" in str(caught.value)
    else:
        assert isinstance(caught.value, wire.WireTimeout) and "bytes read" in str(caught.value)
        os.close(write_fd)


def word_sum(tensor) -> int:
    """An output's bytes as little-endian 64-bit words, the last one padded with zeros."""
    raw = bytes(tensor.contiguous().reshape(-1).view(torch.uint8).tolist())
    raw += bytes(-len(raw) % 8)
    return sum(int.from_bytes(raw[i:i + 8], "little") for i in range(0, len(raw), 8))


def test_the_outputs_checksum_sums_their_bytes_as_words():
    """What the runner answers at a run's end and the judge recomputes on what it fetched
    (fitness.runner.output_checksum): every byte of every tensor output, strided ones read as
    their contiguous copy, a view off a word boundary and a size short of a word included,
    other values skipped; one byte changed changes it."""
    outputs = [torch.randn(64, 3000).to(torch.bfloat16), None, torch.randn(40, 30).T, torch.empty(0), "text",
               torch.full((5,), -1.0, dtype=torch.float16), torch.arange(23, dtype=torch.uint8)[3:]]
    want = sum(word_sum(t) for t in outputs if torch.is_tensor(t)) % 2**64
    assert output_checksum(outputs) == want > 0
    outputs[0].view(torch.uint8)[0, 777] ^= 1
    assert output_checksum(outputs) != want


def test_the_runners_copies_keep_each_output_and_sum_as_the_judge_does():
    """A runner's copies (fitness.runner.OutputCopies) hold each output as it was when its
    call returned, though the engine writes the next one into the same buffer; their checksum
    is output_checksum's over what the judge fetches, run after run: a larger run than any
    before (more buffers), then shorter ones over a buffer left with the last run's bytes."""
    copies, shared = OutputCopies(), torch.empty(300, 200)
    runs = [[torch.randn(300, 200), None, torch.randn(4, 7).to(torch.float16), "text"],
            [torch.randn(700, 1000), torch.randn(3000, 100).T, torch.arange(23, dtype=torch.uint8)[3:]],
            [torch.randn(5, 3).to(torch.bfloat16), torch.empty(0), torch.randn(1, 333), torch.tensor(3.5),
             torch.arange(5, dtype=torch.uint8), torch.randn(3, dtype=torch.complex128),  # wider than a word, after 8 bytes
             torch.tensor([True, False])]]  # a scalar above
    for outputs in runs + runs[::-1]:
        copies.start("cpu")
        for out in outputs:
            if torch.is_tensor(out) and out.shape == shared.shape:
                out = shared.copy_(out)  # an engine's own buffer, overwritten below
            copies.keep(out)
        shared.fill_(7.0)
        assert all(torch.equal(kept, out) if torch.is_tensor(out) else kept == out
                   for kept, out in zip(copies.outputs, outputs, strict=True))
        assert copies.checksum() == output_checksum(outputs) == output_checksum(copies.outputs)
    assert len(copies.buffers) == 1


def test_a_call_header_carries_its_flags_both_ways():
    """A staged call (Runner.stage) and request ids as a tensor travel as flags of one byte."""
    header = CallHeader("prefill", [3, 1], [5, 7], True, 64, 14)
    assert decode_call(encode_call(header)) == header and not header.staged
    kept = decode_call(staged(encode_call(header)))
    assert kept.staged and kept.ids_as_tensor and (kept.kind, kept.request_ids, kept.lengths) == ("prefill", [3, 1], [5, 7])
    assert decode_call(RUN_STAGED).kind == "run_staged" and not decode_call(END).staged


def test_a_staged_runs_held_outputs_sum_as_the_judge_does():
    """A staged run's outputs are held as they are (OutputCopies.hold) and summed joined,
    into the buffer of earlier runs when large enough (joined_checksum); an output that is not
    a whole number of words is summed alone, as output_checksum does."""
    copies = OutputCopies()
    copies.start("cpu")
    copies.keep(torch.randn(700, 1000))  # an earlier run: the buffer
    for outputs in ([torch.randn(8, 6000).to(torch.float16), None, torch.randint(-2**62, 2**62, (100,))],
                    [torch.randn(5, 3).to(torch.bfloat16), torch.arange(5, dtype=torch.uint8), None]):
        copies.start("cpu")
        copies.hold(outputs)
        assert copies.checksum() == output_checksum(outputs) == joined_checksum(outputs)
        assert copies.outputs == outputs
    # The contract's logits: rows of one dtype and width joined by one cat (rows_joined), with
    # or without room in the buffer, a transposed one among them; other widths are summed apart.
    logits = [torch.randn(8, 6000).to(torch.bfloat16), None, torch.randn(6000, 3).to(torch.bfloat16).t(),
              torch.randn(1, 6000).to(torch.bfloat16)]
    assert rows_joined([o for o in logits if o is not None]) is not None
    for outputs in (logits, [torch.randn(2, 8), torch.randn(3, 16)], [torch.randn(2, 3), torch.randn(4, 3)]):
        copies.start("cpu")
        copies.hold(outputs)
        assert copies.checksum() == output_checksum(outputs) == joined_checksum(outputs)
    assert rows_joined([torch.randn(2, 8), torch.randn(3, 16)]) is None  # widths differ
    assert rows_joined([torch.randn(2, 3), torch.randn(4, 3)]) is None  # a row of 12 bytes: not whole words
    after = [torch.randn(3, 3), torch.arange(5, dtype=torch.uint8), torch.randn(2, 2)]  # padded between
    copies.start("cpu")
    for out in after:  # where the joined bytes lay, a run copying outputs finds zeros between them
        copies.keep(out)
    assert copies.checksum() == output_checksum(after)
