/* cacheprune eval-detect: per-type precision / recall / F1 of the detector
 * chain on a labelled PII set (Presidio's synth_dataset_v2.json), at
 * character (byte) level and at token level, printed and written as CSV.
 * The dataset counts code points; we convert its offsets to bytes here, at
 * the edge, as everywhere. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../kernels/fileio.h"
#include "../engine/cli/cli.h"
#include "../engine/json_fields.h"
#include "../engine/detect/detect.h"

/* dataset type -> our type ("" = no built-in recognizer for it) */
static const struct { const char *gold, *ours; } type_map[] = {
    { "EMAIL_ADDRESS", "email" }, { "CREDIT_CARD", "card" },  { "IBAN_CODE", "iban" },       { "US_SSN", "ssn" },
    { "IP_ADDRESS", "ip" },       { "PHONE_NUMBER", "phone" }, { "PERSON", "person" },        { "STREET_ADDRESS", "address" },
    { "DATE_TIME", "dob" },       { "DOMAIN_NAME", "" },       { "ORGANIZATION", "org" },     { "GPE", "location" },
    { "TITLE", "title" },         { "AGE", "age" },               { "NRP", "" },                 { "ZIP_CODE", "" },
    { "US_DRIVER_LICENSE", "" },
};
#define N_TYPES (sizeof type_map / sizeof type_map[0])
#define ANY N_TYPES /* the row that matters for sharing: any gold PII vs any detection */

typedef struct counts {
    long gold_spans;
    long c_tp, c_pred, c_gold; /* characters */
    long t_tp, t_pred, t_gold; /* tokens */
    long t_masked; /* gold tokens of this type under any detection, whatever its type: what sharing sees */
} counts;

static int type_index(const char *gold)
{
    for (size_t i = 0; i < N_TYPES; i++)
        if (strcmp(type_map[i].gold, gold) == 0) return (int)i;
    return -1;
}

/* code point offset -> byte offset in s */
static size_t cp_to_byte(const char *s, size_t len, long cp)
{
    size_t b = 0;
    for (long k = 0; k < cp && b < len; k++) {
        b++;
        while (b < len && ((unsigned char)s[b] & 0xc0) == 0x80) b++;
    }
    return b;
}

/* The free-text PII targets (docs/PII.md): recall under the sharing mask, token level;
 * 0 = no target for the type.  any-PII precision has its own (0.85). */
static double mask_target(const char *gold)
{
    static const struct { const char *gold; double r; } t[] = {
        { "PERSON", 0.90 }, { "STREET_ADDRESS", 0.85 }, { "GPE", 0.85 }, { "ORGANIZATION", 0.75 }, { "ANY", 0.85 },
    };
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++)
        if (strcmp(t[i].gold, gold) == 0) return t[i].r;
    return 0;
}
#define ANY_PRECISION_TARGET 0.85

static double ratio(long a, long b) { return b ? (double)a / (double)b : 0; }
static double f1(double p, double r) { return p + r > 0 ? 2 * p * r / (p + r) : 0; }

/* "0.90 met" / "0.90 NOT met" / "-" */
static const char *verdict(double value, double target, char *buf, size_t cap)
{
    if (target <= 0) return "-";
    snprintf(buf, cap, ">=%.2f %s", target, value >= target ? "met" : "NOT met");
    return buf;
}

/* One row: the mask recall (the target metric) first, then the typed token
 * scores beside it, then the same typed scores at byte level. */
static void f1_row(FILE *f, const char *name, const char *ours, const counts *c, int csv)
{
    double cp = ratio(c->c_tp, c->c_pred), cr = ratio(c->c_tp, c->c_gold);
    double tp = ratio(c->t_tp, c->t_pred), tr = ratio(c->t_tp, c->t_gold);
    double mr = ratio(c->t_masked, c->t_gold);
    if (csv) {
        fprintf(f, "%s,%s,%ld,%.4f,%.4f,%.4f,%.4f,%.4f,%.4f,%.4f\n", name, ours, c->gold_spans, cp, cr, f1(cp, cr), tp, tr,
                f1(tp, tr), mr);
        return;
    }
    char buf[32];
    fprintf(f, "%-18s %-9s %6ld   %6.3f  %-14s %6.3f %6.3f %6.3f   %6.3f %6.3f %6.3f\n", name, *ours ? ours : "-",
            c->gold_spans, mr, verdict(mr, mask_target(strncmp(name, "ANY", 3) == 0 ? "ANY" : name), buf, sizeof buf), tp, tr,
            f1(tp, tr), cp, cr, f1(cp, cr));
}

/* One line per gold span that the sharing mask (any detection) leaves a
 * byte of uncovered, and per detected span with no gold byte: the error
 * analysis behind the recognizers' rules.  The texts are the data set's
 * (synthetic), never a user's. */
/* a span's text on one line: line breaks as spaces */
static void put_flat(FILE *f, const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++) fputc(s[i] == '\n' || s[i] == '\r' || s[i] == '\t' ? ' ' : s[i], f);
    fputc('\n', f);
}

static void write_misses(FILE *f, long item, const char *text, size_t len, const cJSON *gspans, const int *gold,
                         const uint8_t *pred, const cp_spans *sp)
{
    for (const cJSON *g = gspans ? gspans->child : NULL; g; g = g->next) {
        const char *type = cJSON_GetStringValue(cJSON_GetObjectItem(g, "entity_type"));
        if (!type || type_index(type) < 0) continue;
        size_t s = cp_to_byte(text, len, (long)cJSON_GetNumberValue(cJSON_GetObjectItem(g, "start_position")));
        size_t e = cp_to_byte(text, len, (long)cJSON_GetNumberValue(cJSON_GetObjectItem(g, "end_position")));
        size_t hit = 0;
        for (size_t i = s; i < e; i++) hit += pred[i * (N_TYPES + 1) + ANY];
        if (hit < e - s) {
            fprintf(f, "%ld\tMISS\t%s\t%s\t", item, type, hit ? "part" : "none");
            put_flat(f, text + s, e - s);
            if (hit) { /* the bytes left out, each piece after a '|' */
                fputs("\t\t\t\t", f);
                for (size_t i = s; i < e; i++)
                    if (!pred[i * (N_TYPES + 1) + ANY]) {
                        if (i == s || pred[(i - 1) * (N_TYPES + 1) + ANY]) fputc('|', f);
                        fputc(text[i] == '\n' ? ' ' : text[i], f);
                    }
                fputc('\n', f);
            }
        }
    }
    for (size_t k = 0; k < sp->n; k++) {
        int any = 0;
        for (size_t i = sp->v[k].start; i < sp->v[k].end && i < len; i++) any |= gold[i] >= 0;
        if (!any && sp->v[k].end <= len) {
            fprintf(f, "%ld\tFP\t%s\t-\t", item, sp->v[k].type);
            put_flat(f, text + sp->v[k].start, sp->v[k].end - sp->v[k].start);
        }
    }
}

int cli_eval_detect(int argc, char **argv)
{
    cli_detect_opts o = CLI_DETECT_DEFAULTS;
    const char *data = "../shared/data/presidio-synth-pii/synth_dataset_v2.json", *model = "../shared/models/cp-books-6m",
               *csv_path = NULL, *misses_path = NULL;
    int quiet = 0, half = -1; /* -1: all texts, 0: even, 1: odd */
    for (int i = 1; i < argc; i++) {
        int r = cli_parse_detect_opt(argc, argv, &i, &o);
        if (r < 0) return 2;
        if (r > 0) continue;
        const char *a = argv[i], *v;
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            printf("usage: cacheprune eval-detect [--data FILE] [--model DIR] [--csv OUT] [detector options]\n"
                   "  --data FILE       Presidio synth_dataset_v2.json (default ../shared/data/presidio-synth-pii/...)\n"
                   "  --model DIR       tokenizer for the token-level scores (default ../shared/models/cp-books-6m)\n"
                   "  --csv OUT         also write the table as CSV\n"
                   "  --half even|odd   only the even (0, 2, ...) or odd texts: tune on one half, report the other\n"
                   "  --misses OUT      write each gold span the sharing mask misses (MISS) and each detected span\n"
                   "                    with no gold byte (FP) to OUT, one a line, for error analysis\n"
                   "  --quiet-progress  no progress line (shown only when stderr is a terminal)\n"
                   "detector options, as for `cacheprune detect`:\n");
            cli_detect_opts_help(stdout);
            return 0;
        }
        if (strcmp(a, "--quiet-progress") == 0) {
            quiet = 1;
            continue;
        }
        static const char *const with_value[] = { "--data", "--model", "--csv", "--half", "--misses", NULL };
        if (!cli_one_of(a, with_value)) return cli_unknown("eval-detect", a), 2;
        if (!(v = cli_value("eval-detect", argc, argv, &i))) return 2;
        if (strcmp(a, "--data") == 0) data = v;
        else if (strcmp(a, "--model") == 0) model = v;
        else if (strcmp(a, "--misses") == 0) misses_path = v;
        else if (strcmp(a, "--half") == 0) {
            if (strcmp(v, "even") != 0 && strcmp(v, "odd") != 0) {
                cli_error("eval-detect: --half takes even or odd, not %s", v);
                return 2;
            }
            half = v[0] == 'o';
        } else csv_path = v;
    }
    cp_error err = { 0 };
    char *json = NULL;
    cp_tokenizer *tok = NULL;
    if (cp_read_file(data, (size_t)256 << 20, &json, NULL, &err) != CP_OK || cp_tokenizer_load(model, &tok, &err) != CP_OK) {
        cli_error("%s", err.msg);
        free(json);
        return 1;
    }
    cJSON *root = cJSON_Parse(json);
    free(json);
    if (!cJSON_IsArray(root)) {
        cli_error("%s: expected a JSON array of {full_text, spans}", data);
        cJSON_Delete(root);
        cp_tokenizer_free(tok);
        return 1;
    }
    cp_detect_chain chain;
    if (!cli_make_chain(&chain, &o)) {
        cJSON_Delete(root);
        cp_tokenizer_free(tok);
        return 1;
    }
    FILE *mf = NULL;
    if (misses_path && !(mf = fopen(misses_path, "w"))) {
        cli_error("%s: cannot write", misses_path);
        cp_chain_free(&chain);
        cJSON_Delete(root);
        cp_tokenizer_free(tok);
        return 1;
    }
    counts c[N_TYPES + 1];
    memset(c, 0, sizeof c);
    long n_scored = 0, n_tokens = 0;
    long n_items = 0, wholly = 0;
    int rcode = 0;
    /* a plugin detector (a child process per text) can make this minutes long */
    cli_progress pg = { "eval-detect", -1, cli_progress_wanted(quiet) };
    size_t total = (size_t)cJSON_GetArraySize(root);
    for (const cJSON *it = root->child; it && rcode == 0; it = it->next, n_items++) {
        cli_progress_items(&pg, (size_t)n_items, total, "texts");
        const char *text = cJSON_GetStringValue(cJSON_GetObjectItem(it, "full_text"));
        const cJSON *gspans = cJSON_GetObjectItem(it, "spans");
        if (!text || (half >= 0 && (n_items & 1) != half)) continue;
        n_scored++;
        size_t len = strlen(text);
        /* per byte: which gold type (or -1), which of our types were predicted */
        int *gold = malloc((len + 1) * sizeof *gold);
        uint8_t *pred = calloc((len + 1) * (N_TYPES + 1), 1);
        cp_spans sp = { 0 };
        cp_encoding enc = { 0 };
        if (!gold || !pred) rcode = 1;
        for (size_t i = 0; gold && i < len; i++) gold[i] = -1;
        for (const cJSON *g = gspans ? gspans->child : NULL; g && !rcode; g = g->next) {
            int ti = type_index(cJSON_GetStringValue(cJSON_GetObjectItem(g, "entity_type")) ?: "");
            const cJSON *a = cJSON_GetObjectItem(g, "start_position"), *b = cJSON_GetObjectItem(g, "end_position");
            long long ca = 0, cb = 0; /* character offsets, checked before any cast */
            cp_error je = { 0 };
            if (ti < 0) continue; /* a type we do not score */
            /* a bad gold span is an error, never skipped or counted empty:
             * the scores would be of another data set */
            if (cp_json_int_value(a, "start_position", 0, (long long)len, &ca, &je) ||
                cp_json_int_value(b, "end_position", 0, (long long)len, &cb, &je) || ca >= cb) {
                if (!je.msg[0] || ca >= cb) snprintf(je.msg, sizeof je.msg, "start_position %lld is not before end_position %lld", ca, cb);
                cli_error("%s: text %ld: a gold span: %s (offsets are characters in [0, %zu])", data, n_items, je.msg, len);
                rcode = 1;
                break;
            }
            size_t s = cp_to_byte(text, len, (long)ca), e = cp_to_byte(text, len, (long)cb);
            for (size_t i = s; i < e; i++) gold[i] = ti;
            c[ti].gold_spans++;
            c[ANY].gold_spans++;
        }
        if (!rcode && (cp_chain_detect(&chain, text, len, CP_ROLE_USER, &sp, &err) != CP_OK ||
                       cp_tokenize(tok, text, len, 0, &enc, &err) != CP_OK)) {
            cli_error("%s", err.msg);
            rcode = 1;
        }
        wholly += sp.wholly;
        for (size_t k = 0; k < sp.n && !rcode; k++)
            for (size_t t = 0; t < N_TYPES; t++)
                if (*type_map[t].ours && strcmp(type_map[t].ours, sp.v[k].type) == 0)
                    for (size_t i = sp.v[k].start; i < sp.v[k].end && i < len; i++) pred[i * (N_TYPES + 1) + t] = 1;
        for (size_t k = 0; k < sp.n && !rcode; k++) /* any detection, whatever its type */
            for (size_t i = sp.v[k].start; i < sp.v[k].end && i < len; i++) pred[i * (N_TYPES + 1) + ANY] = 1;
        n_tokens += (long)enc.n;
        if (mf && !rcode) write_misses(mf, n_items, text, len, gspans, gold, pred, &sp);
        for (size_t t = 0; t <= N_TYPES && !rcode; t++) {
            for (size_t i = 0; i < len; i++) {
                int g = t == ANY ? gold[i] >= 0 : gold[i] == (int)t, p = pred[i * (N_TYPES + 1) + t];
                c[t].c_gold += g, c[t].c_pred += p, c[t].c_tp += g && p;
            }
            for (size_t k = 0; k < enc.n; k++) { /* a token is gold / predicted if any of its bytes is */
                int g = 0, p = 0, m = 0;
                for (uint32_t i = enc.start[k]; i < enc.end[k]; i++) {
                    g |= t == ANY ? gold[i] >= 0 : gold[i] == (int)t;
                    p |= pred[i * (N_TYPES + 1) + t];
                    m |= pred[i * (N_TYPES + 1) + ANY];
                }
                c[t].t_gold += g, c[t].t_pred += p, c[t].t_tp += g && p, c[t].t_masked += g && m;
            }
        }
        free(gold);
        free(pred);
        cp_spans_free(&sp);
        cp_encoding_free(&enc);
    }
    if (rcode == 0) cli_progress_items(&pg, (size_t)n_items, total, "texts");
    cli_progress_end(&pg);
    if (rcode == 0) {
        printf("detector evaluation on %ld texts (%s%s); %ld failed closed\n", n_scored, data,
               half < 0 ? "" : half ? ", odd half" : ", even half", wholly);
        /* the target metric first: a gold type's tokens under any detection
         * (typed or not) are what sharing keeps private */
        printf("token level.  mask R (the target metric): the share of a gold type's tokens inside the detection\n"
               "mask, whatever type was detected -- what sharing uses.  typed P/R/F1 count only detections of the\n"
               "matching type (secondary); char: the same typed scores per byte.\n");
        printf("%-18s %-9s %6s   %-6s  %-14s %-20s   %s\n", "gold type", "ours", "spans", "mask R", "target",
               "typed P     R     F1", "char P      R     F1");
        for (size_t t = 0; t < N_TYPES; t++) f1_row(stdout, type_map[t].gold, type_map[t].ours, &c[t], 0);
        f1_row(stdout, "ANY (sharing mask)", "any", &c[ANY], 0);
        char rb[32], pb[32];
        double any_r = ratio(c[ANY].t_masked, c[ANY].t_gold), any_p = ratio(c[ANY].t_tp, c[ANY].t_pred);
        printf("any-PII (token level, the sharing mask): recall %.3f (%s), precision %.3f (%s)\n", any_r,
               verdict(any_r, mask_target("ANY"), rb, sizeof rb), any_p, verdict(any_p, ANY_PRECISION_TARGET, pb, sizeof pb));
        /* what sharing loses: on a set with no gold spans (a preset's user
         * turns), this is the whole of the mask's cost */
        printf("tokens with any detection (before mask padding): %ld of %ld (%.2f %%)\n", c[ANY].t_pred, n_tokens,
               n_tokens ? 100.0 * (double)c[ANY].t_pred / (double)n_tokens : 0.0);
        if (csv_path) {
            FILE *f = fopen(csv_path, "w");
            if (!f) {
                cli_error("%s: cannot write", csv_path);
                rcode = 1;
            } else {
                fprintf(f, "gold_type,our_type,gold_spans,char_p,char_r,char_f1,token_p,token_r,token_f1,token_mask_r\n");
                for (size_t t = 0; t < N_TYPES; t++) f1_row(f, type_map[t].gold, type_map[t].ours, &c[t], 1);
                f1_row(f, "ANY", "any", &c[ANY], 1);
                fclose(f);
            }
        }
    }
    if (mf && fclose(mf) != 0 && rcode == 0) {
        cli_error("%s: write failed", misses_path);
        rcode = 1;
    }
    cp_chain_free(&chain);
    cJSON_Delete(root);
    cp_tokenizer_free(tok);
    return rcode;
}
