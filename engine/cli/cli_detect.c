/* cacheprune detect: spans (and, with a model, the token mask) of a text. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../kernels/log.h"
#include "cli.h"
#include "../detect/detect.h"

static void usage(FILE *f)
{
    fputs("usage: cacheprune detect [options] [--] TEXT|-\n"
          "\n"
          "Finds sensitive spans in TEXT (or stdin with -).  <pii>...</pii> markers are honoured and removed.\n"
          "After --, the next argument is the text even if it starts with '-'.\n"
          "\n"
          "  --role R            the message's role: system, user (default), assistant, document\n"
          "  --model DIR         also print the token mask for DIR's tokenizer\n"
          "  --json              {\"spans\":[...],\"wholly\":...,\"mask\":[...]}\n",
          f);
    cli_detect_opts_help(f);
}

/* The options cli_parse_detect_opt takes, for every command that takes them. */
void cli_detect_opts_help(FILE *f)
{
    fputs("  --rules FILE        a rule file (regex/keyword/allow lines; see README), repeatable\n"
          "  --plugin LIB.so     an in-process plugin (trusted code; C ABI in engine/detect/detect_plugin_abi.h)\n"
          "  --plugin-config S   the string passed to the plugin's cp_plugin_open\n"
          "  --plugin-cmd \"CMD\"  a child process speaking line-delimited JSON, protocol v2 ({\"id\",\"text\",\"role\"} -> {\"id\",\"spans\"})\n"
          "  --timeout-ms N      answer timeout of --plugin-cmd (default 2000)\n"
          "  --ner               the NER plugin (plugins/ner: node over the npm package compromise), on by default\n"
          "                      when make deps installed it; if it cannot start, the command refuses to start\n"
          "  --ner-dir DIR       the folder holding ner.mjs and its node_modules (implies --ner; default\n"
          "                      $CP_NER_DIR, else plugins/ner)\n"
          "  --no-ner            leave the NER plugin out\n"
          "  --no-builtin        leave out the built-in recognizers\n"
          "  --no-names          leave out the built-in free-text recognizer (names, places, organisations,\n"
          "                      street addresses, ages in user and assistant turns; on by default)\n"
          "  --words FILE        its common-word list, one word a line (default " CP_WORDS_DEFAULT ",\n"
          "                      Debian's wamerican; the command refuses to start without it)\n"
          "  --policy SPEC       per-role policy: role=scan|formats|secrets|public|sensitive,... (default\n"
          "                      user=scan,assistant=scan,system=formats,document=secrets; formats: every\n"
          "                      detector but names, NER and plugins; secrets: shared text in which keys,\n"
          "                      passwords and checksum-valid numbers are still found)\n"
          "  --mask-pad K        tokens marked each side of a sensitive one (default 1)\n",
          f);
}

int cli_make_chain(cp_detect_chain *c, const cli_detect_opts *o)
{
    cp_error err = { 0 };
    cp_detector *d;
    cp_chain_init(c);
    if (o->policy && cp_chain_set_policy(c, o->policy, &err) != CP_OK) goto fail;
    if (o->builtin) {
        if (cp_detector_builtin(&d, &err) != CP_OK || cp_chain_add(c, d, &err) != CP_OK) goto fail;
    }
    if (o->names && (cp_detector_names_words(o->words, &d, &err) != CP_OK || cp_chain_add(c, d, &err) != CP_OK)) goto fail;
    if (o->plugin && (cp_detector_dlopen(o->plugin, o->plugin_config, &d, &err) != CP_OK || cp_chain_add(c, d, &err) != CP_OK))
        goto fail;
    if (o->plugin_cmd) {
        char *copy = strdup(o->plugin_cmd), *argv[64];
        int n = 0;
        for (char *t = copy ? strtok(copy, " ") : NULL; t && n < 63; t = strtok(NULL, " ")) argv[n++] = t;
        argv[n] = NULL;
        cp_status rc = n ? cp_detector_process(argv, o->timeout_ms, &d, &err) : cp_fail(&err, CP_EINVAL, "--plugin-cmd is empty");
        free(copy);
        if (rc != CP_OK || cp_chain_add(c, d, &err) != CP_OK) goto fail;
    }
    /* on by default where installed: a configured classifier that cannot
     * start stops the command (never a silent run without it) */
    const char *env_dir = getenv("CP_NER_DIR");
    const char *ner_dir = o->ner_dir ? o->ner_dir : env_dir && *env_dir ? env_dir : "plugins/ner";
    if ((o->ner > 0 || (o->ner < 0 && cp_ner_installed(ner_dir))) &&
        (cp_detector_ner("node", ner_dir, o->timeout_ms, &d, &err) != CP_OK || cp_chain_add(c, d, &err) != CP_OK)) {
        if (o->ner < 0)
            cp_fail_wrap(&err, "the NER plugin is installed in %s, so it is on by default (--no-ner turns it off)", ner_dir);
        goto fail;
    }
    /* rule files last: their allow lines also filter the detectors before them */
    for (int i = 0; i < o->n_rules; i++)
        if (cp_detector_rules(o->rules[i], &d, &err) != CP_OK || cp_chain_add(c, d, &err) != CP_OK) goto fail;
    return 1;
fail:
    cli_error("%s", err.msg);
    cp_chain_free(c);
    return 0;
}

/* Parses one detector option at argv[*i]; returns 1 if it was one, 0 if
 * not, -1 on error. */
int cli_parse_detect_opt(int argc, char **argv, int *i, cli_detect_opts *o)
{
    const char *a = argv[*i], *v = *i + 1 < argc ? argv[*i + 1] : NULL;
    long long k;
    if (strcmp(a, "--no-builtin") == 0) {
        o->builtin = 0;
        return 1;
    }
    if (strcmp(a, "--no-names") == 0) {
        o->names = 0;
        return 1;
    }
    if (strcmp(a, "--ner") == 0 || strcmp(a, "--no-ner") == 0) {
        o->ner = a[2] == 'n' && a[3] == 'e'; /* --no-ner: 0, not the default's -1 */
        if (!o->ner) o->ner_dir = NULL;
        return 1;
    }
    static const char *const with_value[] = { "--rules", "--plugin", "--plugin-config", "--plugin-cmd", "--timeout-ms",
                                              "--policy", "--mask-pad", "--ner-dir", "--words", NULL };
    int known = 0;
    for (int j = 0; with_value[j]; j++) known |= strcmp(a, with_value[j]) == 0;
    if (!known) return 0;
    if (!v) {
        cli_error("%s needs a value (see --help)", a);
        return -1;
    }
    (*i)++;
    if (strcmp(a, "--rules") == 0) {
        if (o->n_rules == (int)(sizeof o->rules / sizeof o->rules[0])) {
            cli_error("--rules: at most %zu files", sizeof o->rules / sizeof o->rules[0]);
            return -1;
        }
        o->rules[o->n_rules++] = v;
    } else if (strcmp(a, "--plugin") == 0) o->plugin = v;
    else if (strcmp(a, "--plugin-config") == 0) o->plugin_config = v;
    else if (strcmp(a, "--plugin-cmd") == 0) o->plugin_cmd = v;
    else if (strcmp(a, "--policy") == 0) o->policy = v;
    else if (strcmp(a, "--ner-dir") == 0) o->ner_dir = v, o->ner = 1;
    else if (strcmp(a, "--words") == 0) o->words = v;
    else if (strcmp(a, "--timeout-ms") == 0) {
        if (!cli_parse_int(a, v, 1, 600000, &k)) return -1;
        o->timeout_ms = (int)k;
    } else {
        if (!cli_parse_int(a, v, 0, 64, &k)) return -1;
        o->mask_pad = (int)k;
    }
    return 1;
}

/* The whole of stdin, at most DETECT_STDIN_MAX bytes: more is an error,
 * never a prefix scanned as if it were all (a secret past the cut would
 * be reported as nothing found). */
#define DETECT_STDIN_MAX ((size_t)256 << 20)
static char *read_stdin(size_t *n)
{
    size_t cap = 1 << 16, len = 0;
    char *buf = malloc(cap + 1);
    while (buf) {
        size_t r = fread(buf + len, 1, cap + 1 - len, stdin); /* the +1: one byte past a full buffer tells "more" */
        len += r;
        if (len > cap) {
            if (cap >= DETECT_STDIN_MAX) break;
            char *b = realloc(buf, (cap *= 2) + 1);
            if (!b) free(buf);
            buf = b;
            continue;
        }
        if (r == 0 || feof(stdin) || ferror(stdin)) break;
    }
    if (!buf) {
        cli_error("detect: out of memory reading stdin");
        return NULL;
    }
    if (ferror(stdin)) {
        cli_error("detect: reading stdin failed after %zu bytes", len);
        free(buf);
        return NULL;
    }
    if (len > DETECT_STDIN_MAX) {
        cli_error("detect: stdin holds more than its limit of %zu MiB (%zu bytes): refused, not scanned in part", DETECT_STDIN_MAX >> 20,
                  DETECT_STDIN_MAX);
        free(buf);
        return NULL;
    }
    buf[len] = 0, *n = len;
    return buf;
}

int cli_detect(int argc, char **argv)
{
    cli_detect_opts o = CLI_DETECT_DEFAULTS;
    const char *text_arg = NULL, *model = NULL, *role_name = "user";
    int json = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--") == 0) { /* the text follows, whatever it starts with */
            if (text_arg || i + 2 != argc) {
                cli_error("detect: give the text as one argument after -- (see --help)");
                return 2;
            }
            text_arg = argv[++i];
            break;
        }
        int r = cli_parse_detect_opt(argc, argv, &i, &o);
        if (r < 0) return 2;
        if (r > 0) continue;
        const char *a = argv[i];
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            usage(stdout);
            return 0;
        } else if (strcmp(a, "--json") == 0) json = 1;
        else if (strcmp(a, "--model") == 0 || strcmp(a, "--role") == 0) {
            const char *v = cli_value("detect", argc, argv, &i);
            if (!v) return 2;
            *(strcmp(a, "--model") == 0 ? &model : &role_name) = v;
        } else if (a[0] == '-' && a[1] == '-') {
            cli_error("detect: unknown option '%s' (see --help)", a);
            return 2;
        } else if (!text_arg) text_arg = a;
        else {
            cli_error("detect: give the text as one argument (or - for stdin)");
            return 2;
        }
    }
    if (!text_arg) {
        cli_error("detect: no text (see --help)");
        return 2;
    }
    cp_error err = { 0 };
    cp_role role;
    if (cp_role_from_name(role_name, &role, &err) != CP_OK) {
        cli_error("--role: %s", err.msg);
        return 2;
    }
    size_t raw_len = 0;
    char *raw = strcmp(text_arg, "-") == 0 ? read_stdin(&raw_len) : strdup(text_arg);
    if (!raw) {
        if (strcmp(text_arg, "-") != 0) cli_error("detect: out of memory"); /* read_stdin said why */
        return 1;
    }
    if (strcmp(text_arg, "-") != 0) raw_len = strlen(raw);
    int rcode = 1;
    cp_detect_chain chain;
    int have_chain = 0;
    cp_spans spans = { 0 };
    char *text = NULL;
    size_t len = 0;
    cp_tokenizer *tok = NULL;
    cp_encoding enc = { 0 };
    uint8_t *mask = NULL;
    if (cp_strip_pii_markers(raw, raw_len, &text, &len, &spans, &err) != CP_OK) {
        cli_error("detect: %s", err.msg);
        goto done;
    }
    if (!cli_make_chain(&chain, &o)) goto done;
    have_chain = 1;
    if (cp_chain_detect(&chain, text, len, role, &spans, &err) != CP_OK) {
        cli_error("detect: %s", err.msg);
        goto done;
    }
    cp_spans_resolve(&spans);
    if (model) {
        if (cp_tokenizer_load(model, &tok, &err) != CP_OK || cp_tokenize(tok, text, len, 0, &enc, &err) != CP_OK) {
            cli_error("%s", err.msg);
            goto done;
        }
        mask = calloc(enc.n + 1, 1);
        if (!mask) goto done;
        cp_spans_to_mask(&spans, 0, &enc, 0, enc.n, o.mask_pad, mask);
    }
    if (json) {
        cJSON *j = cJSON_CreateObject(), *arr = cJSON_AddArrayToObject(j, "spans");
        for (size_t i = 0; i < spans.n; i++) {
            cJSON *s = cJSON_CreateObject();
            cJSON_AddNumberToObject(s, "start", spans.v[i].start);
            cJSON_AddNumberToObject(s, "end", spans.v[i].end);
            cJSON_AddStringToObject(s, "type", spans.v[i].type);
            cJSON_AddNumberToObject(s, "score", (double)(int)(spans.v[i].score * 1000 + 0.5) / 1000);
            cJSON_AddItemToArray(arr, s);
        }
        cJSON_AddBoolToObject(j, "wholly", spans.wholly);
        if (mask) {
            cJSON *m = cJSON_AddArrayToObject(j, "mask");
            for (size_t k = 0; k < enc.n; k++) cJSON_AddItemToArray(m, cJSON_CreateNumber(mask[k]));
        }
        char *p = cJSON_PrintUnformatted(j);
        if (p) puts(p);
        free(p);
        cJSON_Delete(j);
    } else {
        if (spans.wholly) printf("the whole message is sensitive (policy or a detector failure)\n");
        for (size_t i = 0; i < spans.n; i++)
            printf("[%u, %u)  %-16s %.2f  %.*s\n", spans.v[i].start, spans.v[i].end, spans.v[i].type, spans.v[i].score,
                   (int)(spans.v[i].end - spans.v[i].start), text + spans.v[i].start);
        if (mask) {
            printf("mask:");
            for (size_t k = 0; k < enc.n; k++) printf(" %d", mask[k]);
            printf("\n");
        }
    }
    rcode = 0;
done:
    if (have_chain) cp_chain_free(&chain);
    cp_spans_free(&spans);
    cp_encoding_free(&enc);
    cp_tokenizer_free(tok);
    free(mask);
    free(text);
    free(raw);
    return rcode;
}
