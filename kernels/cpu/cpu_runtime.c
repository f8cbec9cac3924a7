/* OPENBLAS_CORETYPE and GOMP_SPINCOUNT before the libraries read them
 * (cpu_runtime.h says why and how). */
#include "cpu_runtime.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/auxv.h>
#include <unistd.h>

char *openblas_get_corename(void);

#define CPU_SPINCOUNT "1000" /* rounds a waiting OpenMP thread spins before it sleeps (cpu_runtime.h) */
#define MARKER "CP_RUNTIME_SET"

/* What the start of this process did: the variables a cacheprune process
 * set (this one before re-executing, or a parent), and the errno of a
 * re-execution that failed.  The process's one piece of runtime state,
 * written only by the constructor, before main. */
static struct {
    char set[96];   /* "GOMP_SPINCOUNT,OPENBLAS_CORETYPE" */
    int exec_errno; /* 0: no re-execution, or it worked */
} cpu_runtime_singleton;

/* how wide a kernel set's vectors are: 2 AVX-512, 1 AVX2, 0 narrower or
 * unknown.  OpenBLAS's kernel-set names, not CPU models. */
static int core_width(const char *core)
{
    static const char *const w512[] = { "SkylakeX", "Cooperlake", "SapphireRapids" };
    static const char *const w256[] = { "Haswell", "Zen" };
    if (!core) return 0;
    for (size_t i = 0; i < sizeof w512 / sizeof w512[0]; i++)
        if (strcmp(core, w512[i]) == 0) return 2;
    for (size_t i = 0; i < sizeof w256 / sizeof w256[0]; i++)
        if (strcmp(core, w256[i]) == 0) return 1;
    return 0;
}

const char *cpu_blas_core_for(const cpu_features *f, const char *forced)
{
    if (forced && *forced) {
        /* the kernel set of the forced path's vector width, where the CPU
         * has it (the backend reports a forced path it lacks) */
        if (strcmp(forced, "generic") == 0) return "Prescott";
        if (strcmp(forced, "avx2") == 0 && f->avx2_fma) return "Haswell";
        if ((strcmp(forced, "avx512") == 0 || strcmp(forced, "avx512vnni") == 0 || strcmp(forced, "avx512bf16") == 0 ||
             strcmp(forced, "amx") == 0) &&
            f->avx512)
            return "SkylakeX";
    }
    /* SkylakeX's sgemm is OpenBLAS 0.3.21's widest (Cooperlake adds bf16
     * routines we do not call) */
    return f->avx512 ? "SkylakeX" : f->avx2_fma ? "Haswell" : NULL;
}

void cpu_env_plan_make(const cpu_features *f, const char *cp_cpu_isa, const char *omp_wait_policy, const char *gomp_spincount,
                       const char *openblas_coretype, const char *blas_core_now, cpu_env_plan *out)
{
    out->gomp_spincount = out->openblas_coretype = NULL;
    if (!omp_wait_policy && !gomp_spincount) out->gomp_spincount = CPU_SPINCOUNT;
    if (openblas_coretype) return;
    const char *want = cpu_blas_core_for(f, cp_cpu_isa);
    if (!want || (blas_core_now && strcmp(blas_core_now, want) == 0)) return;
    int forced = cp_cpu_isa && *cp_cpu_isa;
    if (!forced && core_width(blas_core_now) >= core_width(want)) return;
    out->openblas_coretype = want;
}

const char *cpu_blas_core(void)
{
    const char *c = openblas_get_corename();
    return c ? c : "unknown";
}

/* whether NAME is in the comma-separated list */
static int listed(const char *list, const char *name)
{
    size_t n = strlen(name);
    for (const char *p = list; (p = strstr(p, name)) != NULL; p += n)
        if ((p == list || p[-1] == ',') && (p[n] == ',' || p[n] == 0)) return 1;
    return 0;
}

/* Runs after the shared libraries' constructors (this is the executable's
 * own .init_array), with glibc's (argc, argv, envp).  Nothing has been
 * printed and no thread started yet, so re-executing is invisible but for
 * the libraries loading twice (`--version`: 21 ms of CPU against 11 ms
 * with both variables set, on the 2-core Xeon under load). */
static void cpu_runtime_start(int argc, char **argv, char **envp)
{
    (void)argc, (void)envp;
    const char *marker = getenv(MARKER);
    long marker_pid = -1;
    if (marker) {
        char *colon;
        marker_pid = strtol(marker, &colon, 10);
        if (*colon == ':') snprintf(cpu_runtime_singleton.set, sizeof cpu_runtime_singleton.set, "%s", colon + 1);
    }
    if (marker_pid == (long)getpid() || !argv || !argv[0]) return; /* re-executed already (or no argv to do it with) */
    /* started as `ld.so BINARY ...` (no interpreter of its own: AT_BASE 0),
     * /proc/self/exe is the loader, which would take argv[1] for the
     * program: leave that process as it is */
    if (getauxval(AT_BASE) == 0) return;
    cpu_features f;
    cpu_features_detect(&f);
    cpu_env_plan p;
    cpu_env_plan_make(&f, getenv("CP_CPU_ISA"), getenv("OMP_WAIT_POLICY"), getenv("GOMP_SPINCOUNT"), getenv("OPENBLAS_CORETYPE"),
                      openblas_get_corename(), &p);
    if (!p.gomp_spincount && !p.openblas_coretype) return;
    char value[128];
    snprintf(value, sizeof value, "%ld:%s%s%s", (long)getpid(), p.gomp_spincount ? "GOMP_SPINCOUNT" : "",
             p.gomp_spincount && p.openblas_coretype ? "," : "", p.openblas_coretype ? "OPENBLAS_CORETYPE" : "");
    if ((p.gomp_spincount && setenv("GOMP_SPINCOUNT", p.gomp_spincount, 1)) ||
        (p.openblas_coretype && setenv("OPENBLAS_CORETYPE", p.openblas_coretype, 1)) || setenv(MARKER, value, 1)) {
        cpu_runtime_singleton.exec_errno = errno ? errno : ENOMEM;
        return;
    }
    execv("/proc/self/exe", argv);
    /* still here: this process keeps the libraries' defaults; its children
     * get the variables */
    cpu_runtime_singleton.exec_errno = errno;
    snprintf(cpu_runtime_singleton.set, sizeof cpu_runtime_singleton.set, "%s", strchr(value, ':') + 1);
}

__attribute__((section(".init_array"), used)) static void (*const cpu_runtime_entry)(int, char **, char **) = cpu_runtime_start;

void cpu_runtime_blas(char *out, size_t cap)
{
    const char *set = cpu_runtime_singleton.set;
    int ours = listed(set, "OPENBLAS_CORETYPE") && getenv("OPENBLAS_CORETYPE");
    const char *who = !getenv("OPENBLAS_CORETYPE")             ? "OpenBLAS's own choice"
                      : ours && cpu_runtime_singleton.exec_errno ? "OpenBLAS's own choice: the re-execution that sets its kernels failed"
                      : ours && getenv("CP_CPU_ISA")             ? "set for CP_CPU_ISA"
                      : ours                                     ? "set from cpuid"
                                                                 : "OPENBLAS_CORETYPE from the environment";
    snprintf(out, cap, "%s kernels (%s)", cpu_blas_core(), who);
}

void cpu_runtime_waits(char *out, size_t cap)
{
    const char *wait = getenv("OMP_WAIT_POLICY"), *spin = getenv("GOMP_SPINCOUNT");
    int ours = spin && listed(cpu_runtime_singleton.set, "GOMP_SPINCOUNT");
    if (ours && cpu_runtime_singleton.exec_errno)
        snprintf(out, cap, "libgomp's default (the re-execution that shortens their spin failed: %s)", strerror(cpu_runtime_singleton.exec_errno));
    else if (ours) snprintf(out, cap, "spin %.24s rounds, then sleep (set by cacheprune)", spin);
    else if (wait) snprintf(out, cap, "%.32s (OMP_WAIT_POLICY from the environment)", wait);
    else if (spin) snprintf(out, cap, "spinning %.24s rounds (GOMP_SPINCOUNT from the environment)", spin);
    else snprintf(out, cap, "libgomp's default");
}
