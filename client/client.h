// verifyd::Client: typed, synchronous calls to one verifyd daemon (SPEC §4).
//
// Every call returns absl::StatusOr with the daemon's gRPC code carried over unchanged and the
// message prefixed with the method. Each call gets the default deadline unless CallOptions says
// otherwise. Only idempotent calls (Stats, GetCompaction, Health) are retried, and only on
// UNAVAILABLE: a retried Verify, Append or Commit could apply twice
// (plans/0006-client-and-load.md). Thread-safe: one Client may be shared by every thread of a
// scheduler.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "client/append_chunking.h"
#include "client/channel.h"
#include "client/shared_memory_region.h"
#include "verifyd/v1/verifyd.grpc.pb.h"

namespace verifyd {

struct ClientOptions {
  // Per call unless CallOptions overrides it; a chunked Append gives each chunk this deadline.
  absl::Duration default_deadline = absl::Seconds(30);
  // Largest message sent or received; Append is split to stay under it. Match the daemon's
  // --max-message-bytes.
  int64_t max_message_bytes = int64_t{64} << 20;
  // Extra attempts after UNAVAILABLE, for idempotent calls only; all attempts share one deadline.
  int retries = 3;
  // Wait before the first retry; doubled for each next one.
  absl::Duration retry_backoff = absl::Milliseconds(50);
  // Sent as metadata "x-verifyd-admin-token" with every call: over TCP the daemon needs it for
  // every call that changes state (the Unix socket needs none).
  std::string admin_token;
  // Verify waits for its reply by polling gRPC without sleeping, so the reply is read as soon as
  // it arrives instead of after a thread wake-up (tens of µs on a VM, plans/0012). The calling
  // thread keeps a core busy for the call's duration.
  bool spin_wait = false;
  // Sent as metadata "x-verifyd-client" with every call: external regions and channels belong to
  // the client that made them (plans/0017). Empty: a random id per Client.
  std::string client_id;
};

struct CallOptions {
  std::optional<absl::Duration> deadline;  // overrides ClientOptions::default_deadline
};

// What Client::VerifyShared returns: the response (its out/lse name ranges of the region) and
// views of those ranges, valid until the region is reused or released.
struct SharedVerifyResult {
  v1::VerifyResponse response;
  absl::Span<const uint16_t> out;  // bf16 [sum Q, H, 512]
  absl::Span<const float> lse;     // fp32 [sum Q, H]; empty unless return_lse
};

// Region bytes VerifyShared needs: q | tree_kv | out | lse, each at a multiple of 64.
uint64_t SharedVerifyBytes(int64_t total_q, int64_t heads, bool return_lse);

// Where one Verify's tensors sit in a region, from `base` (a multiple of 64): q [sum Q, H, 576]
// bf16, tree_kv [sum Q, 576] bf16, out [sum Q, H, 512] bf16, lse [sum Q, H] fp32; `end` is the
// first byte after them. A caller that produces q and tree_kv itself (e.g. copies them from its
// GPU) writes them at q / tree_kv and calls VerifySharedInPlace: no copy on the client's path.
struct SharedVerifyLayout {
  int64_t total_q = 0, heads = 0;
  bool return_lse = false;
  uint64_t q = 0, tree_kv = 0, out = 0, lse = 0, end = 0;
};
SharedVerifyLayout SharedVerifyLayoutAt(uint64_t base, int64_t total_q, int64_t heads,
                                        bool return_lse);

// grpc.health.v1 serving status.
enum class HealthStatus { kUnknown = 0, kServing = 1, kNotServing = 2, kServiceUnknown = 3 };
const char* HealthStatusName(HealthStatus status);

class Client {
 public:
  // Creates the channel; does not wait for the daemon (the first call connects). INVALID_ARGUMENT
  // for an empty target or an option out of range.
  static absl::StatusOr<std::unique_ptr<Client>> Connect(const std::string& target,
                                                         ClientOptions options = {});
  // Over an existing channel (tests, in-process servers). The channel must allow messages of
  // options.max_message_bytes.
  static absl::StatusOr<std::unique_ptr<Client>> FromChannel(std::shared_ptr<grpc::Channel> channel,
                                                             ClientOptions options = {});
  ~Client();

  // Sends the request in as many messages as max_message_bytes needs, in order; returns the last
  // answer (the fill levels after the whole append). On an error after k chunks, those k chunks
  // stay appended and the message says how many tokens were.
  absl::StatusOr<v1::AppendResponse> Append(const v1::AppendRequest& request,
                                            const CallOptions& call = {});
  // kv: bf16 [layer_count, tokens, 576] (row-major), appended to layers
  // [layer_begin, layer_begin + layer_count). `at` says where the caller expects to write
  // (AppendPosition::Create() for a new sequence, Fill(n) for one whose layers hold n tokens);
  // a mismatch is FAILED_PRECONDITION and writes nothing (SPEC §2).
  absl::StatusOr<v1::AppendResponse> AppendKv(uint64_t sequence_id, uint32_t layer_begin,
                                              int64_t layer_count, int64_t tokens,
                                              absl::Span<const uint16_t> kv, AppendPosition at,
                                              const CallOptions& call = {});
  // AppendKv with rows already in the fp8 layout (DTYPE_FP8_MLA [layer_count, tokens, 656] bytes,
  // client/fp8_rows.h makes them from bf16), for a daemon started with --kv_dtype=fp8; chunked
  // like AppendKv. A bf16 daemon refuses them (INVALID_ARGUMENT).
  absl::StatusOr<v1::AppendResponse> AppendKvFp8(uint64_t sequence_id, uint32_t layer_begin,
                                                 int64_t layer_count, int64_t tokens,
                                                 absl::Span<const uint8_t> rows, AppendPosition at,
                                                 const CallOptions& call = {});
  // An Append whose kv lies at `offset` (a multiple of 64) of a region this Client registered
  // (RegisterExternalMemory): bf16 [layer_count, tokens, 576] (dtype DTYPE_BF16) or rows already in
  // the fp8 layout [layer_count, tokens, 656] (DTYPE_FP8_MLA, a daemon started with
  // --kv_dtype=fp8). One message whatever the size: the daemon reads and checks the rows where
  // they lie (on the GPU for device memory), names a bad element as for inline rows and keeps
  // nothing of a refused call.
  absl::StatusOr<v1::AppendResponse> AppendKvRegistered(uint64_t sequence_id, uint32_t layer_begin,
                                                        int64_t layer_count, int64_t tokens,
                                                        v1::DType dtype, uint64_t region,
                                                        uint64_t offset, AppendPosition at,
                                                        const CallOptions& call = {});
  absl::StatusOr<v1::VerifyResponse> Verify(const v1::VerifyRequest& request,
                                            const CallOptions& call = {});
  // accepted_path: a root, then each node a child of the previous; empty rejects the whole tree.
  absl::StatusOr<v1::CommitResponse> Commit(uint64_t sequence_id,
                                            absl::Span<const int32_t> accepted_path,
                                            const CallOptions& call = {});
  absl::StatusOr<v1::ReleaseResponse> Release(uint64_t sequence_id, const CallOptions& call = {});
  // A new sequence on the first `length` committed tokens of `source_sequence_id`, sharing their
  // KV slots (plans/0019). Not retried: a second attempt after a lost reply would answer
  // ALREADY_EXISTS for a fork that succeeded.
  absl::StatusOr<v1::ForkResponse> Fork(uint64_t source_sequence_id, uint64_t new_sequence_id,
                                        uint64_t length, const CallOptions& call = {});
  // budget_bytes = 0: until converged. Returns the operation id to poll.
  absl::StatusOr<v1::CompactResponse> Compact(uint64_t budget_bytes, const CallOptions& call = {});
  absl::StatusOr<v1::CompactionStatus> GetCompaction(const std::string& operation_id,
                                                     const CallOptions& call = {});
  // Polls GetCompaction every poll_interval until DONE or FAILED (returned as a status, not an
  // error: the caller reads state and error), calling on_progress with every status seen.
  absl::StatusOr<v1::CompactionStatus> WaitCompaction(
      const std::string& operation_id, absl::Duration poll_interval = absl::Milliseconds(100),
      const std::function<void(const v1::CompactionStatus&)>& on_progress = nullptr,
      const CallOptions& call = {});
  absl::StatusOr<v1::StatsResponse> Stats(const CallOptions& call = {});
  // One page of the live sequences, ascending ids greater than `after_sequence_id` (all when
  // unset), at most `limit` (0: the daemon's default, 1000; it lists fewer when the page would not
  // fit its --max-message-bytes and says truncated). Read-only (renews no lease), so retried.
  absl::StatusOr<v1::ListSequencesResponse> ListSequences(
      std::optional<uint64_t> after_sequence_id = std::nullopt, uint32_t limit = 0,
      const CallOptions& call = {});
  // Every page of ListSequences, concatenated: truncated false, total_sequences from the last
  // page. Each page is a snapshot of its own; a sequence created or released meanwhile may be
  // missed or listed.
  absl::StatusOr<v1::ListSequencesResponse> ListAllSequences(const CallOptions& call = {});
  // Shared memory for tensors (plans/0010): the daemon creates a region of `bytes`, this process
  // maps it. The region must not outlive this Client. FAILED_PRECONDITION when the daemon has
  // shared memory disabled, RESOURCE_EXHAUSTED past its limits; the client must run as the
  // daemon's user on the same host.
  absl::StatusOr<SharedMemoryRegion> CreateSharedMemory(uint64_t bytes,
                                                        const CallOptions& call = {});
  // Drops a region by name (SharedMemoryRegion::Release calls this).
  absl::StatusOr<v1::ReleaseSharedMemoryResponse> ReleaseSharedMemory(const std::string& region,
                                                                      const CallOptions& call = {});
  // AppendKv with the kv placed at offset 0 of `region` instead of inline (one message, no
  // chunking: the region bounds the size).
  absl::StatusOr<v1::AppendResponse> AppendKvShared(uint64_t sequence_id, uint32_t layer_begin,
                                                    int64_t layer_count, int64_t tokens,
                                                    absl::Span<const uint16_t> kv,
                                                    AppendPosition at, SharedMemoryRegion& region,
                                                    const CallOptions& call = {});
  // Verify with q ([sum Q, H, 576]) and tree_kv ([sum Q, 576]) copied into `region` and out/lse
  // written by the daemon into it (layout: SharedVerifyBytes). `request` carries layer,
  // sequences, return_lse and softmax_scale; its tensors and output refs are set here.
  absl::StatusOr<SharedVerifyResult> VerifyShared(v1::VerifyRequest request,
                                                  absl::Span<const uint16_t> q,
                                                  absl::Span<const uint16_t> tree_kv,
                                                  SharedMemoryRegion& region,
                                                  const CallOptions& call = {});
  // Verify with q and tree_kv already written in `region` at `layout` (SharedVerifyLayoutAt with
  // this request's sum Q and return_lse); out/lse come back into the region there.
  absl::StatusOr<SharedVerifyResult> VerifySharedInPlace(v1::VerifyRequest request,
                                                         const SharedVerifyLayout& layout,
                                                         SharedMemoryRegion& region,
                                                         const CallOptions& call = {});
  // The co-located data plane (client/channel.h, plans/0017). Registers memory of this process
  // with the daemon: `handle` is what the caller exported (the 64 bytes of a cudaIpcMemHandle_t
  // from cudaIpcGetMemHandle on the cuda backend; on the cpu backend the path of a file in
  // /dev/shm), `bytes` its size, `device` the CUDA device it is on (the daemon's). The region
  // belongs to this Client (its client_id) until ReleaseExternalMemory, or until no call named it
  // for the daemon's lease.
  absl::StatusOr<v1::RegisterExternalMemoryResponse> RegisterExternalMemory(
      std::string handle, uint64_t bytes, uint32_t device = 0, const CallOptions& call = {});
  absl::StatusOr<v1::ReleaseExternalMemoryResponse> ReleaseExternalMemory(
      uint64_t region, const CallOptions& call = {});
  // A channel of `entries` descriptors in flight (a power of two in [2, 4096]); the Channel must
  // not outlive this Client.
  absl::StatusOr<std::unique_ptr<Channel>> OpenChannel(uint32_t entries = 64,
                                                       const CallOptions& call = {});
  // What Channel::Close calls.
  absl::Status CloseChannel(uint64_t channel, const CallOptions& call = {});
  // A captured bucket on a channel (plans/0033); CapturedStep::Prepare (client/captured_step.h)
  // calls it and maps the step area.
  absl::StatusOr<v1::PrepareCaptureResponse> PrepareCapture(
      const v1::PrepareCaptureRequest& request, const CallOptions& call = {});

  // grpc.health.v1.Health/Check; service "" is the whole daemon.
  absl::StatusOr<HealthStatus> Health(const std::string& service = "",
                                      const CallOptions& call = {});

  const ClientOptions& options() const { return options_; }

 private:
  Client(std::shared_ptr<grpc::Channel> channel, ClientOptions options);

  // Runs attempt(context) with one absolute deadline, retrying UNAVAILABLE when idempotent.
  absl::Status Call(const char* method, bool idempotent, const CallOptions& call,
                    const std::function<absl::Status(grpc::ClientContext&)>& attempt);
  // One unary RPC of the stub through Call (which adds the admin token's metadata to every call):
  // its response, or the status prefixed with the method.
  template <typename Request, typename Response>
  absl::StatusOr<Response> Unary(const char* method, bool idempotent, const CallOptions& call,
                                 grpc::Status (v1::Verifyd::Stub::*rpc)(grpc::ClientContext*,
                                                                        const Request&, Response*),
                                 const Request& request);

  ClientOptions options_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Verifyd::Stub> stub_;
};

}  // namespace verifyd
