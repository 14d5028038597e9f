// session_retry: a test driver of the C++ StreamingSession (built with -DWAN_TRT_BUILD_TESTS=ON; not installed).
//
//   session_retry ENGINE INPUTS BLOCKS OUT
//
// Streams BLOCKS blocks of INPUTS (as `wan_stream --inputs`, from block 0, seed 0) through the AOTInductor
// package ENGINE on the CPU, but offers block 1 twice first: with NaN conditioning (a non-finite input) and
// with conditioning so large the block overflows (a non-finite output). Each must be refused by name, leaving
// the session as it was, so the stream written to OUT equals the one `wan_stream` writes. Exits 1 otherwise.
#include <torch/serialize.h>

#include <fstream>
#include <iostream>
#include <iterator>

#include "wan_trt/runtime.h"

namespace {

at::Tensor get(const c10::Dict<c10::IValue, c10::IValue>& dict, const std::string& key) {
  auto it = dict.find(key);
  return it == dict.end() || it->value().isNone() ? at::Tensor() : it->value().toTensor();
}

// The step's refusal message, or "" if it was not refused.
std::string refusal(wan_trt::StreamingSession& session, const at::Tensor& cond, const at::Tensor& mouse,
                    const at::Tensor& keyboard) {
  try {
    session.step(cond, mouse, keyboard);
  } catch (const wan_trt::Error& e) {
    return e.what();
  }
  return "";
}

int run(char** argv) {
  const std::string engine = argv[1];
  const auto spec = wan_trt::RuntimeSpec::load(engine + ".runtime.txt");
  std::ifstream file(argv[2], std::ios::binary);
  const std::vector<char> bytes{std::istreambuf_iterator<char>(file), std::istreambuf_iterator<char>()};
  auto inputs = torch::pickle_load(bytes).toGenericDict();
  const at::Tensor cond = get(inputs, "cond_concat"), mouse = get(inputs, "mouse"), keyboard = get(inputs, "keyboard");
  const int64_t blocks = std::stoll(argv[3]), f = spec.block_frames;
  wan_trt::AotiRunner runner(engine, spec, at::Device("cpu"));
  wan_trt::StreamingSession session(runner, spec, /*seed=*/0);
  session.start(get(inputs, "visual_context"));
  std::vector<at::Tensor> latents;
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t begin = wan_trt::first_raw_frame(spec, b), n = wan_trt::first_raw_frame(spec, b + 1) - begin;
    auto cut = [&](const at::Tensor& h) { return h.defined() ? h.narrow(1, begin, n) : at::Tensor(); };
    const at::Tensor block_cond = cond.narrow(2, b * f, f);
    if (b == 1) {
      for (const auto& [value, expected] : {std::make_pair(NAN, "cond_concat of block 1 holds non-finite values"),
                                            std::make_pair(3e38f, "of block 1 came out non-finite")}) {
        at::Tensor bad = block_cond.clone();
        bad.narrow(1, 4, bad.size(1) - 4).fill_(value);
        const std::string message = refusal(session, bad, cut(mouse), cut(keyboard));
        std::cout << "refused: " << message << "\n";
        if (message.find(expected) == std::string::npos || session.block() != 1) {
          std::cerr << "expected a refusal of block 1 saying '" << expected << "', got '" << message << "'\n";
          return 1;
        }
      }
    }
    latents.push_back(session.step(block_cond, cut(mouse), cut(keyboard)).latents);
  }
  const std::vector<char> out = torch::pickle_save(at::cat(latents, 2));
  std::ofstream(argv[4], std::ios::binary).write(out.data(), static_cast<std::streamsize>(out.size()));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 5) {
    std::cerr << "usage: session_retry ENGINE INPUTS BLOCKS OUT\n";
    return 2;
  }
  try {
    return run(argv);
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 1;
  }
}
