"""Several engine cores behind one API process: one replica of the engine per GPU, each in
a process that sees its GPU alone, each sequence sent to the replica with the fewest in
flight.

It stands where one EngineCoreClient stands (serve.llm_engine takes either): add, abort,
steps, wait_ready, shutdown. A step arrives tagged with its replica's index, so that the
API process can add up the replicas' counts.
"""
import argparse
import asyncio
import os
from typing import AsyncIterator

from serve.core_client import EngineCoreClient


def replica_devices(num_replicas: int, on_cuda: bool) -> list:
    """Each replica's CUDA_VISIBLE_DEVICES: the i-th GPU this process sees (of its own
    CUDA_VISIBLE_DEVICES when it has one: a server given GPUs 2 and 3 serves on them, not
    on 0 and 1); None on a CPU, where the replicas share the host."""
    if not on_cuda:
        return [None] * num_replicas
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    gpus = [d.strip() for d in visible.split(",")] if visible else [str(i) for i in range(num_replicas)]
    return gpus[:num_replicas]


class ReplicatedClient:
    def __init__(self, args, eos_token_id, num_replicas: int, on_cuda: bool):
        self.replicas = [EngineCoreClient(argparse.Namespace(**vars(args), cuda_visible_devices=device), eos_token_id)
                         for device in replica_devices(num_replicas, on_cuda)]
        self.owner = {}  # seq_id -> its replica
        self.in_flight = [0] * num_replicas

    def wait_ready(self):
        """Every replica made and warmed up; the first one's CoreReady (their schedulers are alike)."""
        return [replica.wait_ready() for replica in self.replicas][0]

    def add(self, requests: list) -> None:
        """Each request to the least loaded replica, in arrival order."""
        batches = [[] for _ in self.replicas]
        for request in requests:
            i = min(range(len(self.replicas)), key=self.in_flight.__getitem__)
            self.owner[request[0]] = i
            self.in_flight[i] += 1
            batches[i].append(request)
        for replica, batch in zip(self.replicas, batches):
            if batch:
                replica.add(batch)

    def abort(self, seq_ids: list) -> None:
        batches = [[] for _ in self.replicas]
        for seq_id in seq_ids:
            if seq_id in self.owner:
                batches[self.done(seq_id)].append(seq_id)
        for replica, batch in zip(self.replicas, batches):
            if batch:
                replica.abort(batch)

    def done(self, seq_id) -> int:
        """Its replica, which now has one sequence fewer in flight."""
        i = self.owner.pop(seq_id)
        self.in_flight[i] -= 1
        return i

    async def steps(self) -> AsyncIterator:
        """Every replica's steps, as they arrive, each tagged with `replica`; a replica's
        failure (EngineCoreDead) ends them all."""
        arrived = asyncio.Queue()

        async def follow(i, replica):
            try:
                async for steps in replica.steps():
                    for step in steps:
                        step.replica = i
                        for seq_id in step.finished:
                            if seq_id in self.owner:
                                self.done(seq_id)
                    await arrived.put(steps)
            except Exception as error:
                await arrived.put(error)

        followers = [asyncio.create_task(follow(i, r)) for i, r in enumerate(self.replicas)]
        try:
            while True:
                steps = await arrived.get()
                if isinstance(steps, Exception):
                    raise steps
                yield steps
        finally:
            for task in followers:
                task.cancel()

    def shutdown(self) -> None:
        for replica in self.replicas:
            replica.shutdown()
