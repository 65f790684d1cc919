// A client that the edge tests kill: appends one sequence of --tokens tokens, sends --calls
// asynchronous Verify calls of --nodes tree nodes (the same tree each time: the first makes it
// pending, the others verify it again, all computed), prints "sent" once the first reply is back
// (by then the rest wait in the daemon's queue), and sleeps until it is killed. The shm form
// creates <count> shared-memory regions of <bytes> instead, prints "sent ok" (or why not), and
// sleeps the same way.
// Usage: dying_client <address> <tokens> <nodes> <calls>
//        dying_client <address> shm <bytes> <count>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "grpcpp/grpcpp.h"
#include "tests/service/shadow_model.h"
#include "tests/service/test_server.h"
#include "verifyd/v1/verifyd.grpc.pb.h"

int main(int argc, char** argv) {
  if (argc != 5) {
    std::fprintf(stderr, "usage: dying_client <address> <tokens> <nodes> <calls>\n");
    return 2;
  }
  auto stub = verifyd::v1::Verifyd::NewStub(verifyd::testing::MakeChannel(argv[1]));
  if (std::string(argv[2]) == "shm") {
    for (int i = 0; i < std::atoi(argv[4]); ++i) {
      grpc::ClientContext context;
      verifyd::v1::CreateSharedMemoryRequest request;
      request.set_bytes(std::strtoull(argv[3], nullptr, 10));
      verifyd::v1::SharedMemoryRegion region;
      const grpc::Status s = stub->CreateSharedMemory(&context, request, &region);
      if (!s.ok()) {
        std::printf("sent failed: %s\n", s.error_message().c_str());
        std::fflush(stdout);
        for (;;) pause();
      }
    }
    std::printf("sent ok\n");
    std::fflush(stdout);
    for (;;) pause();
  }
  const int tokens = std::atoi(argv[2]);
  const int nodes = std::atoi(argv[3]);
  const int calls = std::atoi(argv[4]);
  verifyd::testing::ShadowModel model(1, 16, 0.0625f, 7);
  {
    grpc::ClientContext context;
    verifyd::v1::AppendResponse response;
    const grpc::Status s = stub->Append(&context, model.MakeAppend(1, tokens), &response);
    if (!s.ok()) {
      std::fprintf(stderr, "append: %s\n", s.error_message().c_str());
      return 1;
    }
  }
  const verifyd::v1::VerifyRequest request = model.MakeVerify(
      0, {verifyd::testing::VerifyPart{1, model.RandomParents(nodes), std::nullopt}}, false);
  grpc::CompletionQueue cq;
  struct Pending {
    grpc::ClientContext context;
    verifyd::v1::VerifyResponse response;
    grpc::Status status;
    std::unique_ptr<grpc::ClientAsyncResponseReader<verifyd::v1::VerifyResponse>> reader;
  };
  std::vector<std::unique_ptr<Pending>> pending;
  for (int i = 0; i < calls; ++i) {
    auto p = std::make_unique<Pending>();
    p->reader = stub->AsyncVerify(&p->context, request, &cq);
    p->reader->Finish(&p->response, &p->status, p.get());
    pending.push_back(std::move(p));
  }
  void* tag = nullptr;
  bool ok = false;
  if (!cq.Next(&tag, &ok)) return 1;
  std::printf("sent %s\n", static_cast<Pending*>(tag)->status.ok() ? "ok" : "failed");
  std::fflush(stdout);
  for (;;) pause();
}
