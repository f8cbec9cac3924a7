#include "id_limit.h"

#include "../kernels/fileio.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>

static int max_id(const cJSON *v, int cur)
{
    if (cJSON_IsNumber(v) && v->valuedouble >= 0 && v->valuedouble < (1 << 30) && (int)v->valuedouble > cur)
        return (int)v->valuedouble;
    return cur;
}

cp_status cp_tokenizer_id_limit(const char *dir, int *n_ids, cp_error *err)
{
    char path[4096], *buf;
    size_t n;
    cp_status rc;
    if ((rc = cp_path_join(path, sizeof path, dir, "tokenizer.json", err)) ||
        (rc = cp_read_file(path, (size_t)64 << 20, &buf, &n, err)))
        return rc;
    cJSON *root = cJSON_ParseWithLength(buf, n);
    free(buf);
    if (!root) return cp_fail(err, CP_EFORMAT, "%s: not well-formed JSON", path);
    int top = -1;
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(root, "model");
    const cJSON *vocab = cJSON_GetObjectItemCaseSensitive(model, "vocab");
    for (const cJSON *e = vocab ? vocab->child : NULL; e; e = e->next) {
        /* BPE vocab: {"piece": id}; Unigram: [["piece", score], ...] by id */
        top = cJSON_IsArray(vocab) ? top + 1 : max_id(e, top);
    }
    const cJSON *added = cJSON_GetObjectItemCaseSensitive(root, "added_tokens");
    for (const cJSON *e = cJSON_IsArray(added) ? added->child : NULL; e; e = e->next)
        top = max_id(cJSON_GetObjectItemCaseSensitive(e, "id"), top);
    cJSON_Delete(root);
    if (top < 0) return cp_fail(err, CP_EFORMAT, "%s: no token ids in model.vocab or added_tokens", path);
    *n_ids = top + 1;
    return CP_OK;
}
