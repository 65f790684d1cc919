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
typedef struct vd_capture vd_capture;

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

/* ---- A decode step captured in a CUDA graph (SPEC §3.1 "Inside the engine's CUDA graph",
 * plans/0033; the protocol: channel/step_area.h). Additions only: the functions above and their
 * structs are unchanged, so VD_ABI_VERSION stays; a loader tests for vd_capture_prepare.
 *
 * vd_capture_prepare names the bucket and its memory on a channel (the daemon refuses here what
 * it cannot serve) and maps the step area. Then per replay the engine's graph runs, on CUDA:
 * vd_capture_step_publish (the step's record from the engine's device tensors into the area),
 * and per captured layer i vd_capture_signal_ready / vd_capture_wait_done, all recorded on the
 * capturing stream (kernels: their values move with every replay). The *_host versions do the
 * same on host memory (the cpu backend). After a replay: vd_capture_error (0, or a fault: the
 * capture ended / the daemon restarted = 1, a done flag timed out = 2; the outputs are NaN then)
 * and vd_capture_wait_step (the daemon's word on the step). */
typedef struct {
  uint32_t layer_begin;
  uint32_t num_layers;                /* 0: every layer from layer_begin on */
  uint32_t max_batch;                 /* <= 1024 */
  uint32_t max_q;                     /* <= the daemon's --max-tree-nodes */
  vd_tensor_ref q, tree_kv, out, lse; /* each large enough for max_batch x max_q rows */
  vd_tensor_ref ready, done;          /* uint32 words, offsets multiples of 4 */
  uint32_t return_lse;
  uint32_t has_softmax_scale;
  float softmax_scale;
  uint32_t reserved; /* 0 */
  /* The same memory as this process addresses it (device pointers on cuda, host pointers on the
   * cpu backend): what SignalReady writes, WaitDone reads and a fault NaN-fills (lse: 0 without
   * return_lse). */
  uint64_t ready_pointer, done_pointer, out_pointer, lse_pointer;
} vd_capture_desc;

/* The engine's device tensors StepPublish copies each replay (device pointers, fixed for the
 * graph's life): num_seqs int32 [1]; sequence_ids int64 [max_batch]; q_lens int32 [max_batch];
 * parents int32 [max_batch][max_q]; commit_lens int32 [max_batch] (-1: nothing rides, 0: reject
 * the previous tree); paths int32 [max_batch][max_q] (the previous tree's accepted path). */
typedef struct {
  uint64_t num_seqs, sequence_ids, q_lens, parents, commit_lens, paths;
} vd_step_tensors;

int vd_capture_prepare(vd_client* client, vd_channel* channel, const vd_capture_desc* desc,
                       vd_capture** out);
/* Unregisters and frees what the capture holds in this process (the daemon's side ends with the
 * channel). */
void vd_capture_free(vd_capture* capture);
uint64_t vd_capture_epoch(const vd_capture* capture);
uint32_t vd_capture_num_layers(const vd_capture* capture);
uint32_t vd_capture_max_batch(const vd_capture* capture);
uint32_t vd_capture_max_q(const vd_capture* capture);

/* Host memory (the cpu backend): parents and paths are [num_seqs][max_q] (only the first q_len /
 * commit_len of each row are read). *step gets the step published. */
int vd_capture_publish_host(vd_capture* capture, uint32_t num_seqs, const uint64_t* sequence_ids,
                            const int32_t* q_lens, const int32_t* parents,
                            const int32_t* commit_lens, const int32_t* paths, uint64_t* step);
int vd_capture_signal_ready_host(vd_capture* capture, uint32_t layer_index);
int vd_capture_wait_done_host(vd_capture* capture, uint32_t layer_index, double timeout_seconds);
/* The fault word: the host versions' own, or with CUDA enabled the device's (read on `stream`
 * after the work queued there, which it waits for). */
int vd_capture_error(vd_capture* capture, void* stream, uint32_t* error);
/* Waits until the daemon completed step `step`; 0, or -(code) with its message (the step's first
 * failure), DEADLINE_EXCEEDED, FAILED_PRECONDITION once the capture ended. */
int vd_capture_wait_step(vd_capture* capture, uint64_t step, double timeout_seconds);

/* CUDA only (FAILED_PRECONDITION otherwise). Registers the step area with cudaHostRegister (the
 * kernels write it directly), allocates the device step counter and fault word. done_timeout:
 * how long a WaitDone spins before it declares the daemon dead (<= 0: 10 s). */
int vd_capture_enable_device(vd_capture* capture, double done_timeout_seconds);
int vd_capture_step_publish(vd_capture* capture, void* stream, const vd_step_tensors* tensors);
int vd_capture_signal_ready(vd_capture* capture, void* stream, uint32_t layer_index);
int vd_capture_wait_done(vd_capture* capture, void* stream, uint32_t layer_index);

#ifdef __cplusplus
}
#endif

#endif /* VERIFYD_DATAPLANE_H_ */
