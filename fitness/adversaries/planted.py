"""Engines with planted faults, each one exact edit of the seed engine's source.

Every edit asserts that its text was found, so a change to the seed cannot quietly turn a
planted fault back into the seed.
"""
from pathlib import Path

from contract.loader import SEED_ENGINE


def edit(source: str, old: str, new: str) -> str:
    assert source.count(old) == 1, f"planted fault no longer applies: {old!r}"
    return source.replace(old, new)


def rotate_half_rope(src):
    src = edit(src, "    x0, x1 = x[..., 0::2], x[..., 1::2]  # [N, heads, head_dim/2] each",
               "    x0, x1 = x.chunk(2, dim=-1)")
    return edit(src, "    return torch.stack((x0 * cos - x1 * sin, x0 * sin + x1 * cos), dim=-1).flatten(-2)",
                "    return torch.cat((x0 * cos - x1 * sin, x0 * sin + x1 * cos), dim=-1)")


def reprefill_keeps_kv(src):
    return edit(src, "                self.k[rid] = [None] * self.num_layers\n"
                     "                self.v[rid] = [None] * self.num_layers",
                "                self.k.setdefault(rid, [None] * self.num_layers)\n"
                "                self.v.setdefault(rid, [None] * self.num_layers)")


def ignore_remove(src):
    return edit(src, "        self.cache.remove(as_id_list(request_ids))", "        pass")


def stale_logits(src):
    return edit(src, "        return logits[last]\n",
                "        previous, self.previous = getattr(self, 'previous', None), logits[last]\n"
                "        same = previous is not None and previous.shape == logits[last].shape\n"
                "        return previous if same else logits[last]\n")


def rows_reversed(src):
    return edit(src, "        return logits[last]\n", "        return logits[last].flip(0)\n")


def kv_leaks_across_requests(src):
    # Prefill attention over the whole packed batch: later prompts see earlier ones.
    return edit(src, "    for q_r, k_r, v_r in zip(q.split(step.num_new), k.split(step.num_new), v.split(step.num_new)):",
                "    for q_r, k_r, v_r in [(q, k, v)]:")


def gqa_head_mismatch(src):
    # repeat instead of repeat_interleave: right when heads == kv_heads, wrong under GQA.
    src = edit(src, "    k = k.repeat_interleave(groups, dim=1)  # GQA: [B, heads, Tk, D]",
               "    k = k.repeat(1, groups, 1, 1)")
    return edit(src, "    v = v.repeat_interleave(groups, dim=1)", "    v = v.repeat(1, groups, 1, 1)")


def imports_numpy(src):
    return edit(src, "import torch\n", "import numpy\nimport torch\n")


def crashes_in_prefill(src):
    return edit(src, "        ids = as_id_list(request_ids)\n        lengths",
                "        raise RuntimeError('planted crash')\n        ids = as_id_list(request_ids)\n        lengths")


def hangs_in_decode(src):
    return edit(src, "        ids = as_id_list(request_ids)\n        start",
                "        import time\n        time.sleep(3600)\n        ids = as_id_list(request_ids)\n        start")


# What a hybrid's engine (Qwen3.5: Gated DeltaNet and gated attention layers) gets wrong:
# each an edit (old, new) of the seed; the last two change the delta rule's decay and write
# strength by a tenth only.
HYBRID = {
    "the conv's state not carried": ("    conv_state, matrix = states.read(index, step)\n",
                                     "    conv_state, matrix = states.read(index, step)\n    conv_state = conv_state * 0\n"),
    "the delta rule's state not carried": ("    conv_state, matrix = states.read(index, step)\n",
                                           "    conv_state, matrix = states.read(index, step)\n    matrix = matrix * 0\n"),
    "states kept in another request's slot": (  # vLLM's users' bug: fine at batch 1 and 2
        "        for rid, conv_r, matrix_r in zip(step.request_ids, conv, matrix):",
        "        for rid, conv_r, matrix_r in zip(sorted(step.request_ids), conv, matrix):"),
    "attention's output gate dropped": ("    return attn if gate is None else attn * torch.sigmoid(gate)", "    return attn"),
    "RoPE over the whole head": ("rope_tables(step.positions, self.rotary_dim,", "rope_tables(step.positions, self.head_dim,"),
    "the shared expert dropped": ('    if "shared_expert_gate" not in layer:\n', "    if True:\n"),
    "the norms' 1 + weight missed": ('        if model_config["zero_centred_norm"]:\n            names =',
                                     '        if False:\n            names ='),
    "the query unscaled": ("    return q / math.sqrt(key_dim), k, v.view(", "    return q, k, v.view("),
    "the conv without its SiLU": ("    return F.silu(out), full[:, :, full.shape[-1] - state.shape[-1]:]",
                                  "    return out, full[:, :, full.shape[-1] - state.shape[-1]:]"),
    "a decode step's state not decayed": ("    state = state * log_decay.exp()[..., None, None]\n    predicted",
                                          "    predicted"),
    "the output gate a sigmoid, not a SiLU": ("    return (normed * F.silu(z.float())).to(z.dtype).flatten(1)",
                                              "    return (normed * torch.sigmoid(z.float())).to(z.dtype).flatten(1)"),
    "the decay a tenth too fast": ('    return -lin["A_log"].exp() * F.softplus(', '    return -1.1 * lin["A_log"].exp() * F.softplus('),
    "the write strength a tenth too weak": ('    beta = torch.sigmoid(x @ lin["b"].T).float()',
                                            '    beta = 0.9 * torch.sigmoid(x @ lin["b"].T).float()'),
}


def hybrid_fault(name: str) -> str:
    """The seed with HYBRID[name] planted."""
    return edit(SEED_ENGINE.read_text(), *HYBRID[name])


FAULTS = {  # fault -> the gate stage that must reject it
    "rotate_half_rope": "target",
    "reprefill_keeps_kv": "target",
    "ignore_remove": "target",
    "stale_logits": "target",
    "rows_reversed": "target",
    "kv_leaks_across_requests": "target",
    "gqa_head_mismatch": "derived",
}


def write_faulty(name: str, directory) -> Path:
    path = directory / f"{name}.py"
    path.write_text(globals()[name](SEED_ENGINE.read_text()))
    return path
