/* edgeserve version: what this binary is and how it was built. */
#include "cli/cli.h"

#include <stdio.h>

#ifndef ES_VERSION_STRING
#define ES_VERSION_STRING "0.0.0"
#endif

int cli_cmd_version(int argc, char **argv) {
  (void)argc;
  (void)argv;
  printf("edgeserve %s\n", ES_VERSION_STRING);
#if defined(ES_ASAN)
  printf("build: asan+ubsan\n");
#elif defined(ES_TSAN)
  printf("build: tsan\n");
#elif defined(NDEBUG)
  printf("build: release\n");
#else
  printf("build: debug\n");
#endif
  printf("compiler: %s\n", __VERSION__);
  return 0;
}
