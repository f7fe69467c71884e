// The user ids of one sandbox run (internal): a slot of the policy's uid range,
// held with a lock file for the length of the run, so that two concurrent runs,
// in this process or another, never run as the same user.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "areal/reward/sandbox.hpp"

namespace areal::reward {

class uid_lease {
 public:
  /// A free slot, or nullopt with `error` saying why none could be leased.
  static std::optional<uid_lease> acquire(const sandbox_policy& policy, std::string& error);
  uid_lease(uid_lease&& other) noexcept;
  uid_lease& operator=(uid_lease&& other) noexcept;
  uid_lease(const uid_lease&) = delete;
  ~uid_lease();

  uint32_t program_uid() const { return uid_; }
  uint32_t companion_uid() const { return uid_ + 1; }

 private:
  uid_lease(uint32_t uid, int lock_fd) : uid_{uid}, lock_fd_{lock_fd} {}
  uint32_t uid_;
  int lock_fd_;
};

}  // namespace areal::reward
