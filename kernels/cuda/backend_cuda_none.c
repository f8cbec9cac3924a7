/* Built without CUDA=1: the CUDA backend reports that it is absent. */
#include "../backend.h"

cp_status cp_backend_cuda_create(cp_backend **out, cp_error *err)
{
    *out = NULL;
    return cp_fail(err, CP_EUNSUPPORTED, "this build has no CUDA backend (rebuild with make CUDA=1)");
}

int cp_backend_cuda_device_count(void) { return 0; }
