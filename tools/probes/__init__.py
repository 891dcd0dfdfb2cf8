"""One-off measurements, each kept so that the figure of the log it backs (docs/log/) can be
measured again; no driver runs them. python -m tools.probes.NAME, and the log:

  kernels on a GPU
    decode_attention_bench   split-KV decode attention's tiles       2026-11-26-one-row-projections-in-triton.md
    prefill_attention_bench  varlen prefill attention's blocks       2026-11-27-batch-64-step-prefill-unmasked-blocks.md
    linear_bench             skinny matmuls: cuBLAS, skinny_matmul   2026-11-26-one-row-folds-llama-qwen3-step.md
    skinny_matmul            the one-row projection's first kernels  2026-11-24-search-480ebbd-decode-kernel-costs.md
    glu_matmul_bench         SwiGLU in the gate/up matmul            2026-11-27-glu-matmul-epilogue.md
    bf16_exactness           RoPE and SwiGLU against torch's bf16    2026-11-26-llama-batch-1-roofline-bf16-swiglu.md
    moe_layer_bench          the MoE kernels alone, knob by knob     2026-11-28-moe-triton-alleles-first-gpu-figures.md,
                                                                     2026-11-29-hybrid-chunk-systems-in-triton.md
    delta_inputs_cost        the DeltaNet prefill's padded inputs    2026-11-29-delta-padded-inputs-kernel.md
    chunk_systems_cost       the DeltaNet's chunk systems, by knob   2026-11-29-moe-search-from-seed-hybrid-one-gpu-sweep.md
    delta_gates_cost         the DeltaNet's gates, by knob           2026-11-29-moe-search-from-seed-hybrid-one-gpu-sweep.md
  a step, taken apart
    step_timeline            a decode step's kernels on a timeline   2026-11-27-batch-1-step-timeline-step-inputs.md
    step_without             a step with one part left out           2026-11-27-qwen3-batch-1-step-by-leaving-parts-out.md
    host_profile             where a case's host time goes           2026-11-23-graph-first-launch-metadata-copy.md
  the judge and its host
    call_delivery_cost       delivering a trace call by call         2026-11-25-no-input-before-its-call.md
    launch_cost              a small Triton kernel's launch, 3 ways  2026-11-29-sealed-inputs.md
    input_delivery           a call's inputs onto the device, 4 ways 2026-11-30-delivery-ways-fifth-5-minute-run.md
    runner_view_cost         the runner's tensor work a call         2026-11-28-runner-call-cost.md,
                                                                     2026-11-29-runner-output-copy-as-strided.md,
                                                                     2026-11-30-runner-path-staged-final.md
    runner_stamps            the runner's path between calls, step   2026-11-30-runner-path-staged-final.md
    wire_throughput          the judge's pipe and shared memory      2026-11-26-cpu-what-changed-judge-pipe.md
    fresh_runs               a case in fresh processes, in turn      2026-11-27-cpu-what-changed-fastest-always-judged.md
    host_noise, core_noise   how noisy the host's cores are          2026-11-23-cv-of-a-judgement.md
    swap_orders              pairs of swaps in both orders           2026-11-23-one-program-one-source.md
    kernel_count             the kernels a decode launches, on a CPU 2026-11-29-shared-expert-in-two-kernels.md
    library_replays          a run's replays; seeds no recipe makes  2026-12-01-seed-from-compile-cost.md
  the server
    serving_loop_cost        the serving loop's own host cost a step 2026-11-28-serving-loop-host-cost.md
    fixed_step_engine        an engine file whose step takes a set time (the stand-in those runs serve)
  mixtures of experts
    moe_tie_rows             rows the gate checks under a tie bound  2026-11-28-moe-gate-bf16-routing.md
    moe_alleles_bench        a sparse layer's MLP by each allele     2026-11-28-moe-search-cpu.md
    gate_as_on_gpu           the gate on a CPU in a GPU's dtypes     2026-11-28-moe-triton-alleles-first-gpu-figures.md,
                                                                     2026-12-01-an-fp16-config-for-bf16-targets.md
    planted_in_bf16          the hybrid's planted faults in bf16     2026-11-30-moe-committed-recipe-through-the-gate.md,
                                                                     2026-11-30-delivery-ways-fifth-5-minute-run.md
    tie_bound_by_layer       rows checked under a bound per layer    2026-11-30-moe-committed-recipe-through-the-gate.md

graph_timing is the kernel probes' helper (a callable timed in CUDA graphs), not a probe.
"""
