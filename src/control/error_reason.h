// ErrorReason: why a control-plane call failed, as a type beside its Status, so that no branch
// depends on the words of a message (rewording one changes no behaviour).
//
// The switch sets it where an error is made (the Registry) and sends it across processes in the
// call's trailing metadata (reason_metadata.h; switchml.proto's ErrorReason, whose numbers these
// are); a top-of-rack switch passes on the reason its upstream switch sent (runtime/uplink.cc);
// the ControlClient decides on it. A reference switch sends none: kNone.
#pragma once

#include <cstdint>

namespace switchml::control {

enum class ErrorReason : uint8_t {
  kNone = 0,  // none sent: the code and the message are all there is
  // DEADLINE_EXCEEDED of a Barrier/Broadcast that the switch ended itself shortly before the
  // caller's deadline (Registry::ExpireWait): its message names the ranks that did not arrive.
  kRoundExpired = 1,
};

}  // namespace switchml::control
