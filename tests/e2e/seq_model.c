/* Writes a stateful model for the server's sequence tests: the LSTM of
 * tests/runtime/test_sequence.c (ob_seq_lstm), or with --decoder D the
 * one-layer decoder step whose KV cache grows by 2 D floats a step
 * (ob_seq_decoder).
 *   es_seq_model [--decoder D] OUT.onnx */
#include "support/onnx_builder.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char **argv) {
  int d = 0;
  if (argc == 4 && !strcmp(argv[1], "--decoder"))
    d = atoi(argv[2]);
  if ((argc != 2 && argc != 4) || (argc == 4 && (d < 1 || d > (1 << 16)))) {
    fprintf(stderr, "usage: es_seq_model [--decoder D] OUT.onnx\n");
    return 2;
  }
  const char *path = argv[argc - 1];
  ob *b = ob_new(d ? 13 : 14);
  float *w = NULL;
  if (d)
    w = ob_seq_decoder(b, d);
  else
    ob_seq_lstm(b);
  size_t size;
  uint8_t *bytes = ob_pack(b, &size);
  FILE *f = fopen(path, "wb");
  int ok = f && fwrite(bytes, 1, size, f) == size;
  if (f && fclose(f) != 0)
    ok = 0;
  free(bytes);
  free(w);
  free(b);
  if (!ok) {
    perror(path);
    return 1;
  }
  return 0;
}
