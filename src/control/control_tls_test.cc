// The control plane over TLS, server-only and mutual, with a throw-away CA made by `openssl` at
// test time (skipped when openssl is missing).
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "control/control_client.h"
#include "control/control_server.h"

namespace switchml::control {
namespace {

using namespace std::chrono_literals;

class ControlTlsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (std::system("openssl version >/dev/null 2>&1") != 0) GTEST_SKIP() << "no openssl";
    dir_ = std::filesystem::temp_directory_path() / ("switchml_tls_" + std::to_string(getpid()));
    std::filesystem::create_directories(dir_);
    const std::string d = dir_.string();
    // A CA, and a server and a client certificate signed by it (the server's for "switch").
    const std::string script =
        "cd " + d +
        " && openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.pem -days 1 "
        "-subj /CN=test-ca"
        " && openssl req -newkey rsa:2048 -nodes -keyout server.key -out server.csr "
        "-subj /CN=switch"
        " && printf 'subjectAltName=DNS:switch' > san.ext"
        " && openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial "
        "-out server.pem -days 1 -extfile san.ext"
        " && openssl req -newkey rsa:2048 -nodes -keyout client.key -out client.csr "
        "-subj /CN=worker"
        " && openssl x509 -req -in client.csr -CA ca.pem -CAkey ca.key -CAcreateserial "
        "-out client.pem -days 1"
        " && openssl req -x509 -newkey rsa:2048 -nodes -keyout other.key -out other.pem -days 1 "
        "-subj /CN=other-ca";
    ASSERT_EQ(std::system(("(" + script + ") >/dev/null 2>&1").c_str()), 0);
  }
  void TearDown() override {
    if (!dir_.empty()) std::filesystem::remove_all(dir_);
  }
  std::string File(const char* name) const { return (dir_ / name).string(); }

  std::unique_ptr<ControlServer> Start(bool mutual) {
    ControlServerOptions o;
    o.bind_address = "127.0.0.1";
    o.port = 0;
    o.tls_cert_file = File("server.pem");
    o.tls_key_file = File("server.key");
    if (mutual) o.tls_client_ca_file = File("ca.pem");
    auto s = ControlServer::Start(o, &sw_);
    EXPECT_TRUE(s.ok()) << s.status().ToString();
    return s.ok() ? std::move(s).value() : nullptr;
  }

  Status OneWorkerBarrier(const ControlServer& s, const ControlTlsOptions& tls) {
    auto c = ControlClient::Create("127.0.0.1:" + std::to_string(s.port()), 3s, tls);
    if (!c.ok()) return c.status();
    return (*c)->Barrier(5, 1, "secret", 0);
  }

  std::filesystem::path dir_;
  dataplane::LockedSwitch sw_{dataplane::SwitchConfig{}};
};

// Server-only TLS: a client that trusts the CA gets through; a plaintext client and one that
// trusts another CA do not.
TEST_F(ControlTlsTest, ServerTls) {
  auto s = Start(false);
  ASSERT_NE(s, nullptr);
  ControlTlsOptions tls;
  tls.ca_file = File("ca.pem");
  tls.server_name = "switch";
  EXPECT_TRUE(OneWorkerBarrier(*s, tls).ok());
  EXPECT_FALSE(OneWorkerBarrier(*s, ControlTlsOptions{}).ok());
  ControlTlsOptions wrong = tls;
  wrong.ca_file = File("other.pem");
  EXPECT_FALSE(OneWorkerBarrier(*s, wrong).ok());
}

// Mutual TLS: only a client with a certificate from the CA gets through.
TEST_F(ControlTlsTest, MutualTls) {
  auto s = Start(true);
  ASSERT_NE(s, nullptr);
  ControlTlsOptions tls;
  tls.ca_file = File("ca.pem");
  tls.server_name = "switch";
  // The handshake fails, and gRPC retries it until the deadline: the message says TLS may be
  // why (it said only "is `switchml switch` running there?").
  Status no_cert = OneWorkerBarrier(*s, tls);
  EXPECT_EQ(no_cert.code(), StatusCode::kDeadlineExceeded) << no_cert.ToString();
  EXPECT_NE(no_cert.message().find("does the switch require a client certificate"),
            std::string::npos)
      << no_cert.ToString();
  tls.cert_file = File("client.pem");
  tls.key_file = File("client.key");
  Status st = OneWorkerBarrier(*s, tls);
  EXPECT_TRUE(st.ok()) << st.ToString();
}

// A CA, certificate or key file without PEM data is refused by name. gRPC would take an empty CA
// file's empty roots as "none given" and trust its default (public) roots instead: the client
// used to start with an empty --tls-ca, and a switch with an empty --tls-client-ca.
TEST_F(ControlTlsTest, FilesWithoutPemAreRefused) {
  { std::ofstream empty(File("empty.pem")); }
  ControlTlsOptions tls;
  tls.ca_file = File("empty.pem");
  auto c = ControlClient::Create("127.0.0.1:1", 1s, tls);
  ASSERT_FALSE(c.ok()) << "an empty CA file must not mean the default roots";
  EXPECT_EQ(c.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(c.status().message().find("empty.pem holds no PEM data"), std::string::npos)
      << c.status().ToString();
  tls.ca_file = File("ca.pem");
  tls.cert_file = File("client.pem");
  tls.key_file = dir_.string();  // a directory reads as empty
  c = ControlClient::Create("127.0.0.1:1", 1s, tls);
  EXPECT_EQ(c.status().code(), StatusCode::kInvalidArgument) << c.status().ToString();

  ControlServerOptions o;
  o.bind_address = "127.0.0.1";
  o.port = 0;
  o.tls_cert_file = File("server.pem");
  o.tls_key_file = File("server.key");
  o.tls_client_ca_file = File("empty.pem");
  auto s = ControlServer::Start(o, &sw_);
  ASSERT_FALSE(s.ok()) << "mutual TLS with an empty client CA file";
  EXPECT_NE(s.status().message().find("client CA " + File("empty.pem") + " holds no PEM data"),
            std::string::npos)
      << s.status().ToString();
}

// A key that is not the certificate's is reported as such, not as a port in use (gRPC fails
// BuildAndStart the same way for both; the message used to send the user to --control-port).
TEST_F(ControlTlsTest, KeyOfAnotherCertificateIsNamed) {
  ControlServerOptions o;
  o.bind_address = "127.0.0.1";
  o.port = 0;
  o.tls_cert_file = File("client.pem");
  o.tls_key_file = File("server.key");
  auto s = ControlServer::Start(o, &sw_);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), StatusCode::kInvalidArgument) << s.status().ToString();
  EXPECT_NE(s.status().message().find("TLS certificate " + File("client.pem")), std::string::npos)
      << s.status().ToString();
  EXPECT_EQ(s.status().message().find("port in use"), std::string::npos) << s.status().ToString();
}

// A port in use is still reported as one with TLS on.
TEST_F(ControlTlsTest, PortInUseWithTls) {
  auto first = Start(false);
  ASSERT_NE(first, nullptr);
  ControlServerOptions o;
  o.bind_address = "127.0.0.1";
  o.port = first->port();
  o.tls_cert_file = File("server.pem");
  o.tls_key_file = File("server.key");
  auto s = ControlServer::Start(o, &sw_);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), StatusCode::kUnavailable) << s.status().ToString();
  EXPECT_NE(s.status().message().find("port in use"), std::string::npos) << s.status().ToString();
}

TEST(ControlTlsOptionsTest, IncompleteFilesAreRefused) {
  ControlServerOptions o;
  o.tls_cert_file = "x.pem";
  EXPECT_FALSE(o.Validate().ok());
  ControlTlsOptions t;
  t.cert_file = "x.pem";
  EXPECT_FALSE(ControlClient::Create("127.0.0.1:1", 1s, t).ok());
}

}  // namespace
}  // namespace switchml::control
