#include "cli_engine_opts.h"

#include <ctype.h>
#include <math.h>
#include <openssl/crypto.h>
#include <stdlib.h>
#include <string.h>

#include "cli_calib_default.h"
#include "cli_calibration.h"

void cli_engine_opts_default(cli_engine_opts *o)
{
    memset(o, 0, sizeof *o);
    cp_engine_opts_default(&o->eo);
    o->sharing = "cacheprune";
    o->pool_bytes = (size_t)1 << 30;
    o->dopt = (cli_detect_opts)CLI_DETECT_DEFAULTS;
    o->dtype = CP_WEIGHTS_AUTO;
    o->tier_ttl_s = 86400;
    o->tier_timeout_s = 0.25;
    cli_quality_preset(CLI_QUALITY_DEFAULT, &o->quality_kl, &o->quality_greedy, &o->quality_rouge);
    const char *env = getenv("CACHEPRUNE_CALIBRATION"); /* auto, off or a file; empty: auto */
    if (env && *env) cli_calibration_choice("CACHEPRUNE_CALIBRATION", env, o);
}

int cli_calibration_choice(const char *from, const char *v, cli_engine_opts *o)
{
    if (!v || !*v) return cli_error("%s: auto, off or a calibration file", from), 0;
    o->calibration = NULL, o->calibration_off = 0;
    if (strcmp(v, "off") == 0) o->calibration_off = 1;
    else if (strcmp(v, "auto") != 0) o->calibration = v;
    return 1;
}

/* Decimal digits with an optional fraction, exponent and one K/M/G suffix;
 * strtod alone would also take " 5", "0x10", "nan" and "inf".  The result
 * is whole bytes in [1, 2^60]: 0.4 is not rounded down to a 0-byte budget,
 * 1.5 is not quietly 1 byte,
 * 1e30 is not cast into garbage. */
int cli_parse_bytes(const char *opt, const char *v, size_t *out)
{
    char *end;
    int digits_first = v && (isdigit((unsigned char)v[0]) || (v[0] == '.' && isdigit((unsigned char)v[1])));
    double x = digits_first ? strtod(v, &end) : 0;
    double mul = !digits_first ? 0 : *end == 'K' || *end == 'k' ? 1024.0 : *end == 'M' || *end == 'm' ? 1048576.0
                 : *end == 'G' || *end == 'g' ? 1073741824.0 : 1;
    int suffix_ok = digits_first && (!*end || (mul != 1 && !end[1])) && !strpbrk(v, "xXpP");
    double b = x * mul;
    if (!suffix_ok || !isfinite(b) || b < 1 || b > 1152921504606846976.0 /* 2^60 */ || b != floor(b)) {
        cli_error("%s: expected a whole number of bytes from 1 to 2^60, like 4096, 512M or 2G (K/M/G = 2^10/2^20/2^30), got '%s'", opt, v ? v : "");
        return 0;
    }
    *out = (size_t)b;
    return 1;
}

void cli_engine_opts_usage(FILE *f)
{
    fputs("  --sharing MODE        none, tenant-prefix, global-prefix, chunk, cacheprune (default)\n"
          "  --segment-kv MODE     in-context (default), canonical, strict\n"
          "  --user-text private   keep user text private (default: shared-eligible when not sensitive)\n"
          "  --admit-k K           share a segment once K distinct tenants produced it (default 1)\n"
          "  --chunk-size N        chunk mode (default 512)\n"
          "  --report-reuse        tenants see shared reuse (default: folded into 'computed')\n"
          "  --pool-bytes N        pool budget in bytes (K/M/G suffixes; default 1G)\n"
          "  --detect-memo N       messages of each tenant whose detection its repeats of them reuse, not scanned\n"
          "                        again (a chat history re-sent each turn; keyed by tenant, role and text; each\n"
          "                        tenant's own least recently used out; 1024, 0: off)\n"
          "  --tier redis://HOST:PORT[/DB]  a shared segment tier under the local pool (README \"Tier\");\n"
          "                        --tier-key-file F (required: the key every replica shares, >= 32 bytes,\n"
          "                        e.g. `openssl rand -hex 32`; values are authenticated with it),\n"
          "                        --tier-prefix NAME (cacheprune), --tier-password-file F (AUTH),\n"
          "                        --tier-ttl S (86400), --tier-timeout-ms MS per call (250)\n"
          CLI_DTYPE_USAGE
          CLI_KV_DTYPE_USAGE
          "  --chat-template NAME  plain, chatml, mistral, llama2, llama3 (default: from tokenizer_config.json)\n"
          "  --recompute R --k0 N  recompute the fraction R of the reused tokens and the first N tokens of each\n"
          "                        reused segment (0.85, 2); the stored flags take the top R by external share\n"
          "  --recompute-by M      attention (the stored flags); at request time by K/V deviation:\n"
          "                        deviation (a probe of the layers below L, then R of the reused tokens),\n"
          "                        gradual (CacheBlend: the set shrinks from G x R at layer L to R at the last),\n"
          "                        flagged (R chosen among the stored flags only: a cheaper probe),\n"
          "                        epic (each reused segment's first k0 tokens, the rest of R by deviation;\n"
          "                        the default)\n"
          "  --deviation-layer L   the first layer whose K/V deviation ranks them (1)\n"
          "  --gradual-start G     gradual: the set starts at G x R (2)\n"
          "  --recompute-tail N    request-time methods: also the last N reused tokens of the prompt (0)\n"
          "  --recompute-per-segment X  request-time methods: R + X per reused segment not exact, at most 1 (0)\n"
          "  --calibration FILE    the setting `cacheprune calibrate` chose for this model (it sets --sharing,\n"
          "                        --segment-kv, --recompute-by, --recompute, --k0, --tau, --gradual-start,\n"
          "                        --deviation-layer; none met its budget: prefix-only reuse)\n"
          "  --calibration auto|off  auto (the default; $CACHEPRUNE_CALIBRATION sets it): a cacheprune run\n"
          "                        without the options above uses this model's own calibration, measured\n"
          "                        once on --calib-requests and kept in --state-dir; off: epic R 0.85, k0 2\n"
          "  --state-dir DIR       where automatic calibrations are kept, one file per model and sample\n"
          "                        ($CACHEPRUNE_STATE_DIR, else $XDG_STATE_HOME/cacheprune, else\n"
          "                        ~/.local/state/cacheprune)\n"
          "  --calib-requests FILE  the request log automatic calibration measures on (default: the built-in\n"
          "                        public-domain sample, 64 requests); --calib-sample N: its first N\n"
          "  --quality NAME        the budget automatic calibration meets, against full recompute: high\n"
          "                        (KL <= 0.001, greedy >= 0.97, ROUGE-L >= 0.97), balanced (the default:\n"
          "                        0.002, 0.95, 0.95), fast (0.01, 0.90, 0.90); one bound alone:\n"
          "                        --quality-kl X, --quality-greedy P, --quality-rouge P\n"
          "  detector and annotator options as for `detect` / `annotate` (--rules, --plugin-cmd, --policy,\n"
          "  --mask-pad, --min-len, --tau, --beta, --row-limit)\n",
          f);
}

/* options without a value */
static int parse_flag(const char *a, cli_engine_opts *o)
{
    if (strcmp(a, "--report-reuse") == 0) return o->eo.report_reuse = 1, 1;
    return 0;
}

static int parse_number_opt(const char *a, const char *v, cli_engine_opts *o)
{
    long long k;
    double d;
    cp_engine_opts *eo = &o->eo;
    if (strcmp(a, "--admit-k") == 0) return cli_parse_int(a, v, 1, 8, &k) ? (eo->admit_k = (int)k, 1) : -1;
    if (strcmp(a, "--chunk-size") == 0) return cli_parse_int(a, v, 16, 1 << 20, &k) ? (eo->chunk_size = (int)k, 1) : -1;
    if (strcmp(a, "--min-len") == 0) return cli_parse_int(a, v, 1, 1 << 20, &k) ? (eo->annot.min_len = (int)k, 1) : -1;
    if (strcmp(a, "--k0") == 0) return cli_parse_int(a, v, 0, 1 << 20, &k) ? (eo->annot.k0 = (int)k, 1) : -1;
    if (strcmp(a, "--deviation-layer") == 0) return cli_parse_int(a, v, 1, 1024, &k) ? (eo->deviation_layer = (int)k, 1) : -1;
    if (strcmp(a, "--recompute-tail") == 0) return cli_parse_int(a, v, 0, 1 << 20, &k) ? (eo->recompute_tail = (int)k, 1) : -1;
    if (strcmp(a, "--detect-memo") == 0) return cli_parse_int(a, v, 0, 1 << 20, &k) ? (eo->detect_memo = (int)k, 1) : -1;
    if (strcmp(a, "--recompute-per-segment") == 0) return cli_parse_float(a, v, 0, 1, &d) ? (eo->recompute_per_segment = d, 1) : -1;
    if (strcmp(a, "--gradual-start") == 0) return cli_parse_float(a, v, 1, 100, &d) ? (eo->gradual_start = d, 1) : -1;
    if (strcmp(a, "--tau") == 0) return cli_parse_float(a, v, 0, 1e9, &d) ? (eo->annot.tau = d, 1) : -1;
    if (strcmp(a, "--beta") == 0) return cli_parse_float(a, v, 0, 1, &d) ? (eo->annot.beta = d, 1) : -1;
    if (strcmp(a, "--recompute") == 0) return cli_parse_float(a, v, 0, 1, &d) ? (eo->annot.r = d, 1) : -1;
    if (strcmp(a, "--row-limit") == 0) return cli_parse_float(a, v, 0, 1, &d) ? (eo->annot.row_limit = d, 1) : -1;
    if (strcmp(a, "--pool-bytes") == 0) return cli_parse_bytes(a, v, &o->pool_bytes) ? 1 : -1;
    if (strcmp(a, "--tier-ttl") == 0) return cli_parse_float(a, v, 1, 1e9, &d) ? (o->tier_ttl_s = d, 1) : -1;
    if (strcmp(a, "--tier-timeout-ms") == 0) return cli_parse_float(a, v, 1, 60000, &d) ? (o->tier_timeout_s = d / 1e3, 1) : -1;
    if (strcmp(a, "--calib-sample") == 0) return cli_parse_int(a, v, 1, 1 << 20, &o->calib_sample) ? 1 : -1;
    if (strcmp(a, "--quality-kl") == 0) return cli_parse_float(a, v, 0, 1e9, &o->quality_kl) ? (o->budget_given = 1) : -1;
    if (strcmp(a, "--quality-greedy") == 0) return cli_parse_float(a, v, 0, 1, &o->quality_greedy) ? (o->budget_given = 1) : -1;
    if (strcmp(a, "--quality-rouge") == 0) return cli_parse_float(a, v, 0, 1, &o->quality_rouge) ? (o->budget_given = 1) : -1;
    return 0;
}

static int parse_named_opt(const char *a, const char *v, cli_engine_opts *o)
{
    cp_error err = { 0 };
    if (strcmp(a, "--sharing") == 0) {
        cp_sharing s;
        if (cp_sharing_from_name(v, &s, &err)) return cli_error("%s", err.msg), -1;
        o->sharing = v;
        return 1;
    }
    if (strcmp(a, "--chat-template") == 0) return o->tpl = v, 1;
    if (strcmp(a, "--state-dir") == 0) return o->state_dir = v, 1;
    if (strcmp(a, "--calib-requests") == 0) return o->calib_requests = v, 1;
    if (strcmp(a, "--quality") == 0) {
        if (!cli_quality_preset(v, &o->quality_kl, &o->quality_greedy, &o->quality_rouge))
            return cli_error("--quality: high, balanced or fast, got '%s'", v), -1;
        return o->budget_given = 1;
    }
    if (strcmp(a, "--tier") == 0) {
        cp_tier_url u;
        if (cp_tier_url_parse(v, &u, &err)) return cli_error("%s", err.msg), -1;
        return o->tier = v, 1;
    }
    if (strcmp(a, "--tier-prefix") == 0) return o->tier_prefix = v, 1;
    if (strcmp(a, "--tier-password-file") == 0) return o->tier_password_file = v, 1;
    if (strcmp(a, "--tier-key-file") == 0) return o->tier_key_file = v, 1;
    if (strcmp(a, "--dtype") == 0) return cli_parse_dtype(v, &o->dtype) ? 1 : -1;
    if (strcmp(a, "--kv-dtype") == 0) return cli_parse_kv_dtype(v, &o->eo.kv_dtype) ? 1 : -1;
    if (strcmp(a, "--segment-kv") == 0) return cp_segkv_from_name(v, &o->eo.segment_kv, &err) ? (cli_error("%s", err.msg), -1) : 1;
    if (strcmp(a, "--user-text") == 0) {
        if (strcmp(v, "private") && strcmp(v, "shared")) return cli_error("--user-text: private or shared"), -1;
        o->eo.user_text_private = strcmp(v, "private") == 0;
        return 1;
    }
    if (strcmp(a, "--recompute-by") == 0)
        return cp_recompute_from_name(v, &o->eo.recompute_method, &o->eo.recompute_by_deviation, &err) ? (cli_error("--recompute-by: %s", err.msg), -1) : 1;
    return 0;
}

int cli_parse_engine_opt(int argc, char **argv, int *i, cli_engine_opts *o)
{
    int r = cli_parse_detect_opt(argc, argv, i, &o->dopt);
    if (r) return r;
    const char *a = argv[*i], *v = *i + 1 < argc ? argv[*i + 1] : NULL;
    if (parse_flag(a, o)) return 1;
    static const char *const with_value[] = { "--sharing", "--chat-template", "--segment-kv", "--user-text", "--recompute-by",
                                              "--admit-k", "--chunk-size", "--min-len", "--k0", "--deviation-layer", "--tau",
                                              "--beta", "--recompute", "--row-limit", "--pool-bytes", "--dtype", "--kv-dtype", "--gradual-start",
                                              "--recompute-tail", "--recompute-per-segment", "--calibration", "--detect-memo",
                                              "--tier", "--tier-prefix", "--tier-password-file", "--tier-key-file", "--tier-ttl",
                                              "--tier-timeout-ms", "--state-dir", "--calib-requests", "--calib-sample",
                                              "--quality", "--quality-kl", "--quality-greedy", "--quality-rouge", NULL };
    int known = 0;
    for (int j = 0; with_value[j]; j++) known |= strcmp(a, with_value[j]) == 0;
    if (!known) return 0;
    if (!v) return cli_error("%s needs a value", a), -1;
    (*i)++;
    o->sharing_given |= strcmp(a, "--sharing") == 0;
    static const char *const calibrated[] = { "--segment-kv", "--recompute-by", "--recompute", "--k0", "--tau",
                                              "--gradual-start", "--deviation-layer", "--recompute-tail",
                                              "--recompute-per-segment", NULL };
    for (int j = 0; calibrated[j]; j++) o->quality_given |= strcmp(a, calibrated[j]) == 0;
    if (strcmp(a, "--calibration") == 0) return cli_calibration_choice(a, v, o) ? 1 : -1;
    r = parse_named_opt(a, v, o);
    if (r == 0) r = parse_number_opt(a, v, o);
    return r;
}

int cli_engine_opts_calibrate(cli_engine_opts *o)
{
    if (!o->calibration) return 1;
    if (o->quality_given || o->sharing_given)
        return cli_error("--calibration sets --sharing, --segment-kv, --recompute-by, --recompute, --k0, --tau, --gradual-start "
                         "and --deviation-layer: give it or them"), 0;
    cli_calibration c;
    cp_error err = { 0 };
    if (cli_calibration_read(o->calibration, &c, &err)) return cli_error("%s", err.msg), 0;
    cp_sharing s;
    if (cp_sharing_from_name(o->sharing, &s, &err)) return cli_error("%s", err.msg), 0;
    o->eo.sharing = s;
    cli_calibration_apply(&c, &o->eo);
    o->sharing = cp_sharing_name(o->eo.sharing);
    memcpy(o->calibration_fp, c.fingerprint, sizeof o->calibration_fp);
    char line[512];
    cli_calibration_describe(&c, line, sizeof line);
    fprintf(stderr, "calibration %s: %s\n", o->calibration, line);
    return 1;
}

int cli_calibration_matches(const cli_engine_opts *o, const cp_model *m)
{
    if (!o->calibration) return 1;
    char fp[65];
    cli_fingerprint_hex(m, fp);
    if (strcmp(fp, o->calibration_fp) != 0)
        return cli_error("--calibration %s was made for another model (fingerprint %.12s, this one %.12s)", o->calibration,
                         o->calibration_fp, fp), 0;
    return 1;
}

int cli_tier_open(const cli_engine_opts *o, const cp_model *m, cp_backend *be, cp_tier **out)
{
    *out = NULL;
    if (!o->tier) {
        if (o->tier_prefix || o->tier_password_file || o->tier_key_file)
            return cli_error("--tier-prefix, --tier-password-file and --tier-key-file need --tier"), 0;
        return 1;
    }
    /* refused rather than run with a made-up key: a per-process key would
     * silently share nothing between replicas, a fixed one authenticates
     * nothing */
    if (!o->tier_key_file)
        return cli_error("--tier needs --tier-key-file F: the key every replica on this Redis shares, which authenticates the "
                         "tier's values (make one: openssl rand -hex 32 > F; chmod 600 F)"), 0;
    cp_tier_opts to;
    cp_tier_opts_default(&to);
    cp_error err = { 0 };
    char pw[CP_TIER_PASSWORD_MAX + 1], key[CP_TIER_PASSWORD_MAX + 1];
    if (cp_tier_url_parse(o->tier, &to.url, &err)) return cli_error("%s", err.msg), 0;
    if (o->tier_prefix) to.prefix = o->tier_prefix;
    if (cp_tier_key_read(o->tier_key_file, key, &to.key_len, &err)) return cli_error("%s", err.msg), 0;
    to.key = key;
    if (o->tier_password_file) {
        if (cp_tier_password_read(o->tier_password_file, pw, &to.password_len, &err)) {
            OPENSSL_cleanse(key, sizeof key);
            return cli_error("%s", err.msg), 0;
        }
        to.password = pw;
    }
    to.vocab = (uint32_t)m->cfg.vocab, to.max_pos = (uint32_t)m->cfg.max_pos;
    to.ttl_s = o->tier_ttl_s, to.timeout_s = o->tier_timeout_s;
    to.quota_bytes = o->tier_quota_bytes, to.quota_segments = o->tier_quota_segments;
    if (o->tier_quota_window_s > 0) to.quota_window_s = o->tier_quota_window_s;
    cp_kv_layout l;
    cp_engine_kv_layout_as(m, o->eo.kv_dtype ? o->eo.kv_dtype : CP_F32, &l); /* the tier's values carry it: another dtype's are refused */
    cp_status rc = cp_tier_create(&to, &l, be, out, &err);
    OPENSSL_cleanse(pw, sizeof pw), OPENSSL_cleanse(key, sizeof key); /* the tier keeps its own copies */
    if (rc) return cli_error("%s", err.msg), 0;
    return 1;
}

void cli_tier_close(cp_tier *t)
{
    if (!t) return;
    cp_tier_drain(t, 5.0);
    cp_tier_stats s;
    cp_tier_stats_get(t, &s);
    fprintf(stderr,
            "tier: %llu hits, %llu misses, %llu writes (%llu dropped, %llu kept local), %llu B read, %llu B written, %llu errors, "
            "%llu bad values (%llu failed authentication, %llu out of range), %llu stale, %llu dangling, %.2f ms per lookup\n",
            (unsigned long long)s.hits, (unsigned long long)s.misses, (unsigned long long)s.writes, (unsigned long long)s.write_drops,
            (unsigned long long)s.kept_local, (unsigned long long)s.bytes_read, (unsigned long long)s.bytes_written,
            (unsigned long long)s.errors, (unsigned long long)s.bad_values, (unsigned long long)s.bad_auth,
            (unsigned long long)s.bad_range, (unsigned long long)s.stale, (unsigned long long)s.dangling,
            s.lookup_ms_n ? s.lookup_ms_sum / (double)s.lookup_ms_n : 0.0);
    cp_tier_free(t);
}
