// api_refusals: a test driver of the C++ runtime's library API (built with -DWAN_TRT_BUILD_TESTS=ON; not installed).
//
//   api_refusals CASE ENGINE DECODER [ACTIONS]
//
// Misuses the API as a program that embeds the runtime may, over the DiT package ENGINE and the decoder engine pair
// of DECODER (either engine) on the CPU, and prints the refusal: "refused: <message>". CASE:
//   load            the runner alone, over an ENGINE the test made (a runtime file saying cuda, a plan that is no zip)
//   strided         a feed of the right shape and dtype that is not contiguous (an engine reads it by address)
//   meta            a feed on another device than the runner's
//   missing         feeds without one of the engine's inputs
//   shared-decoder  one decoder given to two sessions (it carries one stream's histories)
//   mixed-decoder   a DecoderStream of DECODER's first graph and the steady graph of the decoder engine ACTIONS
//                   names (another export's)
//   decoder-specs   a DecoderStream of DECODER's runners given the specs of the decoder pair ACTIONS names
//   session-spec    a session of ENGINE's runner given the runtime file ACTIONS names (another engine's)
//   visual-shape    a visual context of another shape
//   cond-shape      a block's conditioning of another shape
//   mouse-shape     a block's mouse actions of another shape
//   held-shape      a block's mouse action held for the block [1, D] of another width D
//   held-sparse     a block's mouse action held for the block [1, D], sparse
//   actions-before  read_actions of the JSON-lines file ACTIONS (two blocks' lines) from block -1
//   actions-beyond  ... from the first block a stream does not reach
//   actions-past    ... 2 blocks from the last block a stream reaches
//   actions-none    ... 0 blocks from block 0
//   actions-config  ... of a spec without action inputs (ENGINE's runtime file edited so; no runner made)
//   step-past       a session started at the last block a stream reaches, stepped twice
//   cpu-graph       the runner made for the CPU with cuda_graph = true (a capture of CPU work captures nothing)
//   visual-int      an integer visual context (image features are floats; actions may be 0/1 integers)
//   cond-bool       a boolean conditioning of the right shape
//   cond-sparse     a sparse conditioning of the right shape
//   decoder-folder  DecoderEngines::load of DECODER copied by the test outside first/ and steady/ (ACTIONS names it)
// Exits 0 when refused with wan_trt::Error, 1 when not refused or refused otherwise.
#include <iostream>

#include "wan_trt/runtime.h"
#include "zero_feeds.h"

namespace {

void run(const std::string& what, const std::string& engine, const std::string& decoder, const std::string& actions) {
  const at::Device cpu("cpu");
  const auto spec = wan_trt::RuntimeSpec::load(engine + ".runtime.txt");
  if (what == "actions-config") {
    wan_trt::read_actions(actions, spec, 0, 1);
    return;
  }
  if (what == "cpu-graph") {
    wan_trt::AotiRunner graphed(engine, spec, cpu, /*cuda_graph=*/true);
    return;
  }
  if (what == "decoder-folder") {
    wan_trt::DecoderEngines::load(actions);
    return;
  }
  wan_trt::AotiRunner runner(engine, spec, cpu);
  auto feeds = zeros(spec);
  at::Tensor& latents = feeds.at("latents");
  if (what == "load") {
    return;
  } else if (what == "strided") {
    std::vector<int64_t> swapped = latents.sizes().vec();
    std::swap(swapped[3], swapped[4]);
    latents = at::zeros(swapped, latents.options()).transpose(3, 4);  // the same shape, another layout
    runner.infer(feeds);
  } else if (what == "meta") {
    latents = at::zeros(latents.sizes(), latents.options().device(at::kMeta));
    runner.infer(feeds);
  } else if (what == "missing") {
    feeds.erase("latents");
    runner.infer(feeds);
  } else if (what == "shared-decoder") {
    const auto pair = wan_trt::DecoderEngines::load(decoder);
    wan_trt::AotiRunner first(pair.first, pair.first_spec, cpu), steady(pair.steady, pair.steady_spec, cpu);
    wan_trt::DecoderStream stream(first, pair.first_spec, steady, pair.steady_spec);
    wan_trt::StreamingSession one(runner, spec, 0, &stream);
    wan_trt::StreamingSession two(runner, spec, 1, &stream);
  } else if (what == "mixed-decoder") {
    const auto pair = wan_trt::DecoderEngines::load(decoder), other = wan_trt::DecoderEngines::load(actions);
    wan_trt::AotiRunner first(pair.first, pair.first_spec, cpu), steady(other.steady, other.steady_spec, cpu);
    wan_trt::DecoderStream stream(first, pair.first_spec, steady, other.steady_spec);
  } else if (what == "decoder-specs") {
    const auto pair = wan_trt::DecoderEngines::load(decoder), other = wan_trt::DecoderEngines::load(actions);
    wan_trt::AotiRunner first(pair.first, pair.first_spec, cpu), steady(pair.steady, pair.steady_spec, cpu);
    wan_trt::DecoderStream stream(first, other.first_spec, steady, other.steady_spec);
  } else if (what == "session-spec") {
    wan_trt::StreamingSession session(runner, wan_trt::RuntimeSpec::load(actions), 0);
  } else if (what == "visual-shape" || what == "cond-shape" || what == "mouse-shape" || what == "held-shape" ||
             what == "held-sparse") {
    wan_trt::StreamingSession session(runner, spec, 0);
    auto visual = feeds.at("visual_context"), cond = feeds.at("cond_concat");
    auto [mouse, keyboard] = zero_actions(spec, 0);
    if (what == "visual-shape") visual = visual.narrow(1, 0, 1);
    session.start(visual);
    if (what == "cond-shape") cond = cond.narrow(2, 0, 1);
    if (what == "mouse-shape") mouse = mouse.narrow(1, 0, 1);
    if (what == "held-shape") mouse = at::zeros({1, mouse.size(2) + 1});
    if (what == "held-sparse") mouse = at::zeros({1, mouse.size(2)}).to_sparse();
    session.step(cond, mouse, keyboard);
  } else if (what == "visual-int" || what == "cond-bool" || what == "cond-sparse") {
    wan_trt::StreamingSession session(runner, spec, 0);
    auto visual = feeds.at("visual_context"), cond = feeds.at("cond_concat");
    const auto [mouse, keyboard] = zero_actions(spec, 0);
    if (what == "visual-int") visual = visual.to(at::kInt);
    session.start(visual);
    if (what == "cond-bool") cond = cond.to(at::kBool);
    if (what == "cond-sparse") cond = cond.to_sparse();
    session.step(cond, mouse, keyboard);
  } else if (what == "actions-before") {
    wan_trt::read_actions(actions, spec, -1, 1);
  } else if (what == "actions-beyond") {
    wan_trt::read_actions(actions, spec, wan_trt::reachable_blocks(spec), 1);
  } else if (what == "actions-past") {
    wan_trt::read_actions(actions, spec, wan_trt::reachable_blocks(spec) - 1, 2);
  } else if (what == "actions-none") {
    wan_trt::read_actions(actions, spec, 0, 0);
  } else if (what == "step-past") {
    wan_trt::StreamingSession session(runner, spec, 0);
    const int64_t last = wan_trt::reachable_blocks(spec) - 1;
    session.start(feeds.at("visual_context"), last);
    const auto [mouse, keyboard] = zero_actions(spec, last);  // the block past it takes as many
    session.step(feeds.at("cond_concat"), mouse, keyboard);
    session.step(feeds.at("cond_concat"), mouse, keyboard);
  } else {
    throw std::invalid_argument("unknown case " + what);
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 4 && argc != 5) {
    std::cerr << "usage: api_refusals CASE ENGINE DECODER [ACTIONS]\n";
    return 2;
  }
  try {
    run(argv[1], argv[2], argv[3], argc == 5 ? argv[4] : "");
  } catch (const wan_trt::Error& e) {
    std::cout << "refused: " << e.what() << "\n";
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "not refused as a user error: " << e.what() << "\n";
    return 1;
  }
  std::cerr << "not refused\n";
  return 1;
}
