"""Host microseconds a call of one small Triton kernel costs, launched three ways: through the
JIT (binding, specialisation, cache look-up), straight through its compiled launcher, and a
torch op with a scalar argument for scale (issue 58: what a per-call unsealing launch costs).

    python -m tools.probes.launch_cost [--calls 2000]
"""
import argparse
import statistics
import sys
import time

import torch
import triton
import triton.language as tl


@triton.jit(do_not_specialize=["count", "key0", "key1"])
def xor_kernel(values, count, key0, key1, BLOCK: tl.constexpr):
    index = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    inside = index < count
    word = key0.to(tl.int64) | (key1.to(tl.int64) << 32)
    tl.store(values + index, tl.load(values + index, mask=inside) ^ word, mask=inside)


def per_call_us(fn, calls: int) -> float:
    times = []
    for _ in range(5):
        torch.cuda.synchronize()
        started = time.perf_counter()
        for i in range(calls):
            fn(i)
        times.append((time.perf_counter() - started) / calls * 1e6)
        torch.cuda.synchronize()
    return statistics.median(times)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.probes.launch_cost")
    parser.add_argument("--calls", type=int, default=2000)
    args = parser.parse_args(argv)
    values = torch.zeros(1 << 16, dtype=torch.int64, device="cuda")
    compiled = xor_kernel[(1,)](values, 64, 1, 2, BLOCK=1024)
    stream = torch.cuda.current_stream().cuda_stream
    print(f"{torch.cuda.get_device_name()}; triton {triton.__version__}; torch {torch.__version__}")
    cases = {"triton through the JIT": lambda i: xor_kernel[(1,)](values[64 * (i % 512):], 64, i, 7, BLOCK=1024),
             "torch bitwise_xor_ (scalar)": lambda i: values[64 * (i % 512):64 * (i % 512) + 64].bitwise_xor_(i)}
    for name, extra in (("direct, constexprs passed", (1024,)), ("direct, constexprs left out", ())):
        def direct(i, extra=extra):
            compiled.run(1, 1, 1, stream, compiled.function, compiled.packed_metadata, None, None, None,
                         values[64 * (i % 512):], 64, i, 7, *extra)
        try:
            direct(0)
            torch.cuda.synchronize()
            cases[f"triton {name}"] = direct
        except Exception as err:  # noqa: BLE001 - which form this triton takes is the question
            print(f"triton {name}: {type(err).__name__}: {err}")
    for name, fn in cases.items():
        print(f"{name:36s} {per_call_us(fn, args.calls):7.2f} us a call", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
