/* Writes a QOperator-format model (ONNX Runtime's quantizer's other form)
 * for tests/e2e/test_qoperator.sh, every com.microsoft QLinear operator the
 * engine runs in one chain, 8-bit type T (u8 or s8):
 *   xq = QuantizeLinear(x [1, 4, 6, 6] float)
 *   a  = QLinearSigmoid(xq)
 *   b  = QLinearAdd(a, c [4, 1, 1] constant)          (broadcast)
 *   m  = QLinearMul(b, xq)
 *   d  = QLinearConcat(m, xq, axis 1)                  -> [1, 8, 6, 6]
 *   e  = QLinearGlobalAveragePool(d)                   -> [1, 8, 1, 1]
 *   f  = QLinearAveragePool(d, 3x3, strides 2, pads 1) -> [1, 8, 3, 3]
 * with outputs d, e and f, each node with its own scale and zero point.
 *   es_qop_model u8|s8 OUT.onnx */
#include "support/onnx_builder.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char **argv) {
  if (argc != 3 || (strcmp(argv[1], "u8") && strcmp(argv[1], "s8"))) {
    fprintf(stderr, "usage: es_qop_model u8|s8 OUT.onnx\n");
    return 2;
  }
  int sg = !strcmp(argv[1], "s8");
  int et = sg ? ONNX__TENSOR_PROTO__DATA_TYPE__INT8 : ONNX__TENSOR_PROTO__DATA_TYPE__UINT8;
  static const float sx = 0.02f, s_sig = 1.0f / 256, s_c = 0.01f, s_add = 0.012f, s_mul = 0.006f,
                     s_cat = 0.011f, s_gap = 0.004f, s_avg = 0.007f;
  /* zero points: u8 around the middle, s8 around 0 (stored as bytes) */
  static uint8_t zu[8] = {128, 0, 120, 40, 130, 125, 110, 118}, zs[8];
  for (int i = 0; i < 8; i++)
    zs[i] = (uint8_t)(int8_t)(zu[i] - 128);
  const uint8_t *z = sg ? zs : zu;
  static uint8_t c[4];
  for (int i = 0; i < 4; i++)
    c[i] = (uint8_t)(z[2] + (i * 37) % 90 - 45);
  ob *b = ob_new(13);
  ob_input(b, "x", 4, (int64_t[]){1, 4, 6, 6});
  const char *sn[8] = {"sx", "s_sig", "s_c", "s_add", "s_mul", "s_cat", "s_gap", "s_avg"};
  const float *sv[8] = {&sx, &s_sig, &s_c, &s_add, &s_mul, &s_cat, &s_gap, &s_avg};
  const char *zn[8] = {"zx", "z_sig", "z_c", "z_add", "z_mul", "z_cat", "z_gap", "z_avg"};
  for (int i = 0; i < 8; i++) {
    ob_init_f32(b, sn[i], 0, NULL, sv[i]);
    ob_init_8bit(b, zn[i], et, 0, NULL, &z[i]);
  }
  ob_init_8bit(b, "c", et, 3, (int64_t[]){4, 1, 1}, c);
  int n[7];
  n[0] = ob_node(b, "QuantizeLinear", "xq", 3, "x", "sx", "zx");
  n[1] = ob_node(b, "QLinearSigmoid", "a", 5, "xq", "sx", "zx", "s_sig", "z_sig");
  n[2] = ob_node(b, "QLinearAdd", "b", 8, "a", "s_sig", "z_sig", "c", "s_c", "z_c", "s_add",
                 "z_add");
  n[3] = ob_node(b, "QLinearMul", "m", 8, "b", "s_add", "z_add", "xq", "sx", "zx", "s_mul",
                 "z_mul");
  n[4] = ob_node(b, "QLinearConcat", "d", 8, "s_cat", "z_cat", "m", "s_mul", "z_mul", "xq", "sx",
                 "zx");
  ob_attr_int(b, n[4], "axis", 1);
  n[5] = ob_node(b, "QLinearGlobalAveragePool", "e", 5, "d", "s_cat", "z_cat", "s_gap", "z_gap");
  ob_attr_int(b, n[5], "channels_last", 0);
  n[6] = ob_node(b, "QLinearAveragePool", "f", 5, "d", "s_cat", "z_cat", "s_avg", "z_avg");
  ob_attr_ints(b, n[6], "kernel_shape", 2, (int64_t[]){3, 3});
  ob_attr_ints(b, n[6], "strides", 2, (int64_t[]){2, 2});
  ob_attr_ints(b, n[6], "pads", 4, (int64_t[]){1, 1, 1, 1});
  ob_attr_int(b, n[6], "channels_last", 0);
  for (int i = 1; i < 7; i++)
    b->nodes[n[i]].domain = "com.microsoft";
  ob_output_typed(b, "d", et);
  ob_output_typed(b, "e", et);
  ob_output_typed(b, "f", et);
  /* ONNX Runtime wants the contrib domain imported */
  static Onnx__OperatorSetIdProto ms;
  static Onnx__OperatorSetIdProto *imports[2];
  onnx__operator_set_id_proto__init(&ms);
  ms.domain = "com.microsoft";
  ms.has_version = 1;
  ms.version = 1;
  imports[0] = b->model.opset_import[0];
  imports[1] = &ms;
  b->model.opset_import = imports;
  b->model.n_opset_import = 2;
  size_t size;
  uint8_t *bytes = ob_pack(b, &size);
  FILE *f = fopen(argv[2], "wb");
  int ok = f && fwrite(bytes, 1, size, f) == size;
  if (f && fclose(f) != 0)
    ok = 0;
  free(bytes);
  free(b);
  if (!ok) {
    fprintf(stderr, "es_qop_model: cannot write %s\n", argv[2]);
    return 1;
  }
  return 0;
}
