/* SHA-256 through OpenSSL EVP: the identity of pool segments and the model
 * fingerprint.  Lives at the bottom layer so model/ and pool/ share it. */
#ifndef CP_SHA256_H
#define CP_SHA256_H

#include <stddef.h>
#include <stdint.h>

/* SHA-256 of the concatenation of (parts[i], lens[i]). */
void cp_sha256(const void *const *parts, const size_t *lens, int n, uint8_t out[32]);

#endif
