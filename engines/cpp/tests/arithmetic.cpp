// arithmetic: a test driver of the C++ runtime's library API (built with -DWAN_TRT_BUILD_TESTS=ON; not installed).
//
//   arithmetic
//
// Fp32AsFp32, which AotiRunner::infer holds around every call of an fp32 engine: with a program's settings that let
// cuDNN's convolutions and the matmuls round fp32 to TF32, it must turn both off while it lives and give the program
// its settings back after, and change nothing for an engine of another precision. Prints "ok", or says what was wrong
// and exits 1.
#include <iostream>

#include "wan_trt/runtime.h"

namespace {

bool tf32(bool convolutions, at::Float32MatmulPrecision matmuls) {
  auto& context = at::globalContext();
  return context.allowTF32CuDNN() == convolutions && context.float32MatmulPrecision() == matmuls;
}

int fail(const std::string& what) {
  std::cout << what << "\n";
  return 1;
}

}  // namespace

int main() {
  using P = at::Float32MatmulPrecision;
  auto& context = at::globalContext();
  context.setAllowTF32CuDNN(true);  // the program's settings: TF32 everywhere
  context.setFloat32MatmulPrecision("high");
  {
    const wan_trt::Fp32AsFp32 arithmetic(true);
    if (!tf32(false, P::HIGHEST)) return fail("an fp32 engine's call ran with TF32 allowed");
  }
  if (!tf32(true, P::HIGH)) return fail("the program's settings were not given back after the call");
  {
    const wan_trt::Fp32AsFp32 arithmetic(false);
    if (!tf32(true, P::HIGH)) return fail("the settings changed for an engine of another precision");
  }
  context.setFloat32MatmulPrecision("medium");
  { const wan_trt::Fp32AsFp32 arithmetic(true); }
  if (!tf32(true, P::MEDIUM)) return fail("the program's 'medium' matmul precision was not given back");
  std::cout << "ok\n";
  return 0;
}
