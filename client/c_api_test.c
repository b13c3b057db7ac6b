/* A C11 client: proves nopfs_client.h is C, and exercises the C API end to end. Run by
 * service/server/local_server_test.cc against a live server (NOPFS_SOCKET set), with the rank and
 * the expected sample count as arguments. Exit status 0 on success; a message on stderr otherwise.
 *
 * Share mode, run by tests/python/test_client.py against a real nopfsd:
 *   c_api_test share RANK EPOCH STEP WORKER WORKERS BATCH EPOCHS
 * reads that share (nopfs_open_share) and prints one line per sample: "ID SIZE FNV1A64" (the
 * FNV-1a hash of the bytes, in hex), so that the test can compare ids and bytes with the files. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client/nopfs_client.h"

static int fail(const char* what) {
  fprintf(stderr, "c_api_test: %s: %s\n", what, nopfs_last_error());
  return 1;
}

static int share_mode(char** argv) {
  nopfs_client* client = NULL;
  nopfs_stream* stream = NULL;
  nopfs_sample s;
  int rc;
  if (nopfs_connect(NULL, &client) != 0) return fail("connect");
  if (nopfs_open_share(client, (uint32_t)strtoul(argv[2], NULL, 10),
                       (uint32_t)strtoul(argv[3], NULL, 10), strtoull(argv[4], NULL, 10),
                       (uint32_t)strtoul(argv[5], NULL, 10), (uint32_t)strtoul(argv[6], NULL, 10),
                       strtoull(argv[7], NULL, 10), (uint32_t)strtoul(argv[8], NULL, 10),
                       &stream) != 0) {
    return fail("open_share");
  }
  while ((rc = nopfs_next(stream, &s, 10000)) == 1) {
    unsigned long long h = 14695981039346656037ULL;
    const unsigned char* p = (const unsigned char*)s.data;
    size_t i;
    for (i = 0; i < s.size; ++i) {
      h ^= p[i];
      h *= 1099511628211ULL;
    }
    printf("%llu %llu %016llx\n", (unsigned long long)s.sample_id, (unsigned long long)s.size, h);
    if (nopfs_release(stream, &s) != 0) return fail("release");
  }
  if (rc != 0) return fail("next");
  nopfs_stream_close(stream);
  nopfs_close(client);
  return 0;
}

int main(int argc, char** argv) {
  if (argc == 9 && strcmp(argv[1], "share") == 0) return share_mode(argv);
  if (argc != 3) {
    fprintf(stderr, "usage: %s RANK EXPECTED_SAMPLES\n", argv[0]);
    return 2;
  }
  unsigned rank = (unsigned)strtoul(argv[1], NULL, 10);
  unsigned long long expected = strtoull(argv[2], NULL, 10);
  nopfs_client* client = NULL;
  nopfs_stream* stream = NULL;
  nopfs_sample s;
  nopfs_stats stats;
  unsigned long long n = 0;
  int rc;
  char* text;

  if (nopfs_connect(NULL, NULL) != NOPFS_E_INVALID_ARGUMENT) return fail("NULL out accepted");
  if (nopfs_connect(NULL, &client) != 0) return fail("connect");
  if (nopfs_open(client, rank, 0, 0, &stream) != 0) return fail("open");
  while ((rc = nopfs_next(stream, &s, 10000)) == 1) {
    if (s.seq != n || s.data == NULL) return fail("sample out of order");
    if (s.size > 0 && ((const unsigned char*)s.data)[0] != (unsigned char)(s.sample_id & 0xff)) {
      return fail("sample content");
    }
    if (nopfs_release(stream, &s) != 0) return fail("release");
    ++n;
  }
  if (rc != 0) return fail("next");
  if (n != expected) {
    fprintf(stderr, "c_api_test: got %llu samples, expected %llu\n", n, expected);
    return 1;
  }
  if (nopfs_release(stream, &s) >= 0) return fail("double release accepted");
  if (strlen(nopfs_last_error()) == 0) return fail("no error message");
  if (nopfs_stream_stats(stream, &stats) != 0 || stats.samples != expected) return fail("stats");
  text = nopfs_status_text(client);
  if (text == NULL) return fail("status");
  free(text);
  nopfs_stream_close(stream);
  nopfs_close(client);
  return 0;
}
