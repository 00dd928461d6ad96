#!/usr/bin/env bash
# chat.sh — sets everything up (packages, build, the default model) and
# starts an interactive chat with the default model. Arguments go to
# `cellm run` (e.g. a model name or path).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/setup.sh"
cellm_install_packages
cellm_build build -DCMAKE_BUILD_TYPE=Release -DCELLM_WERROR=OFF
exec "$CELLM_ROOT/build/cellm" run "$@"
