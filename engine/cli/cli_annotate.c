/* cacheprune annotate: prefill a prompt with the attention export and show
 * the segments the annotator would share, with their text. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../model/model.h"
#include "../annotate/annotate.h"
#include "cli.h"
#include "../detect/detect.h"

static void usage(FILE *f)
{
    fputs("usage: cacheprune annotate --model DIR (--prompt TEXT | --prompt-ids LIST) [options]\n"
          "\n"
          "  --layers LIST      layers whose attention is averaged: all (default) or e.g. 0-2,5\n"
          "  --min-len N        shortest segment (default 32)    --max-len N  longest (default 2048)\n"
          "  --tau X            internal/external threshold (0.25) --beta X sensitive budget per row (0.02)\n"
          "  --row-limit X      a row whose max-head mass on sensitive tokens exceeds X is never shared (0.05)\n"
          "  --k0 N --r X       recompute the first N tokens and the top fraction X by external share (2, 0.15)\n"
          "  --model DIR        the model (HF layout, with tokenizer.json for --prompt)\n"
          "  --prompt TEXT      the prompt     --prompt-ids LIST  or its comma-separated token ids\n"
          "  --json             machine-readable output\n"
          "  --dtype D          weights in memory: auto (as stored; the default), f32, bf16, int8\n"
          "  --kv-dtype D       the prefill's KV cache: f32 (default) or bf16\n"
          "detector options, as for `cacheprune detect` (the prompt is scanned as a user message):\n",
          f);
    cli_detect_opts_help(f);
}

static int parse_layers(const char *s, int n_layers, uint8_t *sel)
{
    if (strcmp(s, "all") == 0) {
        memset(sel, 1, (size_t)n_layers);
        return 1;
    }
    memset(sel, 0, (size_t)n_layers);
    for (const char *p = s; *p;) {
        char *end;
        long a = strtol(p, &end, 10), b = a;
        if (end == p) return 0;
        if (*end == '-') {
            p = end + 1;
            b = strtol(p, &end, 10);
            if (end == p) return 0;
        }
        if (a < 0 || b < a || b >= n_layers) return 0;
        for (long l = a; l <= b; l++) sel[l] = 1;
        p = *end == ',' ? end + 1 : end;
        if (*end && *end != ',') return 0;
    }
    return 1;
}

int cli_annotate(int argc, char **argv)
{
    cli_detect_opts dopt = CLI_DETECT_DEFAULTS;
    const char *model = NULL, *prompt = NULL, *ids_arg = NULL, *layers = "all";
    int json = 0;
    cp_annot_opts o;
    cp_annot_opts_default(&o);
    cp_weight_dtype dtype = CP_WEIGHTS_AUTO;
    cp_dtype kv_dtype = CP_F32;
    for (int i = 1; i < argc; i++) {
        int r = cli_parse_detect_opt(argc, argv, &i, &dopt);
        if (r < 0) return 2;
        if (r > 0) continue;
        const char *a = argv[i], *v;
        long long k;
        double d;
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            usage(stdout);
            return 0;
        }
        if (strcmp(a, "--json") == 0) {
            json = 1;
            continue;
        }
        static const char *const with_value[] = { "--model", "--prompt", "--prompt-ids", "--layers", "--min-len", "--max-len",
                                                  "--k0", "--tau", "--beta", "--row-limit", "--r", "--dtype", "--kv-dtype", NULL };
        if (!cli_one_of(a, with_value)) return cli_unknown("annotate", a), 2;
        if (!(v = cli_value("annotate", argc, argv, &i))) return 2;
        /* a number out of range: cli_parse_* said which option */
        if (strcmp(a, "--model") == 0) model = v;
        else if (strcmp(a, "--dtype") == 0) { if (!cli_parse_dtype(v, &dtype)) return 2; }
        else if (strcmp(a, "--kv-dtype") == 0) { if (!cli_parse_kv_dtype(v, &kv_dtype)) return 2; }
        else if (strcmp(a, "--prompt") == 0) prompt = v;
        else if (strcmp(a, "--prompt-ids") == 0) ids_arg = v;
        else if (strcmp(a, "--layers") == 0) layers = v;
        else if (strcmp(a, "--min-len") == 0) { if (!cli_parse_int(a, v, 1, 1 << 20, &k)) return 2; o.min_len = (int)k; }
        else if (strcmp(a, "--max-len") == 0) { if (!cli_parse_int(a, v, 1, 1 << 20, &k)) return 2; o.max_len = (int)k; }
        else if (strcmp(a, "--k0") == 0) { if (!cli_parse_int(a, v, 0, 1 << 20, &k)) return 2; o.k0 = (int)k; }
        else if (strcmp(a, "--tau") == 0) { if (!cli_parse_float(a, v, 0, 1e9, &d)) return 2; o.tau = d; }
        else if (strcmp(a, "--beta") == 0) { if (!cli_parse_float(a, v, 0, 1, &d)) return 2; o.beta = d; }
        else if (strcmp(a, "--row-limit") == 0) { if (!cli_parse_float(a, v, 0, 1, &d)) return 2; o.row_limit = d; }
        else { if (!cli_parse_float(a, v, 0, 1, &d)) return 2; o.r = d; }
    }
    if (!model || (!prompt == !ids_arg)) {
        cli_error("annotate: --model and one of --prompt / --prompt-ids are required (see --help)");
        return 2;
    }
    int rcode = 1;
    cp_error err = { 0 };
    cp_backend *be = NULL;
    cp_model *m = NULL;
    cp_state *st = NULL;
    cp_tokenizer *tok = NULL;
    cp_encoding enc = { 0 };
    cp_spans spans = { 0 };
    cp_detect_chain chain;
    int have_chain = 0;
    uint8_t *mask = NULL, *sel = NULL;
    float *A = NULL, *sm = NULL;
    cp_annot_result res = { 0 };
    if (!cli_make_backend("cpu", &be)) goto done;
    cp_load_opts lo = { .dtype = dtype };
    if (cp_model_load(model, be, &lo, &m, &err) != CP_OK) {
        cli_error("%s", err.msg);
        goto done;
    }
    if (prompt) {
        if (cp_tokenizer_load(model, &tok, &err) != CP_OK ||
            cp_tokenize(tok, prompt, strlen(prompt), CP_TOK_ADD_SPECIAL, &enc, &err) != CP_OK) {
            cli_error("%s", err.msg);
            goto done;
        }
    } else {
        int32_t *ids;
        int n = cli_parse_ids("--prompt-ids", ids_arg, &ids);
        if (n < 0) goto done;
        for (int i = 0; i < n; i++) cp_encoding_push(&enc, ids[i], 0, 0, &err);
        free(ids);
    }
    int T = (int)enc.n;
    if (T < 1) {
        cli_error("annotate: empty prompt");
        goto done;
    }
    /* before the T x T matrix is allocated (34k tokens: 4.6 GB) */
    if (!cli_fits_context("annotate", T, 0, m->cfg.max_pos)) goto done;
    mask = calloc((size_t)T, 1);
    sel = calloc((size_t)m->cfg.n_layers, 1);
    A = calloc((size_t)T * T, sizeof *A);
    sm = calloc((size_t)T, sizeof *sm);
    if (!mask || !sel || !A || !sm) {
        cli_error("annotate: out of memory for a %d x %d attention matrix", T, T);
        goto done;
    }
    if (!parse_layers(layers, m->cfg.n_layers, sel)) {
        cli_error("--layers: expected 'all' or a list like 0-2,5 within [0, %d)", m->cfg.n_layers);
        goto done;
    }
    if (prompt) {
        if (!cli_make_chain(&chain, &dopt)) goto done;
        have_chain = 1;
        if (cp_chain_detect(&chain, prompt, strlen(prompt), CP_ROLE_USER, &spans, &err) != CP_OK) {
            cli_error("%s", err.msg);
            goto done;
        }
        cp_spans_to_mask(&spans, 0, &enc, 0, enc.n, dopt.mask_pad, mask);
    }
    if (cp_state_create_kv(m, T, 512, kv_dtype, &st, &err) != CP_OK) {
        cli_error("%s", err.msg);
        goto done;
    }
    cp_export ex = { .a = A, .ld = T, .layers = sel, .sensitive = mask, .sens_mass = sm };
    if (cp_forward(m, st, enc.ids, NULL, T, CP_LOGITS_NONE, NULL, &ex, &err) != CP_OK) {
        cli_error("prefill: %s", err.msg);
        goto done;
    }
    cp_annot_input in = { A, (size_t)T, T, NULL, mask, sm, NULL, NULL };
    if (cp_annotate(&in, &o, &res, &err) != CP_OK) {
        cli_error("%s", err.msg);
        goto done;
    }
    cJSON *j = cJSON_CreateObject(), *segs = cJSON_AddArrayToObject(j, "segments");
    for (size_t k = 0; k < res.n; k++) {
        const cp_annot_segment *g = &res.v[k];
        cJSON *x = cJSON_CreateObject();
        cJSON_AddNumberToObject(x, "start", g->start);
        cJSON_AddNumberToObject(x, "len", g->len);
        cJSON_AddNumberToObject(x, "internal", g->internal);
        cJSON_AddNumberToObject(x, "external", g->external);
        cJSON_AddNumberToObject(x, "sensitive", g->sensitive);
        cJSON *rc = cJSON_AddArrayToObject(x, "recompute");
        for (int t = 0; t < g->len; t++)
            if (g->recompute[t]) cJSON_AddItemToArray(rc, cJSON_CreateNumber(g->start + t));
        if (prompt) {
            uint32_t b = enc.start[g->start], e = enc.end[g->start + g->len - 1];
            char *txt = strndup(prompt + b, e - b);
            if (txt) cJSON_AddStringToObject(x, "text", txt);
            free(txt);
        }
        cJSON_AddItemToArray(segs, x);
    }
    cJSON *cuts = cJSON_AddObjectToObject(j, "cuts");
    cJSON_AddNumberToObject(cuts, "sensitive_tokens", res.rows_sensitive);
    cJSON_AddNumberToObject(cuts, "sensitive_attention_rows", res.rows_sens_attention);
    cJSON_AddNumberToObject(cuts, "rejected_tau", (double)res.rejected_tau);
    cJSON_AddNumberToObject(cuts, "rejected_beta", (double)res.rejected_beta);
    cJSON_AddNumberToObject(j, "tokens", T);
    cJSON_AddNumberToObject(j, "runs", res.runs);
    cJSON_AddNumberToObject(j, "tokens_shared", res.tokens_covered);
    cJSON_AddNumberToObject(j, "tokens_recompute", res.tokens_recompute);
    if (json) {
        char *p = cJSON_PrintUnformatted(j);
        if (p) puts(p);
        free(p);
    } else {
        printf("%d tokens, %d runs, %zu segments share %d tokens (%d recomputed on reuse)\n", T, res.runs, res.n,
               res.tokens_covered, res.tokens_recompute);
        printf("cut: %d sensitive tokens, %d rows by sensitive attention; candidates rejected: %ld by tau, %ld by beta\n",
               res.rows_sensitive, res.rows_sens_attention, res.rejected_tau, res.rejected_beta);
        for (size_t k = 0; k < res.n; k++) {
            const cp_annot_segment *g = &res.v[k];
            printf("[%d, %d) internal %.2f external %.2f sensitive %.3f", g->start, g->start + g->len, g->internal,
                   g->external, g->sensitive);
            const cJSON *t = cJSON_GetObjectItem(cJSON_GetArrayItem(segs, (int)k), "text");
            if (t) printf("  \"%.80s%s\"", t->valuestring, strlen(t->valuestring) > 80 ? "..." : "");
            printf("\n");
        }
    }
    cJSON_Delete(j);
    rcode = 0;
done:
    cp_annot_result_free(&res);
    if (have_chain) cp_chain_free(&chain);
    cp_spans_free(&spans);
    cp_encoding_free(&enc);
    cp_tokenizer_free(tok);
    if (m) cp_state_free(m, st);
    cp_model_free(m);
    cp_backend_destroy(be);
    free(mask), free(sel), free(A), free(sm);
    return rcode;
}
