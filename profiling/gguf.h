/* A GGUF (v3) writer for our HF-layout checkpoints, so llama.cpp runs the
 * same weights as we do in `make bench-llama` (profiling/llama_bench.sh).
 * Only what that benchmark needs: the Qwen2 architecture (its RoPE is the
 * rotate-half form on both sides, so q/k rows are copied unpermuted) and no
 * vocabulary (tokenizer.ggml.model = "none": llama.cpp then takes token ids
 * as they are, which is all a benchmark feeds it).
 *
 * Tensor types: F32 everywhere, or BF16 / Q8_0 for the 2-D matrices with
 * the 1-D norms and biases in F32 (what llama.cpp's own converter and
 * quantizer do).  A matrix whose rows are not a whole number of Q8_0 blocks
 * stays F32. */
#ifndef CP_GGUF_H
#define CP_GGUF_H

#include <stddef.h>
#include <stdint.h>

#include "../kernels/status.h"

/* ggml's type ids (ggml.h enum ggml_type) */
typedef enum cp_gguf_type {
    CP_GGUF_F32 = 0,
    CP_GGUF_F16 = 1,
    CP_GGUF_Q8_0 = 8,
    CP_GGUF_BF16 = 30,
} cp_gguf_type;

#define CP_GGUF_ALIGN 32     /* general.alignment's default; we write it explicitly too */
#define CP_Q8_0_BLOCK 32     /* values per Q8_0 block */
#define CP_Q8_0_BYTES 34     /* f16 scale + 32 int8 */

/* "f32" | "bf16" | "q8_0" -> type; CP_EINVAL naming the value otherwise. */
cp_status cp_gguf_type_from_name(const char *name, cp_gguf_type *out, cp_error *err);

/* IEEE half, round to nearest even (subnormals and overflow to inf included). */
uint16_t cp_gguf_f32_to_f16(float f);

/* n values (a multiple of CP_Q8_0_BLOCK) into n / 32 blocks of 34 bytes, as
 * ggml's quantize_row_q8_0_ref: d = max|x| / 127, q = round(x / d) (x * (1/d)
 * with the unrounded d), d stored as f16. */
void cp_q8_0_quantize(const float *x, size_t n, uint8_t *out);

/* Bytes of one row of ne0 values in type t; 0 when t cannot hold such a row. */
size_t cp_gguf_row_bytes(cp_gguf_type t, int64_t ne0);

/* Writes model_dir's checkpoint (config.json + safetensors) to out_path with
 * its matrices in `type`.  Streams one row at a time: memory stays at a few
 * rows whatever the model's size. */
cp_status cp_gguf_write_model(const char *model_dir, const char *out_path, cp_gguf_type type, cp_error *err);

#endif
