/* cacheprune serve: the engine behind an OpenAI-compatible HTTP API, one
 * tenant per API key (engine/server/). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../kernels/log.h"
#include "cli.h"
#include "cli_calib_default.h"
#include "cli_engine_opts.h"
#include "../request.h"
#include "../batch/batcher.h"
#include "../server/server.h"
#include "../tenant.h"

static void usage(FILE *f)
{
    fputs("usage: cacheprune serve --model DIR --keys FILE [options]\n"
          "\n"
          "An OpenAI-compatible server: POST /v1/chat/completions, POST /v1/completions, GET /v1/models,\n"
          "POST /v1/cacheprune/purge, GET /health (no key), GET /metrics (operator keys).  Every other request needs\n"
          "'Authorization: Bearer KEY'; the tenant is the key's, never a field of the request.\n"
          "\n"
          "Keys file: one 'KEY TENANT [operator]' a line ('#' comments); a key is 16-512 visible ASCII\n"
          "characters, a tenant 1-256 bytes of UTF-8.\n"
          "\n"
          "  --host ADDR           address to bind (default 127.0.0.1: loopback only)\n"
          "  --port N              port (default 8080; 0 = any free one, printed as 'listening on HOST:PORT')\n"
          "  --served-model-name NAME  the model /v1/models lists (default: the model directory's name)\n"
          "  --max-queue N         requests waiting for the engine before new ones get 429 (default 64)\n"
          "  --per-tenant-queue N  one tenant's queued + running requests before its new ones get 429 (default a\n"
          "                        quarter of --max-queue + --concurrency: one tenant cannot take every place; 0 = no cap)\n"
          "  --tenant-quota-bytes BYTES, --tenant-quota-segments N  what one tenant may insert into the pool per\n"
          "                        quota window (default 0: unlimited); past it the request is served, not stored\n"
          "  --quota-window S      the quota window in seconds (default 60)\n"
          "  --max-body BYTES      largest request body (K/M suffixes; default 1M): larger ones get 413\n"
          "  --max-tokens-cap N    max_tokens above N is lowered to N; absent, it is N or what the context leaves\n"
          "                        after the prompt, if less (default 256)\n"
          "  --max-connections N   open connections at once (default 256); a client past them gets 503 + Retry-After\n"
          "  --max-connections-per-address N  open connections from one client address at once (default a\n"
          "                        quarter of --max-connections; 0 = no cap, e.g. when every client comes\n"
          "                        through one proxy): one address cannot hold every slot\n"
          "  --header-timeout S    a request's headers must arrive within S seconds of its connection's start\n"
          "                        (or of the previous request's end on a kept-alive one); past it the\n"
          "                        connection is closed (default 10): trickling clients cannot hold slots\n"
          "  --body-timeout S      a request's whole body must arrive within S seconds of its headers\n"
          "                        (default 60); past it the connection is closed\n"
          "  --send-timeout S      a connection none of whose bytes move for S seconds is closed (default 30):\n"
          "                        a client that stops reading its answer cannot hold a slot (nor one that\n"
          "                        pauses that long inside its request)\n"
          "  --drain-seconds S     at SIGTERM/SIGINT, how long to wait for requests in flight (default 60)\n"
          "  --concurrency N       requests in flight together, continuously batched: every forward step decodes one\n"
          "                        token of each and carries one prompt's prefill chunk (default 8; 1 = one at a\n"
          "                        time); each tenant's requests in arrival order, the tenant with fewer in flight\n"
          "                        first, never by cache hits; the last free place only for a tenant with none in\n"
          "                        flight\n"
          "  --step-tokens N       tokens one step carries, decode and prefill (default 32, sized on the CPU so a\n"
          "                        step with prefill work takes at most about twice a decode step; must exceed N)\n"
          "  --prefill-tokens N    tokens a step carries when none of its requests decodes: a burst of new prompts,\n"
          "                        or one alone (default 512, the sequential path's chunk; no one's inter-token\n"
          "                        latency waits on such a step)\n"
          "  --kv-budget MB        KV memory the requests in flight may reserve (prompt + max_tokens each; default\n"
          "                        1024); a request waits for room, one that could never fit is refused (400)\n",
          f);
    cli_engine_opts_usage(f);
}

typedef struct serve_opts {
    const char *model, *keys, *name;
    srv_opts so;
    cli_engine_opts eng;
    /* the pool's per-tenant insert quotas (0 = none) */
    size_t quota_bytes;
    long long quota_segments;
    double quota_window_s;
    /* batching (srv_engine's) */
    int concurrency, step_tokens, prefill_tokens;
    size_t kv_bytes;
} serve_opts;

static int parse_serve_opt(const char *a, const char *v, serve_opts *o)
{
    long long k;
    double d;
    if (strcmp(a, "--model") == 0) return o->model = v, 1;
    if (strcmp(a, "--keys") == 0) return o->keys = v, 1;
    if (strcmp(a, "--host") == 0) return o->so.host = v, 1;
    if (strcmp(a, "--served-model-name") == 0) {
        if (!*v || strlen(v) > SRV_MODEL_NAME_MAX) return cli_error("--served-model-name: 1 to %d bytes", SRV_MODEL_NAME_MAX), 0;
        return o->name = v, 1;
    }
    if (strcmp(a, "--port") == 0) return cli_parse_int(a, v, 0, 65535, &k) ? (o->so.port = (int)k, 1) : 0;
    if (strcmp(a, "--per-tenant-queue") == 0)
        return cli_parse_int(a, v, 0, 1 << 20, &k) ? (o->so.per_tenant_queue = (size_t)k, 1) : 0;
    if (strcmp(a, "--tenant-quota-bytes") == 0) return cli_parse_bytes(a, v, &o->quota_bytes);
    if (strcmp(a, "--tenant-quota-segments") == 0) return cli_parse_int(a, v, 0, 1LL << 31, &o->quota_segments);
    if (strcmp(a, "--quota-window") == 0) return cli_parse_float(a, v, 0.001, 86400 * 365.0, &o->quota_window_s);
    if (strcmp(a, "--max-queue") == 0) return cli_parse_int(a, v, 1, 1 << 20, &k) ? (o->so.max_queue = (size_t)k, 1) : 0;
    if (strcmp(a, "--max-tokens-cap") == 0) return cli_parse_int(a, v, 1, 1 << 20, &k) ? (o->so.http.max_tokens_cap = (int)k, 1) : 0;
    if (strcmp(a, "--max-connections") == 0)
        return cli_parse_int(a, v, 1, 1 << 16, &k) ? (o->so.http.max_connections = (unsigned)k, 1) : 0;
    if (strcmp(a, "--max-connections-per-address") == 0)
        return cli_parse_int(a, v, 0, 1 << 16, &k) ? (o->so.http.max_per_address = (unsigned)k, 1) : 0;
    if (strcmp(a, "--header-timeout") == 0) return cli_parse_float(a, v, 0.01, 86400, &o->so.http.header_timeout_s);
    if (strcmp(a, "--body-timeout") == 0) return cli_parse_float(a, v, 0.01, 86400, &o->so.http.body_timeout_s);
    if (strcmp(a, "--send-timeout") == 0) return cli_parse_float(a, v, 1, 86400, &o->so.http.send_timeout_s);
    if (strcmp(a, "--max-body") == 0) return cli_parse_bytes(a, v, &o->so.http.max_body);
    if (strcmp(a, "--concurrency") == 0) return cli_parse_int(a, v, 1, 4096, &k) ? (o->concurrency = (int)k, 1) : 0;
    if (strcmp(a, "--step-tokens") == 0) return cli_parse_int(a, v, 2, 1 << 16, &k) ? (o->step_tokens = (int)k, 1) : 0;
    if (strcmp(a, "--prefill-tokens") == 0) return cli_parse_int(a, v, 2, 1 << 16, &k) ? (o->prefill_tokens = (int)k, 1) : 0;
    if (strcmp(a, "--kv-budget") == 0) return cli_parse_int(a, v, 1, 1 << 20, &k) ? (o->kv_bytes = (size_t)k << 20, 1) : 0;
    if (strcmp(a, "--drain-seconds") == 0) return cli_parse_float(a, v, 0, 86400, &d) ? (o->so.drain_s = d, 1) : 0;
    cli_error("serve: unknown option '%s' (see --help)", a);
    return 0;
}

/* 1 to go on, 0 on --help, -1 on a bad command line */
static int parse_args(int argc, char **argv, serve_opts *o)
{
    for (int i = 1; i < argc; i++) {
        int r = cli_parse_engine_opt(argc, argv, &i, &o->eng);
        if (r < 0) return -1;
        if (r > 0) continue;
        const char *a = argv[i];
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) return usage(stdout), 0;
        if (i + 1 >= argc) return cli_error("serve: unknown option or missing value '%s' (see --help)", a), -1;
        if (!parse_serve_opt(a, argv[++i], o)) return -1;
    }
    if (!o->model || !o->keys) return cli_error("serve: --model and --keys are required (see --help)"), -1;
    srv_http_opts *h = &o->so.http;
    if (h->max_per_address == SRV_MAX_PER_ADDRESS_UNSET) h->max_per_address = h->max_connections / 4 ? h->max_connections / 4 : 1;
    if (o->so.per_tenant_queue == SRV_PER_TENANT_QUEUE_UNSET) { /* a quarter of what the server holds at once */
        const size_t held = o->so.max_queue + (size_t)(o->concurrency > 0 ? o->concurrency : 1);
        o->so.per_tenant_queue = held / 4 ? held / 4 : 1;
    }
    return 1;
}

/* The model directory's last component: what /v1/models lists by default. */
static const char *dir_name(const char *path, char *buf, size_t cap)
{
    size_t n = strlen(path);
    while (n > 1 && path[n - 1] == '/') n--;
    size_t b = n;
    while (b > 0 && path[b - 1] != '/') b--;
    snprintf(buf, cap, "%.*s", (int)(n - b), path + b);
    return buf;
}

typedef struct serve_state {
    cp_backend *be;
    cp_model *m;
    cp_tokenizer *tok;
    cp_detect_chain chain;
    int have_chain;
    cp_pool *pool;
    cp_engine *engine;
    cp_tenant_table *tenants;
    srv_keys *keys;
    cp_tier *tier; /* --tier: NULL without */
} serve_state;

/* every tenant of the keys file into the tier's private key spaces */
static int bind_tenant(void *ctx, uint32_t id, const char *name, size_t len)
{
    cp_error err = { 0 };
    if (cp_tier_bind_tenant(ctx, id, name, len, &err)) return cli_error("serve: %s", err.msg), 1;
    return 0;
}

static void close_state(serve_state *s)
{
    cp_engine_free(s->engine);
    cli_tier_close(s->tier); /* pending writes drained (bounded) */
    cp_pool_free(s->pool);
    if (s->have_chain) cp_chain_free(&s->chain);
    srv_keys_free(s->keys);
    cp_tenant_table_free(s->tenants);
    cp_tokenizer_free(s->tok);
    cp_model_free(s->m);
    cp_backend_destroy(s->be);
}

/* Keys, model, detector, pool, engine: each failure is one line. */
static int open_state(serve_opts *o, serve_state *s)
{
    cp_error err = { 0 };
    cli_engine_opts *eo = &o->eng;
    if (cp_tenant_table_create(&s->tenants, &err) || srv_keys_load(o->keys, s->tenants, &s->keys, &err))
        return cli_error("serve: %s", err.msg), 0;
    if (!cli_engine_opts_calibrate(eo)) return 0;
    if (cp_sharing_from_name(eo->sharing, &eo->eo.sharing, &err)) return cli_error("%s", err.msg), 0;
    eo->eo.mask_pad = eo->dopt.mask_pad;
    if (!cli_make_backend("cpu", &s->be)) return 0;
    cp_load_opts lo = { .dtype = eo->dtype };
    if (cp_model_load(o->model, s->be, &lo, &s->m, &err) || cp_tokenizer_load(o->model, &s->tok, &err))
        return cli_error("serve: %s", err.msg), 0;
    cli_print_compute(s->be, stderr);
    if (!cli_calibration_matches(eo, s->m)) return 0;
    if (eo->tpl ? cp_template_from_name(eo->tpl, &eo->eo.tpl, &err) : cp_template_detect(s->tok, &eo->eo.tpl, &err))
        return cli_error("serve: %s", err.msg), 0;
    if (!cli_make_chain(&s->chain, &eo->dopt)) return 0;
    s->have_chain = 1;
    /* without a calibration file or the knobs it sets: this model's own (cli_calib_default.h) */
    if (!cli_calib_default(eo, eo->eo.sharing == CP_SHARE_CACHEPRUNE, s->m, s->tok, &s->chain, &eo->eo, 1)) return 0;
    eo->sharing = cp_sharing_name(eo->eo.sharing);
    if (eo->eo.sharing != CP_SHARE_NONE) {
        cp_kv_layout l;
        cp_engine_kv_layout_as(s->m, eo->eo.kv_dtype ? eo->eo.kv_dtype : CP_F32, &l);
        cp_pool_opts po;
        cp_pool_opts_default(&po);
        po.budget_bytes = eo->pool_bytes;
        po.quota_bytes = o->quota_bytes, po.quota_segments = (uint32_t)o->quota_segments;
        if (o->quota_window_s > 0) po.quota_window_s = o->quota_window_s;
        if (cp_pool_create(&l, s->m->be, &po, &s->pool, &err)) return cli_error("serve: %s", err.msg), 0;
    }
    if (cp_engine_create(s->m, s->tok, s->pool, &s->chain, &eo->eo, &s->engine, &err)) return cli_error("serve: %s", err.msg), 0;
    eo->tier_quota_bytes = o->quota_bytes, eo->tier_quota_segments = (uint32_t)o->quota_segments;
    eo->tier_quota_window_s = o->quota_window_s;
    if (!cli_tier_open(eo, s->m, s->be, &s->tier)) return 0;
    if (s->tier && eo->eo.sharing != CP_SHARE_NONE) {
        if (cp_tenant_each(s->tenants, bind_tenant, s->tier)) return 0;
        cp_engine_set_tier(s->engine, s->tier);
    }
    return 1;
}

int cli_serve(int argc, char **argv)
{
    serve_opts o = { .so = { .host = "127.0.0.1", .port = 8080, .max_queue = 64, .per_tenant_queue = SRV_PER_TENANT_QUEUE_UNSET, .drain_s = 60,
                             .http = { .max_body = (size_t)1 << 20, .max_tokens_cap = 256, .max_connections = 256,
.max_per_address = SRV_MAX_PER_ADDRESS_UNSET, .header_timeout_s = SRV_HEADER_TIMEOUT_DEFAULT,
                                       .body_timeout_s = SRV_BODY_TIMEOUT_DEFAULT, .send_timeout_s = SRV_SEND_TIMEOUT_DEFAULT } },
                     .concurrency = SRV_CONCURRENCY_DEFAULT, .step_tokens = CP_BATCH_STEP_TOKENS_CPU,
                     .prefill_tokens = CP_BATCH_PREFILL_TOKENS, .kv_bytes = SRV_KV_BYTES_DEFAULT };
    cli_engine_opts_default(&o.eng);
    int r = parse_args(argc, argv, &o);
    if (r <= 0) return r == 0 ? 0 : 2;
    cp_error err = { 0 };
    /* before the model loads: OpenMP's threads must inherit the mask */
    if (srv_block_signals(&err)) return cli_error("%s", err.msg), 1;
    serve_state s = { 0 };
    char name[SRV_MODEL_NAME_MAX + 1];
    o.so.http.served_name = o.name ? o.name : dir_name(o.model, name, sizeof name);
    int code = 1;
    if (open_state(&o, &s)) {
        srv_engine eng = { .engine = s.engine, .pool = s.pool, .chain = &s.chain, .report_reuse = o.eng.eo.report_reuse,
                           .concurrency = o.concurrency, .step_tokens = o.step_tokens, .prefill_tokens = o.prefill_tokens,
                           .kv_bytes = o.kv_bytes };
        o.so.http.tenants = s.tenants;
        o.so.n_tenants = (uint32_t)cp_tenant_count(s.tenants);
        o.so.tier = s.tier;
        cp_info("serve: %zu keys, %zu tenants, sharing %s, %d in flight, %d tokens a step (%d with no one decoding)",
                srv_keys_count(s.keys), cp_tenant_count(s.tenants), o.eng.sharing, o.concurrency, o.step_tokens, o.prefill_tokens);
        if (srv_serve(&o.so, &eng, s.keys, stdout, &err)) cli_error("%s", err.msg);
        else code = 0;
    }
    close_state(&s);
    return code;
}
