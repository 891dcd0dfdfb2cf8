"""The seed engine on the derived dtype configs of real shapes (fp16 for bf16 targets, the
old bf16 beside it), imitated as a GPU computes (gate_as_on_gpu): worst of the limit."""
import json, sys, tempfile, time
from pathlib import Path
from contract.loader import load_engine_module, SEED_ENGINE
from contract.model_config import ModelConfig, derived_configs
from fitness import gate
from fitness.reference_logits import References
from target import hf_checkpoints
from tools.probes.gate_as_on_gpu import engine_as_on_gpu

names = sys.argv[1].split(",")
seeds = [int(s) for s in sys.argv[2].split(",")]
scratch = Path(tempfile.mkdtemp())
module = load_engine_module(Path(sys.argv[3]) if len(sys.argv) > 3 else SEED_ENGINE)
for name in names:
    folder = scratch / name; folder.mkdir()
    (folder / "config.json").write_text(json.dumps(hf_checkpoints.CHECKPOINTS[name]))
    config = ModelConfig.load(folder)
    derived = derived_configs(config)
    for label, cfg in [("fp16", derived["fp16"]), ("bf16(old)", derived_configs(config.derive(torch_dtype="float16"))["bf16"])]:
        for seed in (seeds if label == "fp16" else seeds[:1]):
            t = time.time()
            with engine_as_on_gpu(module):
                references = References("cpu")
                wdir = gate.judging_weights(cfg, scratch)
                tally = gate.Tally(gate.STRESS_MARGIN)
                try:
                    gate.check_traces(gate.InProcessDriver(module, "cpu"), references, cfg, wdir, seed, label, tally, full=False)
                    found = f"ok {tally.worst:.3f} ({tally.worst_case})"
                except Exception as err:
                    found = f"{type(err).__name__}: {str(err)[:160]}"
                print(f"{name:26s} {label:9s} seed {seed} allowance {references.allowance(cfg, wdir):7.1f} {found} [{time.time()-t:.0f} s]", flush=True)
