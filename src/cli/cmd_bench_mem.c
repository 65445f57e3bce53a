#include "cli/cli.h"
int es_cmd_bench_mem(int argc, char **argv) { (void)argc; (void)argv; return 1; }
