// nopfs._client: the Python binding of the nopfs client (client/client.h) and of the planner's
// per-rank order (policy/partition.h). Pure local IPC: a UNIX socket and shared memory, no
// libfabric, so DataLoader worker processes can each connect on their own.
//
// Buffer lifetime (docs/python.md): Stream.next() returns a Sample whose bytes live in the
// stream's shared-memory ring. Sample.data (a read-only memoryview) and Sample.numpy() (a
// read-only uint8 array) are views of those bytes, not copies; each view keeps the sample's slot
// alive. Sample.release() gives the slot back to the service and refuses (BufferError) while a
// view is still alive, so a view can never show bytes the service has reused. A Sample dropped
// without release() is released when its last view goes away. Sample.tobytes() copies.
//
// Thread safety: a Client and its Streams may be used from several Python threads; next() waits
// without the GIL. Objects must not be used across fork() (they raise nopfs.Error in the child):
// connect in the child, as nopfs.torch does in each DataLoader worker.
//
// The module is bound part by part (python/binding.h): its errors, Sample, Batch, Client and its
// Streams, the planner's order, the JPEG decode of pil_decode; each part in its bind_*.cc.
#include "python/binding.h"

PYBIND11_MODULE(_client, m) {
  using namespace nopfs::python;
  m.doc() = "nopfs client: read a rank's samples from the node's nopfsd without copying";
  BindErrors(m);
  BindSample(m);
  BindBatch(m);
  BindClient(m);
  BindPlan(m);
  BindJpeg(m);
}
