/* A tiny process detector plugin for the tests: reads {"text":...} lines on
 * stdin, answers {"spans":[...]} flagging every "secret".  argv[1] selects a
 * misbehaviour: ok, crash, hang, garbage, badspan. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "ok";
    static char line[1 << 20];
    while (fgets(line, sizeof line, stdin)) {
        if (strcmp(mode, "crash") == 0) abort();
        if (strcmp(mode, "hang") == 0) pause();
        if (strcmp(mode, "garbage") == 0) {
            printf("this is not json\n");
            fflush(stdout);
            continue;
        }
        if (strcmp(mode, "badspan") == 0) {
            printf("{\"spans\":[{\"start\":5,\"end\":2,\"type\":\"x\"}]}\n");
            fflush(stdout);
            continue;
        }
        /* offsets into the JSON-decoded text: the tests send plain ASCII
         * without escapes, so the position after {"text":" maps directly */
        const char *t = strstr(line, "\"text\":\"");
        printf("{\"spans\":[");
        int first = 1;
        if (t) {
            t += 8;
            for (const char *p = t; (p = strstr(p, "secret")); p += 6) {
                printf("%s{\"start\":%ld,\"end\":%ld,\"type\":\"proc_secret\",\"score\":0.7}", first ? "" : ",",
                       (long)(p - t), (long)(p - t + 6));
                first = 0;
            }
        }
        printf("]}\n");
        fflush(stdout);
    }
    return 0;
}
