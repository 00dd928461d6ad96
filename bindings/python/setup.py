"""Builds the cellm package with its own copy of libcellm.

The library is built from the cellm repository this folder sits in
(bindings/python, two levels below the root) with CMake, only its shared
library target, in Release, into setuptools' temporary build folder; then it
is copied into the package as cellm/libcellm.so. Setting CELLM_PREBUILT_LIB
to a libcellm.so that is already built copies that one instead.
"""

import os
import shutil
import subprocess
import sys

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.dist import Distribution

LIB_NAME = {"darwin": "libcellm.dylib"}.get(sys.platform, "libcellm.so")


def repo_root():
    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.dirname(os.path.dirname(here))
    if not os.path.isfile(os.path.join(root, "include", "cellm.h")):
        raise SystemExit(
            "cellm: build this package from inside the cellm repository "
            "(pip install ./bindings/python), or set CELLM_PREBUILT_LIB to a built libcellm.so")
    return root


class BuildWithLib(build_py):
    def run(self):
        super().run()
        dest = os.path.join(self.build_lib, "cellm", LIB_NAME)
        prebuilt = os.environ.get("CELLM_PREBUILT_LIB")
        if prebuilt:
            src = prebuilt
        else:
            src = self.build_native()
        shutil.copyfile(os.path.realpath(src), dest)

    def build_native(self):
        build_dir = os.path.join(os.path.abspath(self.get_finalized_command("build").build_temp),
                                 "cellm-cmake")
        jobs = os.environ.get("CMAKE_BUILD_PARALLEL_LEVEL", str(os.cpu_count() or 2))
        cfg = ["cmake", "-S", repo_root(), "-B", build_dir, "-DCMAKE_BUILD_TYPE=Release",
               "-DCELLM_BUILD_TESTS=OFF", "-DCELLM_BUILD_TOOLS=OFF", "-DCELLM_BUILD_EXAMPLES=OFF"]
        subprocess.check_call(cfg)
        subprocess.check_call(["cmake", "--build", build_dir, "--target", "cellm_shared",
                               "--parallel", jobs])
        return os.path.join(build_dir, LIB_NAME)


class BinaryDistribution(Distribution):
    """The wheel holds a native library: tag it for this platform."""

    def has_ext_modules(self):
        return True


setup(cmdclass={"build_py": BuildWithLib}, distclass=BinaryDistribution)
