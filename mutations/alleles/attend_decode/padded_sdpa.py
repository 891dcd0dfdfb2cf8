"""Every request's cache gathered and padded to the longest, then one masked SDPA."""
import torch

REQUIRES = {}
DEVICES = "any"


def attend_decode(q, k, v, cache, layer, step):
    """Each request's one query over its whole cache, padded to the longest: [B, heads*D]."""
    keys, values = zip(*(cache.read(layer, rid) for rid in step.request_ids))
    keys = torch.nn.utils.rnn.pad_sequence(keys, batch_first=True)  # [B, L, kv_heads, D]
    values = torch.nn.utils.rnn.pad_sequence(values, batch_first=True)
    # The new token sits at its position: a request sees keys 0..position (no host copy).
    valid = torch.arange(keys.shape[1], device=q.device)[None, :] <= step.positions[:, None]  # [B, L]
    out = sdpa(q[:, :, None, :], keys.transpose(1, 2), values.transpose(1, 2),
                                         attn_mask=valid[:, None, None, :])  # [B, heads, 1, D]
    return out.flatten(1)
