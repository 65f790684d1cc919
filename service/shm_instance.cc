#include "service/shm_instance.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <set>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"

namespace verifyd {
namespace {

constexpr char kLockSuffix[] = ".lock";
constexpr size_t kInstanceDigits = 16;

std::string RandomInstance() {
  uint64_t bits = 0;
  while (getrandom(&bits, sizeof(bits), 0) != sizeof(bits)) {
  }
  return absl::StrFormat("%016x", bits);
}

bool IsInstance(absl::string_view s) {
  if (s.size() != kInstanceDigits) return false;
  for (char c : s) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

// True when nobody holds `path`'s lock (its daemon is gone); false when someone does or it cannot
// be opened (then it is left alone).
bool LockIsFree(const std::string& path) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) return false;
  const bool free = flock(fd, LOCK_EX | LOCK_NB) == 0;
  close(fd);
  return free;
}

}  // namespace

absl::StatusOr<std::unique_ptr<ShmInstance>> ShmInstance::Create(int device,
                                                                 std::string directory) {
  const std::string device_prefix = absl::StrCat("verifyd-", device, "-");
  const std::string instance = RandomInstance();
  const std::string prefix = absl::StrCat(device_prefix, instance, "-");
  const std::string lock_path = absl::StrCat(directory, "/", device_prefix, instance, kLockSuffix);
  // Locked under a name no sweeper considers, then renamed into place: a lock file is never seen
  // unlocked while its daemon lives.
  const std::string staged = absl::StrCat(directory, "/.", device_prefix, instance, kLockSuffix);
  const int fd = open(staged.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot create '", staged, "' (shared memory): ", std::strerror(errno)));
  }
  if (flock(fd, LOCK_EX | LOCK_NB) != 0 || rename(staged.c_str(), lock_path.c_str()) != 0) {
    const int err = errno;
    close(fd);
    unlink(staged.c_str());
    return absl::UnavailableError(
        absl::StrCat("cannot take '", lock_path, "' (shared memory): ", std::strerror(err)));
  }
  std::unique_ptr<ShmInstance> self(new ShmInstance(std::move(directory), prefix, lock_path, fd));
  self->Sweep(device_prefix);
  return self;
}

ShmInstance::~ShmInstance() {
  unlink(lock_path_.c_str());
  close(lock_fd_);
}

void ShmInstance::Sweep(const std::string& device_prefix) {
  DIR* dir = opendir(directory_.c_str());
  if (dir == nullptr) return;
  std::vector<std::string> names;
  while (dirent* entry = readdir(dir)) names.emplace_back(entry->d_name);
  closedir(dir);
  // Instances with a lock file, and those whose lock is free (their daemon is gone).
  std::set<std::string> locked, dead;
  std::vector<std::string> dead_locks;
  for (const std::string& name : names) {
    absl::string_view rest = name;
    const bool staged = absl::ConsumePrefix(&rest, ".");
    if (!absl::ConsumePrefix(&rest, device_prefix) || !absl::ConsumeSuffix(&rest, kLockSuffix) ||
        !IsInstance(rest)) {
      continue;
    }
    const std::string path = absl::StrCat(directory_, "/", name);
    if (!staged) locked.emplace(rest);
    if (LockIsFree(path)) {
      if (!staged) dead.emplace(rest);
      dead_locks.push_back(path);
    }
  }
  for (const std::string& name : names) {
    absl::string_view rest = name;
    if (!absl::ConsumePrefix(&rest, device_prefix) || rest.size() <= kInstanceDigits + 1 ||
        rest[kInstanceDigits] != '-') {
      continue;
    }
    const std::string instance(rest.substr(0, kInstanceDigits));
    if (!IsInstance(instance) || (locked.contains(instance) && !dead.contains(instance))) continue;
    const std::string path = absl::StrCat(directory_, "/", name);
    struct stat st {};
    if (lstat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) continue;
    if (unlink(path.c_str()) == 0) {
      ++swept_files_;
      swept_bytes_ += static_cast<int64_t>(st.st_blocks) * 512;
    }
  }
  for (const std::string& path : dead_locks) {
    if (unlink(path.c_str()) == 0) ++swept_files_;
  }
}

}  // namespace verifyd
