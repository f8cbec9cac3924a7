/* The two settings that libraries linked into every binary read once, when
 * they load — before main, so main cannot set them:
 *
 *   - OPENBLAS_CORETYPE: which of its kernel sets OpenBLAS runs.  Left to
 *     itself, OpenBLAS 0.3.21 picks it from a list of CPU models, and a CPU
 *     newer than the library (an Intel Xeon of family 6 model 207, with
 *     AVX-512, AVX512-BF16 and AMX) gets its generic Prescott kernels: f32
 *     prefill at 0.4x of llama.cpp's.  Here the kernel set is decided from
 *     cpuid features: SkylakeX where the CPU has AVX-512 (F, BW, VL),
 *     Haswell where it has AVX2 and FMA, OpenBLAS's own choice below that.
 *     OpenBLAS's choice is kept where it already runs kernels that wide
 *     (e.g. Zen, its AVX2 set for AMD).
 *   - GOMP_SPINCOUNT: how long libgomp's threads spin before they sleep
 *     between parallel regions.  Its default (300 000 rounds) holds a core
 *     for milliseconds: with other work on the cores a spinning thread
 *     keeps the core its descheduled peer needs, and seconds turn into
 *     minutes.  Passive waits (no spin) cost a futex sleep and wake-up at
 *     every region instead, a third of the wall time of a small model's
 *     step.  1000 rounds (tens of microseconds) catch the next region of
 *     the same step and give the core up soon after: rag-v1's first 60
 *     requests, --compare none,cacheprune, cp-books-6m, 2-core Xeon with
 *     AMX, one after the other: 14.5 s passive, 10.4 s at 1000, 9.1 s at 30 000;
 *     beside one `yes` process 14.0 s, 16.8 s and 45.7 s (1000: 1.6x its
 *     quiet time, a fair share of two cores).  Set unless the user chose a
 *     policy (OMP_WAIT_POLICY or GOMP_SPINCOUNT).
 *
 * How: a constructor in this object (linked into every binary that uses the
 * CPU backend: cacheprune, cp_tests, the benchmarks) runs after the
 * libraries' own and, when a variable the user did not set needs a value,
 * sets it and re-executes the binary (/proc/self/exe, same argv, same pid),
 * so the libraries load again and read it.  A variable the user set is
 * never changed.  The re-executed image knows itself by a marker holding
 * its pid (CP_RUNTIME_SET=pid:VAR,...), so a process re-executes at most
 * once whatever happens; children inherit the variables and do not
 * re-execute.  CP_CPU_ISA (gemm_bf16.h) forces the kernel set too:
 * generic Prescott, avx2 Haswell, the AVX-512 paths SkylakeX. */
#ifndef CP_CPU_RUNTIME_H
#define CP_CPU_RUNTIME_H

#include <stddef.h>

#include "gemm_bf16.h"

/* The OpenBLAS kernel set for these features, or for the path CP_CPU_ISA
 * forces (forced: its value, NULL or "" for automatic): NULL where
 * OpenBLAS's own choice stands (no AVX2 + FMA). */
const char *cpu_blas_core_for(const cpu_features *f, const char *forced);

/* What to set before the libraries load again; NULL: leave it. */
typedef struct cpu_env_plan {
    const char *gomp_spincount;
    const char *openblas_coretype;
} cpu_env_plan;

/* The decision, from the environment's values (NULL when unset), the
 * features and the kernel set OpenBLAS runs now (openblas_get_corename):
 * nothing the user set is touched; automatic keeps a kernel set at least
 * as wide as the features allow, a forced CP_CPU_ISA gets exactly its own. */
void cpu_env_plan_make(const cpu_features *f, const char *cp_cpu_isa, const char *omp_wait_policy, const char *gomp_spincount,
                       const char *openblas_coretype, const char *blas_core_now, cpu_env_plan *out);

/* The kernel set OpenBLAS runs in this process ("SkylakeX"). */
const char *cpu_blas_core(void);

/* "SkylakeX kernels (set from cpuid)": the OpenBLAS kernel set this
 * process runs, and who chose it. */
void cpu_runtime_blas(char *out, size_t cap);
/* "spin 1000 rounds, then sleep (set by cacheprune)": how OpenMP's
 * threads wait in this process, and who chose it. */
void cpu_runtime_waits(char *out, size_t cap);

#endif
