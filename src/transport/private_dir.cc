#include "transport/private_dir.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

namespace switchml::transport {

std::string PrivateDirectoryPath(const std::string& kind, const std::string& override_path) {
  if (!override_path.empty()) return override_path;
  const uid_t uid = geteuid();
  struct stat run {};
  if (uid == 0 && stat("/run", &run) == 0 && S_ISDIR(run.st_mode) && run.st_uid == 0 &&
      (run.st_mode & 022) == 0) {
    return "/run/switchml-" + kind;
  }
  return "/tmp/switchml-" + kind + "-" + std::to_string(uid);
}

Result<PrivateDirectory> PrivateDirectory::Open(const std::string& path, const std::string& what,
                                                const std::string& variable) {
  const std::string fix = "; remove it (or make it so), or set " + variable +
                          " to a directory of this user's that only it can write";
  if (mkdir(path.c_str(), 0700) != 0 && errno != EEXIST) {
    return FailedPreconditionError("cannot create " + path + " for the " + what + ": " +
                                   std::strerror(errno) + "; set " + variable +
                                   " to a directory of this user's that only it can write");
  }
  const int fd = open(path.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    return FailedPreconditionError(
        path + " (for the " + what + ") cannot be opened as a directory" +
        (err == ELOOP || err == ENOTDIR ? std::string(": it is a symbolic link or not a directory")
                                        : ": " + std::string(std::strerror(err))) +
        fix);
  }
  struct stat st {};
  std::string why;
  if (fstat(fd, &st) != 0) {
    why = std::strerror(errno);
  } else if (st.st_uid != geteuid()) {
    why = "it belongs to user " + std::to_string(st.st_uid) + ", not to this process's user " +
          std::to_string(geteuid()) + " (another user may have made it first)";
  } else if ((st.st_mode & 077) != 0) {
    char mode[8];
    std::snprintf(mode, sizeof mode, "%04o", static_cast<unsigned>(st.st_mode & 07777));
    why = std::string("its mode is ") + mode +
          ": other users could add, replace or lock files "
          "in it (it must be 0700)";
  }
  if (!why.empty()) {
    close(fd);
    return FailedPreconditionError("refusing " + path + " for the " + what + ": " + why + fix);
  }
  return PrivateDirectory(fd, path);
}

PrivateDirectory::PrivateDirectory(PrivateDirectory&& o) noexcept
    : fd_(std::exchange(o.fd_, -1)), path_(std::move(o.path_)) {}

PrivateDirectory& PrivateDirectory::operator=(PrivateDirectory&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) close(fd_);
    fd_ = std::exchange(o.fd_, -1);
    path_ = std::move(o.path_);
  }
  return *this;
}

PrivateDirectory::~PrivateDirectory() {
  if (fd_ >= 0) close(fd_);
}

Result<int> PrivateDirectory::OpenFile(const std::string& name, int flags) const {
  const std::string path = path_ + "/" + name;
  if (name.empty() || name.find('/') != std::string::npos || name == "." || name == "..") {
    return InvalidArgumentError("not a file name: '" + name + "'");
  }
  const int fd = openat(fd_, name.c_str(), flags | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0) {
    const int err = errno;
    return FailedPreconditionError(
        "cannot open " + path + ": " +
        (err == ELOOP ? std::string("it is a symbolic link") : std::string(std::strerror(err))));
  }
  struct stat st {};
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != geteuid()) {
    close(fd);
    return FailedPreconditionError("refusing " + path +
                                   ": not a regular file of this process's user");
  }
  return fd;
}

}  // namespace switchml::transport
