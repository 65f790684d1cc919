// Fuzz target: the channel's wire format as a hostile client writes it (channel/descriptor.h,
// channel/ring_ends.h; issue 33: N9 is what it finds). The first byte picks the mode:
//  - even: the rest is one descriptor slot (zero-padded to its 8192 bytes). Decode refuses it with
//    "malformed descriptor: ..." or decodes it; a decoded one encodes again into bytes that decode
//    equal; ClaimedNodes never passes kMaxClaimedNodes, and for a decodable Verify it is the sum of
//    its sequences' parents (each capped), which is what a failed call's outputs are poisoned by.
//  - odd: a program over a ring in this process's memory: the client's pushes and completion
//    reads, its hostile stores of submit_tail / complete_head and of raw slot bytes, the daemon's
//    takes (each decoded, its claimed nodes bounded) and completion records. The daemon takes
//    descriptor n once, in order, only while its completion slot is free, and calls the ring
//    corrupt exactly when an index is impossible; the client reads its records in order.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include "channel/descriptor.h"
#include "channel/ring.h"
#include "channel/ring_ends.h"
#include "tests/fuzz/fuzz_input.h"

namespace {

using namespace verifyd::channel;

void Require(bool condition, const char* what) {
  if (condition) return;
  std::fprintf(stderr, "descriptor_fuzz: %s\n", what);
  std::abort();
}

constexpr uint64_t kMaxPerSequence = 1024;  // --max-tree-nodes at its largest

bool SameRef(const TensorRef& a, const TensorRef& b) {
  return a.region == b.region && a.offset == b.offset;
}
bool SameFlag(const FlagRef& a, const FlagRef& b) {
  return a.region == b.region && a.offset == b.offset && a.value == b.value &&
         a.reserved == b.reserved;
}
bool Same(const Descriptor& a, const Descriptor& b) {
  if (a.kind != b.kind || a.id != b.id || a.layer != b.layer || a.return_lse != b.return_lse ||
      a.scale.has_value() != b.scale.has_value() || a.sequences.size() != b.sequences.size()) {
    return false;
  }
  if (a.scale && std::memcmp(&*a.scale, &*b.scale, sizeof(float)) != 0) return false;
  for (size_t i = 0; i < a.sequences.size(); ++i) {
    const SequenceEntry& x = a.sequences[i];
    const SequenceEntry& y = b.sequences[i];
    if (x.sequence_id != y.sequence_id || x.parents != y.parents || x.has_commit != y.has_commit ||
        x.commit_length != y.commit_length || x.accepted_path != y.accepted_path) {
      return false;
    }
  }
  return SameRef(a.q, b.q) && SameRef(a.tree_kv, b.tree_kv) && SameRef(a.out, b.out) &&
         SameRef(a.lse, b.lse) && SameFlag(a.ready, b.ready) && SameFlag(a.done, b.done);
}

// What every decode of a slot must satisfy, wherever the bytes came from.
void CheckSlot(const uint8_t* slot) {
  const uint64_t claimed = ClaimedNodes(slot, kMaxPerSequence);
  Require(claimed <= kMaxClaimedNodes, "ClaimedNodes past the slot's capacity");
  absl::StatusOr<Descriptor> d = Decode(slot);
  if (!d.ok()) {
    Require(d.status().code() == absl::StatusCode::kInvalidArgument, "refusal is not INVALID_ARG");
    Require(d.status().message().rfind("malformed descriptor: ", 0) == 0,
            "refusal does not say malformed descriptor");
    return;
  }
  uint64_t parents = 0;
  for (const SequenceEntry& s : d->sequences) {
    parents += s.parents.size() < kMaxPerSequence ? s.parents.size() : kMaxPerSequence;
  }
  Require(claimed == (parents < kMaxClaimedNodes ? parents : kMaxClaimedNodes),
          "ClaimedNodes of a decodable descriptor is not its parents' sum");
  std::vector<uint8_t> again(kDescriptorBytes, 0);
  Require(Encode(*d, again.data()).ok(), "a decoded descriptor does not encode");
  absl::StatusOr<Descriptor> twice = Decode(again.data());
  Require(twice.ok() && Same(*d, *twice), "decode(encode(decode(x))) != decode(x)");
}

Descriptor DrawDescriptor(verifyd::fuzz::FuzzInput& in) {
  Descriptor d;
  d.kind = in.Bool() ? DescriptorKind::kVerify : DescriptorKind::kCommit;
  d.id = in.Take<uint64_t>();
  d.layer = in.Below(8);
  d.sequences.resize(1 + in.Below(3));
  for (SequenceEntry& s : d.sequences) {
    s.sequence_id = in.Below(16);
    s.parents.resize(in.Below(40));
    for (size_t i = 0; i < s.parents.size(); ++i) {
      s.parents[i] = static_cast<int32_t>(in.Below(static_cast<uint32_t>(i) + 1)) - 1;
    }
    s.has_commit = in.Bool();
    s.accepted_path.resize(in.Below(4));
    for (int32_t& node : s.accepted_path) node = static_cast<int32_t>(in.Below(40));
    s.commit_length = static_cast<uint32_t>(s.accepted_path.size());
  }
  d.return_lse = in.Bool();
  d.out = {in.Below(3), 64 * uint64_t{in.Below(64)}};
  d.done = {in.Below(3), 4 * uint64_t{in.Below(64)}, in.Take<uint32_t>(), 0};
  return d;
}

// An index the hostile client stores: near the honest one, or anything.
uint64_t DrawIndex(verifyd::fuzz::FuzzInput& in, uint64_t near) {
  switch (in.Below(4)) {
    case 0:
      return in.Take<uint64_t>();
    case 1:
      return near - in.Below(4);
    default:
      return near + in.Below(20);
  }
}

struct AlignedFree {
  void operator()(void* p) const { std::free(p); }
};

void RunRing(verifyd::fuzz::FuzzInput& in) {
  const uint32_t entries = 2u << in.Below(4);  // 2 .. 16
  const uint64_t bytes = RingFileBytes(entries);
  // aligned_alloc wants a size that is a multiple of the alignment; ASan enforces it.
  const uint64_t rounded = (bytes + 4095) / 4096 * 4096;
  std::unique_ptr<void, AlignedFree> memory(std::aligned_alloc(4096, rounded));
  std::memset(memory.get(), 0, bytes);
  const RingView view(memory.get(), entries);
  view.Initialize();
  RingProducer producer(view);
  RingConsumer consumer(view);
  std::vector<uint8_t> copy(kDescriptorBytes);
  uint64_t taken = 0;      // descriptors the daemon took
  uint64_t completed = 0;  // records the daemon wrote (in order)
  uint64_t popped = 0;     // records the client read
  for (int step = 0; step < 256 && !in.empty(); ++step) {
    RingHeader& h = view.header();
    switch (in.Below(7)) {
      case 0:
        (void)producer.Push(DrawDescriptor(in));
        break;
      case 1:
        h.submit_tail.store(DrawIndex(in, taken), std::memory_order_release);
        break;
      case 2:
        h.complete_head.store(DrawIndex(in, popped), std::memory_order_release);
        break;
      case 3: {  // raw bytes into a slot
        uint8_t* slot = view.descriptor_slot(in.Below(entries));
        const uint32_t at = in.Below(kDescriptorBytes - 256);
        const size_t n = in.remaining() < 256 ? in.remaining() : 256;
        std::memcpy(slot + at, in.rest(), n);
        for (size_t i = 0; i < n; ++i) in.Take<uint8_t>();
        break;
      }
      case 4: {
        const uint64_t tail = h.submit_tail.load(std::memory_order_acquire);
        const uint64_t read = h.complete_head.load(std::memory_order_acquire);
        uint64_t number = 0;
        std::string why;
        const RingConsumer::Take t = consumer.TryTake(copy.data(), &number, &why);
        const bool impossible = tail < taken || tail - taken > entries || read > taken;
        Require((t == RingConsumer::Take::kCorrupt) == impossible,
                "corrupt exactly when an index is impossible");
        if (t == RingConsumer::Take::kCorrupt) {
          Require(!why.empty(), "a corrupt ring without a reason");
          return;  // the daemon closes the channel
        }
        if (t == RingConsumer::Take::kTaken) {
          Require(number == taken, "descriptors taken out of order");
          Require(number < tail, "a descriptor taken that was not published");
          Require(number - read < entries, "a completion slot the client has not read reused");
          ++taken;
          CheckSlot(copy.data());
        } else if (t == RingConsumer::Take::kEmpty) {
          Require(tail == taken, "empty while descriptors wait");
        }
        break;
      }
      case 5:
        if (completed < taken) {
          view.WriteCompletion(completed, in.Take<uint64_t>(), in.Below(17), "why", 3, 0);
          ++completed;
        }
        break;
      default: {
        Completion c;
        if (producer.PopCompletion(&c)) {
          Require(c.number == popped, "records read out of order");
          Require(c.number < completed, "a record read that was never written");
          ++popped;
        }
        break;
      }
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  verifyd::fuzz::FuzzInput in(data, size);
  if ((in.Take<uint8_t>() & 1) == 0) {
    std::vector<uint8_t> slot(kDescriptorBytes, 0);
    const size_t n = in.remaining() < kDescriptorBytes ? in.remaining() : kDescriptorBytes;
    std::memcpy(slot.data(), in.rest(), n);
    CheckSlot(slot.data());
  } else {
    RunRing(in);
  }
  return 0;
}
