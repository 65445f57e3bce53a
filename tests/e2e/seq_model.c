/* Writes the stateful model the server's sequence test serves (the LSTM of
 * tests/runtime/test_sequence.c, ob_seq_lstm) to a file.
 *   es_seq_model OUT.onnx */
#include "support/onnx_builder.h"

#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: es_seq_model OUT.onnx\n");
    return 2;
  }
  ob *b = ob_new(14);
  ob_seq_lstm(b);
  size_t size;
  uint8_t *bytes = ob_pack(b, &size);
  FILE *f = fopen(argv[1], "wb");
  int ok = f && fwrite(bytes, 1, size, f) == size;
  if (f && fclose(f) != 0)
    ok = 0;
  free(bytes);
  free(b);
  if (!ok) {
    perror(argv[1]);
    return 1;
  }
  return 0;
}
