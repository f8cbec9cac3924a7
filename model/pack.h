/* A flat weight pack: a model's config and tensors (f32, in
 * cp_model_tensor_refs order) behind a short text header, plus the token ids
 * and reference outputs a check compares against.  It exists for the device
 * check, which is built on a machine with only the CUDA toolkit and libc (no
 * cJSON to read config.json or a safetensors header); reading and writing it
 * needs libc alone.  Every field is validated and the file size must match
 * the header exactly. */
#ifndef CP_PACK_H
#define CP_PACK_H

#include <stdint.h>

#include "model.h"

typedef struct cp_pack_extra {
    int32_t *ids;   /* prompt ids */
    int n_ids;
    float *logits;  /* [n_ids, vocab] reference logits at every position, or NULL */
    int32_t *greedy;/* reference greedy continuation */
    int n_greedy;
    char name[64];
} cp_pack_extra;

/* m's weights are read through its backend (any backend). */
cp_status cp_pack_write(const char *path, cp_model *m, const cp_pack_extra *x, cp_error *err);
/* Loads onto be: matrices in be->matrix_dtype, vectors f32. */
cp_status cp_pack_read(const char *path, cp_backend *be, cp_model **out, cp_pack_extra *x, cp_error *err);
void cp_pack_extra_free(cp_pack_extra *x);

#endif
