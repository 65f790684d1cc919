#include "client/health_codec.h"

#include <cstdint>

#include "absl/status/status.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"
#include "google/protobuf/wire_format_lite.h"

namespace verifyd {

using google::protobuf::internal::WireFormatLite;

std::string EncodeHealthCheckRequest(const std::string& service) {
  std::string bytes;
  if (service.empty()) return bytes;  // proto3 omits default values
  {
    google::protobuf::io::StringOutputStream stream(&bytes);
    google::protobuf::io::CodedOutputStream out(&stream);
    out.WriteTag(WireFormatLite::MakeTag(1, WireFormatLite::WIRETYPE_LENGTH_DELIMITED));
    out.WriteVarint32(static_cast<uint32_t>(service.size()));
    out.WriteString(service);
  }
  return bytes;
}

absl::StatusOr<int> DecodeHealthCheckResponse(const std::string& bytes) {
  google::protobuf::io::CodedInputStream in(reinterpret_cast<const uint8_t*>(bytes.data()),
                                            static_cast<int>(bytes.size()));
  int status = 0;
  while (uint32_t tag = in.ReadTag()) {
    if (tag == WireFormatLite::MakeTag(1, WireFormatLite::WIRETYPE_VARINT)) {
      uint64_t value;
      if (!in.ReadVarint64(&value)) break;
      status = static_cast<int>(value);
    } else if (!WireFormatLite::SkipField(&in, tag)) {
      return absl::InternalError("grpc.health.v1.HealthCheckResponse: malformed field");
    }
  }
  if (!in.ConsumedEntireMessage() || in.CurrentPosition() != static_cast<int>(bytes.size())) {
    return absl::InternalError("grpc.health.v1.HealthCheckResponse: truncated message");
  }
  return status;
}

}  // namespace verifyd
