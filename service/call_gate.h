// Who may call what. The Unix socket is the owner's transport: its file is mode 0660 inside a
// directory the daemon controls, so reaching it proves the caller is the daemon's user or in its
// group (the scheduler's). Every other transport (--tcp) may read (Stats, GetCompaction) but any
// call that changes state or reads tensors (Append, Verify, Commit, Release, Compact, the shared-
// memory calls), and ListSequences (per-sequence traffic: verifyd_service.h says why), needs the
// admin token in metadata x-verifyd-admin-token.
#pragma once

#include <functional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "grpcpp/server_context.h"

namespace verifyd {

inline constexpr char kAdminTokenMetadata[] = "x-verifyd-admin-token";

// The token file's content without trailing white space. Refused when the file cannot be read, is
// empty, or may be read by others than its owner and group (the token would not be a secret).
absl::StatusOr<std::string> ReadAdminTokenFile(const std::string& path);

// Whether a call's peer is on the owner's transport (the Unix socket): Acceptor::IsOwner, which
// knows which transport each connection it handed to gRPC ("fd:N") came on.
using OwnerCheck = std::function<bool(const std::string& peer)>;

class CallGate {
 public:
  // `admin_token` "": no token opens a non-owner transport's gated calls. `is_owner` null: only
  // gRPC's own "unix:" peers are the owner's.
  CallGate(std::string admin_token, OwnerCheck is_owner)
      : admin_token_(std::move(admin_token)), is_owner_(std::move(is_owner)) {}

  // OK or PERMISSION_DENIED naming the method, the metadata key and what to do.
  absl::Status CheckGated(const char* method, const grpc::ServerContextBase& context) const;

 private:
  const std::string admin_token_;
  const OwnerCheck is_owner_;
};

}  // namespace verifyd
