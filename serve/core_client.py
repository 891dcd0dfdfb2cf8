"""The API process's line to the engine core's process: start it, send it requests and
aborts, receive its steps, stop it (vLLM V1's EngineCoreClient).

Two one-way pipes. Requests go out from the event loop, written without blocking: what the
pipe takes at once, the rest when it is writable again, so the loop never waits on a full pipe
(a burst of long prompts) while the core waits on it to read outputs. Outputs are read on the
event loop when the pipe is readable. The core is spawned (no CUDA
state, no event loop inherited) and exits when the pipe from here closes, this process's
death included.
"""
import asyncio
import atexit
import multiprocessing
import os
import struct
from multiprocessing.reduction import ForkingPickler
from typing import AsyncIterator

from serve.engine_core import CoreFailed, CoreReady, run_engine_core

SHUTDOWN_SECONDS = 10  # for the core to leave once its pipe closes, before it is killed


class EngineCoreDead(Exception):
    """The engine core failed or exited: nothing more will be served."""


class EngineCoreClient:
    def __init__(self, args, eos_token_id):
        context = multiprocessing.get_context("spawn")
        requests_out, self.requests = context.Pipe(duplex=False)
        self.outputs, outputs_in = context.Pipe(duplex=False)
        # Not a daemon: an engine may start processes of its own (compile workers); the
        # pipe's end, shutdown() and atexit see that the core leaves.
        self.process = context.Process(target=run_engine_core, name="engine-core",
                                       args=(args, eos_token_id, requests_out, outputs_in))
        self.process.start()
        requests_out.close()  # the core's ends: so that either side's exit is the other's end of file
        outputs_in.close()
        atexit.register(self.shutdown)
        self.requests_out = PipeWriter(self.requests)

    def wait_ready(self) -> CoreReady:
        """Block until the engine is made and warmed up; raises EngineCoreDead if it failed."""
        while not self.outputs.poll(1.0):
            if not self.process.is_alive():
                raise EngineCoreDead(f"the engine core exited with code {self.process.exitcode}")
        ready = self.receive()
        assert isinstance(ready, CoreReady), ready
        return ready

    def add(self, requests: list) -> None:
        self.requests_out.send([("add", requests)])

    def abort(self, seq_ids: list) -> None:
        self.requests_out.send([("abort", seq_ids)])

    def receive(self):
        try:
            message = self.outputs.recv()
        except EOFError:
            self.process.join(SHUTDOWN_SECONDS)
            raise EngineCoreDead(f"the engine core exited with code {self.process.exitcode}") from None
        if isinstance(message, CoreFailed):
            raise EngineCoreDead(message.message)
        return message

    async def steps(self) -> AsyncIterator:
        """Lists of the StepOutputs that arrived together, as they arrive."""
        loop = asyncio.get_running_loop()
        readable = asyncio.Event()
        fd = self.outputs.fileno()  # kept: shutdown may close the pipe before this ends
        loop.add_reader(fd, readable.set)
        try:
            while True:
                await readable.wait()
                readable.clear()
                arrived = []
                while self.outputs.poll():
                    arrived.append(self.receive())
                if arrived:
                    yield arrived
        finally:
            loop.remove_reader(fd)

    def shutdown(self) -> None:
        """Close the pipes to and from the core and wait for it to leave; kill it if it does not."""
        self.requests_out.close()
        self.outputs.close()  # a core blocked on sending a step gets a broken pipe
        self.process.join(SHUTDOWN_SECONDS)
        if self.process.is_alive():
            self.process.kill()
            self.process.join()


class PipeWriter:
    """Messages down a pipe a multiprocessing Connection reads, written from the event loop
    without blocking it: each message in the Connection's framing (a 4-byte length, then the
    pickle), what the pipe takes at once written now, the rest when it is writable. A thread
    that sent them instead waited for the event loop to let go of the GIL: 0.7 ms between a
    request's submission and its arrival in the core at concurrency 1 on an H200
    (docs/log/2026-11-29-server-warm-up-whole-step.md)."""

    def __init__(self, connection):
        self.connection, self.fd = connection, connection.fileno()
        os.set_blocking(self.fd, False)
        self.pending = bytearray()
        self.loop = None  # the loop that flushes `pending`, while there is any
        self.is_broken = False  # the core is gone: what it would have read is dropped

    def send(self, message) -> None:
        if self.is_broken:
            return
        data = bytes(ForkingPickler.dumps(message))
        frame = struct.pack("!i", len(data)) + data
        if self.pending:
            self.pending += frame
            return
        written = self.write(frame)
        if written < len(frame):
            self.pending += frame[written:]
            try:
                self.loop = asyncio.get_running_loop()
            except RuntimeError:  # no loop here: write the rest now
                self.write_all()
                return
            self.loop.add_writer(self.fd, self.flush)

    def write(self, data) -> int:
        try:
            return os.write(self.fd, data)
        except BlockingIOError:
            return 0
        except OSError:  # the core is gone; its output pipe says why
            self.is_broken = True
            self.pending.clear()
            return len(data)

    def flush(self) -> None:
        del self.pending[:self.write(self.pending)]
        if not self.pending:
            self.loop.remove_writer(self.fd)
            self.loop = None

    def write_all(self) -> None:
        """What is pending, waiting for the pipe as long as it takes."""
        if self.loop is not None and not self.loop.is_closed():
            self.loop.remove_writer(self.fd)
        self.loop = None
        os.set_blocking(self.fd, True)
        while self.pending and not self.is_broken:
            del self.pending[:self.write(self.pending)]
        os.set_blocking(self.fd, False)

    def close(self) -> None:
        """The pipe's end (the core leaves at it); what is pending is dropped, not waited for."""
        if self.loop is not None and not self.loop.is_closed():
            self.loop.remove_writer(self.fd)
        self.loop = None
        self.pending.clear()
        if not self.connection.closed:
            self.connection.close()
