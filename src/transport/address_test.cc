#include "transport/address.h"

#include <gtest/gtest.h>

#include <string>

namespace switchml::transport {
namespace {

TEST(ResolveIpv4Test, DottedQuadsAndLocalhost) {
  auto ip = ResolveIpv4("10.1.2.3");
  ASSERT_TRUE(ip.ok());
  EXPECT_EQ(*ip, 0x0a010203u);
  ip = ResolveIpv4("localhost");
  ASSERT_TRUE(ip.ok()) << ip.status().ToString();
  EXPECT_EQ(*ip >> 24, 127u);  // somewhere in 127/8
}

TEST(ResolveIpv4Test, ErrorsNameTheHost) {
  auto ip = ResolveIpv4("");
  ASSERT_FALSE(ip.ok());
  EXPECT_EQ(ip.status().code(), StatusCode::kInvalidArgument);
  ip = ResolveIpv4("::1");
  ASSERT_FALSE(ip.ok());
  EXPECT_NE(ip.status().message().find("IPv6"), std::string::npos);
  ip = ResolveIpv4("no-such-host.invalid");
  ASSERT_FALSE(ip.ok());
  EXPECT_NE(ip.status().message().find("no-such-host.invalid"), std::string::npos)
      << ip.status().message();
}

TEST(ParseHostPortTest, HostAloneTakesTheDefaultPort) {
  auto e = ParseHostPort("192.168.1.7", 48864);
  ASSERT_TRUE(e.ok());
  EXPECT_EQ(*e, (Endpoint{0xc0a80107, 48864}));
}

TEST(ParseHostPortTest, HostAndPort) {
  auto e = ParseHostPort("127.0.0.1:50099", 1);
  ASSERT_TRUE(e.ok());
  EXPECT_EQ(*e, (Endpoint{kLoopbackIpv4, 50099}));
  e = ParseHostPort("10.0.0.1:65535", 1);
  ASSERT_TRUE(e.ok());
  EXPECT_EQ(e->port, 65535);
  e = ParseHostPort("localhost:1", 2);
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  EXPECT_EQ(e->port, 1);
}

TEST(ParseHostPortTest, BadPortsAndSyntaxAreExplained) {
  struct Case {
    const char* text;
    const char* expected_fragment;
  };
  const Case cases[] = {
      {"", "empty"},
      {"10.0.0.1:", "no port"},
      {":80", "no host"},
      {"10.0.0.1:0", "1..65535"},
      {"10.0.0.1:65536", "1..65535"},
      {"10.0.0.1:99999999999999999999", "1..65535"},
      {"10.0.0.1:-1", "decimal"},
      {"10.0.0.1:80x", "decimal"},
      {"10.0.0.1: 80", "decimal"},
      {"1:2:3", "more than one"},
      {"[::1]:80", "IPv6"},
  };
  for (const Case& c : cases) {
    auto e = ParseHostPort(c.text, 1);
    ASSERT_FALSE(e.ok()) << c.text;
    EXPECT_EQ(e.status().code(), StatusCode::kInvalidArgument) << c.text;
    EXPECT_NE(e.status().message().find(c.expected_fragment), std::string::npos)
        << c.text << " -> " << e.status().message();
  }
  auto e = ParseHostPort("no-such-host.invalid:80", 1);
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.status().message().find("no-such-host.invalid"), std::string::npos);
}

}  // namespace
}  // namespace switchml::transport
