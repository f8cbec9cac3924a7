/* AMX availability (gemm_amx.h says what and why): the cpuid and XCR0
 * checks and Linux's permission for the tile data, asked once per
 * process.  The kernels are in gemm_amx_bf16.c, gemm_amx_i8.c,
 * gemm_amx_attn.c and gemm_amx_peak.c, over the driver of
 * gemm_amx_tiles.c; they use target attributes only: the same binary runs
 * on CPUs without AMX, where cp_amx_ready says no and nothing touches a
 * tile. */
#define _DEFAULT_SOURCE /* syscall() for arch_prctl */
#include "gemm_amx.h"

#include <pthread.h>
#include <stdio.h>
#include <sys/syscall.h>
#include <unistd.h>

/* Linux's arch_prctl codes for dynamically enabled state components */
#define CP_ARCH_GET_XCOMP_PERM 0x1022
#define CP_ARCH_REQ_XCOMP_PERM 0x1023
#define CP_XFEATURE_XTILEDATA 18

/* ---- availability ------------------------------------------------------ */

int cp_amx_cpuid_allows(uint32_t leaf1_ecx, uint32_t leaf7_edx, uint64_t xcr0, const uint32_t palette[3], const char **why)
{
    if (!(leaf7_edx >> 24 & 1)) return *why = "cpuid: no AMX-TILE", 0;
    if (!(leaf7_edx >> 22 & 1)) return *why = "cpuid: no AMX-BF16", 0;
    if (!(leaf7_edx >> 25 & 1)) return *why = "cpuid: no AMX-INT8", 0;
    if (!(leaf1_ecx >> 27 & 1)) return *why = "cpuid: OSXSAVE off, the OS does not save extended state", 0;
    if ((xcr0 >> 17 & 3) != 3) return *why = "XCR0: the OS does not enable the tile state (XTILECFG, XTILEDATA)", 0;
    /* palette 1: eax bytes per tile (31:16), ebx max names (31:16) and
     * bytes per row (15:0), ecx max rows (15:0) */
    if ((palette[0] >> 16) < 1024 || (palette[1] >> 16) < 8 || (palette[1] & 0xffff) < 64 || (palette[2] & 0xffff) < 16)
        return *why = "cpuid leaf 0x1d: palette 1 is not 8 tiles of 16 rows x 64 bytes", 0;
    *why = "";
    return 1;
}

static void cpuid2(uint32_t leaf, uint32_t sub, uint32_t r[4])
{
    __asm__ volatile("cpuid" : "=a"(r[0]), "=b"(r[1]), "=c"(r[2]), "=d"(r[3]) : "a"(leaf), "c"(sub));
}

/* The one-time checks and Linux's permission for the tile data: a named,
 * process-wide singleton (the permission is the process's, asked once). */
static struct {
    pthread_once_t once;
    cp_status status;
    char why[160];
} amx_permission = { PTHREAD_ONCE_INIT, CP_EUNSUPPORTED, "not checked" };

static void amx_permission_init(void)
{
    uint32_t r0[4], r1[4], r7[4] = { 0 }, pal[3] = { 0 }, r[4];
    uint64_t xcr0 = 0;
    cpuid2(0, 0, r0);
    cpuid2(1, 0, r1);
    if (r0[0] >= 7) cpuid2(7, 0, r7);
    if (r0[0] >= 0x1d) {
        cpuid2(0x1d, 0, r);
        if (r[0] >= 1) cpuid2(0x1d, 1, r), pal[0] = r[0], pal[1] = r[1], pal[2] = r[2];
    }
    if (r1[2] >> 27 & 1) {
        uint32_t lo, hi;
        __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
        xcr0 = (uint64_t)hi << 32 | lo;
    }
    const char *why;
    if (!cp_amx_cpuid_allows(r1[2], r7[3], xcr0, pal, &why)) {
        snprintf(amx_permission.why, sizeof amx_permission.why, "%s", why);
        return;
    }
    if (syscall(SYS_arch_prctl, CP_ARCH_REQ_XCOMP_PERM, CP_XFEATURE_XTILEDATA) != 0) {
        snprintf(amx_permission.why, sizeof amx_permission.why, "arch_prctl(ARCH_REQ_XCOMP_PERM, XTILEDATA) refused by the kernel");
        return;
    }
    unsigned long granted = 0;
    if (syscall(SYS_arch_prctl, CP_ARCH_GET_XCOMP_PERM, &granted) != 0 || !(granted >> CP_XFEATURE_XTILEDATA & 1)) {
        snprintf(amx_permission.why, sizeof amx_permission.why, "arch_prctl(ARCH_GET_XCOMP_PERM): XTILEDATA not granted");
        return;
    }
    amx_permission.why[0] = 0;
    amx_permission.status = CP_OK;
}

cp_status cp_amx_ready(cp_error *err)
{
    pthread_once(&amx_permission.once, amx_permission_init);
    if (amx_permission.status != CP_OK) return cp_fail(err, amx_permission.status, "AMX tiles unavailable: %s", amx_permission.why);
    return CP_OK;
}
