"""What runs a built backend: the one runner interface (:mod:`.runner`), the streaming session
(:mod:`.session`), the CUDA-graph wrapper (:mod:`.cuda_graph`), the runtime file the C++ runtime
reads (:mod:`.runtime_file`) and the Python driver of that C++ runtime (:mod:`.cpp`, sources in
engines/cpp)."""
