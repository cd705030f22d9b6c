"""The committed gRPC stubs are exactly what proto/dsched.proto generates."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
STUBS = ("dsched_pb2.py", "dsched_pb2.pyi", "dsched_pb2_grpc.py")


def test_generated_stubs_match_proto(tmp_path):
    subprocess.run(
        [
            sys.executable,
            "-m",
            "grpc_tools.protoc",
            f"-Idsched_pb={ROOT / 'proto'}",
            f"--python_out={tmp_path}",
            f"--grpc_python_out={tmp_path}",
            f"--pyi_out={tmp_path}",
            str(ROOT / "proto" / "dsched.proto"),
        ],
        check=True,
        capture_output=True,
        text=True,
    )
    stale = [
        name
        for name in STUBS
        if (tmp_path / "dsched_pb" / name).read_bytes() != (ROOT / "dsched_pb" / name).read_bytes()
    ]
    assert not stale, f"stubs out of date with proto/dsched.proto: {stale}; run `make proto`"


def test_stubs_live_in_a_package_not_named_proto():
    import dsched_pb.dsched_pb2_grpc as grpc_stubs

    assert grpc_stubs.__name__.startswith("dsched_pb.")
    assert (
        "from dsched_pb import dsched_pb2"
        in (ROOT / "dsched_pb" / "dsched_pb2_grpc.py").read_text()
    )
