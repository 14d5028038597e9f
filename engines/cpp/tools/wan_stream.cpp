// wan_stream: stream N blocks through an engine from C++ and write the latents.
//
//   wan_stream --engine E.pt2 --inputs stream_inputs.pt --blocks 8 --out latents.pt
//              [--runtime E.pt2.runtime.txt] [--seed 0] [--device cpu|cuda] [--cuda-graph] [--tensorrt]
//              [--start-block 0]
//
// --inputs is a file written with torch.save (Python) of a dict {"visual_context", "cond_concat",
// "mouse", "keyboard", "first_block"} (see wan_trt.engines.runtime.cpp.write_stream_inputs) holding the
// blocks from first_block on (raw actions from that block's first raw frame on); the stream starts
// there (--start-block, if given, must say the same); raw action histories are cut
// into each block's new frames here, as a live client would send them. Output: torch.save-loadable
// tensor [1, 16, 3*N, H, W] and one "block i: ms" line per block on stdout.
#include <torch/serialize.h>

#include <fstream>
#include <iostream>
#include <iterator>

#include "wan_trt/runtime.h"

namespace {

std::vector<char> read_file(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  if (!file) throw wan_trt::Error("cannot open " + path);
  return {std::istreambuf_iterator<char>(file), std::istreambuf_iterator<char>()};
}

at::Tensor get(const c10::Dict<c10::IValue, c10::IValue>& dict, const std::string& key) {
  auto it = dict.find(key);
  if (it == dict.end() || it->value().isNone()) return at::Tensor();
  return it->value().toTensor();
}

int run(int argc, char** argv) {
  std::map<std::string, std::string> args{{"--blocks", "8"}, {"--seed", "0"}, {"--device", "cpu"}};
  bool cuda_graph = false, tensorrt = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--cuda-graph") cuda_graph = true;
    else if (a == "--tensorrt") tensorrt = true;
    else if (i + 1 < argc) args[a] = argv[++i];
    else throw wan_trt::Error("missing value for " + a);
  }
  for (const char* required : {"--engine", "--inputs", "--out"})
    if (!args.count(required)) throw wan_trt::Error(std::string("missing ") + required);
  const std::string engine = args["--engine"];
  const auto spec = wan_trt::RuntimeSpec::load(args.count("--runtime") ? args["--runtime"] : engine + ".runtime.txt");
  const at::Device device(args["--device"]);
  std::unique_ptr<wan_trt::Runner> runner;
#ifdef WAN_TRT_WITH_TENSORRT
  if (tensorrt) runner = wan_trt::make_tensorrt_runner(engine, spec);
#endif
  if (tensorrt && !runner) throw wan_trt::Error("--tensorrt: this build has no TensorRT runner");
  if (!runner) runner = std::make_unique<wan_trt::AotiRunner>(engine, spec, device, cuda_graph);

  auto inputs = torch::pickle_load(read_file(args["--inputs"])).toGenericDict();
  const at::Tensor visual = get(inputs, "visual_context"), cond = get(inputs, "cond_concat");
  const at::Tensor mouse = get(inputs, "mouse"), keyboard = get(inputs, "keyboard");
  auto held = inputs.find("first_block");
  const int64_t first = held == inputs.end() ? 0 : held->value().toInt();
  if (args.count("--start-block") && std::stoll(args["--start-block"]) != first)
    throw wan_trt::Error("--start-block " + args["--start-block"] + ": the inputs hold the stream from block " +
                         std::to_string(first));
  const int64_t blocks = std::stoll(args["--blocks"]);
  const int64_t f = spec.block_frames;
  const int64_t held_from = wan_trt::first_raw_frame(spec, first);  // first raw frame the inputs hold

  wan_trt::StreamingSession session(*runner, spec, std::stoll(args["--seed"]));
  session.start(visual.to(device, spec.dtype()), first);
  std::vector<at::Tensor> latents;
  for (int64_t b = first; b < first + blocks; ++b) {
    // this block's new raw frames, as a live client would send them
    const int64_t begin = wan_trt::first_raw_frame(spec, b), n = wan_trt::first_raw_frame(spec, b + 1) - begin;
    auto cut = [&](const at::Tensor& h) { return h.defined() ? h.narrow(1, begin - held_from, n) : at::Tensor(); };
    at::Tensor x0 =
        session.step(cond.narrow(2, (b - first) * f, f).to(device, spec.dtype()), cut(mouse), cut(keyboard));
    latents.push_back(x0.to(at::kCPU));
    std::cout << "block " << b << ": " << session.last_block_ms() << " ms\n";
  }
  std::vector<char> bytes = torch::pickle_save(at::cat(latents, 2));
  std::ofstream(args["--out"], std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const wan_trt::Error& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 1;
  }
}
