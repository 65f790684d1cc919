#include "tools/bench/decode_step_daemon.h"

#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "base/cuda_driver.h"
#include "client/channel.h"
#include "client/client.h"
#include "client/shared_memory_region.h"
#include "tools/bench/decode_step_daemon_process.h"
#include "tools/bench/decode_step_trees.h"
#include "verify/mla_dims.h"

ABSL_DECLARE_FLAG(int, gemm_n);

namespace verifyd::decode_step {
namespace {

// One layer's Verify of the bench's sequence, the commit riding when given; tensors are the
// caller's to add.
v1::VerifyRequest LayerRequest(int layer, const std::vector<int32_t>& parents,
                               const std::optional<std::vector<int32_t>>& commit) {
  v1::VerifyRequest request;
  request.set_layer(static_cast<uint32_t>(layer));
  v1::VerifySequence* s = request.add_sequences();
  s->set_sequence_id(kSequence);
  for (int32_t p : parents) s->add_parents(p);
  if (commit.has_value()) {
    s->mutable_commit_previous()->set_commit_length(static_cast<uint32_t>(commit->size()));
    for (int32_t n : *commit) s->mutable_commit_previous()->add_accepted_path(n);
  }
  return request;
}

// One layer's Verify through gRPC with inline tensors: the model's CPU blocks on its stream, the
// RPC and the copy back.
class GrpcLayer {
 public:
  absl::Status Init(const Dims& d) {
    d_ = d;
    q_bytes_ = size_t(d.nodes) * d.heads * kKvDim * 2;
    kv_bytes_ = size_t(d.nodes) * kKvDim * 2;
    out_bytes_ = size_t(d.nodes) * d.heads * kVDim * 2;
    VERIFYD_CUDA_CHECK(cudaMallocHost(&host_, q_bytes_ + kv_bytes_ + out_bytes_));
    return absl::OkStatus();
  }
  ~GrpcLayer() { cudaFreeHost(host_); }
  absl::Status Run(Client& client, int layer, const std::vector<int32_t>& parents,
                   const std::optional<std::vector<int32_t>>& commit, uint8_t* base,
                   const Region& r, cudaStream_t stream) {
    auto* host = static_cast<uint8_t*>(host_);
    VERIFYD_CUDA_CHECK(
        cudaMemcpyAsync(host, base + r.q[layer], q_bytes_, cudaMemcpyDeviceToHost, stream));
    VERIFYD_CUDA_CHECK(cudaMemcpyAsync(host + q_bytes_, base + r.kv[layer], kv_bytes_,
                                       cudaMemcpyDeviceToHost, stream));
    VERIFYD_CUDA_CHECK(cudaStreamSynchronize(stream));
    v1::VerifyRequest request = LayerRequest(layer, parents, commit);
    v1::Tensor* q = request.mutable_q();
    q->set_dtype(v1::DTYPE_BF16);
    for (int64_t dim : {int64_t{d_.nodes}, int64_t{d_.heads}, int64_t{kKvDim}}) q->add_shape(dim);
    q->set_inline_data(host, q_bytes_);
    v1::Tensor* kv = request.mutable_tree_kv();
    kv->set_dtype(v1::DTYPE_BF16);
    kv->add_shape(d_.nodes);
    kv->add_shape(kKvDim);
    kv->set_inline_data(host + q_bytes_, kv_bytes_);
    VERIFYD_ASSIGN_OR_RETURN(v1::VerifyResponse response, client.Verify(request));
    if (response.out().inline_data().size() != out_bytes_) {
      return absl::InternalError("Verify answered an out of the wrong size");
    }
    uint8_t* out = host + q_bytes_ + kv_bytes_;
    std::memcpy(out, response.out().inline_data().data(), out_bytes_);
    VERIFYD_CUDA_CHECK(
        cudaMemcpyAsync(base + r.out[layer], out, out_bytes_, cudaMemcpyHostToDevice, stream));
    return absl::OkStatus();
  }

 private:
  Dims d_{};
  size_t q_bytes_ = 0, kv_bytes_ = 0, out_bytes_ = 0;
  void* host_ = nullptr;
};

// The same through a host region the daemon made (VerifySharedInPlace): the model's stream copies
// q and tree KV straight into it and out back from it; the CPU still blocks every layer.
class SharedMemoryLayer {
 public:
  absl::Status Init(Client& client, const Dims& d) {
    d_ = d;
    layout_ = SharedVerifyLayoutAt(0, d.nodes, d.heads, false);
    VERIFYD_ASSIGN_OR_RETURN(region_, client.CreateSharedMemory(layout_.end));
    // Pinned, so the copies are DMA (the daemon's backend registers its side too).
    VERIFYD_CUDA_CHECK(cudaHostRegister(region_->bytes().data(), region_->bytes().size(),
                                        cudaHostRegisterDefault));
    return absl::OkStatus();
  }
  ~SharedMemoryLayer() {
    if (region_.has_value()) cudaHostUnregister(region_->bytes().data());
  }
  absl::Status Run(Client& client, int layer, const std::vector<int32_t>& parents,
                   const std::optional<std::vector<int32_t>>& commit, uint8_t* base,
                   const Region& r, cudaStream_t stream) {
    uint8_t* host = region_->bytes().data();
    const size_t q_bytes = size_t(d_.nodes) * d_.heads * kKvDim * 2;
    const size_t kv_bytes = size_t(d_.nodes) * kKvDim * 2;
    const size_t out_bytes = size_t(d_.nodes) * d_.heads * kVDim * 2;
    VERIFYD_CUDA_CHECK(cudaMemcpyAsync(host + layout_.q, base + r.q[layer], q_bytes,
                                       cudaMemcpyDeviceToHost, stream));
    VERIFYD_CUDA_CHECK(cudaMemcpyAsync(host + layout_.tree_kv, base + r.kv[layer], kv_bytes,
                                       cudaMemcpyDeviceToHost, stream));
    VERIFYD_CUDA_CHECK(cudaStreamSynchronize(stream));
    v1::VerifyRequest request = LayerRequest(layer, parents, commit);
    VERIFYD_RETURN_IF_ERROR(client.VerifySharedInPlace(request, layout_, *region_).status());
    VERIFYD_CUDA_CHECK(cudaMemcpyAsync(base + r.out[layer], host + layout_.out, out_bytes,
                                       cudaMemcpyHostToDevice, stream));
    return absl::OkStatus();
  }

 private:
  Dims d_{};
  SharedVerifyLayout layout_;
  std::optional<SharedMemoryRegion> region_;
};

Channel::VerifyDescriptor Descriptor(uint64_t id, int layer, const std::vector<int32_t>& parents,
                                     const std::optional<std::vector<int32_t>>& commit,
                                     uint64_t region, const Region& r) {
  Channel::VerifyDescriptor desc;
  desc.id = id;
  desc.layer = static_cast<uint32_t>(layer);
  desc.sequences.push_back({kSequence, parents, commit});
  desc.q = {region, r.q[layer]};
  desc.tree_kv = {region, r.kv[layer]};
  desc.out = {region, r.out[layer]};
  return desc;
}

// Reads completions until at most `keep` calls are in flight; any failed call fails the run.
absl::Status Drain(Channel& channel, uint64_t keep) {
  while (channel.in_flight() > keep) {
    VERIFYD_ASSIGN_OR_RETURN(Channel::Completion c, channel.WaitCompletion(absl::Seconds(30)));
    if (!c.status.ok()) {
      return absl::Status(c.status.code(),
                          absl::StrCat("descriptor ", c.id, ": ", c.status.message()));
    }
  }
  return absl::OkStatus();
}

}  // namespace

const char* DaemonWayName(DaemonWay way) {
  switch (way) {
    case DaemonWay::kGrpcInline:
      return "daemon: gRPC inline";
    case DaemonWay::kGrpcSharedMemory:
      return "daemon: gRPC shared memory";
    case DaemonWay::kChannelCpuWaits:
      return "daemon: channel, CPU waits";
    case DaemonWay::kChannelStreamOrder:
      return "daemon: channel + stream order";
  }
  return "?";
}

absl::StatusOr<Timing> RunThroughDaemon(const Dims& d, DaemonWay way, bool graphs,
                                        const std::string& verifyd_path,
                                        const std::string& flash_kernel) {
  cudaStream_t model;
  VERIFYD_CUDA_CHECK(cudaStreamCreateWithFlags(&model, cudaStreamNonBlocking));
  VERIFYD_ASSIGN_OR_RETURN(std::unique_ptr<Daemon> daemon,
                           Daemon::Start(verifyd_path, d, graphs, flash_kernel));
  Client& client = daemon->client();
  VERIFYD_RETURN_IF_ERROR(Prefill(client, d, model));
  const Region r = LayOut(d);
  VERIFYD_ASSIGN_OR_RETURN(uint8_t * base, MakeModelRegion(d, r, model));
  VERIFYD_ASSIGN_OR_RETURN(uint64_t region, Register(client, base, r.bytes));
  VERIFYD_ASSIGN_OR_RETURN(const CudaDriverApi* driver, GetCudaDriverApi());
  std::unique_ptr<Channel> channel;
  if (way == DaemonWay::kChannelCpuWaits || way == DaemonWay::kChannelStreamOrder) {
    // A whole step of descriptors fits (entries: a power of two): the CPU can run a step ahead.
    uint32_t entries = 2;
    while (entries < static_cast<uint32_t>(d.layers) + 1) entries *= 2;
    VERIFYD_ASSIGN_OR_RETURN(channel, client.OpenChannel(entries));
  }
  GrpcLayer grpc_layer;
  VERIFYD_RETURN_IF_ERROR(grpc_layer.Init(d));
  SharedMemoryLayer shm_layer;
  if (way == DaemonWay::kGrpcSharedMemory) VERIFYD_RETURN_IF_ERROR(shm_layer.Init(client, d));
  Gemm gemm;
  VERIFYD_RETURN_IF_ERROR(gemm.Init(absl::GetFlag(FLAGS_gemm_n), model));
  LayerClock clock;
  VERIFYD_RETURN_IF_ERROR(clock.Init(d));
  const std::vector<int32_t> parents = TreeParents(d.nodes);
  const std::vector<int32_t> path = AcceptedPath(parents, d.accept);
  size_t mark = 0;
  uint64_t id = 0;
  for (int s = 0; s < d.total_steps(); ++s) {
    if (s == d.warmup) VERIFYD_RETURN_IF_ERROR(clock.Mark(mark++, model));
    for (int l = 0; l < d.layers; ++l) {
      const uint32_t value = static_cast<uint32_t>(s * d.layers + l + 1);
      std::optional<std::vector<int32_t>> commit;
      if (l == 0 && s > 0) commit = path;
      VERIFYD_RETURN_IF_ERROR(gemm.Run(model));
      if (way == DaemonWay::kGrpcInline) {
        VERIFYD_RETURN_IF_ERROR(grpc_layer.Run(client, l, parents, commit, base, r, model));
      } else if (way == DaemonWay::kGrpcSharedMemory) {
        VERIFYD_RETURN_IF_ERROR(shm_layer.Run(client, l, parents, commit, base, r, model));
      } else if (way == DaemonWay::kChannelCpuWaits) {
        VERIFYD_CUDA_CHECK(cudaStreamSynchronize(model));
        VERIFYD_RETURN_IF_ERROR(
            channel->EnqueueVerify(Descriptor(++id, l, parents, commit, region, r)));
        VERIFYD_RETURN_IF_ERROR(Drain(*channel, 0));
      } else {
        Channel::VerifyDescriptor desc = Descriptor(++id, l, parents, commit, region, r);
        desc.ready = {region, r.ready, value};
        desc.done = {region, r.done, value};
        VERIFYD_CU_CHECK(driver->stream_write_value32(
            model, reinterpret_cast<CUdeviceptr>(base + r.ready), value, 0));
        // Back-pressure: a full ring waits for the oldest calls' records.
        for (absl::Status queued = channel->EnqueueVerify(desc); !queued.ok();
             queued = channel->EnqueueVerify(desc)) {
          if (queued.code() != absl::StatusCode::kResourceExhausted) return queued;
          VERIFYD_RETURN_IF_ERROR(Drain(*channel, channel->in_flight() - 1));
        }
        VERIFYD_CU_CHECK(driver->stream_wait_value32(
            model, reinterpret_cast<CUdeviceptr>(base + r.done), value, CU_STREAM_WAIT_VALUE_GEQ));
      }
      if (s >= d.warmup) VERIFYD_RETURN_IF_ERROR(clock.Mark(mark++, model));
    }
  }
  VERIFYD_ASSIGN_OR_RETURN(Timing t, clock.Read(d));
  if (channel != nullptr) {
    VERIFYD_RETURN_IF_ERROR(Drain(*channel, 0));
    VERIFYD_RETURN_IF_ERROR(channel->Close());
  }
  VERIFYD_CUDA_CHECK(cudaStreamSynchronize(model));
  VERIFYD_RETURN_IF_ERROR(client.ReleaseExternalMemory(region).status());
  VERIFYD_RETURN_IF_ERROR(client.Release(kSequence).status());
  VERIFYD_CUDA_CHECK(cudaFree(base));
  VERIFYD_CUDA_CHECK(cudaStreamDestroy(model));
  return t;
}

}  // namespace verifyd::decode_step
