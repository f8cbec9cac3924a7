#!/usr/bin/env bash
# make bench-llama (and the last step of make bench): llama.cpp on the same
# synth weights as ours, in the same run, 2 threads each: 1024-token prefill
# and decode at 1k context, llama.cpp F32 / BF16 / Q8_0 beside our --dtype
# f32 / bf16 (/ int8 once `--dtype int8` exists), as ratios.
#
#   profiling/bench_llama.sh [BUILD_DIR] [MODEL_DIR]
#
# llama.cpp comes from the npm package node-llama-cpp (make deps, or
# `npm install --ignore-scripts --omit=optional` in profiling/llama): its
# @node-llama-cpp/linux-x64 ships libllama / libggml-* and node-llama-cpp
# carries llama.cpp's source as a git bundle, from which llama.h and the
# ggml headers are extracted into BUILD_DIR/llama/src at build time.  No
# ggml is built here.  Absent package: a note and exit 0 (optional step).
#
# The GGUFs are written by our own writer (profiling/gguf.c, build/gguf_write)
# from the safetensors; a greedy check on synth tiny first shows llama.cpp
# and we run the same model (the same 16 greedy ids from F32 and BF16).
#
# CP_BENCH_PRESCOTT=1: ours f32 a second time with OPENBLAS_CORETYPE=Prescott,
# the generic kernels Debian's OpenBLAS 0.3.21 runs on a CPU it does not know
# (family 6 model 207) when nothing chooses them from cpuid: the row "ours
# f32 prescott" against the default row, whose kernel set the binary chose
# (bench_forward prints it: "sgemm GFLOP/s ... (OpenBLAS X kernels)").
#
# CP_BENCH_REUSE=1 (make bench sets it): take our numbers from
# BUILD_DIR/bench-dtype/*.txt, which profiling/bench_dtype.sh wrote moments
# earlier in the same run, instead of running bench_forward again.
set -euo pipefail
B=${1:-build}
M=${2:-build/synth-qwen2.5-0.5b}
T=${CP_BENCH_TOKENS:-1024}
ND=${CP_BENCH_DECODE:-32}
TH=${CP_BENCH_THREADS:-2}
PKG=profiling/llama/node_modules
LIBDIR=$PKG/@node-llama-cpp/linux-x64/bins/linux-x64
BUNDLE=$PKG/node-llama-cpp/llama/gitRelease.bundle
if [ ! -d "$LIBDIR" ] || [ ! -f "$BUNDLE" ]; then
    echo "bench-llama: skipped: node-llama-cpp is not installed in profiling/llama (make deps installs it; needs npm and a registry)"
    exit 0
fi
LIBDIR=$(realpath "$LIBDIR")
out=$B/llama
mkdir -p "$out"

# ---- the driver, against the shipped libraries ----------------------------
if [ ! -f "$out/src/include/llama.h" ] || [ "$BUNDLE" -nt "$out/src/include/llama.h" ]; then
    rm -rf "$out/src.git" "$out/src"
    git clone -q --bare "$BUNDLE" "$out/src.git"
    mkdir -p "$out/src"
    git -C "$out/src.git" archive HEAD include ggml/include | tar -x -C "$out/src"
    touch "$out/src/include/llama.h"
fi
lib() { # the one shipped file matching $1 (the names carry llama.cpp's version)
    local f
    f=$(cd "$LIBDIR" && ls $1 2>/dev/null | head -1)
    [ -n "$f" ] || { echo "bench-llama: no $1 in $LIBDIR" >&2; exit 1; }
    echo "-l:$f"
}
if [ ! -x "$out/llama_bench" ] || [ profiling/llama_bench.c -nt "$out/llama_bench" ] || [ profiling/bench_clock.h -nt "$out/llama_bench" ]; then
    ${CC:-cc} -std=c11 -D_POSIX_C_SOURCE=200809L -O2 -Wall -Wextra -Werror -I"$out/src/include" -I"$out/src/ggml/include" \
        profiling/llama_bench.c -o "$out/llama_bench" -L"$LIBDIR" $(lib 'libllama.v*.so') $(lib 'libggml.v*.so') \
        $(lib 'libggml-base.so') -Wl,-rpath,"$LIBDIR"
fi
LB=("$out/llama_bench" --backends "$LIBDIR")

# ---- same model: greedy ids on synth tiny ---------------------------------
tiny=$out/synth-tiny
[ -f "$tiny/config.json" ] || "$B"/cacheprune synth --shape tiny --out "$tiny" --quiet-progress >/dev/null
prompt=1,2,3,4,5,6,7,8
ours=$("$B"/cacheprune generate --model "$tiny" --dtype f32 --prompt-ids $prompt -n 16 --greedy --ignore-eos --json 2>/dev/null |
    sed 's/.*"ids":\[\([0-9,]*\)\].*/\1/')
for t in f32 bf16; do
    "$B"/gguf_write --model "$tiny" --out "$out/tiny-$t.gguf" --type $t
    theirs=$("${LB[@]}" --model "$out/tiny-$t.gguf" --greedy 16 --usable-vocab 258 2>/dev/null | sed 's/^greedy ids: //')
    same=$(paste -d' ' <(tr , '\n' <<<"$ours") <(tr , '\n' <<<"$theirs") | awk '$1 == $2 { n++ } END { print n + 0 }')
    echo "same-model check (synth tiny, greedy after $prompt): llama.cpp ${t^^} agrees with ours on $same/16 ids"
    [ "$same" -eq 16 ] || { echo "bench-llama: the GGUF does not hold our model (ours $ours, llama.cpp $theirs)" >&2; exit 1; }
done

# ---- the 0.5B shape --------------------------------------------------------
[ -f "$M/config.json" ] || "$B"/cacheprune synth --shape qwen2.5-0.5b --out "$M" --quiet-progress
for t in f32 bf16 q8_0; do
    g=$out/$(basename "$M")-$t.gguf
    if [ ! -f "$g" ] || [ "$M/config.json" -nt "$g" ] || [ "$B/gguf_write" -nt "$g" ]; then
        "$B"/gguf_write --model "$M" --out "$g.tmp" --type $t && mv "$g.tmp" "$g"
    fi
done
load_before=$(cut -d' ' -f1-3 /proc/loadavg)
for t in f32 bf16 q8_0; do
    "${LB[@]}" --model "$out/$(basename "$M")-$t.gguf" --tokens "$T" --decode "$ND" --threads "$TH" 2>/dev/null | tee "$out/llama-$t.txt"
done
dtypes="f32 bf16"
# hook: --dtype int8 (being added on another branch) joins when the CLI knows it
if "$B"/cacheprune generate --help 2>&1 | grep -q 'int8'; then dtypes="$dtypes int8"; fi
for d in $dtypes; do
    f=$out/ours-$d.txt
    if [ "${CP_BENCH_REUSE:-0}" = 1 ] && [ -f "$B/bench-dtype/$d.txt" ] && [ "$d" != int8 ]; then
        cp "$B/bench-dtype/$d.txt" "$f"
    else
        OMP_NUM_THREADS=$TH "$B"/bench_forward --dir "$M" --dtype $d --tokens "$T" --decode "$ND" > "$f"
    fi
done
if [ "${CP_BENCH_PRESCOTT:-0}" = 1 ]; then
    OPENBLAS_CORETYPE=Prescott OMP_NUM_THREADS=$TH "$B"/bench_forward --dir "$M" --dtype f32 --tokens "$T" --decode "$ND" > "$out/ours-f32-prescott.txt"
    dtypes="$dtypes f32-prescott"
fi
load_after=$(cut -d' ' -f1-3 /proc/loadavg)

# ---- summary ---------------------------------------------------------------
num() { grep -m1 "^$2" "$1" | sed "s|^$2 *||" | awk '{ print $1 }'; }
cpu=$(grep -m1 '^model name' /proc/cpuinfo | sed 's/.*: //')
{
    echo
    echo "== llama.cpp vs ours ($cpu; ${TH} threads; prefill $T tokens, decode $ND tokens at ${T}..$((T + ND)) context)"
    echo "   load average before / after: $load_before / $load_after (other work on the machine slows both sides)"
    echo "   llama.cpp $(grep -m1 '^llama.cpp backend:' "$out/llama-f32.txt" | sed 's/^llama.cpp backend: //') backend: $(grep -m1 '^llama.cpp system:' "$out/llama-f32.txt" | sed 's/^llama.cpp system: CPU : //')"
    printf "%-16s %12s %12s\n" run "prefill tok/s" "decode tok/s"
    for t in f32 bf16 q8_0; do
        printf "%-16s %12s %12s\n" "llama.cpp ${t^^}" "$(num "$out/llama-$t.txt" 'prefill tok/s')" "$(num "$out/llama-$t.txt" 'decode tok/s')"
    done
    for d in $dtypes; do
        printf "%-16s %12s %12s\n" "ours $d" "$(num "$out/ours-$d.txt" 'prefill tok/s')" "$(num "$out/ours-$d.txt" 'decode tok/s at context')"
    done
    # per CPU-second (all threads' CPU time): at CP_BENCH_THREADS=1 the
    # forwards' own speeds, whatever else the machine runs; with more
    # threads a side whose waits spin pays for them here
    printf "%-16s %12s %12s\n" "per CPU-second" "prefill" "decode"
    for t in f32 bf16 q8_0; do
        printf "%-16s %12s %12s\n" "llama.cpp ${t^^}" "$(num "$out/llama-$t.txt" 'prefill tok/CPU-s')" "$(num "$out/llama-$t.txt" 'decode tok/CPU-s')"
    done
    for d in $dtypes; do
        printf "%-16s %12s %12s\n" "ours $d" "$(num "$out/ours-$d.txt" 'prefill tok/CPU-s')" "$(num "$out/ours-$d.txt" 'decode tok/CPU-s')"
    done
    echo "ratios (ours / llama.cpp):"
    pair() { # ours-dtype llama-type
        [ -f "$out/ours-$1.txt" ] || return 0
        local op od lp ld
        op=$(num "$out/ours-$1.txt" 'prefill tok/s'); od=$(num "$out/ours-$1.txt" 'decode tok/s at context')
        lp=$(num "$out/llama-$2.txt" 'prefill tok/s'); ld=$(num "$out/llama-$2.txt" 'decode tok/s')
        printf "  %-26s prefill %6.2fx   decode %6.2fx\n" "ours $1 / llama.cpp ${2^^}" "$(echo "$op / $lp" | bc -l)" "$(echo "$od / $ld" | bc -l)"
    }
    pair f32 f32
    if [ "${CP_BENCH_PRESCOTT:-0}" = 1 ]; then pair f32-prescott f32; fi
    pair bf16 bf16
    pair int8 q8_0
    best_ours=$(for d in $dtypes; do num "$out/ours-$d.txt" 'prefill tok/s'; done | sort -g | tail -1)
    best_llama=$(for t in f32 bf16 q8_0; do num "$out/llama-$t.txt" 'prefill tok/s'; done | sort -g | tail -1)
    printf "  %-26s prefill %6.2fx   (target >= 3x)\n" "fastest / fastest" "$(echo "$best_ours / $best_llama" | bc -l)"
    [ ! -f "$out/ours-f32.txt" ] || echo "  (the in-run sgemm ceiling: $(grep -m1 '^sgemm GFLOP/s' "$out/ours-f32.txt" | sed 's/.*(//; s/)$//'))"
    if [ "$dtypes" = "f32 bf16" ]; then echo "  (int8: this build has no --dtype int8; ours int8 / llama.cpp Q8_0 appears once it does)"; fi
    if [ -f "$out/ours-int8.txt" ] && grep -q '^int8 ceiling' "$out/ours-int8.txt"; then
        # the int8 prefill GEMMs against the in-run vpdpbusd ceiling (bench_forward's prefill_i8_table)
        echo "int8 prefill GEMMs, $T rows ($(grep -m1 '^matmul path:' "$out/ours-int8.txt" | sed 's/^matmul path: //')):"
        sed -n '/^int8 ceiling/,/^attention, 1 layer/p' "$out/ours-int8.txt" | sed 's/^/  /'
    fi
} | tee "$out/summary.txt"
