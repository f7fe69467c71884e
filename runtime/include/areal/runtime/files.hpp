// The run's files, never torn: whole files replaced atomically (a temporary
// beside them, fsync, rename), append-only logs written one whole record per
// write and synced, and the lock that makes a run directory one process's.
// Knows nothing of what the files hold.
#pragma once

#include <cstdint>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace areal {

/// A file operation that failed, naming the file and the system's reason
/// (e.g. "No space left on device").
class file_error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// Replaces `path` by `contents` so that a reader sees the old file or the new
/// one, never a part, also after a crash or a power loss. On failure the
/// temporary is removed, the old file stays, and file_error is thrown.
void write_file_atomically(const std::filesystem::path& path, std::string_view contents);
/// The same for a file made of several parts (written in order, not copied together).
void write_file_atomically(const std::filesystem::path& path, const std::vector<std::string_view>& parts);

/// fsyncs a directory, so that the renames and creations in it are durable.
void sync_directory(const std::filesystem::path& directory);

/// Cuts `path` back to its first `bytes` bytes (a file shorter than that is left alone).
void truncate_file(const std::filesystem::path& path, uint64_t bytes);

/// Temporaries this module leaves only when the process is killed mid-write:
/// "NAME.tmp.PID" beside NAME.
bool is_temporary_file(const std::filesystem::path& path);

/// The lock of a run directory is held by another process (named in the message).
class lock_held_error : public file_error {
 public:
  using file_error::file_error;
};

/// A file descriptor this object closes (movable, not copyable).
class owned_fd {
 public:
  owned_fd() = default;
  explicit owned_fd(int fd) : fd_(fd) {}
  owned_fd(owned_fd&& other) noexcept : fd_(other.release()) {}
  owned_fd& operator=(owned_fd&& other) noexcept;
  owned_fd(const owned_fd&) = delete;
  owned_fd& operator=(const owned_fd&) = delete;
  ~owned_fd();

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  int release() {
    int fd = fd_;
    fd_ = -1;
    return fd;
  }

 private:
  int fd_ = -1;
};

/// An append-only file of records (JSON lines). Each append is one write(2)
/// of the whole record; one that fails part-way is cut back, so the file
/// always ends on a whole record.
class append_only_file {
 public:
  append_only_file() = default;
  /// Opens (creating) `path` for appending; throws file_error.
  explicit append_only_file(const std::filesystem::path& path);

  bool is_open() const { return fd_.valid(); }
  const std::filesystem::path& path() const { return path_; }
  /// Throws file_error; the file is then as it was before the call.
  void append(std::string_view record);
  /// Makes what was appended durable (fdatasync); throws file_error.
  void sync();
  /// Bytes in the file: what was there at open plus what was appended.
  uint64_t size() const { return size_; }

 private:
  owned_fd fd_;
  std::filesystem::path path_;
  uint64_t size_ = 0;
};

/// An advisory lock (flock) on a file of a run directory, held until this
/// object goes, that is for the process's life when the program keeps it. The
/// lock file names its holder (pid, host, start time).
class run_lock {
 public:
  /// Takes the lock file `name` in `directory` (created if missing). Throws
  /// lock_held_error when another process holds it, naming that process, and
  /// file_error when the file cannot be made.
  static run_lock acquire(const std::filesystem::path& directory, const std::string& name);
  bool held() const { return fd_.valid(); }

 private:
  owned_fd fd_;  // closing it releases the flock
};

}  // namespace areal
