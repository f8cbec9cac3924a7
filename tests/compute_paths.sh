#!/bin/sh
# The tests whose promise must hold on every compute path -- batch
# invariance (batch/bitwise_*) and the privacy canary (cp-books-6m's
# positive control, in-context and canonical cases and the bf16-KV
# positive control; the whole suite runs all 38 on the automatic path:
# these keep the scalar generic path near a minute) -- run once
# per path this CPU has: CP_CPU_ISA over generic, avx2, avx512, avx512bf16
# and amx, then the automatic path under OPENBLAS_CORETYPE=Prescott (the
# generic kernels Debian's OpenBLAS 0.3.21 runs on a CPU it does not
# know).  `make test` runs it after the whole suite, which ran the
# automatic path.  A path the CPU cannot run is skipped with one line
# saying why; the last line names the paths that ran.  Exits non-zero when
# any run failed.
#
# usage: tests/compute_paths.sh CP_TESTS  (in make test's environment)
BIN=${1:?usage: tests/compute_paths.sh CP_TESTS}
FILTER='@(batch/bitwise_*|request/canary_cpbooks_global_prefix_control_user|request/canary_cpbooks_in_context_user|request/canary_cpbooks_canonical_user|request/canary_bf16_kv_global_prefix_control_user)'
flags=$(grep -m1 '^flags' /proc/cpuinfo 2>/dev/null)
has() {
    for f in "$@"; do
        case " ${flags#*:} " in *" $f "*) ;; *) return 1 ;; esac
    done
}
ran="" skipped="" failed=""
run() { # label, then the environment of the run
    label=$1
    shift
    echo "compute paths: $label ($*)"
    if env "$@" "$BIN" --jobs 2 --filter "$FILTER"; then ran="$ran $label"; else ran="$ran $label"; failed="$failed $label"; fi
}
skip() {
    echo "compute paths: $1 skipped: $2"
    skipped="$skipped $1"
}
run generic CP_CPU_ISA=generic
if has avx2 fma; then run avx2 CP_CPU_ISA=avx2; else skip avx2 "this CPU has no AVX2 + FMA"; fi
if has avx512f avx512bw avx512vl; then run avx512 CP_CPU_ISA=avx512; else skip avx512 "this CPU has no AVX-512 F/BW/VL"; fi
if has avx512f avx512bw avx512vl avx512_bf16; then run avx512bf16 CP_CPU_ISA=avx512bf16; else skip avx512bf16 "this CPU has no AVX512_BF16"; fi
# amx is oneDNN's bf16 path: on AMX tiles, or on oneDNN's AVX512_BF16
# kernels where the CPU has those but no AMX (CP_CPU_ISA=amx runs there)
if has amx_bf16 amx_tile; then run amx CP_CPU_ISA=amx
elif has avx512f avx512bw avx512vl avx512_bf16; then run "amx(oneDNN on avx512_bf16)" CP_CPU_ISA=amx
else skip amx "this CPU has neither AMX-BF16 nor AVX512_BF16 for oneDNN's bf16 path"; fi
run "auto+OPENBLAS_CORETYPE=Prescott" OPENBLAS_CORETYPE=Prescott
echo "compute paths ran:${ran:- none}${skipped:+; skipped:$skipped}${failed:+; FAILED:$failed}"
[ -z "$failed" ]
