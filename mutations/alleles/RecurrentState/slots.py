"""A Gated DeltaNet's states (Qwen3.5) in slots: per DeltaNet layer, one pool of conv states
[slots, conv_dim, kernel - 1] and one of delta-rule matrices [slots, heads, key dim, value
dim] (fp32), a request's slot fixed from its prefill to its removal. Reads gather and
writes scatter by `step.state_slots`, so a step's addresses are a tensor: a decode graph
replays them for whatever requests fill its rows (Engine.cuda_graphs), padding rows in
slot 0, which no request owns. The seed keeps a tensor per request and layer in dicts,
stacked and split again every step.

The pools grow (doubling) when a prefill finds no free slot; their tensors then move, and
`generation` tells a graph-holding engine to capture again.
"""
import torch

REQUIRES = {}
DEVICES = "any"

STATE_SLOTS = 16  # range: 2..1024; slots first made (slot 0 is scratch), doubled when full


class RecurrentState:
    """Per DeltaNet layer, pools of conv states and delta-rule matrices, a slot per request."""
    static_addresses = True  # read by Engine.cuda_graphs: its decode graphs may hold these states

    def __init__(self, model_config, device):
        types = model_config.get("layer_types") or ()
        self.layers = [i for i, kind in enumerate(types) if kind == "linear_attention"]
        self.device, self.dtype = torch.device(device), compute_dtype(model_config, device)
        if self.layers:
            key_dim = model_config["linear_num_key_heads"] * model_config["linear_key_head_dim"]
            heads = model_config["linear_num_value_heads"]
            self.conv_shape = (2 * key_dim + heads * model_config["linear_value_head_dim"],
                               model_config["linear_conv_kernel_dim"] - 1)
            self.matrix_shape = (heads, model_config["linear_key_head_dim"], model_config["linear_value_head_dim"])
        self.conv, self.matrix, self.slot_of, self.free = {}, {}, {}, []
        self.capacity, self.generation = 0, 0
        self.grow(STATE_SLOTS)

    def grow(self, capacity):
        """Pools of `capacity` slots holding what the old ones held; the new slots free."""
        for layer in self.layers:
            conv = torch.zeros(capacity, *self.conv_shape, device=self.device, dtype=self.dtype)
            matrix = torch.zeros(capacity, *self.matrix_shape, device=self.device, dtype=torch.float32)
            if self.capacity:
                conv[:self.capacity], matrix[:self.capacity] = self.conv[layer], self.matrix[layer]
            self.conv[layer], self.matrix[layer] = conv, matrix
        self.free += range(max(self.capacity, 1), capacity)  # slot 0: scratch, for padding rows
        self.capacity, self.generation = capacity, self.generation + 1

    def prepare(self, step):
        """A slot for each new request of a prefill (one prefilled again keeps its own), and
        the step's slots as a tensor."""
        if not self.layers:
            return
        if not step.is_decode:
            for rid in step.request_ids:
                if rid not in self.slot_of:
                    if not self.free:
                        self.grow(2 * self.capacity)
                    self.slot_of[rid] = self.free.pop()
        step.state_slots = torch.tensor([self.slot_of[rid] for rid in step.request_ids], device=self.device)

    def read(self, layer, step):
        return self.conv[layer][step.state_slots], self.matrix[layer][step.state_slots]

    def write(self, layer, step, conv, matrix):
        self.conv[layer].index_copy_(0, step.state_slots, conv.to(self.dtype))
        self.matrix[layer].index_copy_(0, step.state_slots, matrix.float())

    def remove(self, request_ids):
        for rid in request_ids:
            if rid in self.slot_of:
                self.free.append(self.slot_of.pop(rid))
