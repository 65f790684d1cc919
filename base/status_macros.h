// Status plumbing: Debian 12's Abseil (20220623) has no RETURN_IF_ERROR, so the project keeps its
// own.
#pragma once

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define VERIFYD_CONCAT_INNER(a, b) a##b
#define VERIFYD_CONCAT(a, b) VERIFYD_CONCAT_INNER(a, b)

#define VERIFYD_RETURN_IF_ERROR(expr)                  \
  do {                                                 \
    ::absl::Status verifyd_status_ = (expr);           \
    if (!verifyd_status_.ok()) return verifyd_status_; \
  } while (0)

#define VERIFYD_ASSIGN_OR_RETURN_IMPL(tmp, lhs, rexpr) \
  auto tmp = (rexpr);                                  \
  if (!tmp.ok()) return tmp.status();                  \
  lhs = std::move(*tmp)

#define VERIFYD_ASSIGN_OR_RETURN(lhs, rexpr) \
  VERIFYD_ASSIGN_OR_RETURN_IMPL(VERIFYD_CONCAT(verifyd_statusor_, __LINE__), lhs, rexpr)
