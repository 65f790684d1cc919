#include "service/malformed_request_interceptor.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "google/protobuf/descriptor.h"
#include "grpcpp/server_context.h"
#include "service/grpc_status.h"

namespace verifyd {
namespace {

constexpr char kServicePrefix[] = "/verifyd.v1.Verifyd/";

class MalformedRequestInterceptor : public grpc::experimental::Interceptor {
 public:
  MalformedRequestInterceptor(grpc::experimental::ServerRpcInfo* info, ServiceMetrics* metrics,
                              const google::protobuf::MethodDescriptor* method)
      : info_(info), metrics_(metrics), method_(method), start_(absl::Now()) {}

  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    using grpc::experimental::InterceptionHookPoints;
    if (methods->QueryInterceptionHookPoint(InterceptionHookPoints::PRE_SEND_STATUS)) {
      const grpc::Status status = methods->GetSendStatus();
      // Our handlers never answer UNIMPLEMENTED: this is gRPC's answer to a request it could not
      // hand to the handler.
      if (status.error_code() == grpc::StatusCode::UNIMPLEMENTED &&
          status.error_message().empty()) {
        // A call the client cancelled meanwhile is left as it is (nobody reads the reply).
        if (!info_->server_context()->IsCancelled()) {
          const grpc::Status invalid(
              grpc::StatusCode::INVALID_ARGUMENT,
              absl::StrCat("the request is not a valid ", method_->input_type()->full_name(),
                           " message (it does not parse)"));
          metrics_->RecordRpc(method_->name(), GrpcCodeName(invalid.error_code()),
                              absl::Now() - start_);
          methods->ModifySendStatus(invalid);
        }
      }
    }
    methods->Proceed();
  }

 private:
  grpc::experimental::ServerRpcInfo* info_;
  ServiceMetrics* metrics_;
  const google::protobuf::MethodDescriptor* method_;
  const absl::Time start_;
};

}  // namespace

grpc::experimental::Interceptor* MalformedRequestInterceptorFactory::CreateServerInterceptor(
    grpc::experimental::ServerRpcInfo* info) {
  const std::string full = info->method() != nullptr ? info->method() : "";
  if (full.rfind(kServicePrefix, 0) != 0) return nullptr;
  const std::string name = full.substr(sizeof(kServicePrefix) - 1);
  if (name == "Verify") return nullptr;
  const google::protobuf::ServiceDescriptor* service =
      google::protobuf::DescriptorPool::generated_pool()->FindServiceByName("verifyd.v1.Verifyd");
  const google::protobuf::MethodDescriptor* method =
      service != nullptr ? service->FindMethodByName(name) : nullptr;
  if (method == nullptr) return nullptr;
  return new MalformedRequestInterceptor(info, metrics_, method);
}

}  // namespace verifyd
