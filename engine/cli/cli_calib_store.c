/* The automatic calibration's file (cli_calib_store.h). */
#include "cli_calib_store.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../json_fields.h"

#define GRID_FORMAT 2 /* 2: each point has its recompute tail */

void cli_calib_measure(const mode_stats *s, double *hit, double *compute, double *kl, double *greedy, double *rouge)
{
    int q = s->quality_n;
    *hit = s->prompt ? (double)s->hit / (double)s->prompt : 0;
    *compute = s->computed + (s->n_layers ? (double)s->partial_rows / s->n_layers : 0);
    *kl = q ? s->kl_sum / q : 0, *greedy = q ? s->agree_sum / q : 1, *rouge = q ? s->rouge_sum / q : 1;
}

static cJSON *point_json(const cli_calib_point *p)
{
    cJSON *o = cJSON_CreateObject();
    if (!o) return NULL;
    int ok = cJSON_AddStringToObject(o, "recompute_by", cp_recompute_name(p->method, p->by_deviation)) &&
             cJSON_AddNumberToObject(o, "recompute", p->r) && cJSON_AddNumberToObject(o, "k0", p->k0) &&
             cJSON_AddNumberToObject(o, "recompute_tail", p->tail) &&
             cJSON_AddNumberToObject(o, "kl", p->kl) && cJSON_AddNumberToObject(o, "greedy", p->greedy) &&
             cJSON_AddNumberToObject(o, "rouge_l", p->rouge_l) && cJSON_AddNumberToObject(o, "hit_rate", p->hit_rate) &&
             cJSON_AddNumberToObject(o, "compute_tokens", p->compute_tokens);
    if (!ok) cJSON_Delete(o), o = NULL;
    return o;
}

static char *grid_text(const cli_calib_grid *g)
{
    cJSON *o = cJSON_CreateObject(), *a = o ? cJSON_AddArrayToObject(o, "grid") : NULL;
    int ok = a && cJSON_AddNumberToObject(o, "format", GRID_FORMAT) && cJSON_AddStringToObject(o, "model_fingerprint", g->fingerprint) &&
             cJSON_AddStringToObject(o, "sample", g->sample) && cJSON_AddNumberToObject(o, "requests", g->requests) &&
             cJSON_AddNumberToObject(o, "full_tokens", g->full_tokens);
    for (int i = 0; ok && i < g->n; i++) {
        cJSON *p = point_json(&g->pt[i]);
        ok = p && cJSON_AddItemToArray(a, p);
    }
    char *text = ok ? cJSON_Print(o) : NULL;
    cJSON_Delete(o);
    return text;
}

cp_status cli_calib_grid_write(const char *path, const cli_calib_grid *g, cp_error *err)
{
    char *text = grid_text(g), tmp[4200];
    if (!text) return cp_fail(err, CP_ENOMEM, "calibration: out of memory writing %s", path);
    int w = snprintf(tmp, sizeof tmp, "%s.XXXXXX", path);
    int fd = w > 0 && (size_t)w < sizeof tmp ? mkstemp(tmp) : -1;
    FILE *f = fd >= 0 ? fdopen(fd, "w") : NULL;
    if (!f && fd >= 0) close(fd);
    int ok = f && fputs(text, f) >= 0 && fputc('\n', f) != EOF;
    if (f) ok = fclose(f) == 0 && ok;
    free(text);
    if (ok && rename(tmp, path) == 0) return CP_OK;
    if (fd >= 0) unlink(tmp);
    return cp_fail(err, CP_EIO, "calibration: cannot write %s", path);
}

static const char *const top_keys[] = { "format", "model_fingerprint", "sample", "requests", "full_tokens", "grid", NULL };
static const char *const point_keys[] = { "recompute_by", "recompute", "k0", "recompute_tail", "kl", "greedy", "rouge_l", "hit_rate", "compute_tokens", NULL };

static cp_status read_point(const cJSON *o, double full, cli_calib_point *p, cp_error *err)
{
    long long k0 = 0, tail = 0;
    const cJSON *by = cJSON_GetObjectItemCaseSensitive(o, "recompute_by");
    if (!cJSON_IsObject(o)) return cp_fail(err, CP_EFORMAT, "a grid point must be an object");
    cp_status rc = cp_json_known_keys(o, "grid point", point_keys, err);
    if (rc == CP_OK && !cJSON_IsString(by)) rc = cp_fail(err, CP_EFORMAT, "'recompute_by' must be a string");
    if (rc == CP_OK) rc = cp_recompute_from_name(by->valuestring, &p->method, &p->by_deviation, err);
    if (rc == CP_OK) rc = cp_json_real(o, "recompute", 0, 1, -1, &p->r, err);
    if (rc == CP_OK) rc = cp_json_int(o, "k0", 0, 1 << 20, -1, &k0, err);
    if (rc == CP_OK) rc = cp_json_int(o, "recompute_tail", 0, 1 << 20, -1, &tail, err);
    if (rc == CP_OK) rc = cp_json_real(o, "kl", 0, 1e3, -1, &p->kl, err);
    if (rc == CP_OK) rc = cp_json_real(o, "greedy", 0, 1, -1, &p->greedy, err);
    if (rc == CP_OK) rc = cp_json_real(o, "rouge_l", 0, 1, -1, &p->rouge_l, err);
    if (rc == CP_OK) rc = cp_json_real(o, "hit_rate", 0, 1, -1, &p->hit_rate, err);
    if (rc == CP_OK) rc = cp_json_real(o, "compute_tokens", 0, 2 * full + 1, -1, &p->compute_tokens, err);
    if (rc == CP_OK && (p->r < 0 || k0 < 0 || tail < 0 || p->kl < 0 || p->greedy < 0 || p->rouge_l < 0 || p->hit_rate < 0 || p->compute_tokens < 0))
        rc = cp_fail(err, CP_EFORMAT, "every grid point field is required");
    p->k0 = (int)k0, p->tail = (int)tail;
    return rc;
}

static cp_status read_root(const cJSON *o, const char *fingerprint, const char *sample, cli_calib_grid *g, cp_error *err)
{
    long long fmt = 0, req = 0;
    const cJSON *fp = cJSON_GetObjectItemCaseSensitive(o, "model_fingerprint"), *sm = cJSON_GetObjectItemCaseSensitive(o, "sample");
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(o, "grid");
    if (!cJSON_IsObject(o)) return cp_fail(err, CP_EFORMAT, "not a JSON object");
    cp_status rc = cp_json_known_keys(o, "calibration", top_keys, err);
    if (rc == CP_OK) rc = cp_json_int(o, "format", 0, 1 << 20, -1, &fmt, err);
    if (rc == CP_OK && fmt != GRID_FORMAT) rc = cp_fail(err, CP_EFORMAT, "'format' %lld is not %d", fmt, GRID_FORMAT);
    if (rc == CP_OK && !(cJSON_IsString(fp) && strcmp(fp->valuestring, fingerprint) == 0))
        rc = cp_fail(err, CP_EFORMAT, "it was made for another model (its 'model_fingerprint' is not this model's)");
    if (rc == CP_OK && !(cJSON_IsString(sm) && strcmp(sm->valuestring, sample) == 0))
        rc = cp_fail(err, CP_EFORMAT, "it was measured on another sample (its 'sample' is not this one's)");
    if (rc == CP_OK) rc = cp_json_int(o, "requests", 1, 1 << 30, -1, &req, err);
    if (rc == CP_OK) rc = cp_json_real(o, "full_tokens", 1, 1e15, -1, &g->full_tokens, err);
    if (rc == CP_OK && (req < 1 || g->full_tokens < 1)) rc = cp_fail(err, CP_EFORMAT, "'requests' and 'full_tokens' are required");
    int n = cJSON_IsArray(a) ? cJSON_GetArraySize(a) : -1;
    if (rc == CP_OK && (n < 1 || n > CLI_CALIB_MAX_POINTS))
        rc = cp_fail(err, CP_EFORMAT, "'grid' must be an array of 1 to %d points", CLI_CALIB_MAX_POINTS);
    for (int i = 0; rc == CP_OK && i < n; i++)
        if ((rc = read_point(cJSON_GetArrayItem(a, i), g->full_tokens, &g->pt[i], err))) cp_fail_wrap(err, "grid point %d", i);
    if (rc == CP_OK) {
        memcpy(g->fingerprint, fingerprint, 64), memcpy(g->sample, sample, 64);
        g->requests = (int)req, g->n = n;
    }
    return rc;
}

cp_status cli_calib_grid_read(const char *path, const char *fingerprint, const char *sample, cli_calib_grid *g, cp_error *err)
{
    memset(g, 0, sizeof *g);
    cJSON *o = NULL;
    cp_status rc = cp_json_read_strict(path, (size_t)1 << 20, &o, err);
    if (rc == CP_OK) rc = read_root(o, fingerprint, sample, g, err);
    cJSON_Delete(o);
    if (rc) memset(g, 0, sizeof *g);
    return rc;
}

int cli_calib_grid_pick(const cli_calib_grid *g, double kl, double greedy, double rouge)
{
    int best = -1;
    for (int i = 0; i < g->n; i++) {
        const cli_calib_point *p = &g->pt[i];
        if (!(p->kl <= kl && p->greedy >= greedy && p->rouge_l >= rouge)) continue;
        const cli_calib_point *b = best < 0 ? NULL : &g->pt[best];
        if (!b || p->compute_tokens < b->compute_tokens ||
            (p->compute_tokens == b->compute_tokens && (p->r < b->r || (p->r == b->r && p->tail < b->tail))))
            best = i;
    }
    return best;
}
