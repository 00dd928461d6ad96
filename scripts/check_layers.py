#!/usr/bin/env python3
"""Checks the layering of src/ (DESIGN.md, "Folders show the layers"): a
file includes only headers of its own layer or of a layer below it, and a
backend never includes another backend. Exit status 1, with each offending
line, when a file breaks it."""
import os
import re
import sys

# Bottom to top; backends share a rank and may not include each other.
RANK = {"base": 0, "format": 1, "text": 2, "model": 3, "cpu": 4, "vulkan": 4, "runtime": 5}

root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src")
bad = []
for dirpath, _, names in os.walk(root):
    for name in sorted(names):
        if not name.endswith((".c", ".h")):
            continue
        path = os.path.join(dirpath, name)
        layer = os.path.relpath(path, root).split(os.sep)[0]
        if layer not in RANK:
            bad.append(f"{path}: not in a layer folder ({', '.join(RANK)})")
            continue
        for no, line in enumerate(open(path, encoding="utf-8"), 1):
            m = re.match(r'\s*#\s*include\s+"([^"]+)"', line)
            if not m or "/" not in m.group(1):
                continue
            dep = m.group(1).split("/")[0]
            if dep not in RANK:
                continue
            if RANK[dep] > RANK[layer] or (RANK[dep] == RANK[layer] and dep != layer):
                bad.append(f"{path}:{no}: {layer} includes {m.group(1)}")
for b in bad:
    print(b)
sys.exit(1 if bad else 0)
