/* make bench-batch, part 1: what one continuous-batching step costs on this
 * backend (CPU).  A pure decode step of B sequences (each over a context of
 * C tokens) against the same step carrying P prefill tokens as well — the
 * ratio is what --step-tokens trades: a step with prefill work should take
 * at most about twice a pure decode step, so running requests keep their
 * pace while a new prompt is prefilled.  Times are the minimum of R tries
 * (a shared machine's stalls only ever add). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../model/model.h"

#include "bench_clock.h"

static void check(cp_status rc, const cp_error *err)
{
    if (rc) {
        fprintf(stderr, "bench_batch: %s\n", err->msg);
        exit(1);
    }
}

enum { MAXB = 16, CTX = 128, TRIES = 5 };

/* one step: B decode tokens (each sequence's next) and, when P > 0, P prefill
 * tokens of a fresh sequence; returns ms.  The decoders' states are rolled
 * back (n, next_pos) so every try sees the same context. */
static double step_ms(cp_model *m, cp_batch_ws *ws, cp_state **dec, int B, cp_state *pre, int P, const int32_t *toks, float *logits,
                      cp_error *err)
{
    cp_batch_seq q[MAXB + 1];
    int32_t one = 5;
    for (int i = 0; i < B; i++)
        q[i] = (cp_batch_seq){ .s = dec[i], .tokens = &one, .n = 1, .mode = CP_LOGITS_LAST, .logits = logits + (size_t)i * m->cfg.vocab };
    int nq = B;
    if (P > 0) {
        pre->n = 0, pre->next_pos = 0;
        q[nq++] = (cp_batch_seq){ .s = pre, .tokens = toks, .n = P, .mode = CP_LOGITS_LAST, .logits = logits + (size_t)B * m->cfg.vocab };
    }
    double t0 = now_ms();
    check(cp_forward_batch(m, ws, q, nq, err), err);
    double t = now_ms() - t0;
    for (int i = 0; i < B; i++) dec[i]->n = CTX, dec[i]->next_pos = CTX;
    return t;
}

static double best(cp_model *m, cp_batch_ws *ws, cp_state **dec, int B, cp_state *pre, int P, const int32_t *toks, float *logits,
                   cp_error *err)
{
    double b = 1e30;
    for (int r = 0; r < TRIES; r++) {
        double t = step_ms(m, ws, dec, B, pre, P, toks, logits, err);
        if (t < b) b = t;
    }
    return b;
}

int main(int argc, char **argv)
{
    const char *dir = NULL;
    for (int i = 1; i + 1 < argc; i++)
        if (strcmp(argv[i], "--dir") == 0) dir = argv[++i];
    if (!dir) {
        fprintf(stderr, "usage: bench_batch --dir MODEL_DIR\n");
        return 2;
    }
    cp_error err = { 0 };
    cp_backend *be = NULL;
    cp_model *m = NULL;
    check(cp_backend_cpu_create(&be, &err), &err);
    check(cp_model_load(dir, be, NULL, &m, &err), &err);
    const int Ps[] = { 8, 16, 32, 48, 64, 128 }, nP = 6, Bs[] = { 1, 4, 8, 16 }, nB = 4;
    cp_batch_ws *ws = NULL;
    check(cp_batch_ws_create(m, MAXB + 128, &ws, &err), &err);
    cp_state *dec[MAXB], *pre = NULL;
    int32_t *toks = malloc(CTX * sizeof *toks);
    float *logits = malloc((size_t)(MAXB + 1) * m->cfg.vocab * sizeof *logits);
    if (!toks || !logits) return fprintf(stderr, "bench_batch: out of memory\n"), 1;
    for (int i = 0; i < CTX; i++) toks[i] = (int32_t)((i * 7919 + 13) % m->cfg.vocab);
    for (int i = 0; i < MAXB; i++) { /* each decoder over CTX tokens of context */
        check(cp_state_create(m, CTX + 8, 64, &dec[i], &err), &err);
        check(cp_forward(m, dec[i], toks, NULL, CTX, CP_LOGITS_NONE, NULL, NULL, &err), &err);
    }
    check(cp_state_create(m, 160, 64, &pre, &err), &err);
    printf("bench_batch: %s (%d layers, hidden %d), context %d, min of %d tries\n", dir, m->cfg.n_layers, m->cfg.hidden, CTX, TRIES);
    printf("%-10s %12s %14s\n", "decoders", "step ms", "ms per token");
    double dec_ms[4];
    for (int b = 0; b < nB; b++) {
        dec_ms[b] = best(m, ws, dec, Bs[b], pre, 0, toks, logits, &err);
        printf("%-10d %12.2f %14.3f\n", Bs[b], dec_ms[b], dec_ms[b] / Bs[b]);
    }
    printf("decode of 16 in one step vs 16 steps of 1: %.2fx the tokens per second\n", 16 * dec_ms[0] / dec_ms[3]);
    printf("\n%-10s %-10s %12s %16s\n", "decoders", "prefill", "step ms", "vs decode only");
    int pick[4] = { 0 }; /* per decoder count: the largest budget (decoders + prefill) whose step stays <= 2x a decode step */
    for (int b = 1; b < nB; b++)
        for (int p = 0; p < nP; p++) {
            double t = best(m, ws, dec, Bs[b], pre, Ps[p], toks, logits, &err);
            printf("%-10d %-10d %12.2f %15.2fx\n", Bs[b], Ps[p], t, t / dec_ms[b]);
            if (t <= 2 * dec_ms[b]) pick[b] = Bs[b] + Ps[p];
        }
    printf("\nstep tokens (decoders + prefill) with a step <= 2x a decode step: %d at 4 decoders, %d at 8, %d at 16\n", pick[1], pick[2],
           pick[3]);
    for (int i = 0; i < MAXB; i++) cp_state_free(m, dec[i]);
    cp_state_free(m, pre);
    cp_batch_ws_free(m, ws);
    free(toks), free(logits);
    cp_model_free(m);
    cp_backend_destroy(be);
    return 0;
}
