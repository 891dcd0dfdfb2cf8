"""Every prompt of the call in one SDPA: padded to the longest, causal and key-padding masks."""
import torch

REQUIRES = {}
DEVICES = "any"


def attend_prefill(q, k, v, cache, layer, step):
    """Causal attention over each prompt alone, all at once: q [N, heads, D] -> [N, heads*D]."""
    lengths = step.num_new
    longest = max(lengths)

    def padded(t):  # [N, h, D] -> [B, h, longest, D]
        return torch.nn.utils.rnn.pad_sequence(t.split(lengths), batch_first=True).transpose(1, 2)

    arange = torch.arange(longest, device=q.device)
    valid = arange[None, :] < torch.tensor(lengths, device=q.device)[:, None]  # [B, longest]
    # A padded query row still sees key 0, so no row is fully masked (no NaN from softmax).
    mask = (arange[None, :] <= arange[:, None])[None] & valid[:, None, :]  # [B, q, k]
    out = sdpa(padded(q), padded(k), padded(v), attn_mask=mask[:, None])  # [B, heads, longest, D]
    out = out.transpose(1, 2).flatten(2).flatten(0, 1)  # [B*longest, heads*D]
    keep = torch.cat([torch.arange(n) + b * longest for b, n in enumerate(lengths)])  # packed rows
    return out[keep.to(q.device)]
