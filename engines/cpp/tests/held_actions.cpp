// held_actions: a test driver of the C++ runtime's library API (built with -DWAN_TRT_BUILD_TESTS=ON; not installed).
//
//   held_actions ENGINE
//
// Streams 3 blocks of the DiT package ENGINE on the CPU twice from zero conditioning, once given each block's mouse
// and keyboard as one action [1, D] held for the block, once as that action repeated for every frame [1, n, D]: the
// session takes both forms, as the Python session does, so the latents must be equal. Prints "held: same latents",
// or what differed (exit 1).
#include <iostream>

#include "wan_trt/runtime.h"
#include "zero_feeds.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: held_actions ENGINE\n";
    return 2;
  }
  const std::string engine = argv[1];
  const at::Device cpu("cpu");
  const auto spec = wan_trt::RuntimeSpec::load(engine + ".runtime.txt");
  wan_trt::AotiRunner runner(engine, spec, cpu);
  const auto feeds = zeros(spec);
  std::vector<at::Tensor> latents[2];
  for (int held = 0; held < 2; ++held) {
    wan_trt::StreamingSession session(runner, spec, 0);
    session.start(feeds.at("visual_context"));
    for (int64_t block = 0; block < 3; ++block) {
      const auto [mouse_frames, keyboard_frames] = zero_actions(spec, block);
      const at::Tensor mouse = at::full({1, mouse_frames.size(2)}, 0.25 * (block + 1));
      at::Tensor keyboard = at::zeros({1, keyboard_frames.size(2)});
      keyboard[0][block % keyboard_frames.size(2)] = 1;
      const int64_t n = mouse_frames.size(1);
      const auto result = held ? session.step(feeds.at("cond_concat"), mouse, keyboard)
                               : session.step(feeds.at("cond_concat"), mouse.unsqueeze(1).expand({1, n, -1}),
                                              keyboard.unsqueeze(1).expand({1, n, -1}).contiguous());
      latents[held].push_back(result.latents.clone());
    }
  }
  for (size_t b = 0; b < latents[0].size(); ++b)
    if (!at::equal(latents[0][b], latents[1][b])) {
      std::cout << "held: block " << b << "'s latents differ\n";
      return 1;
    }
  std::cout << "held: same latents\n";
  return 0;
}
