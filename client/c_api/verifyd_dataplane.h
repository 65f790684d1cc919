/* libverifyd_dataplane: the co-located data plane (SPEC §3.1, plans/0017) behind a C ABI, for
 * Python (ctypes, python/verifyd/dataplane.py) and any other language that can call C. One build
 * serves every Python version: no compiled extension to match against an interpreter or torch.
 *
 * It wraps the C++ verifyd::Client (registration, channels; gRPC over the daemon's socket) and
 * verifyd::Channel (descriptors into the shared-memory ring). When built with CUDA it also makes
 * CUDA IPC handles itself (vd_register_cuda) and records the stream-order operations on the
 * caller's stream (vd_stream_write_value32 / vd_stream_wait_value32: cuStreamWriteValue32 /
 * cuStreamWaitValue32 through the driver's entry points, no libcuda link).
 *
 * Errors: every int function returns 0 (or a count) on success and a negative value on failure:
 * -(gRPC status code), e.g. -3 for INVALID_ARGUMENT. vd_last_error_code() / vd_last_error() give
 * the code and the message (the daemon's text for a daemon refusal) of the calling thread's last
 * failure. Strings returned stay valid until the thread's next failing call.
 *
 * Threads: a vd_client may be shared by threads (as verifyd::Client); a vd_channel belongs to one
 * thread at a time (as verifyd::Channel). A channel must be closed before its client.
 *
 * Sketch (cpu backend: a sealed memfd stands in for device memory; cuda: vd_register_cuda):
 *
 *   vd_client* c;  vd_connect("unix:///run/verifyd/verifyd-0.sock", "", "", 30.0, &c);
 *   uint64_t region;  vd_register_file(c, "/proc/<pid>/fd/<memfd>", bytes, 0, &region);
 *   vd_channel* ch;  vd_channel_open(c, 64, &ch);
 *   vd_verify_desc d = {0};  ... d.q = (vd_tensor_ref){region, q_offset}; ...
 *   vd_enqueue_verify(ch, &d);          // the daemon waits for d.ready, writes d.done
 *   vd_completion done;  vd_wait_completion(ch, 10.0, &done);
 *   vd_channel_close(ch);  vd_disconnect(c);
 */
#ifndef VERIFYD_DATAPLANE_H_
#define VERIFYD_DATAPLANE_H_

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Bumped on any change of a struct below or a function's signature. */
#define VD_ABI_VERSION 1
/* Bytes of vd_completion.message (the ring's record carries at most 224). */
#define VD_MESSAGE_BYTES 256

typedef struct vd_client vd_client;
typedef struct vd_channel vd_channel;

/* A byte offset in a registered region (a multiple of 64); region 0: not given. */
typedef struct {
  uint64_t region;
  uint64_t offset;
} vd_tensor_ref;

/* A uint32 word in a registered region (offset a multiple of 4); region 0: no flag. */
typedef struct {
  uint64_t region;
  uint64_t offset;
  uint32_t value;
  uint32_t reserved; /* 0 */
} vd_flag;

/* One sequence of a Verify: parents[i] = -1 for a root, else an index < i. has_commit: the
 * accepted path of its previous tree (commit_path[0..commit_length)) rides on this call. */
typedef struct {
  uint64_t sequence_id;
  const int32_t* parents;
  uint32_t num_parents;
  uint32_t has_commit;
  const int32_t* commit_path;
  uint32_t commit_length;
  uint32_t reserved; /* 0 */
} vd_sequence;

/* q bf16 [sum Q, H, 576], tree_kv bf16 [sum Q, 576], out bf16 [sum Q, H, 512], lse fp32
 * [sum Q, H] (with return_lse only), as for the gRPC Verify. */
typedef struct {
  uint64_t id; /* echoed in the completion */
  uint32_t layer;
  uint32_t num_sequences;
  const vd_sequence* sequences;
  vd_tensor_ref q, tree_kv, out, lse;
  uint32_t return_lse;
  uint32_t has_softmax_scale;
  float softmax_scale;
  uint32_t reserved; /* 0 */
  vd_flag ready, done;
} vd_verify_desc;

typedef struct {
  uint64_t id;
  uint64_t committed_length; /* Commit only */
  int32_t code;              /* gRPC status code; 0: OK */
  uint32_t reserved;
  char message[VD_MESSAGE_BYTES]; /* NUL-terminated */
} vd_completion;

/* VD_ABI_VERSION of the library (the loader checks it). */
int vd_abi_version(void);
/* 1 when built with CUDA (vd_register_cuda and the stream helpers work), else 0. */
int vd_has_cuda(void);
/* The calling thread's last failure: gRPC code (0 when none) and message ("" when none). */
int vd_last_error_code(void);
const char* vd_last_error(void);

/* A client of one daemon. client_id: metadata x-verifyd-client, the owner of the regions and
 * channels made through this client (NULL or "": a random id). admin_token (NULL or "": none):
 * metadata x-verifyd-admin-token, which a daemon on TCP needs for calls that change state.
 * timeout_seconds: each call's deadline (<= 0: 30 s). Does not wait for the daemon. */
int vd_connect(const char* target, const char* client_id, const char* admin_token,
               double timeout_seconds, vd_client** out);
void vd_disconnect(vd_client* client);
/* The client id sent (the random one when none was given); valid while the client lives. */
const char* vd_client_id(const vd_client* client);

/* cpu backend: registers `path` = /proc/<this pid>/fd/<n>, a memfd of this process with its pages
 * allocated and sealed against shrinking (memfd_create MFD_ALLOW_SEALING, posix_fallocate,
 * F_ADD_SEALS F_SEAL_SHRINK), `bytes` long, as a region; the daemon maps nothing else. */
int vd_register_file(vd_client* client, const char* path, uint64_t bytes, uint32_t device,
                     uint64_t* region);
/* cuda backend: registers the device memory [device_pointer, device_pointer + bytes). The library
 * exports the CUDA IPC handle of the allocation holding it; the region starts at that
 * allocation's base, written to *region_base (offsets are from there). FAILED_PRECONDITION when
 * the library was built without CUDA; INVALID_ARGUMENT when the pointer is not device memory or
 * the range leaves its allocation. */
int vd_register_cuda(vd_client* client, uint64_t device_pointer, uint64_t bytes, uint64_t* region,
                     uint64_t* region_base);
/* ReleaseExternalMemory; *bytes (may be NULL) gets the region's size. */
int vd_release_memory(vd_client* client, uint64_t region, uint64_t* bytes);

/* OpenChannel with `entries` descriptors in flight (a power of two in [2, 4096]; 0: 64). */
int vd_channel_open(vd_client* client, uint32_t entries, vd_channel** out);
/* CloseChannel (in-flight descriptors complete ABORTED) and frees the handle, even when the
 * daemon's answer is an error (returned). */
int vd_channel_close(vd_channel* channel);
uint64_t vd_channel_id(const vd_channel* channel);
uint32_t vd_channel_entries(const vd_channel* channel);
/* Descriptors enqueued whose completion was not returned yet. */
uint64_t vd_channel_in_flight(const vd_channel* channel);
void vd_channel_heartbeat(vd_channel* channel);

/* Publishes a Verify descriptor. RESOURCE_EXHAUSTED: entries descriptors in flight (read
 * completions, retry); FAILED_PRECONDITION: the channel is closed. */
int vd_enqueue_verify(vd_channel* channel, const vd_verify_desc* descriptor);
/* A Commit descriptor: the accepted path (root first; length 0 rejects the whole tree). */
int vd_enqueue_commit(vd_channel* channel, uint64_t id, uint64_t sequence_id,
                      const int32_t* accepted_path, uint32_t length);
/* Up to `capacity` completions written so far, in enqueue order; returns how many (never blocks).
 * Completions beyond `capacity` are kept for the next call. */
int vd_poll_completions(vd_channel* channel, vd_completion* out, uint32_t capacity);
/* The next completion; DEADLINE_EXCEEDED after timeout_seconds, FAILED_PRECONDITION when nothing
 * is in flight. */
int vd_wait_completion(vd_channel* channel, double timeout_seconds, vd_completion* out);

/* CUDA only (FAILED_PRECONDITION otherwise): records on `stream` (a cudaStream_t / CUstream; 0 is
 * the legacy default stream) a write of `value` to the uint32 at device address `device_pointer`
 * after the stream's earlier work, or a wait until that word is >= value (cuStreamWaitValue32
 * with CU_STREAM_WAIT_VALUE_GEQ) before the stream's later work. Neither blocks the CPU; both
 * can be captured into a CUDA graph. */
int vd_stream_write_value32(void* stream, uint64_t device_pointer, uint32_t value);
int vd_stream_wait_value32(void* stream, uint64_t device_pointer, uint32_t value);

#ifdef __cplusplus
}
#endif

#endif /* VERIFYD_DATAPLANE_H_ */
