// locale_reads: a test driver of the C++ runtime's file readers (built with -DWAN_TRT_BUILD_TESTS=ON; not installed).
//
//   locale_reads LOCALE ENGINE ACTIONS BLOCKS OUT
//
// Sets the process's locale to LOCALE, as a program that embeds the runtime may (a comma as the decimal
// point, say), then reads ENGINE's runtime file and BLOCKS blocks of the JSON-lines actions file ACTIONS.
// Writes the action frames to OUT (torch.save's format: the inputs' [1, N, D] tensors in the order of their
// names, joined along D), for comparison with wan_trt.actions.read_actions. Exits 2 when LOCALE is not
// available.
#include <torch/serialize.h>

#include <clocale>
#include <fstream>
#include <iostream>

#include "wan_trt/runtime.h"

int main(int argc, char** argv) {
  if (argc != 6) {
    std::cerr << "usage: locale_reads LOCALE ENGINE ACTIONS BLOCKS OUT\n";
    return 2;
  }
  if (std::setlocale(LC_ALL, argv[1]) == nullptr) {
    std::cerr << "locale " << argv[1] << " is not available\n";
    return 2;
  }
  try {
    const auto spec = wan_trt::RuntimeSpec::load(std::string(argv[2]) + ".runtime.txt");
    std::vector<at::Tensor> frames;  // std::map: in the order of the names
    for (const auto& [name, values] : wan_trt::read_actions(argv[3], spec, 0, std::stoll(argv[4]))) {
      frames.push_back(values);
    }
    const std::vector<char> out = torch::pickle_save(at::cat(frames, 2));
    std::ofstream(argv[5], std::ios::binary).write(out.data(), static_cast<std::streamsize>(out.size()));
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
