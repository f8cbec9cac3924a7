/* stories260K in HF layout: a real trained model against Karpathy's
 * published greedy sample (../shared/models/stories260K/reference_greedy.json). */
#include <cjson/cJSON.h>
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>

#include "../engine/sampler.h"
#include "helpers.h"

static int load_reference(int32_t **ids_out)
{
    char path[512];
    shared_path(path, sizeof path, "models/stories260K/reference_greedy.json");
    char *text = read_text(path, NULL);
    cr_assert(text, "cannot read %s", path);
    cJSON *root = cJSON_Parse(text);
    free(text);
    cJSON *ids = cJSON_GetObjectItemCaseSensitive(root, "ids");
    cr_assert(cJSON_IsArray(ids), "%s: no ids array", path);
    int n = cJSON_GetArraySize(ids);
    int32_t *out = malloc((size_t)n * sizeof *out);
    int i = 0;
    for (cJSON *e = ids->child; e; e = e->next) out[i++] = (int32_t)e->valuedouble;
    cJSON_Delete(root);
    *ids_out = out;
    return n;
}

static cp_model *open_stories(cp_backend **be)
{
    char dir[512];
    return load_model_or_die(shared_path(dir, sizeof dir, "models/stories260K-hf"), be);
}

Test(stories260K, teacher_forced_argmax_matches_reference)
{
    int32_t *ref;
    int n = load_reference(&ref);
    cr_assert_geq(n, 256);
    cp_backend *be;
    cp_model *m = open_stories(&be);
    int V = m->cfg.vocab, T = 256;
    cp_error err = { 0 };
    cp_state *s = NULL;
    cr_assert_eq(cp_state_create(m, T, 128, &s, &err), CP_OK, "%s", err.msg);
    float *lg = malloc((size_t)T * V * sizeof(float));
    cr_assert_eq(cp_forward(m, s, ref, NULL, T, CP_LOGITS_ALL, lg, NULL, &err), CP_OK, "%s", err.msg);
    int mismatches = 0;
    for (int i = 0; i + 1 < T; i++) {
        const float *row = lg + (size_t)i * V;
        int best = cp_argmax(row, V);
        if (best == ref[i + 1]) continue;
        /* allowed only where the reference's token is a near-tie */
        float gap = row[best] - row[ref[i + 1]];
        cr_assert(gap < 1e-3f, "position %d: argmax %d, reference %d, logit gap %g", i, best, ref[i + 1], gap);
        mismatches++;
    }
    cr_log_info("stories260K: %d near-tie mismatches in %d positions", mismatches, T - 1);
    free(lg);
    free(ref);
    cp_state_free(m, s);
    cp_model_free(m);
    cp_backend_destroy(be);
}

Test(stories260K, free_running_greedy_reproduces_reference)
{
    int32_t *ref;
    int n = load_reference(&ref);
    cp_backend *be;
    cp_model *m = open_stories(&be);
    int V = m->cfg.vocab;
    cp_error err = { 0 };
    cp_state *s = NULL;
    cr_assert_eq(cp_state_create(m, n, 1, &s, &err), CP_OK, "%s", err.msg);
    float *lg = malloc((size_t)V * sizeof(float));
    int32_t tok = 1; /* BOS, as --prompt-ids 1 */
    cr_assert_eq(ref[0], 1);
    int same = 1;
    for (int i = 1; i < n; i++) {
        cr_assert_eq(cp_forward(m, s, &tok, NULL, 1, CP_LOGITS_LAST, lg, NULL, &err), CP_OK, "%s", err.msg);
        tok = cp_argmax(lg, V);
        if (tok != ref[i]) break;
        same++;
    }
    cr_assert_geq(same, 200, "greedy run reproduces only %d of %d reference ids", same, n);
    free(lg);
    free(ref);
    cp_state_free(m, s);
    cp_model_free(m);
    cp_backend_destroy(be);
}
