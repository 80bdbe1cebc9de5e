"""The engine's C kernels (engine/kernels), an optional extension: the rest of setup is in
pyproject.toml. Without a C compiler the install still succeeds and the engine runs ONNX
Runtime's own kernels."""

import os
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext


class BuildKernels(build_ext):
    """ONNX Runtime loads the library by its path and Python never imports it, so it gets
    a name no importer takes for a Python module (pkgutil's walks, PyInstaller's analysis),
    and no Python entry point is asked of it."""

    def get_ext_filename(self, fullname: str) -> str:
        package = fullname.split(".")[:-1]
        return os.path.join(*package, fullname.rpartition(".")[2].lstrip("_") + ".ortops")

    def get_export_symbols(self, ext: Extension) -> list[str]:
        return []  # the source exports RegisterCustomOps itself


flags = ["/O2"] if sys.platform == "win32" else ["-O3", "-fvisibility=hidden", "-Wall"]

setup(
    ext_modules=[Extension("engine.kernels._decode_attention",
                           sources=["engine/kernels/decode_attention.c"],
                           extra_compile_args=flags, optional=True)],
    cmdclass={"build_ext": BuildKernels},
)
