// A channel descriptor's bytes (plans/0017-data-plane.md): what the client encodes into a ring
// slot and the daemon decodes from its own copy. Header-only for the same reason as ring.h.
//
//   DescriptorHeader (kind, bytes, id, layer, sequences, flags, scale, q/tree_kv/out/lse refs,
//                     ready/done flag refs)
//   then per sequence: SequenceHeader, int32 parents[num_parents], int32 path[path_nodes]
// A Commit descriptor has one sequence whose commit is the commit spec (parents empty) and no
// tensor refs; a Verify names every tensor by registered region + byte offset. Decoding checks
// only the form (sizes inside the descriptor, known kind and flags): every rule of the request
// itself is the validation's, shared with the gRPC path (executor/verify_validation.h).
#pragma once

#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "channel/ring.h"

namespace verifyd::channel {

enum class DescriptorKind : uint32_t { kVerify = 1, kCommit = 2 };

struct TensorRef {
  uint64_t region = 0;  // 0: not given
  uint64_t offset = 0;
};
struct FlagRef {
  uint64_t region = 0;  // 0: no flag
  uint64_t offset = 0;
  uint32_t value = 0;
  uint32_t reserved = 0;
};

inline constexpr uint32_t kFlagReturnLse = 1u << 0;
inline constexpr uint32_t kFlagHasScale = 1u << 1;
inline constexpr uint32_t kKnownFlags = kFlagReturnLse | kFlagHasScale;

struct DescriptorHeader {
  uint32_t kind;
  uint32_t bytes;  // of the whole descriptor, header included
  uint64_t id;     // the client's, echoed in the completion record
  uint32_t layer;
  uint32_t num_sequences;
  uint32_t flags;
  float scale;
  TensorRef q, tree_kv, out, lse;
  FlagRef ready, done;
};
static_assert(sizeof(DescriptorHeader) == 144);

struct SequenceHeader {
  uint64_t sequence_id;
  uint32_t num_parents;
  uint32_t has_commit;  // 0 or 1
  uint32_t commit_length;
  uint32_t path_nodes;
};
static_assert(sizeof(SequenceHeader) == 24);

// Decoded (and what the client fills to encode).
struct SequenceEntry {
  uint64_t sequence_id = 0;
  std::vector<int32_t> parents;
  bool has_commit = false;
  uint32_t commit_length = 0;
  std::vector<int32_t> accepted_path;
};
struct Descriptor {
  DescriptorKind kind = DescriptorKind::kVerify;
  uint64_t id = 0;
  uint32_t layer = 0;
  std::vector<SequenceEntry> sequences;
  bool return_lse = false;
  std::optional<float> scale;
  TensorRef q, tree_kv, out, lse;
  FlagRef ready, done;
};

inline uint64_t EncodedBytes(const Descriptor& d) {
  uint64_t bytes = sizeof(DescriptorHeader);
  for (const SequenceEntry& s : d.sequences) {
    bytes += sizeof(SequenceHeader) + 4 * (s.parents.size() + s.accepted_path.size());
  }
  return bytes;
}

// Client: INVALID_ARGUMENT when the descriptor does not fit a slot.
inline absl::Status Encode(const Descriptor& d, uint8_t* slot) {
  const uint64_t bytes = EncodedBytes(d);
  if (bytes > kDescriptorBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("the descriptor needs ", bytes, " bytes, more than a channel slot's ",
                     kDescriptorBytes, "; send this batch with the gRPC Verify or split it"));
  }
  DescriptorHeader h{};
  h.kind = static_cast<uint32_t>(d.kind);
  h.bytes = static_cast<uint32_t>(bytes);
  h.id = d.id;
  h.layer = d.layer;
  h.num_sequences = static_cast<uint32_t>(d.sequences.size());
  h.flags = (d.return_lse ? kFlagReturnLse : 0) | (d.scale ? kFlagHasScale : 0);
  h.scale = d.scale.value_or(0.f);
  h.q = d.q;
  h.tree_kv = d.tree_kv;
  h.out = d.out;
  h.lse = d.lse;
  h.ready = d.ready;
  h.done = d.done;
  std::memcpy(slot, &h, sizeof(h));
  uint64_t at = sizeof(h);
  for (const SequenceEntry& s : d.sequences) {
    SequenceHeader sh{s.sequence_id, static_cast<uint32_t>(s.parents.size()),
                      s.has_commit ? 1u : 0u, s.commit_length,
                      static_cast<uint32_t>(s.accepted_path.size())};
    std::memcpy(slot + at, &sh, sizeof(sh));
    at += sizeof(sh);
    if (!s.parents.empty()) std::memcpy(slot + at, s.parents.data(), 4 * s.parents.size());
    at += 4 * s.parents.size();
    if (!s.accepted_path.empty()) {
      std::memcpy(slot + at, s.accepted_path.data(), 4 * s.accepted_path.size());
    }
    at += 4 * s.accepted_path.size();
  }
  return absl::OkStatus();
}

// Daemon: reads the header only, to answer a descriptor whose body is malformed with its id.
inline DescriptorHeader PeekHeader(const uint8_t* copy) {
  DescriptorHeader h;
  std::memcpy(&h, copy, sizeof(h));
  return h;
}

// The most tree nodes a slot can carry: every byte after the header a parent.
inline constexpr uint64_t kMaxClaimedNodes = (kDescriptorBytes - sizeof(DescriptorHeader)) / 4;

// Daemon, for a descriptor that does not decode: the tree nodes its body claims, so that the
// call's outputs can still be poisoned (SPEC §3.1: a failed call's outputs are NaN). The header's
// num_sequences and bytes may be the broken fields, so the sequence headers are read as far as
// the slot holds them: num_sequences of them when that many fit the body, else every one up to
// `bytes` (or the slot's end when `bytes` is impossible). Each counts at most `max_per_sequence`
// parents, the whole at most kMaxClaimedNodes. For a descriptor that decodes: the sum of its
// sequences' parents (each at most `max_per_sequence`).
inline uint64_t ClaimedNodes(const uint8_t* copy, uint64_t max_per_sequence) {
  const DescriptorHeader h = PeekHeader(copy);
  const bool bytes_possible = h.bytes >= sizeof(DescriptorHeader) && h.bytes <= kDescriptorBytes;
  const uint64_t end = bytes_possible ? h.bytes : kDescriptorBytes;
  const uint64_t fit = (end - sizeof(DescriptorHeader)) / sizeof(SequenceHeader);
  const bool counted = h.num_sequences >= 1 && h.num_sequences <= fit;
  uint64_t nodes = 0;
  uint64_t at = sizeof(DescriptorHeader);
  for (uint64_t b = 0; counted ? b < h.num_sequences : at + sizeof(SequenceHeader) <= end; ++b) {
    if (at + sizeof(SequenceHeader) > kDescriptorBytes) break;
    SequenceHeader sh;
    std::memcpy(&sh, copy + at, sizeof(sh));
    nodes += sh.num_parents < max_per_sequence ? sh.num_parents : max_per_sequence;
    if (nodes >= kMaxClaimedNodes) return kMaxClaimedNodes;
    at += sizeof(SequenceHeader) + 4 * (uint64_t{sh.num_parents} + sh.path_nodes);
  }
  return nodes;
}

// Daemon: `copy` is the daemon's private copy of one slot (kDescriptorBytes). INVALID_ARGUMENT
// naming the field for a malformed descriptor.
inline absl::StatusOr<Descriptor> Decode(const uint8_t* copy) {
  const DescriptorHeader h = PeekHeader(copy);
  auto bad = [](const std::string& what) {
    return absl::InvalidArgumentError(absl::StrCat("malformed descriptor: ", what));
  };
  if (h.kind != static_cast<uint32_t>(DescriptorKind::kVerify) &&
      h.kind != static_cast<uint32_t>(DescriptorKind::kCommit)) {
    return bad(absl::StrCat("kind = ", h.kind, " must be 1 (Verify) or 2 (Commit)"));
  }
  if (h.bytes < sizeof(DescriptorHeader) || h.bytes > kDescriptorBytes) {
    return bad(absl::StrCat("bytes = ", h.bytes, " must be in [", sizeof(DescriptorHeader), ", ",
                            kDescriptorBytes, "]"));
  }
  if ((h.flags & ~kKnownFlags) != 0) {
    return bad(absl::StrCat("flags = ", h.flags, " has bits outside ", kKnownFlags));
  }
  Descriptor d;
  d.kind = static_cast<DescriptorKind>(h.kind);
  d.id = h.id;
  d.layer = h.layer;
  d.return_lse = (h.flags & kFlagReturnLse) != 0;
  if ((h.flags & kFlagHasScale) != 0) d.scale = h.scale;
  d.q = h.q;
  d.tree_kv = h.tree_kv;
  d.out = h.out;
  d.lse = h.lse;
  d.ready = h.ready;
  d.done = h.done;
  // Each sequence takes at least its header, so this bounds the loop before any allocation.
  const uint64_t max_sequences = (h.bytes - sizeof(DescriptorHeader)) / sizeof(SequenceHeader);
  if (h.num_sequences > max_sequences) {
    return bad(absl::StrCat("num_sequences = ", h.num_sequences, " cannot fit bytes = ", h.bytes));
  }
  if (d.kind == DescriptorKind::kCommit && h.num_sequences != 1) {
    return bad(
        absl::StrCat("a Commit descriptor has num_sequences = ", h.num_sequences, ", must be 1"));
  }
  d.sequences.resize(h.num_sequences);
  uint64_t at = sizeof(DescriptorHeader);
  for (uint32_t b = 0; b < h.num_sequences; ++b) {
    if (at + sizeof(SequenceHeader) > h.bytes) {
      return bad(absl::StrCat("sequences[", b, "] starts past bytes = ", h.bytes));
    }
    SequenceHeader sh;
    std::memcpy(&sh, copy + at, sizeof(sh));
    at += sizeof(sh);
    if (sh.has_commit > 1) {
      return bad(
          absl::StrCat("sequences[", b, "].has_commit = ", sh.has_commit, " must be 0 or 1"));
    }
    const uint64_t words = uint64_t{sh.num_parents} + sh.path_nodes;
    if (at + 4 * words > h.bytes) {
      return bad(absl::StrCat("sequences[", b, "] has ", sh.num_parents, " parents and ",
                              sh.path_nodes, " path nodes, past bytes = ", h.bytes));
    }
    SequenceEntry& s = d.sequences[b];
    s.sequence_id = sh.sequence_id;
    s.has_commit = sh.has_commit == 1;
    s.commit_length = sh.commit_length;
    s.parents.resize(sh.num_parents);
    if (sh.num_parents > 0) std::memcpy(s.parents.data(), copy + at, 4 * sh.num_parents);
    at += 4 * uint64_t{sh.num_parents};
    s.accepted_path.resize(sh.path_nodes);
    if (sh.path_nodes > 0) std::memcpy(s.accepted_path.data(), copy + at, 4 * sh.path_nodes);
    at += 4 * uint64_t{sh.path_nodes};
  }
  if (at != h.bytes) {
    return bad(absl::StrCat("bytes = ", h.bytes, " but the sequences end at ", at));
  }
  return d;
}

}  // namespace verifyd::channel
