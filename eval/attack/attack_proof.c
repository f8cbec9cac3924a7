/* Attacks on what reuse proves and admits: chain (the chain proof as an
 * oracle) and admission (--admit-k as a channel). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attack.h"

static const char *const pw_a[] = { "purple", "orange", "silver", "yellow", "golden", "violet", "indigo", "scarlet", "crimson", "amber" };
static const char *const pw_b[] = { "elephant", "giraffe", "penguin", "dolphin", "tortoise", "pelican", "panther", "falcon", "walrus" };

/* a sentence holding a shared secret in plain words that no built-in
 * recognizer marks (a "password is" cue would be) */
static void password(uint64_t *rng, char *out, size_t cap)
{
    snprintf(out, cap, "our meeting word is %s %s", pw_a[att_rnd(rng) % 10], pw_b[att_rnd(rng) % 9]);
}

/* K such sentences of one token length; the first is the true one */
static int pw_candidates(uint64_t *rng, cp_tokenizer *t, int K, char cand[][64]) { return att_candidates_of(rng, t, K, cand, password); }

/* Guesses from per-candidate observations (seen: [K], times: [K][R]): by
 * counters the candidate that saw most (want_most) or least, ties sharing
 * the credit; by time the lowest median (want_fast) or highest.  Adds the
 * true candidate's (0) times and the others' to the KS samples. */
static void guess(const int *seen, double *times, int K, int R, int want_most, int want_fast, double *hit_c, double *hit_t, double *t_true,
                  int *n_true, double *t_false, int *n_false)
{
    int best = seen[0], ties = 0;
    for (int k = 0; k < K; k++) best = want_most ? (seen[k] > best ? seen[k] : best) : (seen[k] < best ? seen[k] : best);
    for (int k = 0; k < K; k++) ties += seen[k] == best;
    *hit_c += seen[0] == best ? 1.0 / ties : 0;
    double bm = want_fast ? 1e30 : -1e30;
    int bk = 0;
    for (int k = 0; k < K; k++) {
        double med = att_median(times + k * R, R);
        if (want_fast ? med < bm : med > bm) bm = med, bk = k;
    }
    *hit_t += bk == 0;
    for (int r = 0; r < R; r++) t_true[(*n_true)++] = times[r];
    for (int k = 1; k < K; k++)
        for (int r = 0; r < R; r++) t_false[(*n_false)++] = times[k * R + r];
}

/* The chain proof as an oracle (THREAT_MODEL.md, "Exactness proved along a
 * chain of hits"): the guess is the candidate whose whole-layout request
 * computes least (the proof recomputes nothing past a true guess). */
int attack_chain(const att_opts *o, cp_model *m, cp_tokenizer *tok, cp_detect_chain *ch, const char *mode, att_result *by_counter,
                 att_result *by_time)
{
    int K = o->cands, R = o->repeats, n_true = 0, n_false = 0, ok = 1;
    double hit_c = 0, hit_t = 0;
    double *t_true = malloc((size_t)o->trials * R * sizeof(double)), *t_false = malloc((size_t)o->trials * R * K * sizeof(double));
    double *tt = malloc((size_t)K * R * sizeof *tt);
    int *seen = malloc((size_t)K * sizeof *seen);
    size_t p2_cap = strlen(att_doc_text) + strlen(att_poison_docs[2]) + 3;
    char *p2 = malloc(p2_cap);
    if (!t_true || !t_false || !tt || !seen || !p2) ok = 0, cli_error("attack: out of memory");
    if (p2) snprintf(p2, p2_cap, "%s %s", att_doc_text, att_poison_docs[2]);
    const cp_role roles[4] = { CP_ROLE_DOCUMENT, CP_ROLE_USER, CP_ROLE_DOCUMENT, CP_ROLE_USER };
    uint32_t next_tenant = 1000;
    for (int tr = 0; tr < o->trials && ok; tr++) {
        char cand[64][64];
        if (!pw_candidates(o->rng, tok, K, cand)) {
            ok = 0, cli_error("attack: could not find %d sentences of equal length", K);
            break;
        }
        att_engine es;
        if (!att_make_engine(o, m, tok, ch, mode, &es)) {
            ok = 0;
            break;
        }
        double t;
        int re;
        const char *victim[4] = { att_poison_docs[1], cand[0], p2, att_question };
        ok = att_ask_msgs(&es, 1, roles, victim, 4, 0, o->report_reuse, &t, &re, NULL);
        for (int k = 0; k < K && ok; k++) { /* each guess from a fresh tenant, stored as its own prompt */
            const char *probe[4] = { att_poison_docs[1], cand[k], p2, att_question };
            uint32_t att = next_tenant++;
            ok = att_ask_msgs(&es, att, roles, probe, 2, 0, o->report_reuse, &t, &re, NULL);
            /* the chain moves tokens between reused and recomputed: the reused ones tell */
            for (int r = 0; r < R && ok; r++) ok = att_ask_msgs(&es, att, roles, probe, 4, 1, o->report_reuse, &tt[k * R + r], &seen[k], NULL);
        }
        if (ok) guess(seen, tt, K, R, 1, 1, &hit_c, &hit_t, t_true, &n_true, t_false, &n_false);
        att_drop_engine(&es);
    }
    if (ok) {
        *by_counter = (att_result){ mode, "chain", "counters", hit_c / o->trials, 1.0 / K, 0, 1 };
        double D, p = att_ks(t_true, n_true, t_false, n_false, &D);
        *by_time = (att_result){ mode, "chain", "timing", hit_t / o->trials, 1.0 / K, D, p };
    }
    free(t_true), free(t_false), free(tt), free(seen), free(p2);
    return ok;
}

/* room for the passage with its year changed, and a margin */
enum { ADMISSION_DOC_CAP = 512 };

/* Admission as a channel: under --admit-k 2 (at least) the victim sent one
 * of K documents (a year in it differs); one attacker tenant sends each
 * as [doc][q], then [its own passage][doc][q] R times.  Were its own copy
 * replaced by the shared one once its send admitted it, the repeat of the
 * victim's document would show no reuse of the attacker's own (and its
 * cost would follow the shared copy): the guess is the candidate that sees
 * least, and by time the slowest. */
int attack_admission(const att_opts *o0, cp_model *m, cp_tokenizer *tok, cp_detect_chain *ch, const char *mode, att_result *by_counter,
                     att_result *by_time)
{
    att_opts o = *o0;
    if (o.admit_k < 2) o.admit_k = 2;
    int K = o.cands, R = o.repeats, n_true = 0, n_false = 0, ok = 1;
    double hit_c = 0, hit_t = 0;
    double *t_true = malloc((size_t)o.trials * R * sizeof(double)), *t_false = malloc((size_t)o.trials * R * K * sizeof(double));
    double *tt = malloc((size_t)K * R * sizeof *tt);
    int *seen = malloc((size_t)K * sizeof *seen);
    char(*docs)[ADMISSION_DOC_CAP] = malloc((size_t)K * sizeof *docs);
    if (!t_true || !t_false || !tt || !seen || !docs) ok = 0, cli_error("attack: out of memory");
    if (ok && strlen(att_doc_text) + 8 > ADMISSION_DOC_CAP) ok = 0, cli_error("attack: the admission probe's document is too long");
    const cp_role roles[3] = { CP_ROLE_DOCUMENT, CP_ROLE_DOCUMENT, CP_ROLE_USER };
    const char *at = ok ? strstr(att_doc_text, "1868") : NULL;
    for (int tr = 0; tr < o.trials && ok && at; tr++) {
        /* the same text, another year ("built in 18xx"), each of one length in tokens: only
         * which one the victim sent differs, not how much there is to compute */
        int n = 0, want = -1;
        for (int tries = 0; n < K && tries < 2000; tries++) {
            int year = (int)(att_rnd(o.rng) % 100), dup = 0;
            snprintf(docs[n], sizeof docs[n], "%.*s18%02d%s", (int)(at - att_doc_text), att_doc_text, year, at + 4);
            for (int i = 0; i < n; i++) dup |= strcmp(docs[i], docs[n]) == 0;
            int L = att_tok_len(tok, docs[n]);
            if (dup || (want >= 0 && L != want)) continue;
            want = L, n++;
        }
        if (n < K) {
            ok = 0, cli_error("attack: could not find %d documents of equal length", K);
            break;
        }
        att_engine es;
        if (!att_make_engine(&o, m, tok, ch, mode, &es)) {
            ok = 0;
            break;
        }
        double t;
        int re;
        const char *victim[2] = { docs[0], att_question };
        ok = att_ask_msgs(&es, 1, roles + 1, victim, 2, 0, o.report_reuse, &t, &re, NULL);
        for (int k0 = 0; k0 < K && ok; k0++) {
            int k = (k0 + tr) % K; /* the true one is not always sent first */
            const char *first[2] = { docs[k], att_question }, *again[3] = { att_poison_docs[1], docs[k], att_question };
            ok = att_ask_msgs(&es, 2, roles + 1, first, 2, 0, o.report_reuse, &t, &re, NULL);
            /* its own hit tokens, reused or recomputed, vanish from its view once shared */
            for (int r = 0; r < R && ok; r++) ok = att_ask_msgs(&es, 2, roles, again, 3, 1, o.report_reuse, &tt[k * R + r], &re, &seen[k]);
        }
        if (ok) guess(seen, tt, K, R, 0, 0, &hit_c, &hit_t, t_true, &n_true, t_false, &n_false);
        att_drop_engine(&es);
    }
    if (ok && !at) ok = 0, cli_error("attack: the admission probe's document has no year");
    if (ok) {
        *by_counter = (att_result){ mode, "admission", "counters", hit_c / o.trials, 1.0 / K, 0, 1 };
        double D, p = att_ks(t_true, n_true, t_false, n_false, &D);
        *by_time = (att_result){ mode, "admission", "timing", hit_t / o.trials, 1.0 / K, D, p };
    }
    free(t_true), free(t_false), free(tt), free(seen), free(docs);
    return ok;
}
