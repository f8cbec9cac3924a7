/* Makes what the device check carries: weight packs (model/pack.h) — a
 * fixture with its independent golden outputs, or a real model with a text
 * whose logits and greedy continuation this CPU backend computes as the
 * reference — and reuse plans (`run --plan-out` JSONL) in a plain text form
 * the device's replay driver reads with libc alone:
 *   "CPPLANS 1 <count>\n" then per request "<n> <plan F/R/C...>\n<n ids>\n".
 *   gpu_pack --model DIR --golden golden.safetensors --out FILE
 *   gpu_pack --model DIR --text TEXT [--greedy N] --out FILE
 *   gpu_pack --plans PLANS.jsonl --out FILE */
#include <cjson/cJSON.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../kernels/fileio.h"

#include "../model/pack.h"
#include "../model/safetensors.h"
#include "../tokenizer/tokenizer.h"
#include "bench_args.h"

static int die(const cp_error *err)
{
    fprintf(stderr, "gpu_pack: %s\n", err->msg);
    return 1;
}

static int convert_plans(const char *in, const char *out)
{
    char *text;
    size_t len;
    cp_error err = { 0 };
    if (cp_read_file(in, (size_t)1 << 30, &text, &len, &err)) return die(&err);
    FILE *f = fopen(out, "w");
    if (!f) return fprintf(stderr, "gpu_pack: cannot create %s\n", out), 1;
    int count = 0;
    for (char *line = text; *line; count++) line = strchr(line, '\n') ? strchr(line, '\n') + 1 : line + strlen(line);
    fprintf(f, "CPPLANS 1 %d\n", count);
    int ok = 1, n_line = 0;
    for (char *line = strtok(text, "\n"); line && ok; line = strtok(NULL, "\n"), n_line++) {
        cJSON *j = cJSON_Parse(line);
        const cJSON *ids = j ? cJSON_GetObjectItemCaseSensitive(j, "ids") : NULL, *pl = j ? cJSON_GetObjectItemCaseSensitive(j, "plan") : NULL;
        int n = cJSON_IsArray(ids) ? cJSON_GetArraySize(ids) : -1;
        ok = n > 0 && cJSON_IsString(pl) && strlen(pl->valuestring) == (size_t)n && strspn(pl->valuestring, "FRC") == (size_t)n;
        /* ids are whole numbers in range, as run --plan-in reads them: not -1 or 0 in their place */
        const cJSON *x;
        if (ok) cJSON_ArrayForEach(x, ids) ok = ok && cJSON_IsNumber(x) && x->valuedouble >= 0 && x->valuedouble <= INT32_MAX &&
                                                     x->valuedouble == (double)(int32_t)x->valuedouble;
        if (!ok) {
            fprintf(stderr, "gpu_pack: %s line %d: not a plan line ({\"ids\": [token ids], \"plan\": \"FRC...\"} of equal lengths)\n", in,
                    n_line + 1);
        } else {
            fprintf(f, "%d %s\n", n, pl->valuestring);
            const cJSON *id;
            int k = 0;
            cJSON_ArrayForEach(id, ids) fprintf(f, "%s%d", k++ ? " " : "", (int)id->valuedouble);
            fprintf(f, "\n");
        }
        cJSON_Delete(j);
    }
    free(text);
    if (fclose(f) != 0) ok = 0;
    if (ok) printf("gpu_pack: %d plans -> %s\n", n_line, out);
    return ok ? 0 : 1;
}

int main(int argc, char **argv)
{
    const char *dir = NULL, *golden = NULL, *text = NULL, *out = NULL, *name = NULL, *plans = NULL;
    int n_greedy = 32;
    static const char usage[] = "usage: gpu_pack --model DIR (--golden FILE | --text TEXT [--greedy N]) --out FILE [--name NAME]\n"
                                "       gpu_pack --plans PLANS.jsonl --out FILE\n";
    const int args = bench_args_check(argc, argv);
    if (args) return bench_usage(args, usage);
    for (int i = 1; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "--model") == 0) dir = argv[i + 1];
        else if (strcmp(argv[i], "--golden") == 0) golden = argv[i + 1];
        else if (strcmp(argv[i], "--text") == 0) text = argv[i + 1];
        else if (strcmp(argv[i], "--out") == 0) out = argv[i + 1];
        else if (strcmp(argv[i], "--name") == 0) name = argv[i + 1];
        else if (strcmp(argv[i], "--greedy") == 0) n_greedy = atoi(argv[i + 1]);
        else if (strcmp(argv[i], "--plans") == 0) plans = argv[i + 1];
        else return fprintf(stderr, "gpu_pack: unknown option %s\n", argv[i]), 2;
    }
    if (plans && out) return convert_plans(plans, out);
    if (!dir || !out || !(golden || text) || n_greedy < 1 || n_greedy > 1024) {
        return bench_usage(2, usage);
    }
    cp_error err = { 0 };
    cp_backend *be;
    cp_model *m;
    if (cp_backend_cpu_create(&be, &err) || cp_model_load(dir, be, NULL, &m, &err)) return die(&err);
    cp_pack_extra x = { 0 };
    snprintf(x.name, sizeof x.name, "%s", name ? name : "model");
    const int V = m->cfg.vocab;
    if (golden) {
        st_set *s;
        if (st_open_file(golden, &s, &err)) return die(&err);
        st_tensor *ids = st_find(s, "input_ids"), *lg = st_find(s, "logits"), *gr = st_find(s, "greedy_ids");
        if (!ids || !lg || !gr || lg->numel != ids->numel * (size_t)V) {
            fprintf(stderr, "gpu_pack: %s lacks input_ids / logits / greedy_ids of matching shapes\n", golden);
            return 1;
        }
        x.n_ids = (int)ids->numel, x.n_greedy = (int)gr->numel;
        x.ids = malloc(ids->numel * 4), x.logits = malloc(lg->numel * 4), x.greedy = malloc(gr->numel * 4);
        if (!x.ids || !x.logits || !x.greedy) return fprintf(stderr, "gpu_pack: out of memory\n"), 1;
        if (st_read_i32(ids, x.ids, &err) || st_read_f32(lg, x.logits, &err) || st_read_i32(gr, x.greedy, &err)) return die(&err);
        st_close(s);
    } else {
        cp_tokenizer *tok;
        cp_encoding e = { 0 };
        if (cp_tokenizer_load(dir, &tok, &err) || cp_tokenize(tok, text, strlen(text), CP_TOK_ADD_SPECIAL, &e, &err)) return die(&err);
        x.n_ids = (int)e.n, x.n_greedy = n_greedy;
        x.ids = malloc(e.n * 4), x.logits = malloc(e.n * (size_t)V * 4), x.greedy = malloc((size_t)n_greedy * 4);
        if (!x.ids || !x.logits || !x.greedy) return fprintf(stderr, "gpu_pack: out of memory\n"), 1;
        memcpy(x.ids, e.ids, e.n * 4);
        cp_encoding_free(&e);
        cp_tokenizer_free(tok);
        /* the reference: every position's logits, then greedy decoding */
        cp_state *st;
        float *last = malloc((size_t)V * 4);
        if (!last || cp_state_create(m, x.n_ids + n_greedy, 256, &st, &err) ||
            cp_forward(m, st, x.ids, NULL, x.n_ids, CP_LOGITS_ALL, x.logits, NULL, &err))
            return last ? die(&err) : 1;
        memcpy(last, x.logits + (size_t)(x.n_ids - 1) * V, (size_t)V * 4);
        for (int i = 0; i < n_greedy; i++) {
            int best = 0;
            for (int v = 1; v < V; v++)
                if (last[v] > last[best]) best = v;
            x.greedy[i] = best;
            if (i + 1 < n_greedy && cp_forward(m, st, &x.greedy[i], NULL, 1, CP_LOGITS_LAST, last, NULL, &err)) return die(&err);
        }
        cp_state_free(m, st);
        free(last);
    }
    if (cp_pack_write(out, m, &x, &err)) return die(&err);
    printf("gpu_pack: %s: %d tokens, %d greedy ids -> %s\n", x.name, x.n_ids, x.n_greedy, out);
    cp_pack_extra_free(&x);
    cp_model_free(m);
    cp_backend_destroy(be);
    return 0;
}
