/* The optional NER plugin (plugins/ner/): the process plugin ner.mjs over
 * the npm package compromise, checked at start so that a configured but
 * unavailable classifier stops the engine with a message saying what is
 * missing, instead of failing every message closed (or, worse, being
 * quietly left out). */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "detect.h"

#define NER_FIRST_ANSWER_MS 20000 /* node's start and compromise's load, on a loaded machine */

int cp_ner_installed(const char *dir)
{
    char pkg[4096];
    if (snprintf(pkg, sizeof pkg, "%s/node_modules/compromise/package.json", dir) >= (int)sizeof pkg) return 0;
    return access(pkg, R_OK) == 0;
}

cp_status cp_detector_ner(const char *node, const char *dir, int timeout_ms, cp_detector **out, cp_error *err)
{
    *out = NULL;
    char script[4096], pkg[4096];
    if (snprintf(script, sizeof script, "%s/ner.mjs", dir) >= (int)sizeof script ||
        snprintf(pkg, sizeof pkg, "%s/node_modules/compromise/package.json", dir) >= (int)sizeof pkg)
        return cp_fail(err, CP_EINVAL, "NER plugin: folder name too long");
    if (access(script, R_OK) != 0)
        return cp_fail(err, CP_EIO, "NER plugin: %s not found (the folder holding ner.mjs: --ner-dir DIR)", script);
    if (access(pkg, R_OK) != 0)
        return cp_fail(err, CP_EIO,
                       "NER plugin: the npm package compromise is not installed in %s/node_modules "
                       "(make deps installs it, or: cd %s && npm ci)",
                       dir, dir);
    char *argv[] = { (char *)node, script, NULL };
    cp_detector *d;
    cp_status rc = cp_detector_process(argv, timeout_ms, &d, err);
    if (rc) return cp_fail_wrap(err, "NER plugin: %s cannot start (is Node.js installed? make deps installs it)", node);
    rc = cp_detector_process_probe(d, NER_FIRST_ANSWER_MS, err);
    if (rc) {
        d->destroy(d);
        return cp_fail_wrap(err, "NER plugin: %s %s did not answer its first request", node, script);
    }
    d->name = "ner";
    *out = d;
    return CP_OK;
}
