// Lock and doorbell directories only this user can write (private_dir.h; issue 28, found 2, 3).
#include "transport/private_dir.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

namespace switchml::transport {
namespace {

namespace fs = std::filesystem;

class PrivateDirTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/switchml-private-dir-test.XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    root_ = tmpl;
  }
  void TearDown() override { fs::remove_all(root_); }
  std::string root_;
};

TEST_F(PrivateDirTest, MadeClosedToOthersAndFilesAreThisUsers) {
  const std::string path = root_ + "/locks";
  auto d = PrivateDirectory::Open(path, "test files", "TEST_DIR");
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  struct stat st {};
  ASSERT_EQ(lstat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0700u);
  auto fd = d->OpenFile("a.lock", O_RDWR);
  ASSERT_TRUE(fd.ok()) << fd.status().ToString();
  ASSERT_EQ(fstat(*fd, &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0600u);
  close(*fd);
  // Opened again: the same file (it is not new).
  fd = d->OpenFile("a.lock", O_RDONLY);
  ASSERT_TRUE(fd.ok());
  close(*fd);
  EXPECT_FALSE(d->OpenFile("../escape", O_RDWR).ok());
  // A second Open of the same directory is fine.
  EXPECT_TRUE(PrivateDirectory::Open(path, "test files", "TEST_DIR").ok());
}

// A directory others can write, a symbolic link in the directory's place, and links among its
// files are refused, naming the path and what to do; a link's target is never touched.
TEST_F(PrivateDirTest, LinksAndOpenDirectoriesAreRefused) {
  const std::string open_dir = root_ + "/open";
  ASSERT_EQ(mkdir(open_dir.c_str(), 0700), 0);
  ASSERT_EQ(chmod(open_dir.c_str(), 01777), 0);
  auto d = PrivateDirectory::Open(open_dir, "test files", "TEST_DIR");
  ASSERT_FALSE(d.ok());
  EXPECT_NE(d.status().message().find("its mode is 1777"), std::string::npos)
      << d.status().message();
  EXPECT_NE(d.status().message().find("TEST_DIR"), std::string::npos) << d.status().message();

  const std::string real = root_ + "/real";
  ASSERT_EQ(mkdir(real.c_str(), 0700), 0);
  const std::string link = root_ + "/link";
  ASSERT_EQ(symlink(real.c_str(), link.c_str()), 0);
  d = PrivateDirectory::Open(link, "test files", "TEST_DIR");
  ASSERT_FALSE(d.ok());
  EXPECT_NE(d.status().message().find("symbolic link"), std::string::npos) << d.status().message();

  const std::string victim = root_ + "/victim";
  { std::ofstream(victim) << "precious"; }
  ASSERT_EQ(symlink(victim.c_str(), (real + "/x.bell").c_str()), 0);
  ASSERT_EQ(symlink((root_ + "/new-file").c_str(), (real + "/y.bell").c_str()), 0);
  d = PrivateDirectory::Open(real, "test files", "TEST_DIR");
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  auto fd = d->OpenFile("x.bell", O_RDWR);
  ASSERT_FALSE(fd.ok());
  EXPECT_NE(fd.status().message().find("symbolic link"), std::string::npos)
      << fd.status().message();
  EXPECT_FALSE(d->OpenFile("y.bell", O_RDWR).ok());
  EXPECT_FALSE(fs::exists(root_ + "/new-file"));
  EXPECT_EQ(fs::file_size(victim), 8u);
}

// A directory of another user (made first by someone else) is refused (root only: needs chown).
TEST_F(PrivateDirTest, AnotherUsersDirectoryIsRefused) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to give a directory to another user";
  const std::string theirs = root_ + "/theirs";
  ASSERT_EQ(mkdir(theirs.c_str(), 0700), 0);
  ASSERT_EQ(chown(theirs.c_str(), 65534, 65534), 0);
  auto d = PrivateDirectory::Open(theirs, "test files", "TEST_DIR");
  ASSERT_FALSE(d.ok());
  EXPECT_NE(d.status().message().find("belongs to user 65534"), std::string::npos)
      << d.status().message();
}

TEST(PrivateDirPathTest, PerUserAndOverridable) {
  EXPECT_EQ(PrivateDirectoryPath("dpdk", "/somewhere"), "/somewhere");
  const std::string p = PrivateDirectoryPath("dpdk", "");
  if (geteuid() == 0) {
    EXPECT_TRUE(p == "/run/switchml-dpdk" || p == "/tmp/switchml-dpdk-0") << p;
  } else {
    EXPECT_EQ(p, "/tmp/switchml-dpdk-" + std::to_string(geteuid()));
  }
}

}  // namespace
}  // namespace switchml::transport
