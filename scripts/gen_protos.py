"""Regenerate the Python stubs in layerserve/ from protos/ (run by `make protos`)."""

from __future__ import annotations

import sys
from pathlib import Path

from grpc_tools import protoc

ROOT = Path(__file__).resolve().parent.parent


def generate(out_dir: Path) -> None:
    protos = sorted(str(p.relative_to(ROOT / "protos")) for p in (ROOT / "protos").rglob("*.proto"))
    include = Path(protoc.__file__).parent / "_proto"
    args = [
        "protoc",
        f"-I{ROOT / 'protos'}",
        f"-I{include}",
        f"--python_out={out_dir}",
        f"--pyi_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        *protos,
    ]
    if protoc.main(args) != 0:
        raise SystemExit("protoc failed")
    package_root = out_dir / "layerserve"
    for package_dir in [package_root, *(p for p in package_root.rglob("*") if p.is_dir())]:
        (package_dir / "__init__.py").touch()


if __name__ == "__main__":
    generate(Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT)
