#!/usr/bin/env bash
# tokenize_speed.sh — tokenization speed of cellm and llama.cpp on the same
# 10 MB of English text, the same model files, one after the other in one
# run. The text is Debian's copyright and licence files (on every Debian
# system), repeated to 10 MB. Needs llama-cpp-python (pip) and a built cellm.
#   bench/tokenize_speed.sh [MODEL...]   (default: smollm2-135m gemma3-270m)
# Prints a markdown table; llama.cpp gets at most LLAMA_TIMEOUT seconds
# (default 120) per model, and its SentencePiece path is quadratic on one
# long text, so for Gemma 3 it also runs on the first 1 MB.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cellm="$root/build/cellm"
models=("$@")
[ "${#models[@]}" -gt 0 ] || models=(smollm2-135m gemma3-270m)
text="$(mktemp)"
trap 'rm -f "$text" "$text.1m"' EXIT
while [ "$(stat -c %s "$text")" -lt 10000000 ]; do
    cat /usr/share/common-licenses/* /usr/share/doc/*/copyright >>"$text" 2>/dev/null
done
head -c 10000000 "$text" >"$text.tmp" && mv "$text.tmp" "$text"
head -c 1000000 "$text" >"$text.1m"
llama() { # llama MODEL_PATH FILE -> "ids seconds" or "timeout"
    timeout "${LLAMA_TIMEOUT:-120}" python3 -c '
import sys, time
from llama_cpp import Llama
t = open(sys.argv[2], "rb").read()
m = Llama(sys.argv[1], vocab_only=True, verbose=False)
a = time.perf_counter(); ids = m.tokenize(t, add_bos=False, special=False)
print(len(ids), "%.2f" % (time.perf_counter() - a))' "$1" "$2" 2>/dev/null || echo "timeout"
}
cel() { # cel MODEL FILE -> "ids seconds"
    "$cellm" tokenize "$1" -f "$2" --count --no-bos 2>&1 | sed -nE 's/^([0-9]+) tokens from [0-9]+ bytes in ([0-9.]+) s.*/\1 \2/p' | head -1
}
echo "| model | text | cellm tokens, s, MB/s | llama.cpp tokens, s, MB/s |"
echo "| --- | --- | --- | --- |"
for m in "${models[@]}"; do
    path="$("$cellm" list | awk -v n="$m" '$1 == n {print $NF}')"
    for f in "$text" "$text.1m"; do
        size=$(stat -c %s "$f")
        c="$(cel "$m" "$f")"
        l="$(llama "$path" "$f")"
        fmt() { if [ "$1" = "timeout" ] || [ -z "$1" ]; then echo "did not finish in ${LLAMA_TIMEOUT:-120} s"; else set -- $1; awk -v t="$1" -v s="$2" -v b="$size" 'BEGIN{printf "%d, %.2f s, %.1f MB/s", t, s, b/s/1e6}'; fi; }
        echo "| $m | $((size / 1000000)) MB | $(fmt "$c") | $(fmt "$l") |"
    done
done
