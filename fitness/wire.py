"""Messages between the judge and a candidate's runner process: a JSON header and raw
tensor bytes, over a pair of pipes.

Nothing here unpickles: the runner is untrusted, and unpickling its bytes would run its
code in the judge. Tensors travel as dtype name, shape and bytes, and only float dtypes
(logits) are accepted back.
"""
import json
import os
import select
import struct
import time

import torch

HEADER = struct.Struct("<Q")
DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32,
          "float64": torch.float64}
MAX_HEADER_BYTES = 1 << 24
MAX_TENSOR_BYTES = 1 << 32  # 4 GiB: far above any trace's logits


class WireError(RuntimeError):
    """The other side sent something that is not a message, or went away."""


class WireTimeout(WireError):
    """No whole message within the deadline."""


def encode_tensor(tensor):
    """(description, bytes) of a tensor; None stands for a value that is not one."""
    if not torch.is_tensor(tensor):
        return {"type": type(tensor).__name__}, b""
    cpu = tensor.detach().contiguous().cpu()
    description = {"dtype": str(cpu.dtype).replace("torch.", ""), "shape": list(cpu.shape)}
    return description, cpu.view(torch.uint8).numpy().tobytes() if cpu.numel() else b""


def float_dtype(description: dict):
    dtype = DTYPES.get(description.get("dtype"))
    if dtype is None:
        raise WireError(f"a {description.get('dtype')!r} tensor where float logits were expected")
    return dtype


def expected_bytes(description: dict) -> int:
    """Bytes of the tensor a description announces (0 for a value that is not a tensor)."""
    if "dtype" not in description:
        return 0
    shape = [int(n) for n in description["shape"]]
    if any(n < 0 for n in shape):
        raise WireError(f"a tensor of shape {shape}")
    return torch.Size(shape).numel() * torch.empty((), dtype=float_dtype(description)).element_size()


def decode_tensor(description: dict, data: bytes):
    """The tensor a description and its bytes stand for; the description's type name when
    the sender had no tensor; WireError for anything but a float tensor of that size."""
    if "dtype" not in description:
        return str(description.get("type", "unknown"))
    dtype, shape = float_dtype(description), [int(n) for n in description["shape"]]
    if len(data) != expected_bytes(description):
        raise WireError(f"{len(data)} bytes for a {description['dtype']} tensor of shape {shape}")
    if not data:
        return torch.empty(shape, dtype=dtype)
    return torch.frombuffer(bytearray(data), dtype=dtype).reshape(shape)


class Channel:
    """One end of a two-pipe connection: `send` writes a message, `receive` reads one."""

    def __init__(self, read_fd: int, write_fd: int):
        self.read_fd, self.write_fd = read_fd, write_fd

    def send(self, header: dict, tensors=()) -> None:
        parts = [encode_tensor(t) for t in tensors]
        header = {**header, "tensors": [d for d, _ in parts]}
        text = json.dumps(header).encode()
        payload = b"".join([HEADER.pack(len(text)), text] + [b for _, b in parts])
        view = memoryview(payload)
        while view:
            written = os.write(self.write_fd, view)
            view = view[written:]

    def receive(self, deadline: float | None = None, spin_s: float = 0.0) -> tuple[dict, list]:
        """(header, tensors); WireTimeout past `deadline` (time.monotonic()), WireError on EOF.
        For its first `spin_s` seconds awake it waits busy (see `spin_until_readable`)."""
        if spin_s > 0:
            spin_until_readable(self.read_fd, spin_s)
        (length,) = HEADER.unpack(self.read_exactly(HEADER.size, deadline))
        if length > MAX_HEADER_BYTES:
            raise WireError(f"a header of {length} bytes")
        try:
            header = json.loads(self.read_exactly(length, deadline))
            descriptions = header.pop("tensors", [])
            sizes = [expected_bytes(d) for d in descriptions]
        except (UnicodeDecodeError, ValueError, TypeError, AttributeError, KeyError) as err:
            raise WireError(f"a header of the wrong shape: {err}") from None
        if sum(sizes) > MAX_TENSOR_BYTES:
            raise WireError(f"{sum(sizes)} bytes of tensors in one message")
        blobs = [self.read_exactly(n, deadline) for n in sizes]
        return header, [decode_tensor(d, b) for d, b in zip(descriptions, blobs)]

    def read_exactly(self, count: int, deadline: float | None) -> bytes:
        """`count` bytes, waiting asleep between them."""
        chunks, left = [], count
        while left:
            wait = None if deadline is None else deadline - time.monotonic()
            if wait is not None and wait <= 0:
                raise WireTimeout(f"no answer within the deadline ({count - left}/{count} bytes read)")
            ready, _, _ = select.select([self.read_fd], [], [], wait)
            if not ready:
                continue
            chunk = os.read(self.read_fd, min(left, 1 << 20))
            if not chunk:
                raise WireError("the other side closed the connection")
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)


STOPPED_GAP_S = 0.01  # a gap this long between two polls: the process was stopped, not polling


def spin_until_readable(fd: int, awake_s: float) -> bool:
    """Poll `fd` without sleeping until it is readable or this process has polled for
    `awake_s` seconds (time it spent stopped, SIGSTOP, does not count). On the GPU
    machines' virtual cores a process that sleeps waits for its core when it wakes: a
    decode timed right after 50 ms asleep had a tail to 991 ms, right after 50 ms of
    spinning to 301 ms (docs/PERF.md, 2026-11-23, host noise)."""
    spent, last = 0.0, time.monotonic()
    while spent < awake_s:
        if select.select([fd], [], [], 0)[0]:
            return True
        now = time.monotonic()
        if now - last < STOPPED_GAP_S:
            spent += now - last
        last = now
    return False
