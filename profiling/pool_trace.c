/* The pool's occupancy request by request (whether the pool stays full: with
 * whole-segment eviction an 8 MB f32 pool held only 4.2 MB at the end of a
 * rag-v1 run while the bf16 one was full).
 * Runs the first N requests of a JSONL log through one engine (default
 * options, sharing cacheprune, the built-in detector: the CLI's name list
 * and NER plugin are not loaded) and prints after each: bytes held, the
 * budget, segments, tokens held, inserts, evictions, tail truncations,
 * refusals, the net change in blocks held and the hit rate so far; at the
 * end one summary line (bytes, segments and tokens held, per MB of the
 * budget, and the hit rate: prompt tokens reused or recomputed from the
 * pool).  --whole-eviction evicts whole segments only (no tail-block
 * eviction), for A/B runs of one binary.
 *
 * usage: pool_trace --model DIR --requests FILE [--n N] [--pool-bytes B] [--kv-dtype f32|bf16] [--whole-eviction] [--quiet] */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../engine/detect/detect.h"
#include "../engine/request.h"
#include "../engine/run_lines.h"
#include "../pool/pool.h"
#include "../tokenizer/tokenizer.h"
#include "bench_args.h"

static void check(cp_status rc, const cp_error *err, const char *what)
{
    if (rc) {
        fprintf(stderr, "pool_trace: %s: %s\n", what, err->msg);
        exit(1);
    }
}

int main(int argc, char **argv)
{
    const char *model = NULL, *requests = NULL;
    long n_max = 60;
    size_t budget = (size_t)8 << 20;
    cp_dtype kv = CP_F32;
    int whole = 0, quiet = 0;
    for (int i = 1; i < argc; i++) { /* flags take no value */
        if (strcmp(argv[i], "--whole-eviction") == 0) whole = 1;
        else if (strcmp(argv[i], "--quiet") == 0) quiet = 1;
        else continue;
        memmove(argv + i, argv + i + 1, (size_t)(argc - i - 1) * sizeof *argv);
        argc--, i--;
    }
    static const char usage[] =
        "usage: pool_trace --model DIR --requests FILE [--n N] [--pool-bytes B] [--kv-dtype f32|bf16] [--whole-eviction] [--quiet]\n";
    const int args = bench_args_check(argc, argv);
    if (args) return bench_usage(args, usage);
    for (int i = 1; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "--model") == 0) model = argv[i + 1];
        else if (strcmp(argv[i], "--requests") == 0) requests = argv[i + 1];
        else if (strcmp(argv[i], "--n") == 0) n_max = atol(argv[i + 1]);
        else if (strcmp(argv[i], "--pool-bytes") == 0) budget = (size_t)atoll(argv[i + 1]);
        else if (strcmp(argv[i], "--kv-dtype") == 0) kv = strcmp(argv[i + 1], "bf16") == 0 ? CP_BF16 : CP_F32;
        else return bench_usage(2, usage);
    }
    if (!model || !requests || n_max < 1 || budget == 0) {
        return bench_usage(2, usage);
    }
    setvbuf(stdout, NULL, _IOLBF, 0); /* a line per request as it finishes */
    cp_error err = { 0 };
    cp_backend *be;
    cp_model *m;
    cp_tokenizer *tok;
    cp_load_opts lo = { .dtype = CP_WEIGHTS_AUTO };
    check(cp_backend_cpu_create(&be, &err), &err, "backend");
    check(cp_model_load(model, be, &lo, &m, &err), &err, "load");
    check(cp_tokenizer_load(model, &tok, &err), &err, "tokenizer");
    cp_detect_chain ch;
    cp_detector *d;
    cp_chain_init(&ch);
    check(cp_detector_builtin(&d, &err), &err, "detector");
    check(cp_chain_add(&ch, d, &err), &err, "detector");
    cp_engine_opts eo;
    cp_engine_opts_default(&eo);
    eo.kv_dtype = kv;
    cp_kv_layout l;
    cp_engine_kv_layout_as(m, kv, &l);
    cp_pool_opts po;
    cp_pool_opts_default(&po);
    po.budget_bytes = budget;
    po.whole_eviction = whole;
    cp_pool *pool;
    check(cp_pool_create(&l, be, &po, &pool, &err), &err, "pool");
    cp_engine *e;
    check(cp_engine_create(m, tok, pool, &ch, &eo, &e, &err), &err, "engine");
    cp_tenant_table *ten;
    check(cp_tenant_table_create(&ten, &err), &err, "tenants");
    FILE *f = fopen(requests, "r");
    if (!f) return fprintf(stderr, "pool_trace: cannot open %s\n", requests), 1;
    char *line = NULL;
    size_t cap = 0;
    ssize_t len;
    long i = 0;
    size_t block = cp_kv_block_bytes(&l), biggest = 0, prev_used = 0;
    long long prompt = 0, hit = 0;
    if (!quiet)
        printf("%4s %6s %9s %9s %5s %7s %7s %9s %6s %8s %9s %6s\n", "req", "prompt", "held KB", "budget KB", "segs", "tokens", "inserts",
               "evictions", "trunc", "refused", "net blocks", "hit %");
    while (i < n_max && (len = getline(&line, &cap, f)) > 0) {
        cJSON *j = cJSON_ParseWithLength(line, (size_t)len);
        cp_request req;
        cp_request_msg *msgs = NULL;
        cp_span *spans = NULL;
        char why[256];
        if (!j || !cp_run_request_parse(j, ten, 1, &req, &msgs, &spans, why, sizeof why)) {
            fprintf(stderr, "pool_trace: line %ld: %s\n", i + 1, j ? why : "not JSON");
            return 1;
        }
        req.max_tokens = 1;
        cp_response r;
        check(cp_engine_run(e, &req, &r, &err), &err, "request");
        cp_pool_stats ps;
        cp_pool_stats_get(pool, &ps);
        prompt += r.prompt_tokens;
        hit += r.reused + r.recomputed; /* as `run` counts its hit rate */
        if (!quiet)
            printf("%4ld %6d %9zu %9zu %5zu %7zu %7llu %9llu %6llu %8llu %+9ld %6.1f\n", i + 1, r.prompt_tokens, ps.bytes_used >> 10,
                   ps.bytes_budget >> 10, ps.segments, ps.tokens, (unsigned long long)ps.inserts,
                   (unsigned long long)(ps.evictions_gdsf + ps.evictions_lru + ps.evictions_bucket + ps.evictions_ttl),
                   (unsigned long long)ps.truncations, (unsigned long long)ps.insert_refusals,
                   (long)(ps.bytes_used / block) - (long)(prev_used / block), prompt ? 100.0 * (double)hit / (double)prompt : 0.0);
        prev_used = ps.bytes_used;
        if (ps.bytes_used > biggest) biggest = ps.bytes_used;
        cp_response_free(&r);
        free(msgs), free(spans);
        cJSON_Delete(j);
        i++;
    }
    cp_pool_stats ps;
    cp_pool_stats_get(pool, &ps);
    double mb = (double)budget / (1 << 20);
    if (!quiet) printf("block %zu bytes; most held at once %zu KB of %zu KB\n", block, biggest >> 10, (size_t)(budget >> 10));
    /* one line, key=value, for scripts (profiling/pool_capacity.sh) */
    printf("summary kv=%s eviction=%s budget_bytes=%zu held_bytes=%zu segments=%zu tokens=%zu segments_per_mb=%.2f tokens_per_mb=%.1f "
           "truncations=%llu evictions=%llu requests=%ld hit_rate=%.4f\n",
           kv == CP_BF16 ? "bf16" : "f32", whole ? "whole" : "tail", ps.bytes_budget, ps.bytes_used, ps.segments, ps.tokens,
           (double)ps.segments / mb, (double)ps.tokens / mb, (unsigned long long)ps.truncations,
           (unsigned long long)(ps.evictions_gdsf + ps.evictions_lru + ps.evictions_bucket + ps.evictions_ttl), i,
           prompt ? (double)hit / (double)prompt : 0.0);
    free(line);
    fclose(f);
    cp_engine_free(e);
    cp_pool_free(pool);
    cp_tenant_table_free(ten);
    cp_chain_free(&ch);
    cp_tokenizer_free(tok);
    cp_model_free(m);
    cp_backend_destroy(be);
    return 0;
}
