"""Generate the Python gRPC code for proto/oasis/v1/*.proto into controller/rpc/.

Run from the repository root: ``python proto/generate.py``. The generated modules are
not committed; ``make`` and the package build run this script.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SOURCE = ROOT / "proto" / "oasis" / "v1"
TARGET = "controller/rpc"


def generate(root: Path = ROOT) -> None:
    from grpc_tools import protoc  # build-time dependency only

    protos = sorted(p.name for p in SOURCE.glob("*.proto"))
    args = [
        "grpc_tools.protoc",
        f"-I{TARGET}={SOURCE}",
        f"--python_out={root}",
        f"--grpc_python_out={root}",
        f"--pyi_out={root}",
        *(f"{TARGET}/{name}" for name in protos),
    ]
    if protoc.main(args) != 0:
        raise SystemExit("protoc failed")


if __name__ == "__main__":
    generate()
    sys.exit(0)
