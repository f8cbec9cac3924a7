/* Annotator cost: time against T on synthetic attention (O(T^2): about 4x
 * per doubling until max_len bounds the DP), and against the prefill it
 * follows at T = 4096 on synth qwen2.5-0.5b, measured in the same run. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "../engine/annotate/annotate.h"
#include "../model/model.h"
#include "../model/synth.h"

#include "bench_clock.h"

static void fill(float *A, int T)
{
    uint32_t r = 12345;
    for (int i = 0; i < T; i++) {
        float *row = A + (size_t)i * T, sum = 0;
        for (int j = 0; j <= i; j++) {
            r = r * 1664525u + 1013904223u;
            row[j] = (float)(r >> 8) / 16777216.0f * (i - j < 64 ? 4.0f : 1.0f);
            sum += row[j];
        }
        for (int j = 0; j <= i; j++) row[j] /= sum;
    }
}

int main(int argc, char **argv)
{
    int skip_model = argc > 1 && strcmp(argv[1], "--no-model") == 0;
    cp_error err = { 0 };
    cp_annot_opts o;
    cp_annot_opts_default(&o);
    printf("%-8s %12s %10s %10s\n", "T", "annotate ms", "x prev", "segments");
    double prev = 0;
    for (int T = 512; T <= 16384; T *= 2) {
        float *A = malloc((size_t)T * T * sizeof *A);
        if (!A) return 1;
        fill(A, T);
        cp_annot_input in = { A, (size_t)T, T, NULL, NULL, NULL, NULL, NULL };
        cp_annot_result r;
        double t = now_s();
        if (cp_annotate(&in, &o, &r, &err) != CP_OK) {
            fprintf(stderr, "bench_annotate: %s\n", err.msg);
            return 1;
        }
        t = now_s() - t;
        printf("%-8d %12.1f %10.2f %10zu\n", T, t * 1e3, prev > 0 ? t / prev : 0, r.n);
        prev = t;
        cp_annot_result_free(&r);
        free(A);
    }
    if (skip_model) return 0;

    const char *dir = "build/synth-qwen2.5-0.5b";
    char cfg[512];
    snprintf(cfg, sizeof cfg, "%s/config.json", dir);
    struct stat sb;
    if (stat(cfg, &sb) != 0) {
        cp_synth_opts so = { .shape = "qwen2.5-0.5b", .out_dir = dir, .seed = 1 };
        if (cp_synth(&so, &err)) {
            fprintf(stderr, "bench_annotate: %s\n", err.msg);
            return 1;
        }
    }
    cp_backend *be;
    cp_model *m;
    if (cp_backend_cpu_create(&be, &err) || cp_model_load(dir, be, NULL, &m, &err)) {
        fprintf(stderr, "bench_annotate: %s\n", err.msg);
        return 1;
    }
    int T = 4096;
    int32_t *ids = malloc((size_t)T * sizeof *ids);
    for (int i = 0; i < T; i++) ids[i] = (i * 7919) % 20000;
    float *A = malloc((size_t)T * T * sizeof *A), *sm = calloc((size_t)T, sizeof *sm);
    uint8_t *sens = calloc((size_t)T, 1);
    cp_state *s;
    if (cp_state_create(m, T, 1024, &s, &err)) return 1;
    float *logits = malloc((size_t)m->cfg.vocab * sizeof *logits);
    double t0 = now_s();
    if (cp_forward(m, s, ids, NULL, T, CP_LOGITS_LAST, logits, NULL, &err)) return 1;
    double t_plain = now_s() - t0;
    cp_state_reset(m, s, &err);
    cp_export ex = { .a = A, .ld = T, .sensitive = sens, .sens_mass = sm };
    t0 = now_s();
    if (cp_forward(m, s, ids, NULL, T, CP_LOGITS_NONE, NULL, &ex, &err)) return 1;
    double t_export = now_s() - t0;
    cp_annot_input in = { A, (size_t)T, T, NULL, sens, sm, NULL, NULL };
    cp_annot_result r;
    t0 = now_s();
    if (cp_annotate(&in, &o, &r, &err)) return 1;
    double t_ann = now_s() - t0;
    printf("\nT = %d on synth qwen2.5-0.5b: prefill %.1f s; with attention export %.1f s (%.2fx); annotate %.0f ms = %.1f %% "
           "of the prefill (target <= 10 %%)\n",
           T, t_plain, t_export, t_export / t_plain, t_ann * 1e3, 100 * t_ann / t_plain);
    cp_annot_result_free(&r);
    cp_state_free(m, s);
    cp_model_free(m);
    cp_backend_destroy(be);
    free(ids), free(A), free(sm), free(sens), free(logits);
    return 0;
}
