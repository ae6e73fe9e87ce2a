// Monitor.Status (switchml.proto): the switch's read-only account of what it is doing now, for
// `switchml status`. The answer is built here from the registry (jobs, workers, waiting calls),
// the call counters and the data plane's snapshot; the control server only routes the call.
//
// Who sees what: under RegistryOptions::require_secret a request without a job secret is refused
// (PERMISSION_DENIED), as every other call is. Otherwise the switch-wide figures are answered,
// and each job in full only to a request that carries its secret (a job created without a secret
// to anyone); the other jobs are only counted (StatusResponse.other_jobs).
#pragma once

#include <grpcpp/support/status.h>

#include "control/call_stats.h"
#include "control/registry.h"
#include "control/switch_snapshot.h"
#include "control/switchml.pb.h"

namespace switchml::control {

// `snapshot` may be null (a control plane without a data plane behind it: its part only).
grpc::Status AnswerStatus(const Registry& registry, const CallStats& calls,
                          const SwitchSnapshot* snapshot,
                          const switchml_proto::StatusRequest& request,
                          switchml_proto::StatusResponse* response);

}  // namespace switchml::control
