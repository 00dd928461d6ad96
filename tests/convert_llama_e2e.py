#!/usr/bin/env python3
"""End-to-end: files written by `cellm convert` run in llama.cpp.

Runs scripts/llama_arch_check.py with the cellm under test ($CELLM_BIN):
each family's random-weight fixture (tests/data/arch/) is converted to F16
and loaded in llama.cpp through llama-cpp-python, whose greedy tokens must
equal transformers' (for mistral, while the sequence fits its window; see
the script). Needs llama-cpp-python (setup.sh --test installs it).
"""
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def main():
    cellm = os.environ.get("CELLM_BIN")
    if not cellm:
        print("CELLM_BIN is not set (ctest sets it)", file=sys.stderr)
        return 1
    script = os.path.join(HERE, "..", "scripts", "llama_arch_check.py")
    return subprocess.run([sys.executable, script, cellm]).returncode


if __name__ == "__main__":
    sys.exit(main())
