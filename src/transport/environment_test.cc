#include "transport/environment.h"

#include <gtest/gtest.h>

#include <map>
#include <string>

namespace switchml::transport {
namespace {

// An environment of its own: no test changes the process's.
EnvironmentLookup Env(std::map<std::string, std::string> vars) {
  return [vars = std::move(vars)](const char* name) -> std::optional<std::string> {
    auto it = vars.find(name);
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
}

// Given no variable (or empty ones), Expect every field as the caller made it.
TEST(TransportEnvironmentTest, UnsetOrEmptyVariablesLeaveTheCallersValues) {
  DpdkOptions d;
  d.device = "net_af_packet0,iface=veth0";
  d.first_nap = std::chrono::microseconds(7);
  ASSERT_TRUE(ReadDpdkEnvironment(Env({{"SWITCHML_DPDK_DEVICE", ""}}), &d).ok());
  EXPECT_EQ(d.device, "net_af_packet0,iface=veth0");
  EXPECT_EQ(d.first_nap, std::chrono::microseconds(7));
  EXPECT_TRUE(d.doorbells);
  XdpOptions x;
  x.queue = 3;
  ASSERT_TRUE(ReadXdpEnvironment(Env({}), &x).ok());
  EXPECT_EQ(x.queue, 3u);
  ShmOptions s;
  s.directory = "/tmp/mine";
  ASSERT_TRUE(ReadShmEnvironment(Env({{"SWITCHML_SHM_DIR", ""}}), &s).ok());
  EXPECT_EQ(s.directory, "/tmp/mine");
}

// Given every DPDK variable set to a good value, Expect each typed field to hold it, parsed once.
TEST(TransportEnvironmentTest, DpdkVariablesFillTheirFields) {
  DpdkOptions d;
  ASSERT_TRUE(ReadDpdkEnvironment(Env({{"SWITCHML_DPDK_DEVICE", "0000:01:00.0"},
                                       {"SWITCHML_DPDK_EAL", "--no-huge -m 64"},
                                       {"SWITCHML_DPDK_MEMIF_INTERFACES", "16"},
                                       {"SWITCHML_DPDK_MEMIF_SOCKET", "mine"},
                                       {"SWITCHML_DPDK_LOCK_DIR", "/tmp/locks"},
                                       {"SWITCHML_DPDK_NEIGH",
                                        "10.0.0.1=02:00:00:00:00:01, 10.0.0.2=0a-0b-0c-0d-0e-0f"},
                                       {"SWITCHML_DPDK_DOORBELL", "off"},
                                       {"SWITCHML_DPDK_POLL", "spin"},
                                       {"SWITCHML_DPDK_SPIN", "4294967295"},
                                       {"SWITCHML_DPDK_NAP_US", "5"},
                                       {"SWITCHML_DPDK_MAX_NAP_US", "50"},
                                       {"SWITCHML_DPDK_MAX_SLEEP_US", "60000000"},
                                       {"SWITCHML_DPDK_YIELD_US", "0"}}),
                                  &d)
                  .ok());
  EXPECT_EQ(d.device, "0000:01:00.0");
  EXPECT_EQ(d.eal_args, "--no-huge -m 64");
  EXPECT_EQ(d.memif_interfaces, 16u);
  EXPECT_EQ(d.memif_socket, "mine");
  EXPECT_EQ(d.lock_dir, "/tmp/locks");
  ASSERT_EQ(d.neighbours.size(), 2u);
  EXPECT_EQ(d.neighbours[0].ipv4, 0x0a000001u);
  EXPECT_EQ(d.neighbours[0].mac[5], 0x01);
  EXPECT_EQ(d.neighbours[1].ipv4, 0x0a000002u);
  EXPECT_EQ(d.neighbours[1].mac[0], 0x0a);
  EXPECT_EQ(d.neighbours[1].mac[5], 0x0f);
  EXPECT_FALSE(d.doorbells);
  EXPECT_TRUE(d.spin_only);
  EXPECT_EQ(d.spin_polls, 4294967295u);
  EXPECT_EQ(d.first_nap, std::chrono::microseconds(5));
  EXPECT_EQ(d.max_nap, std::chrono::microseconds(50));
  EXPECT_EQ(d.max_sleep, std::chrono::microseconds(60000000));
  EXPECT_EQ(d.yield_for, std::chrono::microseconds(0));
}

// Given a bad value of any variable, Expect an error naming the variable, what it accepts and
// the value, and nothing read as 0 or as on ("abc" was 0, "20x" 20, a nap of 0 1 us, any
// doorbell but "off" on, any XDP debug value on).
TEST(TransportEnvironmentTest, BadValuesAreRefusedNamingTheVariable) {
  struct Case {
    const char* name;
    const char* value;
    const char* says;
  };
  for (const Case& c : {
           Case{"SWITCHML_DPDK_NAP_US", "abc",
                "must be a whole number in 1..3600000000, not 'abc'"},
           Case{"SWITCHML_DPDK_NAP_US", "0", "must be a whole number in 1..3600000000"},
           Case{"SWITCHML_DPDK_MAX_SLEEP_US", "0", "must be a whole number"},
           Case{"SWITCHML_DPDK_SPIN", "20x", "must be a whole number in 0..4294967295"},
           Case{"SWITCHML_DPDK_SPIN", "4294967296", "must be a whole number"},
           Case{"SWITCHML_DPDK_YIELD_US", "-1", "must be a whole number"},
           Case{"SWITCHML_DPDK_DOORBELL", "no", "must be on (the default) or off, not 'no'"},
           Case{"SWITCHML_DPDK_POLL", "busy", "must be spin (never sleep) or unset"},
           Case{"SWITCHML_DPDK_MEMIF_INTERFACES", "8x", "must be in 1..256, not '8x'"},
           Case{"SWITCHML_DPDK_MEMIF_INTERFACES", "0", "must be in 1..256"},
           Case{"SWITCHML_DPDK_NEIGH", "10.0.0.1=02:00:00:00:00", "is not ipv4=mac"},
           Case{"SWITCHML_DPDK_NEIGH", "10.0.0.1", "is not ipv4=mac"},
           Case{"SWITCHML_XDP_QUEUE", "abc", "must be a queue id (0, 1, ...), not 'abc'"},
           Case{"SWITCHML_XDP_QUEUE", "-1", "must be a queue id"},
           Case{"SWITCHML_XDP_MODE", "fast", "must be auto, native or generic, not 'fast'"},
           Case{"SWITCHML_XDP_COPY", "yes", "must be 0 or 1 (1: copy mode only), not 'yes'"},
           Case{"SWITCHML_XDP_DEBUG", "yes", "must be 0 or 1"},
       }) {
    DpdkOptions d;
    XdpOptions x;
    const bool dpdk = std::string(c.name).rfind("SWITCHML_DPDK_", 0) == 0;
    const Status st = dpdk ? ReadDpdkEnvironment(Env({{c.name, c.value}}), &d)
                           : ReadXdpEnvironment(Env({{c.name, c.value}}), &x);
    ASSERT_FALSE(st.ok()) << c.name << "=" << c.value;
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(st.message().find(c.name), std::string::npos) << st.message();
    EXPECT_NE(st.message().find(c.says), std::string::npos) << st.message();
  }
}

// Given the XDP variables, Expect their typed fields, 0 and 1 both meaning what they say.
TEST(TransportEnvironmentTest, XdpVariablesFillTheirFields) {
  XdpOptions x;
  x.debug = true;
  ASSERT_TRUE(ReadXdpEnvironment(Env({{"SWITCHML_XDP_IFACE", "veth0"},
                                      {"SWITCHML_XDP_QUEUE", "2"},
                                      {"SWITCHML_XDP_MODE", "generic"},
                                      {"SWITCHML_XDP_COPY", "1"},
                                      {"SWITCHML_XDP_DEBUG", "0"},
                                      {"SWITCHML_XDP_LOCK_DIR", "/tmp/x"}}),
                                 &x)
                  .ok());
  EXPECT_EQ(x.interface, "veth0");
  EXPECT_EQ(x.queue, 2u);
  EXPECT_EQ(x.mode, XdpAttachMode::kGeneric);
  EXPECT_TRUE(x.copy_only);
  EXPECT_FALSE(x.debug);
  EXPECT_EQ(x.lock_dir, "/tmp/x");
}

}  // namespace
}  // namespace switchml::transport
