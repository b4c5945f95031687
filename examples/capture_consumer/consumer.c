/* A C program that traces one stage through the installed capture library: the embedding row
 * of each token, read from nowhere but a constant here (a real port records its own buffers).
 * usage: consumer MODEL_DIR OUT.h5 HIDDEN_SIZE */
#include <parity_capture.h>
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char** argv) {
  if (argc != 4) {
    fprintf(stderr, "usage: consumer MODEL_DIR OUT.h5 HIDDEN_SIZE\n");
    return 2;
  }
  const int32_t tokens[2] = {3, 5};
  const size_t hidden = (size_t)strtoul(argv[3], NULL, 10);
  float* row = calloc(hidden, sizeof(float));
  parity_capture* cap = NULL;
  parity_capture_options options = {"consumer", "float32", NULL};
  if (row == NULL ||
      parity_capture_open(&cap, argv[2], argv[1], tokens, 2, &options) != PARITY_CAPTURE_OK) {
    fprintf(stderr, "consumer: %s\n", parity_capture_last_error());
    return 2;
  }
  for (int pos = 0; pos < 2; ++pos)
    if (parity_capture_record(cap, "embedding", pos, PARITY_CAPTURE_MODEL_LAYER,
                              PARITY_CAPTURE_ALL_SLOTS, row, PARITY_CAPTURE_F32, hidden,
                              PARITY_LAYOUT_DEFAULT) != PARITY_CAPTURE_OK) {
      fprintf(stderr, "consumer: %s\n", parity_capture_last_error());
      parity_capture_abandon(&cap);
      return 2;
    }
  /* A wrong shape is refused at the call, with a message naming the stage and position. */
  if (parity_capture_record(cap, "final_norm", 0, PARITY_CAPTURE_MODEL_LAYER,
                            PARITY_CAPTURE_ALL_SLOTS, row, PARITY_CAPTURE_F32, hidden - 1,
                            PARITY_LAYOUT_DEFAULT) != PARITY_CAPTURE_ERR_SHAPE) {
    fprintf(stderr, "consumer: a short row was not refused\n");
    return 1;
  }
  printf("refused as expected: %s\n", parity_capture_last_error());
  free(row);
  /* close() refuses a capture with a refused record; abandon it and write a clean one. */
  if (parity_capture_close(&cap) != PARITY_CAPTURE_ERR_STATE) {
    fprintf(stderr, "consumer: close() wrote a capture with a refused record\n");
    return 1;
  }
  printf("close refused as expected: %s\n", parity_capture_last_error());
  row = calloc(hidden, sizeof(float));
  if (parity_capture_open(&cap, argv[2], argv[1], tokens, 2, &options) != PARITY_CAPTURE_OK)
    return 2;
  for (int pos = 0; pos < 2; ++pos)
    parity_capture_record(cap, "embedding", pos, PARITY_CAPTURE_MODEL_LAYER,
                          PARITY_CAPTURE_ALL_SLOTS, row, PARITY_CAPTURE_F32, hidden,
                          PARITY_LAYOUT_DEFAULT);
  free(row);
  if (parity_capture_close(&cap) != PARITY_CAPTURE_OK) {
    fprintf(stderr, "consumer: %s\n", parity_capture_last_error());
    return 2;
  }
  /* A null handle is a disabled capture: every call is a no-op. */
  if (parity_capture_record(NULL, "nonsense", -5, 99, 7, NULL, PARITY_CAPTURE_F32, 1, 0) !=
          PARITY_CAPTURE_OK ||
      parity_capture_close(NULL) != PARITY_CAPTURE_OK)
    return 1;
  printf("consumer: wrote %s\n", argv[2]);
  return 0;
}
