/* `cacheprune synth`: HF-layout checkpoints with seeded random weights in
 * real shapes, for speed and memory work (never for quality claims). */
#ifndef CP_SYNTH_H
#define CP_SYNTH_H

#include <stddef.h>
#include <stdint.h>

#include "../kernels/status.h"

typedef struct cp_synth_opts {
    const char *shape;         /* tiny, qwen2.5-0.5b, qwen2.5-7b, mistral-7b */
    const char *out_dir;       /* created if absent */
    uint64_t seed;
    const char *tokenizer_dir; /* copy its tokenizer files; NULL = own byte-level tokenizer */
    size_t shard_bytes;        /* split into shards above this size; 0 = 4 GiB */
    void (*progress)(void *ctx, size_t done, size_t total);
    void *progress_ctx;
} cp_synth_opts;

cp_status cp_synth(const cp_synth_opts *o, cp_error *err);
/* Space-separated list of shape names, for --help. */
const char *cp_synth_shape_names(void);

#endif
