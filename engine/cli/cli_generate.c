/* cacheprune generate: one prompt, prefill then decode, with timings. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../kernels/clock.h"
#include "../../kernels/log.h"
#include "../../model/model.h"
#include "../../kernels/fileio.h"
#include "cli.h"
#include "../request.h"
#include "../sampler.h"

static void usage(FILE *f)
{
    fputs("usage: cacheprune generate --model DIR (--prompt TEXT | --chat FILE.json | --prompt-ids 1,2,3) [options]\n"
          "\n"
          "  --model DIR           HF-layout model directory (config.json, safetensors, tokenizer.json)\n"
          "  --prompt TEXT         prompt text (BOS/EOS added as the tokenizer's post-processor says)\n"
          "  --chat FILE.json      chat messages {\"messages\":[{\"role\":...,\"content\":...}]}\n"
          "  --chat-template NAME  plain, chatml, mistral, llama2, llama3 (default: from tokenizer_config.json)\n"
          "  --prompt-ids LIST     prompt as comma-separated token ids\n"
          "  -n N                  tokens to generate (default 32)\n"
          "  --greedy              argmax decoding (the default)\n"
          "  --temp T              sample at temperature T (0 = greedy)\n"
          "  --top-p P             nucleus sampling mass (default 1 = off)\n"
          "  --top-k K             keep the K most likely tokens (default 0 = off)\n"
          "  --seed S              sampling seed (default 0)\n"
          "  --ignore-eos          keep generating past an end-of-sequence token\n"
          "  --chunk N             prefill at most N tokens per pass (default 512)\n"
          "  --backend B           cpu (default) or cuda\n"
          CLI_DTYPE_USAGE
          CLI_KV_DTYPE_USAGE
          "  --quiet-progress      no loading progress line (shown only when stderr is a terminal)\n"
          "  --json                print {\"ids\":[...],\"text\":...,\"prompt_tokens\":...,\"prefill_ms\":...,\"decode_tok_s\":...}\n"
          "\n"
          "Without --json the text streams to stdout as it is generated (ids when the model has no tokenizer).\n",
          f);
}

typedef struct gen_args {
    const char *model, *backend, *prompt, *chat, *tpl;
    int32_t *prompt_ids;
    int n_prompt_ids;
    long long n_gen, chunk;
    cp_sampler_opts so;
    int json, ignore_eos, quiet_progress;
    cp_weight_dtype dtype;
    cp_dtype kv_dtype;
} gen_args;

static int parse(int argc, char **argv, gen_args *a)
{
    *a = (gen_args){ .backend = "cpu", .n_gen = 32, .chunk = 512, .so = { .temperature = 0, .top_p = 1 }, .dtype = CP_WEIGHTS_AUTO, .kv_dtype = CP_F32 };
    for (int i = 1; i < argc; i++) {
        const char *o = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        double d;
        long long k;
#define NEED_VALUE                                              \
    if (!v) {                                                   \
        cli_error("generate: %s needs a value (see --help)", o); \
        return 0;                                               \
    }                                                           \
    i++;
        if (strcmp(o, "--help") == 0 || strcmp(o, "-h") == 0) {
            usage(stdout);
            exit(0);
        } else if (strcmp(o, "--model") == 0) { NEED_VALUE a->model = v; }
        else if (strcmp(o, "--backend") == 0) { NEED_VALUE a->backend = v; }
        else if (strcmp(o, "--dtype") == 0) { NEED_VALUE if (!cli_parse_dtype(v, &a->dtype)) return 0; }
        else if (strcmp(o, "--kv-dtype") == 0) { NEED_VALUE if (!cli_parse_kv_dtype(v, &a->kv_dtype)) return 0; }
        else if (strcmp(o, "--prompt") == 0) { NEED_VALUE a->prompt = v; }
        else if (strcmp(o, "--chat") == 0) { NEED_VALUE a->chat = v; }
        else if (strcmp(o, "--chat-template") == 0) { NEED_VALUE a->tpl = v; }
        else if (strcmp(o, "--prompt-ids") == 0) {
            NEED_VALUE
            free(a->prompt_ids);
            if ((a->n_prompt_ids = cli_parse_ids(o, v, &a->prompt_ids)) < 0) return 0;
        } else if (strcmp(o, "-n") == 0) { NEED_VALUE if (!cli_parse_int(o, v, 0, 1 << 20, &a->n_gen)) return 0; }
        else if (strcmp(o, "--chunk") == 0) { NEED_VALUE if (!cli_parse_int(o, v, 1, 1 << 20, &a->chunk)) return 0; }
        else if (strcmp(o, "--greedy") == 0) a->so.temperature = 0;
        else if (strcmp(o, "--temp") == 0) { NEED_VALUE if (!cli_parse_float(o, v, 0, 100, &d)) return 0; a->so.temperature = (float)d; }
        else if (strcmp(o, "--top-p") == 0) { NEED_VALUE if (!cli_parse_float(o, v, 1e-6, 1, &d)) return 0; a->so.top_p = (float)d; }
        else if (strcmp(o, "--top-k") == 0) { NEED_VALUE if (!cli_parse_int(o, v, 0, 1 << 22, &k)) return 0; a->so.top_k = (int)k; }
        else if (strcmp(o, "--seed") == 0) { NEED_VALUE if (!cli_parse_int(o, v, 0, INT64_MAX, &k)) return 0; a->so.seed = (uint64_t)k; }
        else if (strcmp(o, "--ignore-eos") == 0) a->ignore_eos = 1;
        else if (strcmp(o, "--json") == 0) a->json = 1;
        else if (strcmp(o, "--quiet-progress") == 0) a->quiet_progress = 1;
        else {
            cli_error("generate: unknown option '%s' (see --help)", o);
            return 0;
        }
#undef NEED_VALUE
    }
    if (!a->model) { cli_error("generate: --model DIR is required"); return 0; }
    if ((a->n_prompt_ids > 0) + (a->prompt != NULL) + (a->chat != NULL) != 1) {
        cli_error("generate: give exactly one of --prompt, --chat and --prompt-ids");
        return 0;
    }
    return 1;
}

/* The prompt's ids, from text, a chat or the given ids. */
static int prompt_ids(const gen_args *a, cp_tokenizer *tok, const cp_error *tok_err, cp_encoding *enc)
{
    cp_error err = { 0 };
    if (a->n_prompt_ids > 0) {
        for (int i = 0; i < a->n_prompt_ids; i++)
            if (cp_encoding_push(enc, a->prompt_ids[i], 0, 0, &err) != CP_OK) return 0;
        return 1;
    }
    if (!tok) {
        cli_error("%s: use --prompt-ids", tok_err->msg[0] ? tok_err->msg : "no tokenizer");
        return 0;
    }
    if (a->prompt) {
        if (cp_tokenize(tok, a->prompt, strlen(a->prompt), CP_TOK_ADD_SPECIAL, enc, &err) == CP_OK) return 1;
        cli_error("--prompt: %s", err.msg);
        return 0;
    }
    cJSON *root = NULL;
    cp_message *msgs = NULL;
    size_t n = 0;
    cp_template tpl;
    cp_prompt p = { 0 };
    int ok = cli_load_chat(a->chat, &root, &msgs, &n);
    if (ok) {
        cp_status rc = a->tpl ? cp_template_from_name(a->tpl, &tpl, &err) : cp_template_detect(tok, &tpl, &err);
        if (rc == CP_OK) rc = cp_chat_render(tok, tpl, msgs, n, 1, &p, &err);
        if (rc != CP_OK) {
            cli_error("%s: %s", a->chat, err.msg);
            ok = 0;
        } else {
            *enc = p.enc; /* take the encoding over */
            p.enc = (cp_encoding){ 0 };
        }
    }
    cp_prompt_free(&p);
    free(msgs);
    cJSON_Delete(root);
    return ok;
}

int cli_generate(int argc, char **argv)
{
    gen_args a;
    if (!parse(argc, argv, &a)) {
        free(a.prompt_ids);
        return 2;
    }
    int rcode = 1;
    cp_error err = { 0 };
    cp_backend *be = NULL;
    cp_model *m = NULL;
    cp_state *s = NULL;
    cp_tokenizer *tok = NULL;
    cp_sampler smp = { 0 };
    cp_encoding prompt = { 0 };
    cp_detok_stream ds;
    cp_detok_stream_init(&ds, NULL, 1);
    float *logits = NULL;
    int32_t *out = NULL;
    char *text = NULL;
    cp_error terr = { 0 };
    /* text needs the tokenizer: a missing directory is said as such, not as a missing tokenizer.json */
    if (a.n_prompt_ids == 0 && cp_model_dir_check(a.model, &err)) { cli_error("%s", err.msg); goto done; }
    if (cp_tokenizer_load(a.model, &tok, &terr) != CP_OK && terr.code != CP_EIO) cp_warn("%s", terr.msg);
    if (!prompt_ids(&a, tok, &terr, &prompt)) goto done;
    if (!cli_make_backend(a.backend, &be)) goto done;
    cli_progress prog = { "loading", -1, cli_progress_wanted(a.quiet_progress) };
    cp_load_opts lo = { cli_progress_cb, &prog, a.dtype };
    cp_status rc = cp_model_load(a.model, be, &lo, &m, &err);
    cli_progress_end(&prog);
    if (rc) { cli_error("%s", err.msg); goto done; }
    const cp_config *c = &m->cfg;
    int n_valid = cp_usable_vocab(m, tok);
    int n_prompt = (int)prompt.n;
    if (n_prompt < 1) { cli_error("generate: the prompt is empty"); goto done; }
    if (!cli_fits_context("generate", n_prompt, a.n_gen, c->max_pos)) goto done;
    int capacity = n_prompt + (int)a.n_gen;
    if ((rc = cp_state_create_kv(m, capacity, (int)a.chunk, a.kv_dtype, &s, &err)) ||
        (rc = cp_sampler_init(&smp, &a.so, n_valid, &err))) {
        cli_error("%s", err.msg);
        goto done;
    }
    logits = malloc((size_t)c->vocab * sizeof(float));
    out = malloc(((size_t)a.n_gen + 1) * sizeof *out);
    if (!logits || !out) { cli_error("out of memory"); goto done; }
    cp_detok_stream_init(&ds, tok, 1);
    int stream = tok && !a.json;

    double t0 = cp_now_ms();
    if ((rc = cp_forward(m, s, prompt.ids, NULL, n_prompt, CP_LOGITS_LAST, logits, NULL, &err))) {
        cli_error("prefill: %s", err.msg);
        goto done;
    }
    double t1 = cp_now_ms();
    int n_out = 0;
    while (n_out < a.n_gen) {
        int32_t next = cp_sample(&smp, logits);
        out[n_out++] = next;
        if (stream) {
            char *piece = NULL;
            if (cp_detok_stream_push(&ds, next, &piece, &err) == CP_OK) {
                fputs(piece, stdout);
                fflush(stdout);
            }
            free(piece);
        }
        if ((!a.ignore_eos && cp_config_is_eos(c, next)) || n_out == a.n_gen) break;
        if ((rc = cp_forward(m, s, &next, NULL, 1, CP_LOGITS_LAST, logits, NULL, &err))) {
            cli_error("decode: %s", err.msg);
            goto done;
        }
    }
    double t2 = cp_now_ms();
    double prefill_ms = t1 - t0, decode_s = (t2 - t1) / 1e3;
    /* n_out tokens took n_out - 1 decode steps (the first came from prefill) */
    double tok_s = n_out > 1 && decode_s > 0 ? (n_out - 1) / decode_s : 0;
    if (a.json) {
        cJSON *j = cJSON_CreateObject(), *ids = cJSON_AddArrayToObject(j, "ids");
        for (int i = 0; i < n_out; i++) cJSON_AddItemToArray(ids, cJSON_CreateNumber(out[i]));
        if (tok && cp_detokenize(tok, out, (size_t)n_out, 1, &text, NULL, &err) == CP_OK) cJSON_AddStringToObject(j, "text", text);
        else cJSON_AddNullToObject(j, "text");
        cJSON_AddNumberToObject(j, "prompt_tokens", n_prompt);
        cJSON_AddNumberToObject(j, "prefill_ms", prefill_ms);
        cJSON_AddNumberToObject(j, "decode_tok_s", tok_s);
        cJSON_AddStringToObject(j, "matmul", be->describe ? be->describe(be) : be->name);
        char *p = cJSON_PrintUnformatted(j);
        if (p) puts(p);
        free(p);
        cJSON_Delete(j);
    } else {
        if (!stream)
            for (int i = 0; i < n_out; i++) printf("%s%d", i ? " " : "", out[i]);
        printf("\n");
        fflush(stdout); /* the text first, then the timings on stderr */
        fprintf(stderr, "prefill: %d tokens in %.1f ms (%.0f tok/s); decode: %d tokens at %.1f tok/s [%s]\n", n_prompt,
                prefill_ms, n_prompt / (prefill_ms / 1e3), n_out, tok_s, be->name);
    }
    rcode = 0;
done:
    free(text);
    free(out);
    free(logits);
    cp_detok_stream_free(&ds);
    cp_sampler_free(&smp);
    if (m) cp_state_free(m, s);
    cp_model_free(m);
    cp_backend_destroy(be);
    cp_tokenizer_free(tok);
    cp_encoding_free(&prompt);
    free(a.prompt_ids);
    return rcode;
}
