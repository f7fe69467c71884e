// The run's files, never torn (see files.hpp).
#include "areal/runtime/files.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <ctime>
#include <system_error>

namespace fs = std::filesystem;

namespace areal {

namespace {

[[noreturn]] void fail(const fs::path& path, const std::string& what, int error) {
  throw file_error(path.string() + ": " + what + ": " + std::strerror(error));
}

// 0, or the errno of the failed write; `written` says how far it got.
int write_all(int fd, const char* data, size_t size, size_t& written) {
  written = 0;
  while (written < size) {
    auto n = ::write(fd, data + written, size - written);
    if (n < 0) {
      if (errno == EINTR)
        continue;
      return errno;
    }
    written += static_cast<size_t>(n);
  }
  return 0;
}

fs::path directory_of(const fs::path& path) {
  auto parent = path.parent_path();
  return parent.empty() ? fs::path{"."} : parent;
}

}  // namespace

void sync_directory(const fs::path& directory) {
  int fd = ::open(directory.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0)
    fail(directory, "cannot open the directory to sync it", errno);
  // Some file systems cannot sync a directory (EINVAL); their renames are then as durable as they get.
  int error = ::fsync(fd) == 0 ? 0 : errno;
  ::close(fd);
  if (error != 0 && error != EINVAL)
    fail(directory, "cannot sync the directory", error);
}

void write_file_atomically(const fs::path& path, std::string_view contents) {
  write_file_atomically(path, std::vector<std::string_view>{contents});
}

void write_file_atomically(const fs::path& path, const std::vector<std::string_view>& parts) {
  auto temporary = path;
  temporary += ".tmp." + std::to_string(::getpid());
  int fd = ::open(temporary.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0)
    fail(path, "cannot create its temporary " + temporary.filename().string(), errno);
  size_t written = 0;
  int error = 0;
  for (auto& part : parts)
    if (error == 0)
      error = write_all(fd, part.data(), part.size(), written);
  if (error == 0 && ::fsync(fd) != 0)
    error = errno;
  if (::close(fd) != 0 && error == 0)
    error = errno;
  if (error == 0 && ::rename(temporary.c_str(), path.c_str()) != 0)
    error = errno;
  if (error != 0) {
    ::unlink(temporary.c_str());
    fail(path, "cannot write", error);
  }
  sync_directory(directory_of(path));
}

void truncate_file(const fs::path& path, uint64_t bytes) {
  struct stat info {};
  if (::stat(path.c_str(), &info) != 0) {
    if (errno == ENOENT)
      return;
    fail(path, "cannot read its size", errno);
  }
  if (static_cast<uint64_t>(info.st_size) <= bytes)
    return;
  if (::truncate(path.c_str(), static_cast<off_t>(bytes)) != 0)
    fail(path, "cannot cut it back to " + std::to_string(bytes) + " bytes", errno);
}

bool is_temporary_file(const fs::path& path) {
  auto name = path.filename().string();
  auto at = name.rfind(".tmp.");
  if (at == std::string::npos || at + 5 == name.size())
    return false;
  return name.find_first_not_of("0123456789", at + 5) == std::string::npos;
}

// -- owned_fd ---------------------------------------------------------------------

owned_fd& owned_fd::operator=(owned_fd&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0)
      ::close(fd_);
    fd_ = other.release();
  }
  return *this;
}

owned_fd::~owned_fd() {
  if (fd_ >= 0)
    ::close(fd_);
}

// -- append_only_file -----------------------------------------------------------

append_only_file::append_only_file(const fs::path& path) : path_(path) {
  fd_ = owned_fd{::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644)};
  if (!fd_.valid())
    fail(path, "cannot open for appending", errno);
  struct stat info {};
  if (::fstat(fd_.get(), &info) != 0)
    fail(path, "cannot read its size", errno);
  size_ = static_cast<uint64_t>(info.st_size);
}

void append_only_file::append(std::string_view record) {
  if (!fd_.valid())
    throw file_error(path_.string() + ": not open");
  size_t written = 0;
  int error = write_all(fd_.get(), record.data(), record.size(), written);
  if (error != 0) {
    // A part of the record may be on disk: cut it off, so the file ends on a whole record.
    if (written > 0 && ::ftruncate(fd_.get(), static_cast<off_t>(size_)) != 0)
      fail(path_, "a failed append could not be cut back", errno);
    fail(path_, "cannot append", error);
  }
  size_ += written;
}

void append_only_file::sync() {
  if (fd_.valid() && ::fdatasync(fd_.get()) != 0)
    fail(path_, "cannot sync", errno);
}

// -- run_lock -------------------------------------------------------------------

run_lock run_lock::acquire(const fs::path& directory, const std::string& name) {
  std::error_code ec;
  fs::create_directories(directory, ec);
  if (ec)
    throw file_error(directory.string() + ": cannot create the run directory: " + ec.message());
  auto path = directory / name;
  // O_CLOEXEC: programs this process starts do not inherit (and so keep) the lock.
  run_lock lock;
  lock.fd_ = owned_fd{::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644)};
  int fd = lock.fd_.get();
  if (fd < 0)
    fail(path, "cannot open the run's lock file", errno);
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    int error = errno;
    if (error != EWOULDBLOCK)
      fail(path, "cannot lock", error);
    char holder[256] = {};
    auto n = ::pread(fd, holder, sizeof holder - 1, 0);
    std::string who = n > 0 ? std::string(holder, static_cast<size_t>(n)) : std::string{"another process"};
    while (!who.empty() && (who.back() == '\n' || who.back() == ' '))
      who.pop_back();
    throw lock_held_error(directory.string() + " is in use by " + who);
  }
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  auto now = std::time(nullptr);
  char when[32] = {};
  std::strftime(when, sizeof when, "%Y-%m-%d %H:%M:%S UTC", std::gmtime(&now));
  auto text = "pid " + std::to_string(::getpid()) + " on host " + host + " (since " + when + ")\n";
  size_t written = 0;
  if (::ftruncate(fd, 0) != 0 || write_all(fd, text.data(), text.size(), written) != 0)
    fail(path, "cannot write the run's lock file", errno);
  return lock;
}

}  // namespace areal
