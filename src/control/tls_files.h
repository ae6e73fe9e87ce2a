// Reading the PEM files of the control plane's TLS (--tls-cert, --tls-key, --tls-ca,
// --tls-client-ca), one rule for the server (control_server.cc) and the client
// (control_client.cc).
//
// A file with no PEM block is refused here, by name: gRPC takes empty root certificates to mean
// "no roots given" and then trusts its default (system) roots, so an empty --tls-ca (a file that
// was not provisioned, a directory, a DER file read as empty) would silently trust every public
// CA instead of failing.
#pragma once

#include <fstream>
#include <sstream>
#include <string>

#include "switchml/status.h"

namespace switchml::control {

// The contents of the PEM file at `path`; `what` names it in errors ("CA file", "key").
inline Result<std::string> ReadTlsPem(const std::string& path, const char* what) {
  std::ifstream f(path);
  if (!f) return InvalidArgumentError(std::string("cannot read the TLS ") + what + " " + path);
  std::ostringstream s;
  s << f.rdbuf();
  std::string pem = s.str();
  if (pem.find("-----BEGIN ") == std::string::npos) {
    return InvalidArgumentError(std::string("the TLS ") + what + " " + path +
                                " holds no PEM data (no \"-----BEGIN\" line): is it empty, a "
                                "directory, or in DER form? (convert with `openssl x509 -inform "
                                "der` / `openssl pkey -inform der`)");
  }
  return pem;
}

}  // namespace switchml::control
