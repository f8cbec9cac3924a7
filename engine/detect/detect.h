/* The Sensitivity Detector: plugins that find sensitive byte spans in one
 * message, a chain that runs them under a per-role policy, and the mapping
 * from spans to a per-token mask.
 *
 * Failing closed: if any detector in the chain fails (a matching error, a
 * plugin error, crash, timeout or garbage), the message is marked wholly
 * sensitive, the failure is counted, and a log line names the detector and
 * the reason — never the text. */
#ifndef CP_DETECT_H
#define CP_DETECT_H

#include <stddef.h>
#include <stdint.h>

#include "../../tokenizer/chat.h"

#define CP_SPAN_TYPE_MAX 24

typedef struct cp_span {
    uint32_t start, end; /* UTF-8 byte offsets into the message */
    char type[CP_SPAN_TYPE_MAX];
    float score;
} cp_span;

typedef struct cp_spans {
    cp_span *v;
    size_t n, cap;
    int wholly; /* the whole message is sensitive (declared, or a detector failed) */
    /* work the detectors did on this message: regex steps (detect_match.h)
     * and the names scanner's word visits; linear in the message on any
     * input (the tests hold every recognizer to it) */
    uint64_t steps;
} cp_spans;

cp_status cp_spans_add(cp_spans *s, uint32_t start, uint32_t end, const char *type, float score, cp_error *err);
void cp_spans_free(cp_spans *s);
/* Sorts by start and drops spans wholly inside a larger one, or inside an
 * equal one with a higher score (the union of what is marked never shrinks). */
void cp_spans_resolve(cp_spans *s);

/* A detector plugin. */
typedef struct cp_detector cp_detector;
struct cp_detector {
    const char *name;
    /* Appends spans of text[0..len) to out.  A failure returns an error; the
     * chain then fails closed. */
    cp_status (*detect)(cp_detector *d, const char *text, size_t len, cp_role role, cp_spans *out, cp_error *err);
    /* Optional: the detector's high-precision part (credentials, numbers a
     * checksum validates), run on roles whose policy is `secrets` (system
     * prompts and documents by default); NULL: not run on those */
    cp_status (*detect_secrets)(cp_detector *d, const char *text, size_t len, cp_role role, cp_spans *out, cp_error *err);
    void (*destroy)(cp_detector *d);
    /* Works in another process (a process plugin), which keeps what it is
     * sent: it gets the bytes a client marked sensitive as spaces */
    int elsewhere;
    /* Finds free text (names, places: the names recognizer, NER, plugins)
     * rather than formats: not run on roles whose policy is `formats`, where
     * a template's names would cost its sharing */
    int free_text;
    void *impl;
};

/* Built-in recognizers (PCRE2 + validators): email, phone, card, iban, ssn,
 * ip, dob, address, secret, url_credentials, health, person; on `secrets`
 * roles card, iban, ssn, secret and url_credentials only. */
cp_status cp_detector_builtin(cp_detector **out, cp_error *err);
/* Free-text recognizer (detect_names*.c): people, organisations, places,
 * street addresses, ages and titles in prose, by a linear-time scanner over
 * words (types person, org, location, address, age, title).  Meant for user
 * and assistant turns: the chain's default policy keeps documents and
 * system prompts away from it. */
cp_status cp_detector_names(cp_detector **out, cp_error *err);
/* The same with its common-word list read from words (a word a line; the
 * lowercase entries count): NULL is CP_WORDS_DEFAULT, Debian's wamerican,
 * which .ci/deps installs.  A missing or unreadable list is an error: the
 * recognizer never runs without it (it would take every sentence-initial
 * word for a name, or none). */
#define CP_WORDS_DEFAULT "/usr/share/dict/words"
cp_status cp_detector_names_words(const char *words, cp_detector **out, cp_error *err);
/* Rule file: see detect_rules.c for the line format. */
cp_status cp_detector_rules(const char *path, cp_detector **out, cp_error *err);
/* A shared object implementing the C ABI of detect_plugin_abi.h (trusted
 * code, run in-process). */
cp_status cp_detector_dlopen(const char *path, const char *config, cp_detector **out, cp_error *err);
/* A child process speaking line-delimited JSON, protocol v2 (every reply
 * echoes its request's id; see detect_plugin_abi.h); argv[0] is run without
 * a shell, in a process group of its own.  timeout_ms bounds each answer.  A
 * binary that cannot be executed is refused here ("cannot execute CMD:
 * reason"), not at the first request. */
cp_status cp_detector_process(char *const argv[], int timeout_ms, cp_detector **out, cp_error *err);
/* Sends a process plugin one empty message and requires its answer within
 * first_timeout_ms (or its own timeout if longer): a plugin that cannot
 * work at all (its package missing, a crash at start) is found before any
 * real message.  Not done by cp_detector_process itself: a plugin's
 * failures are otherwise runtime failures, each failing closed.  The same
 * allowance holds after: the first answer of each child started after a
 * failure may take first_timeout_ms too (its start), so one slow message
 * does not time out every message after it while the runtime restarts. */
cp_status cp_detector_process_probe(cp_detector *d, int first_timeout_ms, cp_error *err);
/* The optional NER plugin (plugins/ner/ner.mjs over the npm package
 * compromise) as a process plugin, run by `node` (a command looked up on
 * PATH, or a path) from folder dir, checked before it is returned: its
 * script and package installed, node able to start, a first answer within
 * 20 s (node and compromise load).  Any of these missing is an error that
 * says which and how to install it: configured but unavailable, the
 * engine refuses to start rather than run without it. */
cp_status cp_detector_ner(const char *node, const char *dir, int timeout_ms, cp_detector **out, cp_error *err);
/* Whether make deps installed the NER plugin in dir (its npm package is
 * there): the default chain then includes it. */
int cp_ner_installed(const char *dir);

/* What the policy does with a role's messages: scan (every detector),
 * formats (every detector but the free-text ones: e-mails, phones, cards,
 * credentials, health cues, ... are found; names are not), secrets (shared
 * text, but credentials and checksum-valid numbers in it are found and
 * kept private: each detector's detect_secrets), public (shared, never
 * scanned), sensitive (wholly private). */
typedef enum cp_role_policy { CP_POLICY_SCAN = 0, CP_POLICY_PUBLIC, CP_POLICY_SENSITIVE, CP_POLICY_SECRETS, CP_POLICY_FORMATS } cp_role_policy;

typedef struct cp_detect_chain {
    cp_detector *d[16];
    int n;
    cp_role_policy policy[4]; /* per cp_role */
    uint64_t failures;        /* detector failures, each failed closed */
    uint64_t messages;
} cp_detect_chain;

/* Defaults: user and assistant scan, system formats, document secrets. */
void cp_chain_init(cp_detect_chain *c);
cp_status cp_chain_add(cp_detect_chain *c, cp_detector *d, cp_error *err); /* takes ownership */
void cp_chain_free(cp_detect_chain *c);
/* Policy from "role=scan|formats|secrets|public|sensitive,..." */
cp_status cp_chain_set_policy(cp_detect_chain *c, const char *spec, cp_error *err);
/* Runs the policy and the detectors on one message.  Only out-of-memory is
 * an error; detector failures set out->wholly. */
cp_status cp_chain_detect(cp_detect_chain *c, const char *text, size_t len, cp_role role, cp_spans *out, cp_error *err);

/* cp_chain_detect on a message some of whose bytes its client marked
 * sensitive (marked: its spans; NULL or empty: none).  Detectors in this
 * process see the text whole; one that works elsewhere sees the marked bytes
 * as spaces -- they are private whatever it finds, and its process would
 * keep them.  out may be marked itself (the spans found are appended). */
cp_status cp_chain_detect_marked(cp_detect_chain *c, const char *text, size_t len, cp_role role, const cp_spans *marked,
                                 cp_spans *out, cp_error *err);

/* Each detector's detect_secrets (the `secrets` policy's scan) on text that
 * belongs to no one role: the seam between two messages.  As
 * cp_chain_detect: only out-of-memory is an error, a detector failure sets
 * out->wholly. */
cp_status cp_chain_detect_secrets(cp_detect_chain *c, const char *text, size_t len, cp_spans *out, cp_error *err);

/* Marks mask[k] for every token k in [t0, t1) of enc whose range overlaps a
 * span (span offsets shifted by `base` into enc's coordinates), or all of
 * them when spans->wholly; then pads each marked run by `pad` tokens each
 * side within [t0, t1). */
void cp_spans_to_mask(const cp_spans *s, uint32_t base, const cp_encoding *enc, size_t t0, size_t t1, int pad,
                      uint8_t *mask);

/* Inline markers: removes "<pii>" and "</pii>" from text, returning the
 * cleaned text (malloc'd) and the marked spans in its coordinates (type
 * "marked", score 1).  An unbalanced or nested marker is an error. */
cp_status cp_strip_pii_markers(const char *text, size_t len, char **clean, size_t *clean_len, cp_spans *spans,
                               cp_error *err);

#endif
