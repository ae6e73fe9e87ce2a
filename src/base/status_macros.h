// Short names for the public SWITCHML_-prefixed status macros, for the library's own code only
// (an embedding program may have its own RETURN_IF_ERROR; the installed headers define none).
#pragma once

#include "switchml/status.h"

#define RETURN_IF_ERROR(expr) SWITCHML_RETURN_IF_ERROR(expr)
#define ASSIGN_OR_RETURN(lhs, expr) SWITCHML_ASSIGN_OR_RETURN(lhs, expr)
