// gRPC 1.51's callback handlers answer a request that does not parse with UNIMPLEMENTED and an
// empty message, and one larger than --max-message-bytes is refused by gRPC core; in both cases no
// handler of ours runs, so verifyd_rpc_requests_total never counted them and the error-ratio alert
// could not see a misbehaving client (issue 17 defect 7). This interceptor, installed on the
// server, sees the status about to be sent for every callback method: the first becomes
// INVALID_ARGUMENT with a message naming the expected message type, and both are counted. (Verify
// is a raw completion-queue method and parses its request itself: VerifydService::VerifyPolled.)
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
