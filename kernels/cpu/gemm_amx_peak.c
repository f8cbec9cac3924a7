/* The AMX tile unit's ceilings (gemm_amx.h, cp_amx_peak): bf16 and int8
 * tile products on registers alone, timed by cpu_peak_rate.  Target
 * attributes only (gemm_amx.c). */
#include "gemm_amx_internal.h"
#include "peak_rate.h"

/* ---- ceilings ---------------------------------------------------------- */

/* The ceilings' tiles: configured, all eight zero (the tile numbers are
 * immediates, so each is named) */
AMX_FN static void peak_tiles_on(void)
{
    tiles_on();
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    _tile_zero(4);
    _tile_zero(5);
    _tile_zero(6);
    _tile_zero(7);
}

/* 6 accumulators (tmm0..5) against tmm6 x tmm7, no loads: the tile
 * multiply unit's throughput.  Zero inputs: the unit's timing does not
 * depend on the values. */
AMX_FN __attribute__((noinline)) static double bf16_peak_loop(long iters)
{
    peak_tiles_on();
    for (long i = 0; i < iters; i++) {
        _tile_dpbf16ps(0, 6, 7);
        _tile_dpbf16ps(1, 6, 7);
        _tile_dpbf16ps(2, 6, 7);
        _tile_dpbf16ps(3, 6, 7);
        _tile_dpbf16ps(4, 6, 7);
        _tile_dpbf16ps(5, 6, 7);
    }
    _tile_release();
    return (double)iters * 6 * 16 * 16 * 32 * 2;
}

AMX_FN __attribute__((noinline)) static double i8_peak_loop(long iters)
{
    peak_tiles_on();
    for (long i = 0; i < iters; i++) {
        _tile_dpbusd(0, 6, 7);
        _tile_dpbusd(1, 6, 7);
        _tile_dpbusd(2, 6, 7);
        _tile_dpbusd(3, 6, 7);
        _tile_dpbusd(4, 6, 7);
        _tile_dpbusd(5, 6, 7);
    }
    _tile_release();
    return (double)iters * 6 * 16 * 16 * 64 * 2;
}

cp_status cp_amx_peak(int threads, double seconds, cp_amx_ceiling *out, cp_error *err)
{
    cp_status s = cp_amx_ready(err);
    if (s) return s;
    if (threads < 1) return cp_fail(err, CP_EINVAL, "amx peak: %d threads", threads);
    out->bf16_flops = cpu_peak_rate(bf16_peak_loop, threads, seconds, 1 << 14, &out->bf16_flops_cpu);
    out->i8_ops = cpu_peak_rate(i8_peak_loop, threads, seconds, 1 << 14, &out->i8_ops_cpu);
    return CP_OK;
}
