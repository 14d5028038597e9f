// Zero inputs for the C++ runtime's test drivers (api_refusals, spec_copies): what the drivers feed where only the
// path through the library matters, not the values.
#pragma once

#include <map>
#include <string>
#include <utility>

#include "wan_trt/runtime.h"

// Every input of ``io``, zeros of its shape and dtype, on the CPU.
inline std::map<std::string, at::Tensor> zeros(const wan_trt::GraphIO& io) {
  std::map<std::string, at::Tensor> feeds;
  for (const auto& t : io.inputs) feeds[t.name] = at::zeros(t.shape, at::TensorOptions().dtype(t.dtype));
  return feeds;
}

// Zero mouse and keyboard raw frames [1, n, D] of ``block`` (n: the raw frames it adds).
inline std::pair<at::Tensor, at::Tensor> zero_actions(const wan_trt::RuntimeSpec& spec, int64_t block) {
  const int64_t n = wan_trt::raw_frames_in_block(spec, block);
  return {at::zeros({1, n, spec.input("mouse_window").shape.back()}),
          at::zeros({1, n, spec.input("keyboard_window").shape.back()})};
}
