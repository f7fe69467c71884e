// Leases sandbox user ids with lock files (see sandbox_uids.hpp).
#include "sandbox_uids.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <utility>

namespace areal::reward {

namespace {

// Root's own directory for the locks; every process on the machine uses the same one.
std::string lock_dir() {
  std::error_code ec;
  std::filesystem::path dir =
      std::filesystem::is_directory("/run", ec) ? "/run" : std::filesystem::temp_directory_path();
  dir /= "areal-sandbox-uids";
  mkdir(dir.c_str(), 0700);
  return dir.string();
}

}  // namespace

std::optional<uid_lease> uid_lease::acquire(const sandbox_policy& policy, std::string& error) {
  if (policy.uid_slots == 0) {
    error = "the sandbox has no uid slots (reward.sandbox_uid_slots = 0)";
    return std::nullopt;
  }
  if (policy.uid_base == 0 || uint64_t{policy.uid_base} + 2 * uint64_t{policy.uid_slots} > 0xFFFFFFFEull) {
    error = "the sandbox uid range " + std::to_string(policy.uid_base) + " + 2 x " + std::to_string(policy.uid_slots) +
            " must lie within 1..4294967294";
    return std::nullopt;
  }
  static const std::string dir = lock_dir();
  // Threads of one process start at different slots, so that they rarely try the same lock.
  static std::atomic<uint32_t> next{0};
  uint32_t start = next.fetch_add(1);
  for (uint32_t i = 0; i < policy.uid_slots; ++i) {
    uint32_t uid = policy.uid_base + 2 * ((start + i) % policy.uid_slots);
    auto path = dir + "/" + std::to_string(uid) + ".lock";
    int fd = open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (fd < 0) {
      error = "cannot open the uid lock " + path + ": " + std::strerror(errno);
      return std::nullopt;
    }
    if (flock(fd, LOCK_EX | LOCK_NB) == 0)
      return uid_lease{uid, fd};
    close(fd);
  }
  error = "all " + std::to_string(policy.uid_slots) +
          " sandbox uid slots are in use by concurrent runs; raise reward.sandbox_uid_slots";
  return std::nullopt;
}

uid_lease::uid_lease(uid_lease&& other) noexcept : uid_{other.uid_}, lock_fd_{other.lock_fd_} {
  other.lock_fd_ = -1;
}

uid_lease& uid_lease::operator=(uid_lease&& other) noexcept {
  std::swap(uid_, other.uid_);
  std::swap(lock_fd_, other.lock_fd_);
  return *this;
}

uid_lease::~uid_lease() {
  if (lock_fd_ >= 0)
    close(lock_fd_);
}

}  // namespace areal::reward
