"""Device names as the command line takes them and as the contract passes them."""
import torch

DEVICE_CHOICES = ("auto", "cpu", "cuda")


def resolve_device(name: str) -> str:
    """"auto" becomes "cuda" when a GPU is visible, else "cpu"; the evaluator never passes
    "auto" to an engine, so neither do we."""
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return name


def is_cuda(device) -> bool:
    return str(device).startswith("cuda")
