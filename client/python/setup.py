"""Installs the carpool package, generating carpool/carpool_pb2.py from carpool.proto with protoc.

The metadata is in pyproject.toml; this file only adds the protoc step to build_py. The proto file
is found at $CARPOOL_PROTO, else ../../proto/carpool.proto (the repository layout); protoc at
$PROTOC, else on PATH (Debian: protobuf-compiler), else grpc_tools.protoc when installed.
"""
import os
import shutil
import subprocess

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))


def find_proto():
    candidates = [os.environ.get("CARPOOL_PROTO", ""),
                  os.path.join(HERE, "..", "..", "proto", "carpool.proto")]
    for path in candidates:
        if path and os.path.isfile(path):
            return os.path.abspath(path)
    raise RuntimeError("carpool.proto not found: install from a carpool checkout "
                       "(pip install ./client/python) or set CARPOOL_PROTO to its path")


def run_protoc(proto, out_dir):
    args = ["-I" + os.path.dirname(proto), "--python_out=" + out_dir, proto]
    protoc = os.environ.get("PROTOC") or shutil.which("protoc")
    if protoc:
        subprocess.run([protoc] + args, check=True)
        return
    try:
        from grpc_tools import protoc as grpc_protoc  # optional fallback
    except ImportError:
        raise RuntimeError("protoc not found: install protobuf-compiler (Debian) or set PROTOC")
    if grpc_protoc.main(["protoc"] + args) != 0:
        raise RuntimeError("protoc failed on " + proto)


class BuildPyWithProto(build_py):
    """build_py that also writes carpool/carpool_pb2.py (into the source tree when editable)."""

    def run(self):
        super().run()
        if getattr(self, "editable_mode", False):
            out_dir = os.path.join(HERE, "carpool")
        else:
            out_dir = os.path.join(self.build_lib, "carpool")
        os.makedirs(out_dir, exist_ok=True)
        run_protoc(find_proto(), out_dir)


setup(cmdclass={"build_py": BuildPyWithProto})
