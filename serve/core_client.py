"""The API process's line to the engine core's process: start it, send it requests and
aborts, receive its steps, stop it (vLLM V1's EngineCoreClient).

Two one-way pipes. Requests go out from a thread of their own, so the event loop never
waits on a full pipe (a burst of long prompts) while the core waits on it to read outputs;
outputs are read on the event loop when the pipe is readable. The core is spawned (no CUDA
state, no event loop inherited) and exits when the pipe from here closes, this process's
death included.
"""
import asyncio
import atexit
import multiprocessing
import queue
import threading
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
        self.to_send = queue.SimpleQueue()
        self.sender = threading.Thread(target=self.send_requests, name="engine-core-sender", daemon=True)
        self.sender.start()

    def wait_ready(self) -> CoreReady:
        """Block until the engine is made and warmed up; raises EngineCoreDead if it failed."""
        while not self.outputs.poll(1.0):
            if not self.process.is_alive():
                raise EngineCoreDead(f"the engine core exited with code {self.process.exitcode}")
        ready = self.receive()
        assert isinstance(ready, CoreReady), ready
        return ready

    def add(self, requests: list) -> None:
        self.to_send.put(("add", requests))

    def abort(self, seq_ids: list) -> None:
        self.to_send.put(("abort", seq_ids))

    def send_requests(self) -> None:
        """What queued up since the last send goes as one message; None closes the pipe."""
        is_closing = False
        while not is_closing:
            messages = [self.to_send.get()]
            while not self.to_send.empty():
                messages.append(self.to_send.get_nowait())
            is_closing = None in messages
            try:
                self.requests.send([m for m in messages if m is not None])
            except OSError:  # the core is gone; its output pipe says why
                return
        self.requests.close()

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
        if self.sender.is_alive():
            self.to_send.put(None)
            self.sender.join(SHUTDOWN_SECONDS)
        self.outputs.close()  # a core blocked on sending a step gets a broken pipe
        self.process.join(SHUTDOWN_SECONDS)
        if self.process.is_alive():
            self.process.kill()
            self.process.join()
