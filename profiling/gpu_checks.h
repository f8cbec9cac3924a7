/* The device checks, one function per op or end-to-end case: each returns 1
 * when the device (k->gpu) agrees with the CPU reference within the stated
 * tolerance, else 0 with the reason in k->why.  With a CPU backend in the
 * device's place (self_test) they check the harness itself. */
#ifndef CP_GPU_CHECKS_H
#define CP_GPU_CHECKS_H

#include "../kernels/backend.h"

typedef struct check {
    cp_backend *gpu, *cpu;    /* the backend under test; the reference */
    cp_backend *fast, *exact; /* the device's two variants: bf16 weights and GEMM activations (default); f32 (CP_CUDA_GEMM=f32) */
    cp_backend *mma;          /* attention variant 2 (CP_CUDA_ATTN=mma) */
    int act_bf16;             /* the backend under test rounds activations to bf16 in its GEMMs */
    int self_test;
    int failed, passed;
    char why[2048];
} check;

/* Creates the backends (CPU ones in the device's place when self_test);
 * CP_EDEVICE / CP_EUNSUPPORTED when there is no device. */
cp_status gpu_checks_open(check *k, int self_test, cp_error *err);
void gpu_checks_close(check *k);

int t_embed(check *k);
int t_rmsnorm(check *k);
int t_rope(check *k);
int t_swiglu(check *k);
int t_matmul(check *k);
int t_place(check *k);
int t_attention(check *k);
int t_attention_mma(check *k); /* on k->gpu: give it k->mma */
int t_sample(check *k);
int t_annot(check *k, int self_test);
/* a pack (model/pack.h) end to end: logits within nmse_tol of its reference,
 * greedy_ok = tokens before the first difference of greedy_n */
int e2e(check *k, const char *path, double nmse_tol, double *nmse_out, int *greedy_ok, int *greedy_n);
/* placement + reuse prefill equal to a plain prefill */
int t_reuse_prefill(check *k, const char *path, double *nmse_out);
/* several sequences in one cp_forward_batch step equal each alone */
int t_batch_parity(check *k, const char *path, double nmse_tol, double *nmse_out);

#endif
