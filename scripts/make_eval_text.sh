#!/usr/bin/env bash
# make_eval_text.sh OUT — writes the evaluation text for perplexity: the book
# of Genesis from the King James Version (public domain), as Debian's
# bible-kjv package ships it, one verse per line without verse labels.
set -euo pipefail
out="${1:?usage: make_eval_text.sh OUT}"
if ! command -v bible >/dev/null 2>&1; then
    sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bible-kjv >/dev/null
fi
bible -l10000 "Genesis 1:1-50:26" | sed -E 's/^[A-Za-z0-9]+:[0-9]+ //' >"$out"
