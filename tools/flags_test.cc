#include "flags.h"

#include <gtest/gtest.h>

namespace switchml::tools {
namespace {

// A command's flags as it binds them: every kind once.
struct DemoFlags {
  int64_t n = 3;
  Size size{10};
  std::string name = "x";
  double p = 0.5;
  bool quiet = false;
};

void Bind(Flags* f, DemoFlags* d) {
  f->Add("n", &d->n, "count");
  f->Add("size", &d->size, "size");
  f->Add("name", &d->name, "name");
  f->Add("p", &d->p, "prob");
  f->Add("quiet", &d->quiet, "quiet");
}

TEST(FlagsTest, ParsesEachKindIntoItsBoundVariable) {
  Flags f("demo", "a demo");
  DemoFlags d;
  Bind(&f, &d);
  bool help;
  ASSERT_TRUE(
      f.Parse({"--n", "7", "--size=64M", "--name", "y", "--p=0.01", "--quiet"}, &help).ok());
  EXPECT_FALSE(help);
  EXPECT_EQ(d.n, 7);
  EXPECT_EQ(d.size.value, 64ull << 20);
  EXPECT_EQ(d.name, "y");
  EXPECT_DOUBLE_EQ(d.p, 0.01);
  EXPECT_TRUE(d.quiet);
  ASSERT_TRUE(f.Parse({"--quiet=false", "--n=-4", "--size", "3"}, &help).ok());
  EXPECT_FALSE(d.quiet);
  EXPECT_EQ(d.n, -4);
  EXPECT_EQ(d.size.value, 3u);
}

TEST(FlagsTest, UnsetFlagsKeepTheirDefaultsWhichHelpShows) {
  Flags f("demo", "a demo");
  DemoFlags d;
  d.n = 12;
  d.name = "";  // an empty default is not shown
  Bind(&f, &d);
  bool help;
  ASSERT_TRUE(f.Parse({"--p", "2"}, &help).ok());
  EXPECT_EQ(d.n, 12);
  EXPECT_EQ(d.size.value, 10u);
  EXPECT_EQ(d.name, "");
  EXPECT_FALSE(d.quiet);
  const std::string usage = f.Usage();
  EXPECT_NE(usage.find("usage: switchml demo [flags]\n\na demo\n"), std::string::npos) << usage;
  EXPECT_NE(usage.find("  --n N                   count (default 12)\n"), std::string::npos)
      << usage;
  EXPECT_NE(usage.find("  --size N                size (default 10)\n"), std::string::npos);
  EXPECT_NE(usage.find("  --name S                name\n"), std::string::npos);
  EXPECT_NE(usage.find("  --p N                   prob (default 0.5)\n"), std::string::npos);
  EXPECT_NE(usage.find("  --quiet                 quiet\n"), std::string::npos);
}

TEST(FlagsTest, UsageNamesAProgramOfItsOwn) {
  Flags own("gen", "a load", "switchml_transport_bench");
  EXPECT_EQ(own.Usage().rfind("usage: switchml_transport_bench gen [flags]\n", 0), 0u);
  Flags alone("gloo_allreduce", "a baseline", /*program=*/"");
  EXPECT_EQ(alone.Usage().rfind("usage: gloo_allreduce [flags]\n", 0), 0u);
}

TEST(FlagsTest, WasSetTellsGivenFromDefaulted) {
  Flags f("demo", "a demo");
  DemoFlags d;
  Bind(&f, &d);
  bool help;
  ASSERT_TRUE(f.Parse({"--n", "3", "--quiet=false"}, &help).ok());
  EXPECT_TRUE(f.WasSet(&d.n));  // given, even as its default
  EXPECT_TRUE(f.WasSet(&d.quiet));
  EXPECT_FALSE(f.WasSet(&d.size));
  EXPECT_FALSE(f.WasSet(&d.name));
  EXPECT_FALSE(f.WasSet(&d.p));
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

TEST(FlagsTest, ErrorsNameTheFlagAndLeaveItsVariable) {
  Flags f("demo", "a demo");
  DemoFlags d;
  Bind(&f, &d);
  bool help;
  EXPECT_EQ(f.Parse({"--nope"}, &help).message(), "unknown flag --nope (see switchml demo --help)");
  EXPECT_EQ(f.Parse({"stray"}, &help).message(),
            "unexpected argument 'stray' (flags start with --; see switchml demo --help)");
  Flags own("tool", "a program of its own", "");
  EXPECT_EQ(own.Parse({"--nope"}, &help).message(), "unknown flag --nope (see tool --help)");
  EXPECT_EQ(f.Parse({"--n", "x"}, &help).message(), "--n wants a whole number, not 'x'");
  EXPECT_EQ(f.Parse({"--n="}, &help).message(), "--n wants a whole number, not ''");
  EXPECT_EQ(f.Parse({"--size", "3T"}, &help).message(),
            "--size wants a count like 1000, 64K, 64M or 1G, not '3T'");
  EXPECT_EQ(f.Parse({"--p", "0.5x"}, &help).message(), "--p wants a number, not '0.5x'");
  EXPECT_EQ(f.Parse({"--n"}, &help).message(), "--n needs a value");
  EXPECT_EQ(f.Parse({"--quiet=yes"}, &help).message(), "--quiet takes no value (or =true/=false)");
  EXPECT_EQ(d.n, 3);  // refused values are not written
  EXPECT_EQ(d.size.value, 10u);
  EXPECT_DOUBLE_EQ(d.p, 0.5);
  EXPECT_FALSE(d.quiet);
  // Numbers strtoll/strtod would clamp or that mean nothing as a flag are refused, not read as
  // another number (99999999999999999999 once read as 9223372036854775807, nan passed range
  // checks written as "not in range").
  EXPECT_EQ(f.Parse({"--n", "99999999999999999999"}, &help).message(),
            "--n 99999999999999999999 is out of range");
  EXPECT_NE(f.Parse({"--n", "-99999999999999999999"}, &help).message().find("out of range"),
            std::string::npos);
  for (const char* bad : {"nan", "inf", "-inf", "1e999", "NAN"}) {
    EXPECT_NE(f.Parse({"--p", bad}, &help).message().find("--p wants a finite number"),
              std::string::npos)
        << bad;
  }
  EXPECT_TRUE(f.Parse({"--p", "1e-300", "--n", "-9223372036854775808"}, &help).ok());
  EXPECT_EQ(d.n, INT64_MIN);
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
  EXPECT_FALSE(ParseSize("17179869184G", &v));  // 2^64: would wrap
}

TEST(FlagsTest, MisuseIsAProgrammingErrorThatAborts) {
  Flags f("demo", "a demo");
  DemoFlags d;
  Bind(&f, &d);
  int64_t other = 0;
  EXPECT_DEATH(f.Add("n", &other, "again"), "n");
  EXPECT_DEATH(f.WasSet(&other), "no flag is bound");
  bool on = true;
  EXPECT_DEATH(f.Add("on", &on, "on by default"), "off unless given");
}

}  // namespace
}  // namespace switchml::tools
