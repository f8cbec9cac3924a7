/* What the CPU runtime runs before main (kernels/cpu/cpu_runtime.h): the
 * OpenBLAS kernel set follows cpuid features (never OpenBLAS's list of CPU
 * models), OpenMP's threads spin briefly before they sleep unless the user chose a policy,
 * nothing the user set is changed, and the binary says which compute path
 * it took (--version; the first line of run and demo). */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../kernels/cpu/cpu_runtime.h"
#include "helpers.h"

static const cpu_features F_AVX512 = { .avx2_fma = 1, .avx512 = 1, .avx512_bf16 = 1, .avx512_vnni = 1, .amx_bf16 = 1 };
static const cpu_features F_AVX2 = { .avx2_fma = 1 };
static const cpu_features F_SSE = { 0 };

static const char *str(const char *s) { return s ? s : "(none)"; }

Test(runtime, blas_kernels_follow_cpuid_features)
{
    cr_assert_str_eq(str(cpu_blas_core_for(&F_AVX512, NULL)), "SkylakeX");
    cr_assert_str_eq(str(cpu_blas_core_for(&F_AVX2, "")), "Haswell");
    cr_assert_null(cpu_blas_core_for(&F_SSE, NULL), "below AVX2 OpenBLAS's own choice stands");
    /* a forced path gets its own width's kernels, where the CPU has them */
    cr_assert_str_eq(str(cpu_blas_core_for(&F_AVX512, "generic")), "Prescott");
    cr_assert_str_eq(str(cpu_blas_core_for(&F_AVX512, "avx2")), "Haswell");
    static const char *const wide[] = { "avx512", "avx512vnni", "avx512bf16", "amx" };
    for (int i = 0; i < 4; i++) cr_assert_str_eq(str(cpu_blas_core_for(&F_AVX512, wide[i])), "SkylakeX", "%s", wide[i]);
    cr_assert_str_eq(str(cpu_blas_core_for(&F_AVX2, "amx")), "Haswell", "amx without AVX-512: the features decide");
}

/* OpenBLAS 0.3.21 on a CPU newer than it (family 6 model 207): Prescott. */
Test(runtime, plan_replaces_generic_kernels_on_an_unknown_cpu)
{
    cpu_env_plan p;
    cpu_env_plan_make(&F_AVX512, NULL, NULL, NULL, NULL, "Prescott", &p);
    cr_assert_str_eq(str(p.openblas_coretype), "SkylakeX");
    cr_assert_str_eq(str(p.gomp_spincount), "1000");
    cpu_env_plan_make(&F_AVX2, NULL, NULL, NULL, NULL, "Nehalem", &p);
    cr_assert_str_eq(str(p.openblas_coretype), "Haswell");
    cpu_env_plan_make(&F_AVX512, NULL, NULL, NULL, NULL, NULL, &p); /* a name it cannot tell: as narrow */
    cr_assert_str_eq(str(p.openblas_coretype), "SkylakeX");
}

Test(runtime, plan_keeps_kernels_as_wide_and_everything_the_user_set)
{
    cpu_env_plan p;
    cpu_env_plan_make(&F_AVX512, NULL, NULL, NULL, NULL, "SkylakeX", &p);
    cr_assert_null(p.openblas_coretype);
    cpu_env_plan_make(&F_AVX512, NULL, NULL, NULL, NULL, "Cooperlake", &p);
    cr_assert_null(p.openblas_coretype, "Cooperlake runs SkylakeX's sgemm: as wide");
    cpu_env_plan_make(&F_AVX2, NULL, NULL, NULL, NULL, "Zen", &p);
    cr_assert_null(p.openblas_coretype, "Zen is OpenBLAS's AVX2 set for AMD: kept");
    cpu_env_plan_make(&F_AVX512, NULL, NULL, NULL, "Prescott", "Prescott", &p);
    cr_assert_null(p.openblas_coretype, "OPENBLAS_CORETYPE from the user is never changed");
    cpu_env_plan_make(&F_AVX512, NULL, "active", NULL, NULL, "SkylakeX", &p);
    cr_assert_null(p.gomp_spincount, "OMP_WAIT_POLICY from the user is never changed");
    cpu_env_plan_make(&F_AVX512, NULL, NULL, "300000", NULL, "SkylakeX", &p);
    cr_assert_null(p.gomp_spincount, "GOMP_SPINCOUNT is a policy the user chose");
    cpu_env_plan_make(&F_AVX512, "avx2", "passive", NULL, NULL, "SkylakeX", &p);
    cr_assert_str_eq(str(p.openblas_coretype), "Haswell", "a forced path gets exactly its width");
    cr_assert_null(p.gomp_spincount);
    cpu_env_plan_make(&F_AVX512, "avx2", "passive", NULL, NULL, "Haswell", &p);
    cr_assert_null(p.openblas_coretype, "already running it: nothing to do");
}

/* `cacheprune ARGS` with the runtime's variables cleared (as a user's shell
 * has them) plus env; stdout and stderr folded into out. */
static int fresh(const char *env, const char *args, char *out, size_t cap)
{
    char e[512];
    snprintf(e, sizeof e, "env -u OPENBLAS_CORETYPE -u OMP_WAIT_POLICY -u GOMP_SPINCOUNT -u CP_RUNTIME_SET -u CP_CPU_ISA %s", env);
    return test_cli_output_env(e, args, out, cap);
}

/* the line starting with prefix, cut at its end (in place) */
static char *line_of(char *out, const char *prefix)
{
    for (char *l = out; l && *l; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : NULL)
        if (strncmp(l, prefix, strlen(prefix)) == 0) {
            l[strcspn(l, "\n")] = 0;
            return l;
        }
    return NULL;
}

/* Each path this CPU has, forced: --version names it and OpenBLAS runs the
 * kernel set it was given before it loaded (the binary re-executed itself). */
Test(runtime, version_names_the_forced_compute_path, .timeout = TEST_TIMEOUT(60))
{
    cpu_features f;
    cpu_features_detect(&f);
    static const struct { const char *isa, *blas; } paths[] = {
        { "generic", "Prescott" }, { "avx2", "Haswell" }, { "avx512", "SkylakeX" }, { "avx512bf16", "SkylakeX" }, { "amx", "SkylakeX" },
    };
    const int have[] = { 1, f.avx2_fma, f.avx512, f.avx512_bf16, f.amx_bf16 };
    static char out[1 << 14];
    int ran = 0;
    for (int i = 0; i < 5; i++) {
        if (!have[i]) continue;
        char env[64], want[160];
        snprintf(env, sizeof env, "CP_CPU_ISA=%s", paths[i].isa);
        cr_assert_eq(fresh(env, "--version", out, sizeof out), 0, "%s: %s", env, out);
        char *l = line_of(out, "compute: ");
        cr_assert(l, "%s: no compute line:\n%s", env, out);
        snprintf(want, sizeof want, "compute: %s; f32 weights -> own ", paths[i].isa);
        cr_assert(strncmp(l, want, strlen(want)) == 0, "%s: want '%s...', got '%s'", env, want, l);
        snprintf(want, sizeof want, "OpenBLAS %s kernels (", paths[i].blas);
        const char *who = strstr(l, want);
        cr_assert(who, "%s: want '%s' in '%s'", env, want, l);
        who += strlen(want); /* set here, or OpenBLAS had picked the same set */
        cr_assert(strncmp(who, "set for CP_CPU_ISA)", 19) == 0 || strncmp(who, "OpenBLAS's own choice)", 22) == 0, "%s: %s", env, l);
        cr_assert(strstr(l, "bf16 -> ") && strstr(l, "int8 -> ") && strstr(l, "OpenMP waits: spin 1000 rounds, then sleep (set by cacheprune)"), "%s", l);
        ran++;
    }
    cr_assert_geq(ran, 1);
}

/* libgomp's own account of the image that runs main (OMP_DISPLAY_ENV
 * prints it when the library loads, once per image): its threads spin
 * 1000 rounds at most before they sleep unless the user asked otherwise,
 * and the user's choice stands. */
Test(runtime, openmp_threads_spin_briefly_unless_the_user_chose, .timeout = TEST_TIMEOUT(60))
{
    static char out[1 << 14];
    cr_assert_eq(fresh("OMP_DISPLAY_ENV=verbose", "--version", out, sizeof out), 0, "%s", out);
    char *last = NULL;
    for (char *p = out; (p = strstr(p, "GOMP_SPINCOUNT = '")) != NULL; p++) last = p;
    cr_assert(last, "no libgomp display:\n%s", out);
    cr_assert(strncmp(last, "GOMP_SPINCOUNT = '1000'", 23) == 0, "the image that runs main spins otherwise: %.40s\n%s", last, out);
    cr_assert_eq(fresh("OMP_DISPLAY_ENV=verbose OMP_WAIT_POLICY=active", "--version", out, sizeof out), 0, "%s", out);
    cr_assert(strstr(out, "OpenMP waits: active (OMP_WAIT_POLICY from the environment)"), "%s", out);
    cr_assert_null(strstr(out, "GOMP_SPINCOUNT = '1000'"), "the user's active policy was overridden:\n%s", out);
}

/* run's first line: the path the loaded model runs on */
Test(runtime, run_first_line_names_the_path, .timeout = TEST_TIMEOUT(120))
{
    char model[512], dir[512], args[2048];
    shared_path(model, sizeof model, "models/cp-books-6m");
    test_tmpdir(dir, sizeof dir, "runtime-run");
    static char out[1 << 16];
    snprintf(args, sizeof args, "workload --preset rag-v1 --requests 2 --out %s/log.jsonl", dir);
    cr_assert_eq(fresh("", args, out, sizeof out), 0, "%s", out);
    cpu_features f;
    cpu_features_detect(&f);
    const char *isa = f.avx512 ? "avx512" : f.avx2_fma ? "avx2" : "generic";
    char env[64], want[320];
    snprintf(env, sizeof env, "CP_CPU_ISA=%s", isa);
    snprintf(args, sizeof args, "run --quiet-progress --model %s --requests %s/log.jsonl --max-tokens 2 --sharing none", model, dir);
    cr_assert_eq(fresh(env, args, out, sizeof out), 0, "%s", out);
    snprintf(want, sizeof want, "compute: %s, bf16 weights -> own %s kernels, f32 compute", isa, isa);
    cr_assert(strncmp(out, want, strlen(want)) == 0, "want a first line '%s...', got:\n%.600s", want, out);
    snprintf(args, sizeof args, "run --quiet-progress --model %s --requests %s/log.jsonl --max-tokens 2 --sharing none --dtype f32", model,
             dir);
    cr_assert_eq(fresh(env, args, out, sizeof out), 0, "%s", out);
    /* the pair kernel is the widest the CPU has, whatever CP_CPU_ISA says */
    snprintf(want, sizeof want,
             "compute: %s, f32 weights -> own %s f32 kernels%s; attention -> own f32 pair kernel (%s at head_dim a multiple of 16); BLAS (attention without output rows): OpenBLAS ",
             isa, isa, f.avx512 ? " (packed at load)" : "", f.avx512 ? "AVX-512" : f.avx2_fma ? "AVX2" : "portable loops");
    cr_assert(strncmp(out, want, strlen(want)) == 0, "want a first line '%s...', got:\n%.600s", want, out);
}
