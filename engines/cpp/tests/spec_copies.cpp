// spec_copies: a test driver of the C++ runtime's library API (built with -DWAN_TRT_BUILD_TESTS=ON; not installed).
//
//   spec_copies CASE ENGINE DECODER
//
// Makes a runner, a decoder stream or a session from spec objects, then changes the caller's objects as a program that
// reuses them may, and runs: what it made must keep running as the specs it was given say (it keeps copies of them).
// Prints "kept: <what it checked>", or says what went wrong and exits 1. ENGINE: the DiT package; DECODER: either
// engine of a decoder engine pair; both run on the CPU. CASE:
//   runner   an AotiRunner whose spec object is then replaced by another (empty) one runs a pass
//   decoder  a DecoderStream whose pair's specs are then replaced decodes two blocks of a session
//   session  a StreamingSession whose spec object's schedule (sigmas) is then changed streams two blocks as one given
//            the unchanged spec does
#include <iostream>

#include "wan_trt/runtime.h"
#include "zero_feeds.h"

namespace {

// Block ``block``'s latents [1, 16, 3, h, w] and frames (with a decoder) from zero conditioning and actions.
wan_trt::Block step(wan_trt::StreamingSession& session, const wan_trt::RuntimeSpec& spec, int64_t block) {
  const auto [mouse, keyboard] = zero_actions(spec, block);
  return session.step(at::zeros(spec.input("cond_concat").shape), mouse, keyboard);
}

// What ``what`` checked, or what went wrong (exit 1).
int report(bool kept, const std::string& what) {
  std::cout << (kept ? "kept: " : "not kept: ") << what << "\n";
  return kept ? 0 : 1;
}

int run(const std::string& what, const std::string& engine, const std::string& decoder) {
  const at::Device cpu("cpu");
  const auto given = wan_trt::RuntimeSpec::load(engine + ".runtime.txt");
  if (what == "runner") {
    auto spec = given;
    wan_trt::AotiRunner runner(engine, spec, cpu);
    spec = wan_trt::RuntimeSpec();  // the caller's object reused
    const auto outputs = runner.infer(zeros(given));
    return report(outputs.size() == given.outputs.size() && outputs.count("flow"), "a pass ran on the spec given");
  }
  wan_trt::AotiRunner runner(engine, given, cpu);
  if (what == "decoder") {
    auto pair = wan_trt::DecoderEngines::load(decoder);
    wan_trt::AotiRunner first(pair.first, pair.first_spec, cpu), steady(pair.steady, pair.steady_spec, cpu);
    wan_trt::DecoderStream stream(first, pair.first_spec, steady, pair.steady_spec);
    pair = wan_trt::DecoderEngines();  // the caller's object reused
    wan_trt::StreamingSession session(runner, given, 0, &stream);
    session.start(at::zeros(given.input("visual_context").shape));
    const int64_t frames = step(session, given, 0).frames.size(0) + step(session, given, 1).frames.size(0);
    return report(frames == 9 + 12, "two blocks decoded to " + std::to_string(frames) + " frames");
  }
  if (what == "session") {
    auto spec = given;
    wan_trt::StreamingSession session(runner, spec, 0), reference(runner, given, 0);
    spec.sigmas.assign(spec.sigmas.size(), 0.5);  // the caller's object changed
    session.start(at::zeros(given.input("visual_context").shape));
    reference.start(at::zeros(given.input("visual_context").shape));
    bool same = true;
    for (int64_t b = 0; b < 2; ++b)
      same = same && at::equal(step(session, given, b).latents, step(reference, given, b).latents);
    return report(same, "two blocks streamed as the spec given says");
  }
  throw std::invalid_argument("unknown case " + what);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 4) {
    std::cerr << "usage: spec_copies CASE ENGINE DECODER\n";
    return 2;
  }
  try {
    return run(argv[1], argv[2], argv[3]);
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 1;
  }
}
