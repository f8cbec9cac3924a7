#include <cjson/cJSON.h>
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "../../kernels/fileio.h"
#include "../../kernels/log.h"
#include "../../tokenizer/chat.h"
#include "../request.h"
#include "cli.h"

void cli_error(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs("cacheprune: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
}

/* strtoll and strtod skip leading blanks and take a sign, hex, "nan",
 * "infinity": a number on the command line is a '-' or a digit first, and
 * a float has no 'x' (hex) and is finite */
static int plain_number_start(const char *s)
{
    return s && (isdigit((unsigned char)s[0]) || (s[0] == '-' && (isdigit((unsigned char)s[1]) || s[1] == '.')) || s[0] == '.');
}

int cli_parse_int(const char *opt, const char *s, long long lo, long long hi, long long *out)
{
    char *end = NULL;
    errno = 0;
    long long v = plain_number_start(s) ? strtoll(s, &end, 10) : 0;
    if (!end || end == s || *end || errno || v < lo || v > hi) {
        cli_error("%s: expected an integer in [%lld, %lld], got '%s'", opt, lo, hi, s ? s : "");
        return 0;
    }
    *out = v;
    return 1;
}

int cli_parse_float(const char *opt, const char *s, double lo, double hi, double *out)
{
    char *end = NULL;
    errno = 0;
    double v = plain_number_start(s) && !strpbrk(s, "xX") ? strtod(s, &end) : 0;
    if (!end || end == s || *end || errno || !isfinite(v) || !(v >= lo && v <= hi)) {
        cli_error("%s: expected a number in [%g, %g], got '%s'", opt, lo, hi, s ? s : "");
        return 0;
    }
    *out = v;
    return 1;
}

int cli_parse_ids(const char *opt, const char *s, int32_t **out)
{
    size_t cap = 1;
    for (const char *p = s; *p; p++) cap += *p == ',';
    int32_t *ids = malloc(cap * sizeof *ids);
    if (!ids) {
        cli_error("%s: out of memory", opt);
        return -1;
    }
    int n = 0;
    const char *p = s;
    while (1) {
        char *end;
        errno = 0;
        long v = isdigit((unsigned char)*p) ? strtol(p, &end, 10) : (end = (char *)p, 0); /* no blanks or signs */
        if (end == p || errno || v < 0 || v > INT32_MAX || (*end && *end != ',')) {
            cli_error("%s: expected comma-separated token ids, bad entry %d", opt, n + 1);
            free(ids);
            return -1;
        }
        ids[n++] = (int32_t)v;
        if (!*end) break;
        p = end + 1;
    }
    *out = ids;
    return n;
}

void cli_progress_cb(void *ctx, size_t done, size_t total)
{
    cli_progress *p = ctx;
    if (!p->enabled || total == 0) return;
    int pct = (int)(100.0 * (double)done / (double)total);
    if (pct == p->last_pct) return;
    p->last_pct = pct;
    fprintf(stderr, "\r%s: %3d%% (%.2f / %.2f GB)", p->what, pct, done / 1e9, total / 1e9);
    fflush(stderr);
}

void cli_progress_items(cli_progress *p, size_t done, size_t total, const char *unit)
{
    if (!p->enabled || total == 0) return;
    int pct = (int)(100.0 * (double)done / (double)total);
    if (pct == p->last_pct) return;
    p->last_pct = pct;
    /* erase to the end of the line: the label may be shorter than the last one */
    fprintf(stderr, "\r%s: %3d%% (%zu / %zu %s)\033[K", p->what, pct, done, total, unit);
    fflush(stderr);
}

void cli_progress_end(cli_progress *p)
{
    if (p->enabled && p->last_pct >= 0) fputc('\n', stderr);
}

int cli_progress_wanted(int quiet)
{
    return !quiet && isatty(2);
}

const char *cli_value(const char *cmd, int argc, char **argv, int *i)
{
    if (*i + 1 >= argc) {
        cli_error("%s: %s needs a value (see --help)", cmd, argv[*i]);
        return NULL;
    }
    return argv[++*i];
}

int cli_one_of(const char *a, const char *const *list)
{
    for (; *list; list++)
        if (strcmp(a, *list) == 0) return 1;
    return 0;
}

void cli_unknown(const char *cmd, const char *a)
{
    if (a[0] == '-') cli_error("%s: unknown option '%s' (see --help)", cmd, a);
    else cli_error("%s: unexpected argument '%s' (see --help)", cmd, a);
}

int cli_make_backend(const char *name, cp_backend **out)
{
    cp_error err = { 0 };
    cp_status rc;
    if (strcmp(name, "cpu") == 0) rc = cp_backend_cpu_create(out, &err);
    else if (strcmp(name, "cuda") == 0) rc = cp_backend_cuda_create(out, &err);
    else {
        cli_error("--backend: expected cpu or cuda, got '%s'", name);
        return 0;
    }
    if (rc != CP_OK) {
        cli_error("%s", err.msg);
        return 0;
    }
    return 1;
}

void cli_print_compute(cp_backend *be, FILE *f)
{
    if (cp_log_get_level() < CP_LOG_WARN) return; /* --quiet: errors only */
    char line[1024];
    cp_error err = { 0 };
    if (cp_cpu_compute_line(be, 0, line, sizeof line, &err) == CP_OK) fprintf(f, "%s\n", line);
    else fprintf(f, "compute: %s, %s\n", be->name, be->describe ? be->describe(be) : "its own kernels");
}

int cli_parse_dtype(const char *v, cp_weight_dtype *out)
{
    cp_error err = { 0 };
    if (cp_weight_dtype_from_name(v, out, &err) == CP_OK) return 1;
    cli_error("%s", err.msg);
    return 0;
}

int cli_parse_kv_dtype(const char *v, cp_dtype *out)
{
    if (v && strcmp(v, "f32") == 0) return *out = CP_F32, 1;
    if (v && strcmp(v, "bf16") == 0) return *out = CP_BF16, 1;
    cli_error("--kv-dtype: f32 or bf16, not '%.32s'", v ? v : "");
    return 0;
}

/* Messages from {"messages": [...]} or a bare array; strings stay owned by root. */
int cli_load_chat(const char *path, cJSON **root, cp_message **msgs, size_t *n)
{
    char *text;
    cp_error err = { 0 };
    if (cp_read_file(path, (size_t)64 << 20, &text, NULL, &err) != CP_OK) {
        cli_error("%s", err.msg);
        return 0;
    }
    *root = cJSON_Parse(text);
    free(text);
    const cJSON *arr = cJSON_IsArray(*root) ? *root : cJSON_GetObjectItemCaseSensitive(*root, "messages");
    if (!cJSON_IsArray(arr)) {
        cli_error("%s: expected {\"messages\": [...]} or an array of messages", path);
        return 0;
    }
    *n = (size_t)cJSON_GetArraySize(arr);
    *msgs = calloc(*n + 1, sizeof **msgs);
    if (!*msgs) return 0;
    size_t i = 0;
    for (const cJSON *m = arr->child; m; m = m->next, i++) {
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(m, "role");
        const cJSON *content = cJSON_GetObjectItemCaseSensitive(m, "content");
        if (!cJSON_IsString(role) || !cJSON_IsString(content)) {
            cli_error("%s: message %zu needs string fields 'role' and 'content'", path, i);
            return 0;
        }
        if (cp_role_from_name(role->valuestring, &(*msgs)[i].role, &err) != CP_OK) {
            cli_error("%s: message %zu: %s", path, i, err.msg);
            return 0;
        }
        (*msgs)[i].text = content->valuestring;
        (*msgs)[i].len = strlen(content->valuestring);
    }
    return 1;
}


/* Whether out is one of the model directory's files; its name into name. */
static int model_file_named(const char *model_dir, const char *out, char *name, size_t cap)
{
    DIR *d = model_dir ? opendir(model_dir) : NULL;
    if (!d) return 0;
    int hit = 0;
    char path[4096];
    cp_error err;
    for (struct dirent *e; !hit && (e = readdir(d));) {
        if (e->d_name[0] == '.' || cp_path_join(path, sizeof path, model_dir, e->d_name, &err)) continue;
        if (cp_same_file(path, out)) snprintf(name, cap, "%s", e->d_name), hit = 1;
    }
    closedir(d);
    return hit;
}

int cli_outputs_distinct(const char *cmd, const cli_path *outs, int n_out, const cli_path *ins, int n_in, const char *model_dir)
{
    for (int i = 0; i < n_out; i++) {
        if (!outs[i].path) continue;
        for (int j = 0; j < n_in; j++)
            if (ins[j].path && cp_same_file(outs[i].path, ins[j].path)) {
                cli_error("%s: %s %s is the same file as %s %s: an output may not overwrite an input", cmd, outs[i].opt,
                          outs[i].path, ins[j].opt, ins[j].path);
                return 0;
            }
        for (int j = 0; j < i; j++)
            if (outs[j].path && cp_same_file(outs[i].path, outs[j].path)) {
                cli_error("%s: %s and %s are the same file (%s): each output needs its own", cmd, outs[j].opt, outs[i].opt,
                          outs[i].path);
                return 0;
            }
        char mf[256];
        if (model_file_named(model_dir, outs[i].path, mf, sizeof mf)) {
            cli_error("%s: %s %s is the model's %s: an output may not overwrite an input", cmd, outs[i].opt, outs[i].path, mf);
            return 0;
        }
    }
    return 1;
}

int cli_parse_modes(const char *opt, const char *list, const char **modes, int max, char **buf)
{
    *buf = NULL;
    char *b = strdup(list);
    if (!b) return cli_error("%s: out of memory", opt), -1;
    int n = 0;
    for (char *p = b, *t; p; p = t) {
        t = strchr(p, ',');
        if (t) *t++ = 0;
        cp_sharing sh;
        cp_error err = { 0 };
        if (!*p) {
            cli_error("%s: an empty entry in '%s' (a comma-separated list of sharing modes)", opt, list);
            goto fail;
        }
        if (cp_sharing_from_name(p, &sh, &err) != CP_OK) {
            cli_error("%s: %s", opt, err.msg);
            goto fail;
        }
        for (int i = 0; i < n; i++)
            if (strcmp(modes[i], p) == 0) {
                cli_error("%s: '%s' is named twice", opt, p);
                goto fail;
            }
        if (n == max) {
            cli_error("%s: at most %d modes", opt, max);
            goto fail;
        }
        modes[n++] = p;
    }
    *buf = b;
    return n;
fail:
    free(b);
    return -1;
}

int cli_fits_context(const char *cmd, long long prompt_tokens, long long to_generate, int context)
{
    if (prompt_tokens + to_generate <= context) return 1;
    if (to_generate > 0)
        cli_error("%s: %lld prompt tokens + %lld to generate = %lld, past the model's context of %d tokens "
                  "(max_position_embeddings): refused, not run past what the model was trained on",
                  cmd, prompt_tokens, to_generate, prompt_tokens + to_generate, context);
    else
        cli_error("%s: %lld prompt tokens, past the model's context of %d tokens (max_position_embeddings): refused", cmd,
                  prompt_tokens, context);
    return 0;
}
