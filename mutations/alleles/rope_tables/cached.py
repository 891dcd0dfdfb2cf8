"""cos/sin tables computed once per (device, head_dim, theta, dtype, scaling) and gathered by position.

The table grows to the next power of two above the largest position asked for; looking
that position up costs a host sync, so this allele suits eager engines (the CUDA-graph
engine builds its own table in create_engine).
"""
import torch

REQUIRES = {}
DEVICES = "any"

ROPE_TABLES = {}  # (device, head_dim, theta, dtype, scaling) -> (cos, sin) [positions, head_dim/2]


def rope_tables(positions, head_dim, theta, dtype, scaling):
    """cos and sin [N, head_dim/2] for absolute positions [N], computed in fp32."""
    key = (str(positions.device), head_dim, float(theta), dtype, scaling)
    cos, sin = ROPE_TABLES.get(key, (None, None))
    needed = int(positions.max()) + 1 if positions.numel() else 1
    if cos is None or cos.shape[0] < needed:
        table_positions = torch.arange(rope_table_size(needed), device=positions.device)
        inv_freq = rope_frequencies(head_dim, theta, scaling, positions.device)
        angles = table_positions.float()[:, None] * inv_freq[None, :]  # [P, head_dim/2]
        cos, sin = angles.cos().to(dtype), angles.sin().to(dtype)
        ROPE_TABLES[key] = (cos, sin)
    return cos[positions], sin[positions]


def rope_table_size(n):
    """The power of two at or above n: the table doubles, so it is rebuilt O(log n) times."""
    return 1 << (n - 1).bit_length()
