"""Microseconds a GPU call takes once launched: the calls captured in one CUDA graph and
replayed between CUDA events, as the graph engines run them (no launch from Python)."""
import torch


def time_graph(calls: list, replays: int = 50) -> float:
    """Microseconds a call: `calls` (functions of no arguments) captured one after another in
    one graph, replayed `replays` times. The first call runs once before the capture, on a
    side stream, so that compilation and lazy state stay out of it."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        calls[0]()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for call in calls:
            call()
    graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(replays):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1e3 / (replays * len(calls))
