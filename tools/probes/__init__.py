"""One-off measurements whose figures are cited in docs/PERF.md or beside the code they
justified (a kernel's block sizes, the judge's cost per call, the host's noise): kept so a
figure can be measured again, not run by any driver.

    python -m tools.probes.decode_attention_bench   split-KV decode attention's tiles (GPU)
    python -m tools.probes.prefill_attention_bench  varlen prefill attention's blocks (GPU)
    python -m tools.probes.bf16_exactness           RoPE and SwiGLU kernels against torch's bf16 rounding (GPU)
    python -m tools.probes.linear_bench             skinny matmuls: cuBLAS against skinny_matmul's kernels (GPU)
    python -m tools.probes.call_delivery_cost       what delivering a trace call by call costs a program (GPU)
    python -m tools.probes.runner_view_cost         the runner's tensor work a call: slices, output copies (GPU)
    python -m tools.probes.host_profile             where a case's host time goes (GPU)
    python -m tools.probes.host_noise, core_noise   how noisy the host's cores are
    python -m tools.probes.swap_orders              pairs of swaps in both orders: one engine, one source?
    python -m tools.probes.moe_tie_rows             rows a Qwen3-MoE gate checks under a dtype's tie bound
    python -m tools.probes.moe_alleles_bench        a sparse layer's MLP, the seed's and each MoE allele's (CPU)
    python -m tools.probes.moe_layer_bench          the MoE kernels alone on a GPU, knob by knob (bytes a layer, TB/s)
    python -m tools.probes.gate_as_on_gpu           the gate on a CPU with every dtype a GPU would compute in
"""
