// TensorRT runner for the C++ session (built with -DWAN_TRT_WITH_TENSORRT=ON where TensorRT exists).
// Outputs are owned buffers allocated once from the spec; the session commits caches by copy.
#include <NvInfer.h>
#include <c10/cuda/CUDAStream.h>

#include <fstream>
#include <iostream>
#include <iterator>

#include "wan_trt/runtime.h"

namespace wan_trt {
namespace {

class Logger : public nvinfer1::ILogger {
  void log(Severity severity, const char* msg) noexcept override {
    if (severity <= Severity::kWARNING) std::cerr << "[TensorRT] " << msg << "\n";
  }
};

class TensorRTRunner : public Runner {
 public:
  TensorRTRunner(const std::string& path, const GraphIO& io) : io_(io) {
    std::ifstream file(path, std::ios::binary);
    if (!file) throw Error("cannot open TensorRT engine " + path);
    std::vector<char> blob((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
    runtime_.reset(nvinfer1::createInferRuntime(logger_));
    engine_.reset(runtime_->deserializeCudaEngine(blob.data(), blob.size()));
    if (!engine_) throw Error(path + ": TensorRT cannot deserialize it; rebuild with this TensorRT");
    context_.reset(engine_->createExecutionContext());
    for (const auto& t : io.outputs)
      outputs_[t.name] = at::empty(t.shape, at::TensorOptions().dtype(t.dtype).device(at::kCUDA));
  }

  std::map<std::string, at::Tensor> infer(const std::map<std::string, at::Tensor>& feeds) override {
    for (const auto& t : io_.inputs) context_->setTensorAddress(t.name.c_str(), feeds.at(t.name).data_ptr());
    for (auto& [name, tensor] : outputs_) context_->setTensorAddress(name.c_str(), tensor.data_ptr());
    if (!context_->enqueueV3(c10::cuda::getCurrentCUDAStream().stream())) throw Error("TensorRT enqueueV3 failed");
    return outputs_;
  }

  bool swap_inputs() const override { return false; }
  at::Device device() const override { return at::Device(at::kCUDA, 0); }

 private:
  Logger logger_;
  const GraphIO& io_;
  std::unique_ptr<nvinfer1::IRuntime> runtime_;
  std::unique_ptr<nvinfer1::ICudaEngine> engine_;
  std::unique_ptr<nvinfer1::IExecutionContext> context_;
  std::map<std::string, at::Tensor> outputs_;
};

}  // namespace

std::unique_ptr<Runner> make_tensorrt_runner(const std::string& engine, const GraphIO& io) {
  verify_engine(engine, io);
  return std::make_unique<TensorRTRunner>(engine, io);
}

}  // namespace wan_trt
