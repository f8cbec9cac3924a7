/* cacheprune attack: the attacker as a client of the request API, seeing
 * only what a tenant sees (TTFT, and the reuse counters only when the
 * operator enables --report-reuse).  Attacks 1-7 of THREAT_MODEL.md:
 *   direct   the victim's request holds public context + a secret; the
 *            attacker probes K candidates of equal token length and picks
 *            the one that looks cached
 *   token    against a prefix cache: recover a PIN one digit at a time
 *   misses   as direct, with free-text names the built-in detector misses
 *   decision whether the public text after a secret gets stored (attack 4;
 *            meaningful in chunk and cacheprune, where segments start mid-message)
 *   context  the attacker reuses KV computed after a secret and matches its
 *            own outputs against simulations of each candidate (attack 5)
 *   poison   the attacker pre-stores a popular passage computed right after a
 *            prompt injection; the victim's output shift is measured (attack 6)
 *   evict    prime and probe: flush the pool, then probe whether the victim
 *            sent a passage again (attack 7), with and without quotas
 *   scheduling  the scheduling channel (eval/probe.h): the attacker's
 *            candidates queue behind other tenants' requests in a batcher;
 *            it guesses from which of its requests finished first, in
 *            steps and in wall time, under our FIFO order and under the
 *            LPM control (longest cached prefix first, as SGLang orders)
 *   chain    the chain proof as an oracle: the victim sends [P1][a short
 *            sentence no detector marks][P2][q]; per candidate sentence a
 *            fresh attacker tenant sends [P1][candidate], then the whole
 *            layout (no-store), and guesses the one that computes least
 *   admission  --admit-k 2 (at least): one attacker tenant sends each
 *            candidate document, then it again after one of its own, and
 *            guesses the one whose repeat looks as if another tenant had
 *            sent it first (shared, not its own copy)
 *   batching  under continuous batching the attacker, decoding, reads its
 *            own inter-token gaps while another tenant's request prefills
 *            in the same steps: does that request hit public text the
 *            attacker primed?  (a shared machine's aggregate timing: it is
 *            measured, not closed; THREAT_MODEL.md says what it reveals)
 * Each probe comes from a fresh tenant (attackers may make many), so its own
 * earlier probes never help it.  Timing is noisy here: probes interleave,
 * repeat, and are summarised by medians and a two-sample KS test. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attack.h"

/* The steps of one mode, in the order they run: the unit of the progress
 * line.  Segments that start mid-message exist only in chunk and cacheprune,
 * so the storage, context, poison and evict attacks run only there; chunk
 * mode has no budget to turn off. */
enum { S_DIRECT, S_MISSES, S_TOKEN, S_DECISION, S_EVICT, S_EVICT_QUOTA, S_CONTEXT_BUDGET, S_CONTEXT_NO_BUDGET, S_POISON, S_SCHED,
       S_CHAIN, S_ADMISSION, S_BATCHING, N_STEPS };
static const char *const step_names[N_STEPS] = { "direct", "misses", "token", "decision", "evict", "evict+quota", "context",
                                                 "context, no budget", "poison", "scheduling", "chain", "admission", "batching" };
/* direct, misses, token: 2 each; decision; evict and evict+q: 2 each (recovery, probe-hit); chain, admission: 2 each */
#define RESULTS_PER_MODE 15

static int step_runs(const att_opts *o, const char *mode, int s)
{
    int seg = strcmp(mode, "chunk") == 0 || strcmp(mode, "cacheprune") == 0;
    switch (s) {
    case S_DIRECT: return o->direct;
    case S_MISSES: return o->misses;
    case S_TOKEN: return o->token;
    case S_DECISION: return o->decision && seg;
    case S_EVICT:
    case S_EVICT_QUOTA: return o->evict && seg;
    case S_CONTEXT_BUDGET: return o->context && seg;
    case S_CONTEXT_NO_BUDGET: return o->context && seg && strcmp(mode, "chunk") != 0;
    case S_SCHED: return o->sched;
    case S_CHAIN: return o->chain && strcmp(mode, "cacheprune") == 0; /* the chain proof is cacheprune's */
    case S_ADMISSION: return o->admission && seg;
    case S_BATCHING: return o->batching;
    default: return o->poison && seg;
    }
}

static void usage(FILE *f)
{
    fputs("usage: cacheprune attack [options]\n"
          "\n"
          "  --model DIR        the model (default ../shared/models/cp-books-6m)\n"
          "  --modes LIST       sharing modes (default none,tenant-prefix,global-prefix,chunk,cacheprune)\n"
          "  --attacks LIST     direct,token,misses,decision,context,poison,evict,scheduling,chain,admission,\n"
          "                     batching (default all)\n"
          "  --trials N         trials per attack (default 4)\n"
          "  --candidates K     candidates per probe (default 16)\n"
          "  --repeats R        timing repeats per probe (default 3)\n"
          "  --report-reuse     show tenants the reuse counters (the operator's choice; default hidden)\n"
          "  --user-text MODE   private or shared (default): user text shared-eligible when not sensitive\n"
          "  --admit-k K        share a segment once K distinct tenants produced it (default 1)\n"
          "  --segment-kv MODE  in-context (default), canonical, strict\n"
          "  --row-limit X      the annotator's row limit (default: the engine's)\n"
          "  --beta X           the annotator's sensitive budget per row (default: the engine's)\n"
          "  --csv OUT          also write the results as CSV\n"
          "  --dtype D          weights in memory: auto (as stored; the default), f32, bf16, int8\n"
          "  --kv-dtype D       KV caches and pool: f32 (default) or bf16\n"
          "  --quiet-progress   no progress (a line per step on a terminal, else a line per mode)\n"
          "\n"
          "The attacker sees what a tenant sees: TTFT, and reuse counters only with --report-reuse.\n"
          "decision and evict read the operator's exact hit counts (an upper bound); context reads the attacker's\n"
          "own logits and greedy tokens; decision, context, poison and evict run in chunk and cacheprune only.\n"
          "scheduling: candidates queue in a batcher (2 in flight, 2 fillers ahead); recovery from the step and the\n"
          "wall time each finished, under FIFO and under the LPM control (longest cached prefix first: leaky, never\n"
          "a serve or run order); 'same trace' counts trials whose steps equal a run with a decoy secret.\n"
          "chain: per candidate sentence a fresh tenant sends [P1][candidate], then the victim's layout\n"
          "[P1][sentence][P2][q] (no-store); the guess is the one that computes least (cacheprune only).\n"
          "admission: under --admit-k 2 (at least) one tenant sends each candidate document, then it again after\n"
          "a passage of its own; the guess is the one whose repeat looks shared (chunk and cacheprune).\n"
          "batching: the attacker primes a public passage (or, the miss case, another), then decodes 44 tokens in a\n"
          "batcher (2 in flight) while another tenant's request with that passage joins; the sum of its 40 gaps\n"
          "after the join, median per case, and the AUC of telling the cases apart (trials x repeats each).\n"
          "CSV: poison rows carry KL(benign || poisoned) in the recovery column.\n",
          f);
}

/* --attacks: a comma-separated list of exact names; an unknown one is an
 * error (a misspelt name must not quietly select another attack or none) */
static int select_attacks(const char *list, att_opts *o)
{
    static const char *const names[] = { "direct", "token", "misses", "decision", "context", "poison", "evict", "scheduling",
                                         "chain", "admission", "batching" };
    int *flags[] = { &o->direct, &o->token, &o->misses, &o->decision, &o->context, &o->poison, &o->evict, &o->sched, &o->chain, &o->admission,
                     &o->batching };
    for (int k = 0; k < 11; k++) *flags[k] = 0;
    for (const char *p = list; *p;) {
        size_t n = strcspn(p, ",");
        int found = 0;
        for (int k = 0; k < 11 && !found; k++)
            if (n == strlen(names[k]) && strncmp(p, names[k], n) == 0) *flags[k] = found = 1;
        if (!found) return cli_error("attack: unknown attack '%.*s' (direct, token, misses, decision, context, poison, evict, scheduling, chain, admission, batching)", (int)(n > 32 ? 32 : n), p), 0;
        p += n + (p[n] == ',');
    }
    return 1;
}

int cli_attack(int argc, char **argv)
{
    att_opts o = { .trials = 4, .cands = 16, .repeats = 3, .admit_k = 1, .direct = 1, .token = 1, .misses = 1, .decision = 1, .context = 1, .poison = 1, .evict = 1, .sched = 1, .chain = 1, .admission = 1, .batching = 1, .row_limit = -1, .beta = -1, .dtype = CP_WEIGHTS_AUTO };
    const char *modes = "none,tenant-prefix,global-prefix,chunk,cacheprune", *attacks = NULL;
    int quiet = 0;
    o.model = "../shared/models/cp-books-6m";
    uint64_t rng = 88172645463325252ull; /* one seed: a run's candidates and secrets repeat run to run */
    o.rng = &rng;
    static const char *const with_value[] = { "--model", "--modes", "--attacks", "--csv", "--user-text", "--segment-kv", "--trials",
                                              "--candidates", "--repeats", "--row-limit", "--beta", "--admit-k", "--dtype", "--kv-dtype", NULL };
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        long long k;
        cp_error err;
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            usage(stdout);
            return 0;
        }
        if (strcmp(a, "--report-reuse") == 0) { o.report_reuse = 1; continue; }
        if (strcmp(a, "--quiet-progress") == 0) { quiet = 1; continue; }
        if (!cli_one_of(a, with_value)) return cli_unknown("attack", a), 2;
        if (!(v = cli_value("attack", argc, argv, &i))) return 2;
        if (strcmp(a, "--model") == 0) o.model = v;
        else if (strcmp(a, "--modes") == 0) modes = v;
        else if (strcmp(a, "--attacks") == 0) attacks = v;
        else if (strcmp(a, "--csv") == 0) o.csv = v;
        else if (strcmp(a, "--dtype") == 0) { if (!cli_parse_dtype(v, &o.dtype)) return 2; }
        else if (strcmp(a, "--kv-dtype") == 0) { if (!cli_parse_kv_dtype(v, &o.kv_dtype)) return 2; }
        else if (strcmp(a, "--user-text") == 0) {
            if (strcmp(v, "private") && strcmp(v, "shared")) return cli_error("attack: --user-text: private or shared, not '%s'", v), 2;
            o.user_private = strcmp(v, "private") == 0;
        }
        else if (strcmp(a, "--segment-kv") == 0) { if (cp_segkv_from_name(v, &o.segkv, &err)) return cli_error("%s", err.msg), 2; }
        else if (strcmp(a, "--trials") == 0) { if (!cli_parse_int(a, v, 1, 1000, &k)) return 2; o.trials = (int)k; }
        else if (strcmp(a, "--candidates") == 0) { if (!cli_parse_int(a, v, 2, 64, &k)) return 2; o.cands = (int)k; }
        else if (strcmp(a, "--repeats") == 0) { if (!cli_parse_int(a, v, 1, 8, &k)) return 2; o.repeats = (int)k; }
        else if (strcmp(a, "--row-limit") == 0) { double d; if (!cli_parse_float(a, v, 0, 1, &d)) return 2; o.row_limit = d; }
        else if (strcmp(a, "--beta") == 0) { double d; if (!cli_parse_float(a, v, 0, 1, &d)) return 2; o.beta = d; }
        else { if (!cli_parse_int(a, v, 1, 8, &k)) return 2; o.admit_k = (int)k; }
    }
    if (attacks && !select_attacks(attacks, &o)) return 2;
    char *mb;
    if ((o.n_modes = cli_parse_modes("--modes", modes, o.modes, 8, &mb)) < 0) return 2;
    cp_error err = { 0 };
    cp_backend *be;
    cp_model *m;
    cp_tokenizer *tok;
    cp_load_opts lo = { .dtype = o.dtype };
    if (cp_backend_cpu_create(&be, &err) || cp_model_load(o.model, be, &lo, &m, &err) || cp_tokenizer_load(o.model, &tok, &err))
        return cli_error("%s", err.msg), 1;
    cp_detect_chain ch;
    cli_detect_opts dopt = CLI_DETECT_DEFAULTS;
    if (!cli_make_chain(&ch, &dopt)) return 1;
    att_result res[8 * RESULTS_PER_MODE];
    att_poison_result pres[8];
    att_ctx_result cres[16];
    att_sched_result sres[16];
    att_batch_result bres[8];
    int nsr = 0, nbr = 0;
    int ncr = 0;
    int npr = 0;
    int nr = 0, rcode = 0;
    /* progress: a line per step on a terminal; elsewhere (a log) a line
     * per mode, the run being minutes long */
    cli_progress pg = { "attack", -1, cli_progress_wanted(quiet) };
    o.progress_line = pg.enabled;
    size_t steps = 0, done = 0;
    for (int i = 0; i < o.n_modes; i++)
        for (int s = 0; s < N_STEPS; s++) steps += (size_t)step_runs(&o, o.modes[i], s);
    char label[128];
    for (int i = 0; i < o.n_modes && !rcode; i++) {
        const char *mode = o.modes[i];
        if (!pg.enabled && !quiet) fprintf(stderr, "attacking %s ...\n", mode);
        for (int s = 0; s < N_STEPS && !rcode; s++) {
            if (!step_runs(&o, mode, s)) continue;
            snprintf(label, sizeof label, "attack (%s: %s)", mode, step_names[s]);
            pg.what = label;
            cli_progress_items(&pg, done, steps, "steps");
            int ok;
            switch (s) {
            case S_DIRECT:
            case S_MISSES: ok = attack_direct(&o, m, tok, &ch, mode, s == S_MISSES, &res[nr], &res[nr + 1]), nr += ok ? 2 : 0; break;
            case S_TOKEN: ok = attack_token(&o, m, tok, &ch, mode, &res[nr], &res[nr + 1]), nr += ok ? 2 : 0; break;
            case S_DECISION: ok = attack_decision(&o, m, tok, &ch, mode, &res[nr]), nr += ok; break;
            case S_EVICT:
            case S_EVICT_QUOTA: ok = attack_evict(&o, m, tok, &ch, mode, s == S_EVICT_QUOTA, &res[nr]), nr += ok ? 2 : 0; break;
            case S_CONTEXT_BUDGET:
            case S_CONTEXT_NO_BUDGET: ok = attack_context(&o, m, tok, &ch, mode, s == S_CONTEXT_BUDGET, &cres[ncr]), ncr += ok; break;
            case S_SCHED: ok = attack_sched(&o, m, tok, &ch, mode, &sres[nsr]), nsr += ok ? 2 : 0; break;
            case S_CHAIN: ok = attack_chain(&o, m, tok, &ch, mode, &res[nr], &res[nr + 1]), nr += ok ? 2 : 0; break;
            case S_ADMISSION: ok = attack_admission(&o, m, tok, &ch, mode, &res[nr], &res[nr + 1]), nr += ok ? 2 : 0; break;
            case S_BATCHING: ok = attack_batching(&o, m, tok, &ch, mode, &bres[nbr]), nbr += ok; break;
            default: ok = attack_poison(&o, m, tok, &ch, mode, &pres[npr]), npr += ok; break;
            }
            rcode = !ok;
            done++;
        }
    }
    pg.what = "attack";
    if (!rcode) cli_progress_items(&pg, done, steps, "steps");
    cli_progress_end(&pg);
    int tests = 0; /* Bonferroni over the KS tests made */
    for (int i = 0; i < nr; i++) tests += strcmp(res[i].channel, "timing") == 0 && strcmp(res[i].attack, "token") != 0;
    FILE *csv = o.csv ? fopen(o.csv, "w") : NULL;
    if (csv) fprintf(csv, "mode,attack,channel,recovery,chance,ks_D,p_bonferroni\n");
    printf("\n%d trials, %d candidates, %d repeats; counters %s to tenants; KV %s\n", o.trials, o.cands, o.repeats,
           o.report_reuse ? "SHOWN (--report-reuse)" : "hidden (default)", o.kv_dtype == CP_BF16 ? "bf16" : "f32");
    printf("%-20s %-8s %-9s %9s %8s %7s %12s\n", "mode", "attack", "channel", "recovery", "chance", "KS D", "p (Bonf.)");
    for (int i = 0; i < nr && !rcode; i++) {
        int has_ks = strcmp(res[i].channel, "timing") == 0 && strcmp(res[i].attack, "token") != 0;
        double p = has_ks ? fmin(1, res[i].p * tests) : NAN;
        char ps[32] = "-", cs[32] = "-";
        if (has_ks) snprintf(ps, sizeof ps, "%.2g", p);
        if (!isnan(res[i].chance)) snprintf(cs, sizeof cs, "%.1f%%", 100 * res[i].chance);
        printf("%-20s %-8s %-9s %8.1f%% %8s %7.3f %12s\n", res[i].mode, res[i].attack, res[i].channel, 100 * res[i].recovery, cs,
               has_ks ? res[i].D : 0.0, ps);
        if (csv) fprintf(csv, "%s,%s,%s,%.4f,%.4f,%.4f,%.4g\n", res[i].mode, res[i].attack, res[i].channel, res[i].recovery,
                         res[i].chance, res[i].D, has_ks ? p : 1.0);
    }
    if (ncr && !rcode) {
        printf("\ncontextual leakage (attack 5): the attacker reuses the victim's passage KV and matches its own output\n");
        printf("%-22s %-7s %8s %12s %10s %10s %8s\n", "mode", "budget", "reused", "KL spread", "by logits", "by text", "chance");
        for (int i = 0; i < ncr; i++) {
            const char *bud = strncmp(cres[i].label, "chunk", 5) == 0 ? "-" : cres[i].budget ? "on" : "off";
            printf("%-22s %-7s %8.1f %12.3g %9.1f%% %9.1f%% %7.1f%%\n", cres[i].label, bud, cres[i].reused, cres[i].spread,
                   100 * cres[i].by_logits, 100 * cres[i].by_text, 100 * cres[i].chance);
            if (csv) fprintf(csv, "%s,context-budget-%s,logits,%.4f,%.4f,0,1\n%s,context-budget-%s,text,%.4f,%.4f,0,1\n", cres[i].label,
                             bud, cres[i].by_logits, cres[i].chance, cres[i].label, bud, cres[i].by_text, cres[i].chance);
        }
    }
    if (nsr && !rcode) {
        printf("\nscheduling channel: the attacker's candidates queue in a batcher; guess = the one finished first\n");
        printf("%-20s %-14s %10s %10s %8s %12s\n", "mode", "order", "by steps", "by wall", "chance", "same trace");
        for (int i = 0; i < nsr; i++) {
            const cp_probe_result *r = &sres[i].r;
            printf("%-20s %-14s %9.1f%% %9.1f%% %7.1f%% %7d / %-3d\n", sres[i].mode, sres[i].order, 100 * r->by_steps,
                   100 * r->by_wall, 100 * r->chance, r->same_trace, r->trials);
            if (csv)
                fprintf(csv, "%s,sched-%s,steps,%.4f,%.4f,0,1\n%s,sched-%s,wall,%.4f,%.4f,0,1\n%s,sched-%s,same-trace,%.4f,1,0,1\n",
                        sres[i].mode, i % 2 ? "lpm" : "fifo", r->by_steps, r->chance, sres[i].mode, i % 2 ? "lpm" : "fifo",
                        r->by_wall, r->chance, sres[i].mode, i % 2 ? "lpm" : "fifo", (double)r->same_trace / r->trials);
        }
    }
    if (nbr && !rcode) {
        printf("\nbatching: the attacker's 40 inter-token gaps while another tenant's request joins its steps\n");
        printf("%-20s %8s %14s %14s %8s\n", "mode", "trials", "hit sum (ms)", "miss sum (ms)", "AUC");
        for (int i = 0; i < nbr; i++) {
            printf("%-20s %8d %14.1f %14.1f %8.2f\n", bres[i].mode, bres[i].trials, bres[i].hit_ms, bres[i].miss_ms, bres[i].auc);
            if (csv) fprintf(csv, "%s,batching,gaps-auc,%.4f,0.5,0,1\n", bres[i].mode, bres[i].auc);
        }
    }
    if (npr && !rcode) {
        printf("\npoisoning (attack 6): victim vs victim alone; 'injection' = poisoned vs benign pre-store\n");
        printf("%-22s %8s %10s %10s %10s %14s %14s\n", "mode", "reused", "KL benign", "KL poison", "KL inject", "greedy changed",
               "by injection");
        for (int i = 0; i < npr; i++) {
            printf("%-22s %8.1f %10.4f %10.4f %10.4f %13.0f%% %13.0f%%\n", pres[i].label, pres[i].reused, pres[i].kl_benign,
                   pres[i].kl_poison, pres[i].kl_injection, 100 * pres[i].changed_benign, 100 * pres[i].changed_poison);
            if (csv) fprintf(csv, "%s,poison,kl_injection,%.6f,0,0,1\n", pres[i].label, pres[i].kl_injection);
        }
    }
    if (csv) fclose(csv);
    free(mb);
    cp_chain_free(&ch);
    cp_tokenizer_free(tok);
    cp_model_free(m);
    cp_backend_destroy(be);
    return rcode;
}
