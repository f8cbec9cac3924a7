#include "status.h"

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* zeroes n bytes the compiler cannot drop as dead stores (this file links
 * into the device check, which has no libcrypto) */
static void wipe(void *p, size_t n)
{
    volatile unsigned char *v = p;
    while (n--) *v++ = 0;
}

cp_status cp_fail(cp_error *err, cp_status code, const char *fmt, ...)
{
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err->msg, sizeof err->msg, fmt, ap);
        va_end(ap);
        err->code = code;
    }
    return code;
}

cp_status cp_fail_wrap(cp_error *err, const char *fmt, ...)
{
    if (!err) return CP_EINVAL;
    char prefix[CP_ERR_MSG_MAX], old[CP_ERR_MSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    memcpy(old, err->msg, sizeof old);
    /* both halves are bounded; the result is cut at the buffer's end */
    size_t n = strlen(prefix);
    if (n > sizeof err->msg - 3) n = sizeof err->msg - 3;
    memcpy(err->msg, prefix, n);
    memcpy(err->msg + n, ": ", 2);
    size_t rest = sizeof err->msg - n - 3, m = strlen(old);
    if (m > rest) m = rest;
    memcpy(err->msg + n + 2, old, m);
    err->msg[n + 2 + m] = 0;
    /* a message may quote what a request sent (a role, a field): no copy
     * stays behind on the stack of a thread that lives on */
    wipe(old, sizeof old);
    wipe(prefix, sizeof prefix);
    return err->code;
}

const char *cp_status_name(cp_status s)
{
    switch (s) {
    case CP_OK: return "ok";
    case CP_EINVAL: return "invalid argument";
    case CP_EIO: return "i/o error";
    case CP_EFORMAT: return "format error";
    case CP_EUNSUPPORTED: return "unsupported";
    case CP_ENOMEM: return "out of memory";
    case CP_ERANGE: return "out of range";
    case CP_EDEVICE: return "device error";
    case CP_EPERM: return "refused by the privacy policy";
    }
    return "unknown status";
}

void *cp_malloc(size_t n, const char *what, cp_error *err)
{
    void *p = malloc(n ? n : 1);
    if (!p) cp_fail(err, CP_ENOMEM, "out of memory allocating %zu bytes for %s", n, what);
    return p;
}

void *cp_calloc(size_t count, size_t size, const char *what, cp_error *err)
{
    void *p = calloc(count ? count : 1, size ? size : 1);
    if (!p) cp_fail(err, CP_ENOMEM, "out of memory allocating %zu x %zu bytes for %s", count, size, what);
    return p;
}

int cp_mul_size(size_t a, size_t b, size_t *out)
{
    if (a != 0 && b > SIZE_MAX / a) return 0;
    *out = a * b;
    return 1;
}
