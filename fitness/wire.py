"""Messages between the judge and a candidate's runner process: a JSON header and raw
tensor bytes, over a pair of pipes; and a run's calls through shared memory (`Slot`).

Nothing here unpickles: the runner is untrusted, and unpickling its bytes would run its
code in the judge. Tensors travel as dtype name, shape and bytes; the judge accepts only
float dtypes (logits) back. A call's tokens go as int64 values in the slot.
"""
import fcntl
import json
import math
import mmap
import os
import select
import struct
import time
from dataclasses import dataclass, replace

import numpy as np
import torch

HEADER = struct.Struct("<Q")
DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32,
          "float64": torch.float64}
ITEM_BYTES = {dtype: torch.empty((), dtype=dtype).element_size() for dtype in DTYPES.values()}
MAX_HEADER_BYTES = 1 << 24
MAX_TENSOR_BYTES = 1 << 32  # 4 GiB: far above any trace's logits


class WireError(RuntimeError):
    """The other side sent something that is not a message, or went away."""


class WireTimeout(WireError):
    """No whole message within the deadline."""


def encode_tensor(tensor):
    """(description, bytes-like view) of a tensor; None stands for a value that is not one."""
    if not torch.is_tensor(tensor):
        return {"type": type(tensor).__name__}, b""
    cpu = tensor.detach().contiguous().cpu()
    description = {"dtype": str(cpu.dtype).replace("torch.", ""), "shape": list(cpu.shape)}
    return description, memoryview(cpu.view(torch.uint8).numpy()) if cpu.numel() else b""


def accepted_dtype(description: dict, accepted: dict):
    dtype = accepted.get(description.get("dtype"))
    if dtype is None:
        raise WireError(f"a {description.get('dtype')!r} tensor where one of {sorted(accepted)} was expected")
    return dtype


def expected_bytes(description: dict, accepted: dict = DTYPES) -> int:
    """Bytes of the tensor a description announces (0 for a value that is not a tensor)."""
    if "dtype" not in description:
        return 0
    shape = [int(n) for n in description["shape"]]
    if any(n < 0 for n in shape):
        raise WireError(f"a tensor of shape {shape}")
    return math.prod(shape) * ITEM_BYTES[accepted_dtype(description, accepted)]


def decode_tensor(description: dict, data: bytes, accepted: dict = DTYPES):
    """The tensor a description and its bytes stand for; the description's type name when
    the sender had no tensor; WireError for anything but an accepted tensor of that size."""
    if "dtype" not in description:
        return str(description.get("type", "unknown"))
    dtype, shape = accepted_dtype(description, accepted), [int(n) for n in description["shape"]]
    if len(data) != expected_bytes(description, accepted):
        raise WireError(f"{len(data)} bytes for a {description['dtype']} tensor of shape {shape}")
    if not data:
        return torch.empty(shape, dtype=dtype)
    # A bytearray is the tensor's own memory (a large read's buffer): no copy of it.
    return torch.frombuffer(data if isinstance(data, bytearray) else bytearray(data), dtype=dtype).reshape(shape)


def read_message(read, accepted: dict) -> tuple[dict, list]:
    """(header, tensors) of one message, its bytes taken through `read(count)`."""
    (length,) = HEADER.unpack(read(HEADER.size))
    if length > MAX_HEADER_BYTES:
        raise WireError(f"a header of {length} bytes")
    try:
        header = json.loads(read(length))
        descriptions = header.pop("tensors", [])
        sizes = [expected_bytes(d, accepted) for d in descriptions]
    except (UnicodeDecodeError, ValueError, TypeError, AttributeError, KeyError) as err:
        raise WireError(f"a header of the wrong shape: {err}") from None
    if sum(sizes) > MAX_TENSOR_BYTES:
        raise WireError(f"{sum(sizes)} bytes of tensors in one message")
    blobs = [read(n) for n in sizes]
    return header, [decode_tensor(d, b, accepted) for d, b in zip(descriptions, blobs)]


def parse(payload: bytes, accepted: dict = DTYPES) -> tuple[dict, list]:
    """(header, tensors) of one whole message."""
    view, at = memoryview(payload), 0

    def read(count: int) -> bytes:
        nonlocal at
        if at + count > len(view):
            raise WireError(f"a message of {len(view)} bytes that says it has more")
        at += count
        return bytes(view[at - count:at])
    return read_message(read, accepted)


def encoded_parts(header: dict, tensors=()) -> list:
    """A message as its pieces: the header's length and text, then each tensor's bytes."""
    parts = [encode_tensor(t) for t in tensors]
    text = json.dumps({**header, "tensors": [d for d, _ in parts]}).encode()
    return [HEADER.pack(len(text)), text] + [b for _, b in parts]


def encode(header: dict, tensors=()) -> bytes:
    """A message's bytes (a run's calls are encoded before the run, off its clock)."""
    return b"".join(encoded_parts(header, tensors))


# A pipe holds 64 KiB by default: a run's logits (1.2 GB for 64 steps of 64 rows of Qwen3's
# 151,936) passed in that many system calls. Linux lets a process raise it to
# /proc/sys/fs/pipe-max-size (1 MiB unless set otherwise).
PIPE_BYTES = 1 << 20
# A read this large goes straight into one buffer of its size (a bytearray that the tensor
# then uses as is), not through `pending`.
BULK_READ_BYTES = 1 << 20


def widen_pipe(fd: int) -> None:
    try:
        fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, PIPE_BYTES)
    except (OSError, AttributeError, ValueError):  # not a pipe, a lower limit, not Linux
        pass


class Channel:
    """One end of a two-pipe connection: `send` writes a message, `receive` reads one.
    `accepted`: the tensor dtypes it takes from the other side."""

    def __init__(self, read_fd: int, write_fd: int, accepted: dict = DTYPES):
        self.read_fd, self.write_fd, self.accepted = read_fd, write_fd, accepted
        self.pending = bytearray()  # read past the last message: the start of the next
        for fd in (read_fd, write_fd):
            widen_pipe(fd)

    def send(self, header: dict, tensors=()) -> None:
        for part in encoded_parts(header, tensors):  # each tensor's bytes as they are, not joined
            view = memoryview(part).cast("B")
            while view:
                written = os.write(self.write_fd, view)
                view = view[written:]

    def receive(self, deadline: float | None = None, spin_s: float = 0.0) -> tuple[dict, list]:
        """(header, tensors); WireTimeout past `deadline` (time.monotonic()), WireError on EOF.
        For its first `spin_s` seconds awake it waits busy (see `spin_until_readable`)."""
        if spin_s > 0 and not self.pending:
            spin_until_readable(self.read_fd, spin_s)
        return read_message(lambda count: self.read_exactly(count, deadline), self.accepted)

    def read_exactly(self, count: int, deadline: float | None) -> bytes:
        """`count` bytes, waiting asleep between reads. A read takes whatever the pipe
        holds (a small message whole, in one system call); what is past `count` is kept
        for the next."""
        if count - len(self.pending) >= BULK_READ_BYTES:
            return self.read_bulk(count, deadline)
        while len(self.pending) < count:
            self.wait_readable(deadline, len(self.pending), count)
            chunk = os.read(self.read_fd, max(count - len(self.pending), 1 << 16))
            if not chunk:
                raise WireError("the other side closed the connection")
            self.pending += chunk
        data = bytes(self.pending[:count])
        del self.pending[:count]
        return data

    def read_bulk(self, count: int, deadline: float | None) -> bytearray:
        """`count` bytes into one buffer of that size, read straight into it (a read of
        at most the pipe's size each, never past `count`): what `pending` held first."""
        data = bytearray(count)
        view, at = memoryview(data), len(self.pending)
        view[:at] = self.pending
        self.pending = bytearray()
        while at < count:
            self.wait_readable(deadline, at, count)
            got = os.readv(self.read_fd, [view[at:]])
            if not got:
                raise WireError("the other side closed the connection")
            at += got
        return data

    def wait_readable(self, deadline: float | None, have: int, count: int) -> None:
        """Asleep until the pipe holds bytes; WireTimeout past `deadline` (`have` of `count` read)."""
        while True:
            wait = None if deadline is None else deadline - time.monotonic()
            if wait is not None and wait <= 0:
                raise WireTimeout(f"no answer within the deadline ({have}/{count} bytes read)")
            if select.select([self.read_fd], [], [], wait)[0]:
                return


STOPPED_GAP_S = 0.01  # a gap this long between two polls: the process was stopped, not polling


def spin_until_readable(fd: int, awake_s: float) -> bool:
    """Poll `fd` without sleeping until it is readable or this process has polled for
    `awake_s` seconds (time it spent stopped, SIGSTOP, does not count). On the GPU
    machines' virtual cores a process that sleeps waits for its core when it wakes: a
    decode timed right after 50 ms asleep had a tail to 991 ms, right after 50 ms of
    spinning to 301 ms (docs/log/2026-11-23-cv-of-a-judgement.md, host noise)."""
    spent, last = 0.0, time.monotonic()
    while spent < awake_s:
        if select.select([fd], [], [], 0)[0]:
            return True
        now = time.monotonic()
        if now - last < STOPPED_GAP_S:
            spent += now - last
        last = now
    return False


# --- a run's calls through shared memory ----------------------------------------------------

MAILBOX_BYTES = 1 << 20  # each way: a call's header (its request ids and lengths) or an answer
INPUT_BYTES = 1 << 25  # a call's inputs (4M tokens); a run's must fit, so a prefill of 16 x 1024 uses 0.4%
INPUT_ALIGN = 16  # each call's inputs start on a 128-byte boundary, as a fresh device tensor would
NUMBER = struct.Struct("<Q")  # a mailbox's message number, then (another) its length
LIVENESS_EVERY = 4096  # polls between two looks at the deadline and at the other side
NAP_S = 50e-6  # a napping wait's first sleep between two looks (on a CPU, or after a long busy wait)
MAX_NAP_S = 1e-3  # ... doubling up to this: a judge that woke every 50 us slowed a 2-thread CPU runner 30%


class Mailbox:
    """One direction of a `Slot`: the sender writes a message, then its number; the
    receiver waits busy for the next number, with no system call (a pipe's round trip, made
    of system calls, took 0.62-0.76 ms on an H100 host's virtual cores; the shared memory's,
    1.6 us on the 2-core CPU: docs/log/2026-11-25-no-input-before-its-call.md). x86 keeps
    stores in order and loads in order, so a number read means its message is there."""

    def __init__(self, memory: mmap.mmap, offset: int, capacity: int):
        self.memory, self.offset, self.capacity = memory, offset, capacity
        self.data = offset + 2 * NUMBER.size
        self.sent = self.received = 0

    def put(self, payload: bytes) -> None:
        if len(payload) > self.capacity:
            raise WireError(f"a message of {len(payload)} bytes, over {self.capacity}")
        self.memory[self.data:self.data + len(payload)] = payload
        NUMBER.pack_into(self.memory, self.offset + NUMBER.size, len(payload))
        self.sent += 1
        NUMBER.pack_into(self.memory, self.offset, self.sent)  # last: the message is whole

    def take(self, deadline: float | None = None, alive=None, nap_s: float = 0.0, busy_s: float = 0.0) -> bytes:
        """The next message. Past `deadline` WireTimeout; when `alive()` turns false (the
        sender died), WireError. After `busy_s` seconds of polling, `nap_s` between polls
        (a CPU's cores are all at work: a busy wait would take one from the program it
        waits on); each nap twice the last, up to MAX_NAP_S."""
        wanted, polls, napping = self.received + 1, 0, bool(nap_s) and busy_s <= 0
        started = time.monotonic() if nap_s else 0.0
        while NUMBER.unpack_from(self.memory, self.offset)[0] != wanted:
            polls += 1
            if napping:
                time.sleep(nap_s)
                nap_s = min(2 * nap_s, MAX_NAP_S)
            elif nap_s and polls % LIVENESS_EVERY == 0:
                napping = time.monotonic() - started >= busy_s
            if polls % LIVENESS_EVERY == 0 or napping:
                if deadline is not None and time.monotonic() > deadline:
                    raise WireTimeout("no answer within the deadline")
                if alive is not None and not alive():
                    raise WireError("the other side is gone")
        (length,) = NUMBER.unpack_from(self.memory, self.offset + NUMBER.size)
        if length > self.capacity:
            raise WireError(f"a message that says it has {length} bytes")
        self.received = wanted
        return bytes(self.memory[self.data:self.data + length])


# A call as the judge sends it: what it is, its flags (request ids as a tensor; staged), how
# many requests, how many int64 values it has in the slot's inputs and where they start;
# then the request ids and (prefill) the prompt lengths. Binary: no parsing on the clock.
CALL = struct.Struct("<BBIIQ")
CALL_KINDS = ("prefill", "decode", "remove", "end", "wake", "run_staged")
AS_TENSOR, STAGED = 1, 2  # flag bits


@dataclass(frozen=True)
class CallHeader:
    kind: str
    request_ids: list
    lengths: list
    ids_as_tensor: bool
    start: int  # of the call's values in the slot's inputs
    count: int
    staged: bool = False  # kept by the runner for `run_staged`, not made now


def encode_call(header: CallHeader) -> bytes:
    numbers = list(header.request_ids) + list(header.lengths)
    flags = AS_TENSOR * bool(header.ids_as_tensor) | STAGED * bool(header.staged)
    return (CALL.pack(CALL_KINDS.index(header.kind), flags, len(header.request_ids), header.count, header.start)
            + struct.pack(f"<{len(numbers)}q", *numbers))


def decode_call(payload: bytes) -> CallHeader:
    code, flags, num_ids, count, start = CALL.unpack_from(payload)
    numbers = struct.unpack_from(f"<{(len(payload) - CALL.size) // 8}q", payload, CALL.size)
    return CallHeader(CALL_KINDS[code], list(numbers[:num_ids]), list(numbers[num_ids:]), bool(flags & AS_TENSOR),
                      start, count, bool(flags & STAGED))


def staged(payload: bytes) -> bytes:
    """A planned call (`Slot.plan`) as one to keep for a staged run."""
    return encode_call(replace(decode_call(payload), staged=True))


END = encode_call(CallHeader("end", [], [], False, 0, 0))
# Answered before the clock starts: the runner's wait turns busy (it naps after a long idle),
# so no run's first call pays a wake-up that depends on how long the runner sat idle.
WAKE = encode_call(CallHeader("wake", [], [], False, 0, 0))
# Every staged call of the run, one after another, as the evaluator's loop makes them.
RUN_STAGED = encode_call(CallHeader("run_staged", [], [], False, 0, 0))
DONE = encode({"ok": True})  # a call's answer, made once: the judge knows it by its bytes


class Slot:
    """Shared memory between a judge and its runner for a run's calls (a memfd, passed to
    the runner by number): `calls` from the judge, `answers` from the runner, and `inputs`,
    int64 values (each call's request ids, when they go as a tensor, then its tokens) that
    the judge writes when the call is due. Each call's values have a place of their own
    until the region is used up: the device may still be reading an earlier call's, and
    an engine may keep its inputs. The region starts over only at a run's start (the
    device is idle then)."""

    def __init__(self, fd: int | None = None):
        size = 2 * MAILBOX_BYTES + INPUT_BYTES
        if fd is None:
            fd = os.memfd_create("judge-run")
            os.ftruncate(fd, size)
        self.fd = fd
        self.memory = mmap.mmap(fd, size)
        self.calls = Mailbox(self.memory, 0, MAILBOX_BYTES - 2 * NUMBER.size)
        self.answers = Mailbox(self.memory, MAILBOX_BYTES, MAILBOX_BYTES - 2 * NUMBER.size)
        self.inputs = np.frombuffer(self.memory, dtype=np.int64, offset=2 * MAILBOX_BYTES)
        self.used = 0  # values placed so far (the judge's side)

    def plan(self, calls: list) -> list:
        """Each call (a header with its values left unplaced, and its values: int64 numpy)
        as it will be sent: (encoded header, start, values), then the run's `end`."""
        sizes = [-(-len(values) // INPUT_ALIGN) * INPUT_ALIGN for _, values in calls]
        if sum(sizes) > len(self.inputs):
            raise WireError(f"a run of {sum(sizes)} input values, over {len(self.inputs)}")
        if self.used + sum(sizes) > len(self.inputs):
            self.used = 0
        planned = []
        for (header, values), size in zip(calls, sizes):
            header = CallHeader(header.kind, header.request_ids, header.lengths, header.ids_as_tensor,
                                self.used, len(values))
            planned.append((encode_call(header), self.used, values))
            self.used += size
        return planned + [(END, 0, None)]

    def send(self, payload: bytes, start: int, values) -> None:
        """A call's values into their place, then its header: now it is due."""
        if values is not None and len(values):
            self.inputs[start:start + len(values)] = values
        self.calls.put(payload)

    def close(self) -> None:
        self.inputs = None  # the array holds the mapping open
        self.memory.close()
        os.close(self.fd)
