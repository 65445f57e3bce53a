/* Writes a model for the server's end-to-end tests: the stateful LSTM of
 * tests/runtime/test_sequence.c (ob_seq_lstm), with --decoder D the
 * one-layer decoder step whose KV cache grows by 2 D floats a step
 * (ob_seq_decoder), or with --nms the detector's tail whose output shapes
 * depend on the data (ob_nms_tail), or with --loop N a Loop no bound covers:
 * m (int64, the trip count) and acc0 [N] -> acc [N], steps [m, N]
 * (ob_loop).
 *   es_seq_model [--decoder D | --nms | --loop N] OUT.onnx */
#include "support/onnx_builder.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char **argv) {
  int d = 0, loop = 0, nms = argc == 3 && !strcmp(argv[1], "--nms");
  if (argc == 4 && !strcmp(argv[1], "--decoder"))
    d = atoi(argv[2]);
  if (argc == 4 && !strcmp(argv[1], "--loop"))
    loop = atoi(argv[2]);
  if ((argc != 2 && argc != 4 && !nms) ||
      (argc == 4 && (d < 1 || d > (1 << 16)) && (loop < 1 || loop > (1 << 20)))) {
    fprintf(stderr, "usage: es_seq_model [--decoder D | --nms | --loop N] OUT.onnx\n");
    return 2;
  }
  const char *path = argv[argc - 1];
  ob *b = ob_new(d || nms || loop ? 13 : 14), *body = ob_new(13);
  float *w = NULL;
  if (loop)
    ob_loop(b, body, loop);
  else if (d)
    w = ob_seq_decoder(b, d);
  else if (nms)
    ob_nms_tail(b);
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
  free(body);
  if (!ok) {
    perror(path);
    return 1;
  }
  return 0;
}
