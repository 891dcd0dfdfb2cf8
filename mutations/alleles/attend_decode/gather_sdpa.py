"""Each request's query over its own cached K/V through SDPA, one request at a time."""
import torch

REQUIRES = {}
DEVICES = "any"


def attend_decode(q, k, v, cache, layer, step):
    """Each request's one query over its whole cache: q [B, heads, D] -> [B, heads*D]."""
    outs = []
    for i, rid in enumerate(step.request_ids):
        keys, values = cache.read(layer, rid)  # [T, kv_heads, D]: no padding, no mask
        out = sdpa(q[i][None, :, None, :], keys.transpose(0, 1)[None],
                                             values.transpose(0, 1)[None])  # [1, heads, 1, D]
        outs.append(out.flatten())
    return torch.stack(outs)
