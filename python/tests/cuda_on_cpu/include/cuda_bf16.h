// Stand-in for CUDA's header when a kernel source is compiled on the CPU by harness.h (the
// types and intrinsics it needs are defined there).
#pragma once
