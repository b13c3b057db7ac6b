/* The nopfs client C API: read a rank's samples from the node's nopfsd without copying.
 *
 * Usable from C (C99 and later) and C++. Every function that can fail returns an int: >= 0 on
 * success, a negative nopfs status code on failure (NOPFS_E_*); nopfs_last_error() then returns
 * the message of the calling thread's last failure (valid until the next failing call on that
 * thread).
 *
 *   nopfs_client* c; nopfs_stream* s; nopfs_sample x;
 *   if (nopfs_connect(NULL, &c) < 0) { fprintf(stderr, "%s\n", nopfs_last_error()); ... }
 *   nopfs_open(c, rank, 0, 0, &s);
 *   while (nopfs_next(s, &x, -1) == 1) { use(x.data, x.size); nopfs_release(s, &x); }
 *   (or a batch at a time: nopfs_next_batch / nopfs_release_batch, nopfs_fill_batch)
 *   nopfs_stream_close(s); nopfs_close(c);
 *
 * A sample the service could not read makes nopfs_next return < 0 with a message naming the sample
 * id and its path; the next call moves on. Handles must not be used across fork() (see client.h).
 * Thread safety: as the C++ API; a handle must not be used while it is being closed.
 */
#ifndef NOPFS_CLIENT_H_
#define NOPFS_CLIENT_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Negated nopfs::StatusCode values. */
#define NOPFS_E_INVALID_ARGUMENT (-1)
#define NOPFS_E_NOT_FOUND (-2)
#define NOPFS_E_PERMISSION_DENIED (-3)
#define NOPFS_E_IO (-4)
#define NOPFS_E_CORRUPTION (-5)
#define NOPFS_E_RESOURCE_EXHAUSTED (-6)
#define NOPFS_E_UNAVAILABLE (-7)
#define NOPFS_E_TIMED_OUT (-8)
#define NOPFS_E_FAILED_PRECONDITION (-9)
#define NOPFS_E_INTERNAL (-10)

typedef struct nopfs_client nopfs_client;
typedef struct nopfs_stream nopfs_stream;

typedef struct nopfs_sample {
  uint64_t seq;
  uint32_t sample_id;
  uint32_t epoch;
  int64_t label;
  uint64_t step;
  uint64_t position;
  const void* data; /* valid until nopfs_release or nopfs_stream_close */
  uint64_t size;
} nopfs_sample;

/* Where nopfs_fill_batch put one sample in the caller's buffer, and what it is. */
typedef struct nopfs_batch_entry {
  uint32_t sample_id;
  uint32_t epoch;
  int64_t label;
  uint64_t step;
  uint64_t position;
  uint64_t offset; /* in the buffer */
  uint64_t size;
} nopfs_batch_entry;

typedef struct nopfs_stats {
  uint64_t samples;
  uint64_t bytes;
  uint64_t next_calls;
  uint64_t stall_ns_total;
  uint64_t stall_ns_median;
  uint64_t stall_ns_p99;
} nopfs_stats;

/* The calling thread's last error message ("" if none). */
const char* nopfs_last_error(void);

/* socket_path NULL or "" -> $NOPFS_SOCKET. */
int nopfs_connect(const char* socket_path, nopfs_client** out);
void nopfs_close(nopfs_client* client);
int nopfs_open(nopfs_client* client, uint32_t rank, uint32_t epoch, uint64_t step,
               nopfs_stream** out);
/* Opens a share of rank's stream (docs/wire.md, OPEN_STREAM): only batches worker, worker +
 * workers, ... of each epoch (batches of `batch` entries, counted from where the stream enters the
 * epoch), ending after `epochs` epochs (0: at the end of the job). What DataLoader-style worker
 * `worker` of `workers` reads; workers = 1 and epochs = 0 is nopfs_open. */
int nopfs_open_share(nopfs_client* client, uint32_t rank, uint32_t epoch, uint64_t step,
                     uint32_t worker, uint32_t workers, uint64_t batch, uint32_t epochs,
                     nopfs_stream** out);
/* 1: *sample filled; 0: end of stream; < 0: error. timeout_ms < 0 waits without limit. */
int nopfs_next(nopfs_stream* stream, nopfs_sample* sample, int64_t timeout_ms);
int nopfs_release(nopfs_stream* stream, const nopfs_sample* sample);
/* Takes up to n samples in stream order in one call into samples[0..n) (one pass over the ring);
 * each stays valid until released. Returns how many (0: end of stream; fewer than n at the end,
 * before a failed sample, which the next call reports, after the timeout once one arrived, or
 * when the ring cannot hold more at once: release them and ask again); < 0: error. */
int nopfs_next_batch(nopfs_stream* stream, nopfs_sample* samples, size_t n, int64_t timeout_ms);
/* Releases n samples at once (all or nothing). */
int nopfs_release_batch(nopfs_stream* stream, const nopfs_sample* samples, size_t n);
/* Copies the next n samples back to back into buffer[0..capacity) and releases them; entries[i]
 * says where sample i is and what it is. Any n (a batch larger than the ring is taken in several
 * passes). Returns how many (fewer than n at the end of the stream, when the next sample does not
 * fit what is left of the buffer: it comes first in the next call, or after the timeout once one
 * arrived); < 0: error, e.g. NOPFS_E_INVALID_ARGUMENT for a sample larger than the whole
 * buffer. */
int nopfs_fill_batch(nopfs_stream* stream, size_t n, void* buffer, size_t capacity,
                     nopfs_batch_entry* entries, int64_t timeout_ms);
int nopfs_stream_stats(const nopfs_stream* stream, nopfs_stats* out);
void nopfs_stream_close(nopfs_stream* stream);
/* The service's status text, NUL-terminated, malloc'ed (free() it); NULL on error. */
char* nopfs_status_text(nopfs_client* client);

#ifdef __cplusplus
}
#endif

#endif /* NOPFS_CLIENT_H_ */
