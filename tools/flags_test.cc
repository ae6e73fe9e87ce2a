#include "flags.h"

#include <gtest/gtest.h>

namespace switchml::tools {
namespace {

TEST(FlagsTest, ParsesKindsAndSizes) {
  Flags f("demo", "a demo");
  f.AddInt("n", 3, "count");
  f.AddSize("size", 10, "size");
  f.AddString("name", "x", "name");
  f.AddDouble("p", 0.5, "prob");
  f.AddBool("quiet", "quiet");
  bool help;
  ASSERT_TRUE(
      f.Parse({"--n", "7", "--size=64M", "--name", "y", "--p=0.01", "--quiet"}, &help).ok());
  EXPECT_FALSE(help);
  EXPECT_EQ(f.GetInt("n"), 7);
  EXPECT_EQ(f.GetSize("size"), 64ull << 20);
  EXPECT_EQ(f.GetString("name"), "y");
  EXPECT_EQ(f.DefaultString("name"), "x");  // (ReadJobFlags tells `run` by --transport's)
  EXPECT_DOUBLE_EQ(f.GetDouble("p"), 0.01);
  EXPECT_TRUE(f.GetBool("quiet"));
  EXPECT_NE(f.Usage().find("--size N"), std::string::npos);
}

TEST(FlagsTest, CheckOutputPathBeforeTheWork) {
  EXPECT_TRUE(CheckOutputPath("json", "-", /*allow_stdout=*/true).ok());
  EXPECT_TRUE(CheckOutputPath("json", "new-file-in-this-directory.json", false).ok());
  EXPECT_TRUE(CheckOutputPath("csv", "/tmp/switchml-flags-test-new.csv", false).ok());
  const Status no_dir = CheckOutputPath("json", "/nonexistent/dir/x.json", false);
  EXPECT_EQ(no_dir.message(),
            "--json /nonexistent/dir/x.json: there is no directory /nonexistent/dir");
  EXPECT_NE(CheckOutputPath("csv", "/tmp", false).message().find("is a directory"),
            std::string::npos);
  EXPECT_NE(CheckOutputPath("csv", "/tmp/", false).message().find("give a file name"),
            std::string::npos);
  EXPECT_FALSE(CheckOutputPath("csv", "", false).ok());
}

TEST(FlagsTest, ErrorsNameTheFlag) {
  Flags f("demo", "a demo");
  f.AddInt("n", 3, "count");
  f.AddSize("size", 10, "size");
  bool help;
  EXPECT_NE(f.Parse({"--nope"}, &help).message().find("unknown flag --nope"), std::string::npos);
  EXPECT_NE(f.Parse({"--n", "x"}, &help).message().find("--n wants a whole number"),
            std::string::npos);
  EXPECT_NE(f.Parse({"--size", "3T"}, &help).message().find("--size"), std::string::npos);
  EXPECT_NE(f.Parse({"--n"}, &help).message().find("needs a value"), std::string::npos);
  // Numbers strtoll/strtod would clamp or that mean nothing as a flag are refused, not read as
  // another number (99999999999999999999 once read as 9223372036854775807, nan passed range
  // checks written as "not in range").
  f.AddDouble("p", 0.5, "prob");
  EXPECT_NE(f.Parse({"--n", "99999999999999999999"}, &help)
                .message()
                .find("--n "
                      "99999999999999999999 "
                      "is out of range"),
            std::string::npos);
  EXPECT_NE(f.Parse({"--n", "-99999999999999999999"}, &help).message().find("out of range"),
            std::string::npos);
  for (const char* bad : {"nan", "inf", "-inf", "1e999", "NAN"}) {
    EXPECT_NE(f.Parse({"--p", bad}, &help).message().find("--p wants a finite number"),
              std::string::npos)
        << bad;
  }
  EXPECT_TRUE(f.Parse({"--p", "1e-300", "--n", "-9223372036854775808"}, &help).ok());
  EXPECT_EQ(f.GetInt("n"), INT64_MIN);
  EXPECT_TRUE(f.Parse({"--help"}, &help).ok());
  EXPECT_TRUE(help);
}

TEST(FlagsTest, ParseSize) {
  uint64_t v;
  EXPECT_TRUE(ParseSize("0", &v) && v == 0);
  EXPECT_TRUE(ParseSize("1k", &v) && v == 1024);
  EXPECT_TRUE(ParseSize("2G", &v) && v == (2ull << 30));
  EXPECT_FALSE(ParseSize("", &v));
  EXPECT_FALSE(ParseSize("M", &v));
  EXPECT_FALSE(ParseSize("1MB", &v));
  EXPECT_FALSE(ParseSize("-1", &v));
}

}  // namespace
}  // namespace switchml::tools
