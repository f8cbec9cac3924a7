/* The calibration file (cli_calibration.h). */
#include "cli_calibration.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../json_fields.h"

#define CALIBRATION_FORMAT 1

void cli_fingerprint_hex(const cp_model *m, char out[65])
{
    for (int i = 0; i < 32; i++) snprintf(out + 2 * i, 3, "%02x", m->fingerprint[i]);
}

static cJSON *setting_json(const cli_calibration *c)
{
    cJSON *s = cJSON_CreateObject();
    if (!s) return NULL;
    cJSON_AddStringToObject(s, "sharing", cp_sharing_name(c->sharing));
    cJSON_AddStringToObject(s, "segment_kv", cp_segkv_name(c->segment_kv));
    cJSON_AddStringToObject(s, "recompute_by", cp_recompute_name(c->method, c->by_deviation));
    cJSON_AddNumberToObject(s, "recompute", c->r);
    cJSON_AddNumberToObject(s, "k0", c->k0);
    cJSON_AddNumberToObject(s, "tau", c->tau);
    cJSON_AddNumberToObject(s, "gradual_start", c->gradual_start);
    cJSON_AddNumberToObject(s, "deviation_layer", c->deviation_layer);
    cJSON_AddNumberToObject(s, "tail", c->tail);
    cJSON_AddNumberToObject(s, "per_segment", c->per_segment);
    return s;
}

cp_status cli_calibration_write(const char *path, const cli_calibration *c, cp_error *err)
{
    cJSON *o = cJSON_CreateObject(), *meas = cJSON_CreateObject();
    cJSON *set = c->meets ? setting_json(c) : cJSON_CreateNull();
    if (!o || !meas || !set) {
        cJSON_Delete(o), cJSON_Delete(meas), cJSON_Delete(set);
        return cp_fail(err, CP_ENOMEM, "calibration: out of memory writing %s", path);
    }
    cJSON_AddNumberToObject(o, "format", CALIBRATION_FORMAT);
    cJSON_AddStringToObject(o, "model_fingerprint", c->fingerprint);
    cJSON_AddNumberToObject(o, "kl_budget", c->kl_budget);
    cJSON_AddNumberToObject(o, "greedy_min", c->greedy_min);
    cJSON_AddNumberToObject(o, "rouge_min", c->rouge_min);
    cJSON_AddNumberToObject(o, "requests", c->requests);
    cJSON_AddBoolToObject(o, "meets_budget", c->meets);
    cJSON_AddItemToObject(o, "setting", set);
    if (c->meets) {
        cJSON_AddNumberToObject(meas, "kl", c->kl);
        cJSON_AddNumberToObject(meas, "greedy", c->greedy);
        cJSON_AddNumberToObject(meas, "rouge_l", c->rouge_l);
        cJSON_AddNumberToObject(meas, "hit_rate", c->hit_rate);
        cJSON_AddNumberToObject(meas, "compute_tokens", c->compute_tokens);
        cJSON_AddNumberToObject(meas, "ttft_ratio", c->ttft_ratio);
        cJSON_AddItemToObject(o, "measured", meas);
    } else {
        cJSON_Delete(meas);
    }
    char *text = cJSON_Print(o);
    cJSON_Delete(o);
    FILE *f = text ? fopen(path, "w") : NULL;
    int ok = f && fputs(text, f) >= 0 && fputc('\n', f) != EOF;
    if (f) ok = fclose(f) == 0 && ok;
    free(text);
    return ok ? CP_OK : cp_fail(err, CP_EIO, "calibration: cannot write %s", path);
}

static const char *const top_keys[] = { "format", "model_fingerprint", "kl_budget", "greedy_min", "rouge_min", "requests", "meets_budget",
                                        "setting", "measured", NULL };
static const char *const setting_keys[] = { "sharing", "segment_kv", "recompute_by", "recompute", "k0", "tau", "gradual_start",
                                            "deviation_layer", "tail", "per_segment", NULL };
static const char *const measured_keys[] = { "kl", "greedy", "rouge_l", "hit_rate", "compute_tokens", "ttft_ratio", NULL };

/* a required string field */
static cp_status need_string(const cJSON *o, const char *name, const char **out, cp_error *err)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, name);
    if (!cJSON_IsString(v)) return cp_fail(err, CP_EFORMAT, "'%s' must be a string", name);
    *out = v->valuestring;
    return CP_OK;
}

static cp_status read_setting(const cJSON *s, cli_calibration *c, cp_error *err)
{
    const char *sh = NULL, *kv = NULL, *by = NULL;
    long long k0 = -1, layer = -1, tail = 0;
    cp_status rc = cp_json_known_keys(s, "setting", setting_keys, err);
    if (rc == CP_OK) rc = need_string(s, "sharing", &sh, err);
    if (rc == CP_OK) rc = need_string(s, "segment_kv", &kv, err);
    if (rc == CP_OK) rc = need_string(s, "recompute_by", &by, err);
    if (rc == CP_OK) rc = cp_sharing_from_name(sh, &c->sharing, err);
    if (rc == CP_OK) rc = cp_segkv_from_name(kv, &c->segment_kv, err);
    if (rc == CP_OK) rc = cp_recompute_from_name(by, &c->method, &c->by_deviation, err);
    if (rc == CP_OK && c->sharing != CP_SHARE_CACHEPRUNE && c->sharing != CP_SHARE_CHUNK)
        rc = cp_fail(err, CP_EINVAL, "'sharing' %s is not a mode a calibration sets", sh);
    if (rc == CP_OK) rc = cp_json_real(s, "recompute", 0, 1, -1, &c->r, err);
    if (rc == CP_OK) rc = cp_json_int(s, "k0", 0, 1 << 20, -1, &k0, err);
    if (rc == CP_OK) rc = cp_json_real(s, "tau", 0, 1e9, -1, &c->tau, err);
    if (rc == CP_OK) rc = cp_json_real(s, "gradual_start", 1, 100, -1, &c->gradual_start, err);
    if (rc == CP_OK) rc = cp_json_int(s, "deviation_layer", 1, 1024, -1, &layer, err);
    if (rc == CP_OK) rc = cp_json_int(s, "tail", 0, 1 << 20, 0, &tail, err);
    if (rc == CP_OK) rc = cp_json_real(s, "per_segment", 0, 1, 0, &c->per_segment, err);
    if (rc == CP_OK && (c->r < 0 || k0 < 0 || c->tau < 0 || c->gradual_start < 1 || layer < 1))
        rc = cp_fail(err, CP_EFORMAT, "every setting field is required");
    if (rc == CP_OK) c->k0 = (int)k0, c->deviation_layer = (int)layer, c->tail = (int)tail;
    return rc;
}

static cp_status read_measured(const cJSON *m, cli_calibration *c, cp_error *err)
{
    cp_status rc = cp_json_known_keys(m, "measured", measured_keys, err);
    if (rc == CP_OK) rc = cp_json_real(m, "kl", 0, 1e9, 0, &c->kl, err);
    if (rc == CP_OK) rc = cp_json_real(m, "greedy", 0, 1, 0, &c->greedy, err);
    if (rc == CP_OK) rc = cp_json_real(m, "rouge_l", 0, 1, 0, &c->rouge_l, err);
    if (rc == CP_OK) rc = cp_json_real(m, "hit_rate", 0, 1, 0, &c->hit_rate, err);
    if (rc == CP_OK) rc = cp_json_real(m, "compute_tokens", 0, 1e18, 0, &c->compute_tokens, err);
    if (rc == CP_OK) rc = cp_json_real(m, "ttft_ratio", 0, 1e9, 0, &c->ttft_ratio, err);
    return rc;
}

static cp_status read_root(const cJSON *o, cli_calibration *c, cp_error *err)
{
    long long fmt = 0, req = 0;
    const char *fp = NULL;
    if (!cJSON_IsObject(o)) return cp_fail(err, CP_EFORMAT, "not a JSON object");
    cp_status rc = cp_json_known_keys(o, "calibration", top_keys, err);
    if (rc == CP_OK) rc = cp_json_int(o, "format", 0, 1 << 20, -1, &fmt, err);
    if (rc == CP_OK && fmt != CALIBRATION_FORMAT) rc = cp_fail(err, CP_EFORMAT, "'format' %lld is not %d", fmt, CALIBRATION_FORMAT);
    if (rc == CP_OK) rc = need_string(o, "model_fingerprint", &fp, err);
    if (rc == CP_OK && strlen(fp) != 64) rc = cp_fail(err, CP_EFORMAT, "'model_fingerprint' must be 64 hex digits");
    if (rc == CP_OK) memcpy(c->fingerprint, fp, 65);
    if (rc == CP_OK) rc = cp_json_real(o, "kl_budget", 0, 1e9, 0, &c->kl_budget, err);
    if (rc == CP_OK) rc = cp_json_real(o, "greedy_min", 0, 1, 0, &c->greedy_min, err);
    if (rc == CP_OK) rc = cp_json_real(o, "rouge_min", 0, 1, 0, &c->rouge_min, err);
    if (rc == CP_OK) rc = cp_json_int(o, "requests", 0, 1LL << 40, 0, &req, err);
    if (rc == CP_OK) c->requests = (int)(req > 1 << 30 ? 1 << 30 : req);
    const cJSON *meets = cJSON_GetObjectItemCaseSensitive(o, "meets_budget"), *set = cJSON_GetObjectItemCaseSensitive(o, "setting");
    const cJSON *meas = cJSON_GetObjectItemCaseSensitive(o, "measured");
    if (rc == CP_OK && !cJSON_IsBool(meets)) rc = cp_fail(err, CP_EFORMAT, "'meets_budget' must be true or false");
    if (rc == CP_OK) c->meets = cJSON_IsTrue(meets);
    if (rc == CP_OK && c->meets && !cJSON_IsObject(set)) rc = cp_fail(err, CP_EFORMAT, "'setting' must be an object when the budget was met");
    if (rc == CP_OK && !c->meets && set && !cJSON_IsNull(set)) rc = cp_fail(err, CP_EFORMAT, "'setting' must be null when no setting met the budget");
    if (rc == CP_OK && c->meets) rc = read_setting(set, c, err);
    if (rc == CP_OK && meas && !cJSON_IsObject(meas)) rc = cp_fail(err, CP_EFORMAT, "'measured' must be an object");
    if (rc == CP_OK && meas) rc = read_measured(meas, c, err);
    return rc;
}

cp_status cli_calibration_read(const char *path, cli_calibration *c, cp_error *err)
{
    memset(c, 0, sizeof *c);
    cJSON *o = NULL;
    cp_status rc = cp_json_read_strict(path, (size_t)1 << 20, &o, err);
    if (rc == CP_OK) rc = read_root(o, c, err);
    cJSON_Delete(o);
    return rc ? cp_fail_wrap(err, "calibration %s", path) : CP_OK;
}

void cli_calibration_apply(const cli_calibration *c, cp_engine_opts *o)
{
    if (!c->meets) {
        if (o->sharing == CP_SHARE_CHUNK || o->sharing == CP_SHARE_CACHEPRUNE) o->sharing = CP_SHARE_TENANT_PREFIX;
        return;
    }
    o->sharing = c->sharing;
    o->segment_kv = c->segment_kv;
    o->recompute_method = c->method;
    o->recompute_by_deviation = c->by_deviation;
    if (c->sharing == CP_SHARE_CHUNK) o->chunk_recompute = c->r;
    else o->annot.r = c->r;
    o->annot.k0 = c->k0;
    o->annot.tau = c->tau;
    o->gradual_start = c->gradual_start;
    o->deviation_layer = c->deviation_layer;
    o->recompute_tail = c->tail;
    o->recompute_per_segment = c->per_segment;
}

void cli_calibration_describe(const cli_calibration *c, char *out, size_t cap)
{
    if (!c->meets) {
        snprintf(out, cap, "no setting met the budget (KL <= %g, greedy >= %.1f %%, ROUGE-L >= %.3f): prefix-only reuse (tenant-prefix)",
                 c->kl_budget, 100 * c->greedy_min, c->rouge_min);
        return;
    }
    snprintf(out, cap, "%s, segment KV %s, recompute by %s, R %g, k0 %d, tau %g, gradual start %g, deviation layer %d, tail %d, "
                       "R per segment %g "
                       "(measured on %d requests: KL %.4f, greedy %.1f %%, ROUGE-L %.3f)",
             cp_sharing_name(c->sharing), cp_segkv_name(c->segment_kv), cp_recompute_name(c->method, c->by_deviation), c->r, c->k0, c->tau,
             c->gradual_start, c->deviation_layer, c->tail, c->per_segment, c->requests, c->kl, 100 * c->greedy, c->rouge_l);
}
