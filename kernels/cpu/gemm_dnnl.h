/* bf16 compute through oneDNN matmul primitives (the CPU backend's amx
 * path, gemm_bf16.h): activations rounded to bf16, weights bf16 as loaded
 * (row-major [out, in], read by oneDNN as the "ba" layout of W^T), f32
 * accumulation and output.  Primitives are cached per shape. */
#ifndef CP_GEMM_DNNL_H
#define CP_GEMM_DNNL_H

#include <stdint.h>

#include "../status.h"

typedef struct cp_dnnl_mm cp_dnnl_mm;

cp_status cp_dnnl_mm_create(cp_dnnl_mm **out, cp_error *err);
void cp_dnnl_mm_destroy(cp_dnnl_mm *g);

/* y[i, 0:out] (row stride ldy) = (accumulate ? y : 0) + bf16(x[i,:]) . W^T */
cp_status cp_dnnl_mm_run(cp_dnnl_mm *g, float *y, int ldy, const float *x, const uint16_t *w, int n, int in, int out,
                        int accumulate, cp_error *err);

/* oneDNN's effective ISA ("avx512_core_amx", ...) and the implementation
 * the last primitive created got ("brg:avx512_core_amx"; "" before any). */
const char *cp_dnnl_mm_isa(void);
const char *cp_dnnl_mm_last_impl(const cp_dnnl_mm *g);

#endif
