"""A DeltaNet layer's states in slots, read and written as RecurrentState.slots does, for the
tests that hold its kernels to the seed's (tests/test_gpu.py, the interpreted fixture)."""


class Pools:
    """Layer 0's conv states [slots, conv_dim, kernel - 1] and delta-rule matrices [slots,
    heads, key dim, value dim], addressed by `step.state_slots`."""
    def __init__(self, conv, matrix):
        self.conv, self.matrix = {0: conv}, {0: matrix}

    def read(self, layer, step):
        return self.conv[layer][step.state_slots], self.matrix[layer][step.state_slots]

    def write(self, layer, step, conv, matrix):
        self.conv[layer].index_copy_(0, step.state_slots, conv.to(self.conv[layer].dtype))
        self.matrix[layer].index_copy_(0, step.state_slots, matrix.float())

    def copy(self):
        return Pools(self.conv[0].clone(), self.matrix[0].clone())
