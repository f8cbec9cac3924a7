/* Attacks that probe candidates and read what a tenant is told: direct and
 * misses (attacks 1 and 3), token (attack 2, a PIN digit by digit) and
 * decision (attack 4, what gets stored after a secret). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attack.h"

static void victim_text(char *out, size_t cap, int misses, const char *secret)
{
    if (misses)
        snprintf(out, cap, "We are writing a short report for the county archive about the storms of the late nineteenth "
                           "century. Yesterday %s and I read the passage above together and took notes on the keepers and "
                           "their logbooks. Please summarise it for us in plain words so that we can quote it.", secret);
    else snprintf(out, cap, "Hello, my card is %s and I would like a short summary of the passage above, please.", secret);
}

/* attacks 1 and 3: returns recovery by counters (when visible) and by timing */
int attack_direct(const att_opts *o, cp_model *m, cp_tokenizer *tok, cp_detect_chain *ch, const char *mode, int misses,
                  att_result *by_counter, att_result *by_time)
{
    int K = o->cands, R = o->repeats, n_true = 0, n_false = 0;
    double hit_c = 0, hit_t = 0;
    double *t_true = malloc((size_t)o->trials * R * sizeof(double)), *t_false = malloc((size_t)o->trials * R * K * sizeof(double));
    uint32_t next_tenant = 1000;
    for (int tr = 0; tr < o->trials; tr++) {
        char cand[64][64], text[512];
        if (!att_candidates(o->rng, tok, misses, K, cand)) return cli_error("attack: could not find %d candidates of equal length", K), 0;
        att_engine es;
        if (!att_make_engine(o, m, tok, ch, mode, &es)) return 0;
        double t;
        int re;
        victim_text(text, sizeof text, misses, cand[0]);
        int failed = !att_ask(&es, 1, att_doc_text, text, o->report_reuse, &t, &re);
        double *tt = calloc((size_t)K * R, sizeof *tt);
        int *rr = calloc((size_t)K, sizeof *rr);
        if (!tt || !rr || !t_true || !t_false) failed = 1, cli_error("attack: out of memory");
        for (int r = 0; r < R && !failed; r++)
            for (int k0 = 0; k0 < K; k0++) {
                int k = (k0 + r * 7) % K; /* interleaved, shifted each round */
                victim_text(text, sizeof text, misses, cand[k]);
                failed |= !att_ask(&es, next_tenant++, att_doc_text, text, o->report_reuse, &tt[k * R + r], &re);
                /* counters from each candidate's first probe: later rounds can
                 * hit what the attacker's own earlier probes stored */
                if (r == 0) rr[k] = re;
            }
        if (failed) {
            free(tt), free(rr), free(t_true), free(t_false);
            att_drop_engine(&es);
            return 0;
        }
        /* counters: the most reuse wins; ties share the credit */
        int best = rr[0], ties = 0;
        for (int k = 0; k < K; k++) best = rr[k] > best ? rr[k] : best;
        for (int k = 0; k < K; k++) ties += rr[k] == best;
        hit_c += rr[0] == best ? 1.0 / ties : 0;
        /* timing: the lowest median wins */
        double bm = 1e30;
        int bk = 0;
        for (int k = 0; k < K; k++) {
            double med = att_median(tt + k * R, R);
            if (med < bm) bm = med, bk = k;
        }
        hit_t += bk == 0;
        for (int r = 0; r < R; r++) t_true[n_true++] = tt[r];
        for (int k = 1; k < K; k++)
            for (int r = 0; r < R; r++) t_false[n_false++] = tt[k * R + r];
        free(tt), free(rr);
        att_drop_engine(&es);
    }
    const char *name = misses ? "misses" : "direct";
    *by_counter = (att_result){ mode, name, "counters", hit_c / o->trials, 1.0 / K, 0, 1 };
    double D, p = att_ks(t_true, n_true, t_false, n_false, &D);
    *by_time = (att_result){ mode, name, "timing", hit_t / o->trials, 1.0 / K, D, p };
    free(t_true), free(t_false);
    return 1;
}

/* attack 2: a PIN digit by digit, each digit guessed from 10 probes */
int attack_token(const att_opts *o, cp_model *m, cp_tokenizer *tok, cp_detect_chain *ch, const char *mode, att_result *by_counter,
                 att_result *by_time)
{
    int ok_t = 0, total = 0;
    double ok_c = 0;
    uint32_t next_tenant = 5000;
    for (int tr = 0; tr < o->trials; tr++) {
        char pin[8];
        snprintf(pin, sizeof pin, "%04u", att_rnd(o->rng) % 10000);
        att_engine es;
        if (!att_make_engine(o, m, tok, ch, mode, &es)) return 0;
        char text[512], known[8] = "";
        double t;
        int re;
        snprintf(text, sizeof text, "%s Note for the archive desk: the door code is %s, keep it safe.", att_doc_text, pin);
        int failed = !att_ask(&es, 1, NULL, text, o->report_reuse, &t, &re);
        for (int pos = 0; pos < 4 && !failed; pos++) {
            int best_t = 0, counts[10];
            double tmin = 1e30;
            for (int d = 0; d < 10; d++) {
                double ts[8];
                int rmax = 0;
                for (int r = 0; r < o->repeats && r < 8; r++) {
                    snprintf(text, sizeof text, "%s Note for the archive desk: the door code is %s%d", att_doc_text, known, d);
                    failed |= !att_ask(&es, next_tenant++, NULL, text, o->report_reuse, &ts[r], &re);
                    if (r == 0) rmax = re; /* first probe only: see attack_direct */
                }
                double med = att_median(ts, o->repeats < 8 ? o->repeats : 8);
                counts[d] = rmax;
                if (med < tmin) tmin = med, best_t = d;
            }
            int truth = pin[pos] - '0', best = counts[0], ties = 0;
            for (int d = 0; d < 10; d++) best = counts[d] > best ? counts[d] : best;
            for (int d = 0; d < 10; d++) ties += counts[d] == best;
            ok_c += counts[truth] == best ? 1.0 / ties : 0; /* ties share the credit */
            ok_t += best_t == truth;
            total++;
            size_t kl = strlen(known);
            known[kl] = pin[pos], known[kl + 1] = 0; /* continue from the true digit: per-digit recovery */
        }
        att_drop_engine(&es);
        if (failed) return 0;
    }
    *by_counter = (att_result){ mode, "token", "counters", ok_c / total, 0.1, 0, 1 };
    *by_time = (att_result){ mode, "token", "timing", (double)ok_t / total, 0.1, 0, 1 };
    return 1;
}

/* attack 4, the decision channel: what a victim stores of the public text
 * after its secret may depend on the secret (in-context annotation reads
 * attention to it).  The attacker owns the model and the engine's code: it
 * simulates the victim under each candidate, predicts how many tokens of that
 * text a later probe would hit, probes the real engine, and keeps the
 * candidates whose prediction matches.  An upper bound: the probe reads the
 * operator's exact shared-hit count, more than any tenant sees. */
static const char follow_text[] =
    " The archive opens at nine on weekdays, and its reading room has long oak tables under tall windows that face the "
    "harbour, where visitors may copy the keepers' logbooks by hand but never take them out of the building.";

static int follow_hits(const att_opts *o, cp_model *m, cp_tokenizer *tok, cp_detect_chain *ch, const char *mode,
                       const char *secret, int *hits)
{
    att_engine es;
    if (!att_make_engine(o, m, tok, ch, mode, &es)) return 0;
    char text[2048];
    snprintf(text, sizeof text, "Hello, my card is %s.%s", secret, follow_text);
    cp_request_msg msgs[2] = { { CP_ROLE_DOCUMENT, att_doc_text, strlen(att_doc_text), 0, NULL, 0 },
                               { CP_ROLE_USER, text, strlen(text), 0, NULL, 0 } };
    cp_request r = { .tenant = 1, .msgs = msgs, .n_msgs = 2, .max_tokens = 1, .sampling = { .top_p = 1 } };
    cp_response resp;
    cp_error err = { 0 };
    int ok = cp_engine_run(es.e, &r, &resp, &err) == CP_OK; /* the victim */
    if (ok) cp_response_free(&resp);
    msgs[1] = (cp_request_msg){ CP_ROLE_USER, follow_text, strlen(follow_text), 0, NULL, 0 };
    r.tenant = 2, r.msgs = msgs + 1, r.n_msgs = 1; /* the probe: the public text alone */
    if (ok) ok = cp_engine_run(es.e, &r, &resp, &err) == CP_OK;
    if (ok) {
        *hits = resp.shared_hit_tokens;
        cp_response_free(&resp);
    } else cli_error("attack: %s", err.msg);
    att_drop_engine(&es);
    return ok;
}

int attack_decision(const att_opts *o, cp_model *m, cp_tokenizer *tok, cp_detect_chain *ch, const char *mode, att_result *out)
{
    int K = o->cands;
    double won = 0;
    for (int tr = 0; tr < o->trials; tr++) {
        char cand[64][64];
        int pred[64], seen;
        if (!att_candidates(o->rng, tok, 0, K, cand)) return cli_error("attack: could not find %d candidates of equal length", K), 0;
        int truth = (int)(att_rnd(o->rng) % (unsigned)K);
        for (int k = 0; k < K; k++)
            if (!follow_hits(o, m, tok, ch, mode, cand[k], &pred[k])) return 0;
        if (!follow_hits(o, m, tok, ch, mode, cand[truth], &seen)) return 0; /* the real victim */
        int consistent = 0;
        for (int k = 0; k < K; k++) consistent += pred[k] == seen;
        won += pred[truth] == seen && consistent ? 1.0 / consistent : 0; /* a uniform guess among the consistent */
        /* below a progress line on a terminal, not glued to its end */
        fprintf(stderr, "%s  decision trial %d: the probe hit %d tokens; %d of %d candidates predict that\n",
                o->progress_line ? "\n" : "", tr + 1, seen, consistent, K);
    }
    *out = (att_result){ att_segkv_label(o, mode, 0), "decision", "storage", won / o->trials, 1.0 / K, 0, 1 };
    return 1;
}
