// mk_params.h: the kernel's parameter block, generated from the ABI X-macros (host and device).
#pragma once

#include "mk_abi.h"

namespace mk {

// The kernel's parameter block, generated from the ABI X-macros (same order as Python's lists).
struct Params {
#define MK_P(name) void* name;
  MK_PARAM_PTRS(MK_P)
#undef MK_P
#define MK_I(name) int name;
  MK_PARAM_INTS(MK_I)
#undef MK_I
#define MK_F(name) float name;
  MK_PARAM_FLOATS(MK_F)
#undef MK_F
};

}  // namespace mk
