/* How many token ids a tokenizer.json can produce (1 + the largest id in its
 * model vocab and added tokens).  The sampler never picks an id at or above
 * it: a config's vocab_size may be padded past the tokenizer (Qwen). */
#ifndef CP_ID_LIMIT_H
#define CP_ID_LIMIT_H

#include "../kernels/status.h"

/* CP_EIO when dir has no tokenizer.json; CP_EFORMAT when it is malformed. */
cp_status cp_tokenizer_id_limit(const char *dir, int *n_ids, cp_error *err);

#endif
