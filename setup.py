"""The packages, the shipped resources and the engine's C kernels; the rest of setup is in
pyproject.toml.

resources/ (the built-in model and the icons) stays where it is in the source tree and is
installed as the package ``onnx_local_llm_resources`` (package data), so a wheel or
``pip install .`` ships the model; engine.model.default_model.resources_dir finds it in
every kind of install.

The C kernels (engine/kernels) are an optional extension: without a C compiler the install
still succeeds and the engine runs ONNX Runtime's own kernels."""

import os
import sys

from setuptools import Extension, find_packages, setup
from setuptools.command.build_ext import build_ext
from setuptools.errors import CCompilerError, CompileError

#: Leaves out decode_attention.c's AVX-VNNI section (BuildKernels.build_extension).
NO_AVX_VNNI = "-DENGINE_NO_AVX_VNNI"


class BuildKernels(build_ext):
    """ONNX Runtime loads the library by its path and Python never imports it, so it gets
    a name no importer takes for a Python module (pkgutil's walks, PyInstaller's analysis),
    and no Python entry point is asked of it."""

    def get_ext_filename(self, fullname: str) -> str:
        package = fullname.split(".")[:-1]
        return os.path.join(*package, fullname.rpartition(".")[2].lstrip("_") + ".ortops")

    def get_export_symbols(self, ext: Extension) -> list[str]:
        return []  # the source exports RegisterCustomOps itself

    def build_extension(self, ext: Extension) -> None:
        """Where the compiler or assembler cannot build the AVX-VNNI section (GCC 11 with
        binutils older than 2.36, say), build once more without it, rather than lose every
        kernel: such CPUs then run the int16 cache's plain C loops."""
        try:
            super().build_extension(ext)
        except (CCompilerError, CompileError) as err:
            if sys.platform == "win32" or NO_AVX_VNNI in ext.extra_compile_args:
                raise
            print(f"engine kernels: building again without the AVX-VNNI code ({err})",
                  file=sys.stderr)
            ext.extra_compile_args = [*ext.extra_compile_args, NO_AVX_VNNI]
            self.force = True
            super().build_extension(ext)


flags = ["/O2"] if sys.platform == "win32" else ["-O3", "-fvisibility=hidden", "-Wall"]

RESOURCES = "onnx_local_llm_resources"
BUILTIN_MODEL = "models/smollm2-135m-instruct"

setup(
    packages=[*find_packages(include=["engine", "engine.*", "app", "app.*"]), RESOURCES],
    package_dir={RESOURCES: "resources"},
    # named files only: whatever else a checkout's resources/models holds stays out
    package_data={RESOURCES: ["icons/*", f"{BUILTIN_MODEL}/*"],
                  "engine.hub": ["*.json"]},  # the model catalog and its schema
    ext_modules=[Extension("engine.kernels._decode_attention",
                           sources=["engine/kernels/decode_attention.c",
                                    "engine/kernels/matmul_nbits.c"],
                           depends=["engine/kernels/ort_api.h"],
                           extra_compile_args=flags, optional=True)],
    cmdclass={"build_ext": BuildKernels},
)
