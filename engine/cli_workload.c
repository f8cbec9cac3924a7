#include "cli.h"
int cli_workload(int argc, char **argv) { (void)argc; (void)argv; cli_error("workload: not built yet"); return 2; }
