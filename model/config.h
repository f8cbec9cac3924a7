/* config.json of a HF Llama / Mistral / Qwen2 checkpoint. */
#ifndef CP_CONFIG_H
#define CP_CONFIG_H

#include <stdint.h>

#include "../kernels/status.h"

typedef enum cp_arch { CP_ARCH_LLAMA = 1, CP_ARCH_MISTRAL, CP_ARCH_QWEN2 } cp_arch;

#define CP_MAX_EOS 8
#define CP_MAX_LAYERS 1024

typedef struct cp_config {
    cp_arch arch;
    const char *arch_name; /* static string: "LlamaForCausalLM" ... */
    int hidden;            /* hidden_size */
    int intermediate;      /* intermediate_size */
    int n_layers;
    int n_heads;
    int n_kv_heads;
    int head_dim;
    int vocab;
    int max_pos;
    float rms_eps;
    double rope_theta;
    int tie_embeddings;
    int qkv_bias; /* Qwen2 */
    /* Sliding window per layer: 0 = full attention, else W (key j visible to
     * query i when i - W < j <= i). */
    int window[CP_MAX_LAYERS];
    /* Llama-3 rope_scaling (rope_type "llama3"); factor 0 = none */
    struct {
        double factor, low_freq_factor, high_freq_factor;
        int original_max_pos;
    } rope_llama3;
    int bos_id; /* -1 when absent */
    int eos_ids[CP_MAX_EOS];
    int n_eos;
} cp_config;

/* Parses JSON text (`where` names it in messages).  Unknown keys are ignored
 * and listed at debug level; a known key whose value changes the computation
 * in a way we do not implement is a CP_EUNSUPPORTED error naming it. */
cp_status cp_config_parse(const char *json, const char *where, cp_config *cfg, cp_error *err);
cp_status cp_config_load(const char *model_dir, cp_config *cfg, cp_error *err);

/* Per-pair inverse frequencies for RoPE (head_dim/2 values), applying
 * rope_scaling when present. */
void cp_config_rope_inv_freq(const cp_config *cfg, double *inv_freq);

/* 1 when id is one of the config's end-of-sequence tokens (eos_token_id,
 * one id or a list), else 0. */
int cp_config_is_eos(const cp_config *cfg, int id);

#endif
