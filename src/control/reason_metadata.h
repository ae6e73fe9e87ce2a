// The typed reason of a failed call (error_reason.h) on the wire: the call's trailing metadata,
// key `switchml-reason`, value the name of switchml.proto's ErrorReason ("ROUND_EXPIRED").
// (Not grpc::Status's error_details: by gRPC's convention those hold a google.rpc.Status, whose
// definition Debian does not ship; a metadata entry is ignored by clients that do not know it,
// a reference client among them.)
#pragma once

#include <grpcpp/client_context.h>
#include <grpcpp/server_context.h>

#include <string>

#include "control/error_reason.h"
#include "control/switchml.pb.h"

namespace switchml::control {

inline constexpr char kReasonMetadataKey[] = "switchml-reason";

static_assert(static_cast<int>(ErrorReason::kNone) == switchml_proto::ERROR_REASON_UNSPECIFIED);
static_assert(static_cast<int>(ErrorReason::kRoundExpired) == switchml_proto::ROUND_EXPIRED);

// Sends `reason` with the call's status (nothing for kNone). Call before the call is finished.
inline void SetReason(grpc::ServerContextBase* ctx, ErrorReason reason) {
  if (reason == ErrorReason::kNone) return;
  ctx->AddTrailingMetadata(
      kReasonMetadataKey,
      switchml_proto::ErrorReason_Name(static_cast<switchml_proto::ErrorReason>(reason)));
}

// The reason the server sent with the call's status: kNone when it sent none (a reference
// switch), or one this build does not know. Call once the call has finished.
inline ErrorReason ReasonOf(const grpc::ClientContext& ctx) {
  const auto& trailers = ctx.GetServerTrailingMetadata();
  auto it = trailers.find(kReasonMetadataKey);
  if (it == trailers.end()) return ErrorReason::kNone;
  switchml_proto::ErrorReason reason;
  if (!switchml_proto::ErrorReason_Parse(std::string(it->second.data(), it->second.size()),
                                         &reason)) {
    return ErrorReason::kNone;
  }
  switch (reason) {
    case switchml_proto::ROUND_EXPIRED:
      return ErrorReason::kRoundExpired;
    default:
      return ErrorReason::kNone;
  }
}

}  // namespace switchml::control
