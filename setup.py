"""Build hook: generate the gRPC code from proto/ before packaging (see proto/generate.py)."""

from __future__ import annotations

import runpy
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py


class BuildWithProtos(build_py):
    def run(self) -> None:
        script = Path(__file__).resolve().parent / "proto" / "generate.py"
        runpy.run_path(str(script))["generate"]()
        super().run()


setup(cmdclass={"build_py": BuildWithProtos})
