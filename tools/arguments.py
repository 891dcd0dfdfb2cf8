"""Command-line flags the measuring tools share."""
import argparse
from pathlib import Path


def target_arguments(parser: argparse.ArgumentParser, device: str = "cuda") -> None:
    """--model-config and --weight-dir (the repository's toy model unless given) and --device."""
    parser.add_argument("--model-config", type=Path, default=Path("target/model_config.json"))
    parser.add_argument("--weight-dir", type=Path, default=Path("target/weights"))
    parser.add_argument("--device", default=device)
