/* build/gguf_write: a checkpoint directory to a GGUF file for llama.cpp
 * (profiling/gguf.h says what is written).
 *
 *   gguf_write --model DIR --out FILE.gguf --type f32|bf16|q8_0 */
#include <stdio.h>
#include <string.h>

#include "gguf.h"
#include "bench_args.h"

int main(int argc, char **argv)
{
    const char *dir = NULL, *out = NULL, *type_name = NULL;
    const int args = bench_args_check(argc, argv);
    if (args) return bench_usage(args, "usage: gguf_write --model DIR --out FILE.gguf --type f32|bf16|q8_0\n");
    for (int i = 1; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "--model") == 0) dir = argv[i + 1];
        else if (strcmp(argv[i], "--out") == 0) out = argv[i + 1];
        else if (strcmp(argv[i], "--type") == 0) type_name = argv[i + 1];
        else dir = NULL, i = argc;
    }
    if (!dir || !out || !type_name || argc != 7) {
        fprintf(stderr, "usage: gguf_write --model DIR --out FILE.gguf --type f32|bf16|q8_0\n");
        return 2;
    }
    cp_error err = { 0 };
    cp_gguf_type t;
    if (cp_gguf_type_from_name(type_name, &t, &err) || cp_gguf_write_model(dir, out, t, &err)) {
        fprintf(stderr, "gguf_write: %s\n", err.msg);
        return 1;
    }
    return 0;
}
