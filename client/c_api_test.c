/* Compiled as C: the header is valid C and the ABI is callable from C. */
#include "client/ckptd.h"

/* With ext_spare < 0 connects with ckptd_connect, else with
 * ckptd_connect_ext and spare_device_buffer = ext_spare. */
int ckptd_c_smoke(const char* socket, const char* job, int ext_spare) {
  float params[256];
  unsigned char rng[16];
  uint64_t params_shape[1] = {256};
  uint64_t rng_shape[1] = {16};
  ckptd_buffer buffers[2] = {
      {"params", CKPTD_PARAMS, CKPTD_FLOAT32, 1, params_shape, 0, 0, CKPTD_DEVICE_HOST, 0, params},
      {"rng", CKPTD_RNG, CKPTD_BYTES, 1, rng_shape, 0, 0, CKPTD_DEVICE_HOST, 0, rng},
  };
  ckptd_options options = {socket, job, 0, 1, 2, 1000, 2000};
  ckptd_options_ext ext = {sizeof(ckptd_options_ext), 0, 0, NULL, NULL, 0, 0};
  ckptd_client* client = 0;
  int i, found = 0, rc;
  uint64_t step = 0;
  double stall = 0;
  for (i = 0; i < 256; ++i) params[i] = (float)i;
  for (i = 0; i < 16; ++i) rng[i] = (unsigned char)i;
  ext.spare_device_buffer = ext_spare;
  rc = ext_spare < 0 ? ckptd_connect(&options, buffers, 2, &client)
                     : ckptd_connect_ext(&options, &ext, buffers, 2, &client);
  if (rc != 0) return 100 + rc;
  if (!ckptd_should_snapshot(client, 4) || ckptd_should_snapshot(client, 3)) return 2;
  if ((rc = ckptd_snapshot(client, 4, &stall)) != 0) return 200 + rc;
  if ((rc = ckptd_wait_persisted(client, 4, 30000)) != 0) return 300 + rc;
  {
    uint64_t failed = 99, last = 99;
    char error[8] = "x";
    if (ckptd_persist_failures(client, &failed, &last, error, sizeof(error)) != 0 || failed != 0 || last != 0 ||
        error[0] != 0) {
      return 6;
    }
  }
  /* ABI 11: the schedule's snapshot of step 8. */
  params[0] = 8.0f;
  if (!ckptd_should_snapshot(client, 8)) return 7;
  if ((rc = ckptd_snapshot_scheduled(client, 8, &stall)) != 0) return 500 + rc;
  if ((rc = ckptd_wait_persisted(client, 8, 30000)) != 0) return 600 + rc;
  for (i = 0; i < 256; ++i) params[i] = -1.0f;
  if ((rc = ckptd_restore(client, &found, &step)) != 0) return 400 + rc;
  if (!found || step != 8 || params[0] != 8.0f || params[255] != 255.0f || rng[15] != 15) return 5;
  ckptd_close(client);
  return 0;
}
