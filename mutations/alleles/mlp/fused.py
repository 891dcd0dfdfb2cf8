"""SwiGLU with gate and up from one matmul by the stacked weight."""
import torch.nn.functional as F

REQUIRES = {"load_weights": ("fused_gate_up", "fused_both")}
DEVICES = "any"


def mlp(x, layer):
    # One launch and one read of x for gate and up; chunk gives views, no copies.
    gate, up = (x @ layer["gate_up"].T).chunk(2, dim=-1)  # [N, intermediate] each
    return (F.silu(gate) * up) @ layer["down"].T
