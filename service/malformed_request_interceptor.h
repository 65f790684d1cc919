// gRPC 1.51's callback handlers answer a request that does not parse with UNIMPLEMENTED and an
// empty message before any handler of ours runs, so verifyd_rpc_requests_total never counted it
// and the error-ratio alert could not see a misbehaving client (issue 17 defect 7). This
// interceptor, installed on the server, sees the status about to be sent for every callback
// method and turns that one into INVALID_ARGUMENT naming the expected message type, counted.
// (Verify is a raw completion-queue method and parses its request itself:
// VerifydService::VerifyPolled.) A message above gRPC's receive limit is refused by gRPC core
// before any C++ layer, interceptors included, sees the call; that limit is twice
// --max-message-bytes, and the handlers refuse and count what lies between (service/message_size.h,
// plans/0015 row 7b).
#pragma once

#include "grpcpp/support/server_interceptor.h"
#include "service/service_metrics.h"

namespace verifyd {

class MalformedRequestInterceptorFactory
    : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  explicit MalformedRequestInterceptorFactory(ServiceMetrics* metrics) : metrics_(metrics) {}
  // Null (no interceptor) for Verify and for methods that are not verifyd.v1.Verifyd's.
  grpc::experimental::Interceptor* CreateServerInterceptor(
      grpc::experimental::ServerRpcInfo* info) override;

 private:
  ServiceMetrics* metrics_;
};

}  // namespace verifyd
