// TensorRT runner for the C++ session (built with -DWAN_TRT_WITH_TENSORRT=ON where TensorRT exists).
// Outputs are owned buffers allocated once from the spec; the session commits caches by copy.
#include <NvInfer.h>
#include <c10/cuda/CUDAStream.h>

#include <algorithm>
#include <fstream>
#include <iostream>
#include <iterator>
#include <set>

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
  // On the current CUDA device, as its enqueueV3 runs on that device's current stream.
  TensorRTRunner(const std::string& path, const GraphIO& io)
      : io_(io), device_(at::kCUDA, c10::cuda::current_device()) {
    std::ifstream file(path, std::ios::binary);
    if (!file) throw Error("cannot open TensorRT engine " + path);
    std::vector<char> blob((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
    runtime_.reset(nvinfer1::createInferRuntime(logger_));
    engine_.reset(runtime_->deserializeCudaEngine(blob.data(), blob.size()));
    if (!engine_) throw Error(path + ": TensorRT cannot deserialize it; rebuild with this TensorRT");
    check_io(path);
    context_.reset(engine_->createExecutionContext());
    if (!context_) throw Error(path + ": TensorRT could not create an execution context (see its log)");
    for (const auto& t : io.outputs)
      outputs_[t.name] = at::empty(t.shape, at::TensorOptions().dtype(t.dtype).device(device_));
  }

  std::map<std::string, at::Tensor> infer(const std::map<std::string, at::Tensor>& feeds) override {
    check_feeds(io_, feeds, device_);  // it binds their addresses: a feed of another shape would be read past its end
    for (const auto& t : io_.inputs) bind(t.name, feeds.at(t.name).data_ptr());
    for (auto& [name, tensor] : outputs_) bind(name, tensor.data_ptr());
    if (!context_->enqueueV3(c10::cuda::getCurrentCUDAStream(device_.index()).stream()))
      throw Error("TensorRT enqueueV3 failed");
    return outputs_;
  }

  bool swap_inputs() const override { return false; }
  at::Device device() const override { return device_; }
  const GraphIO* io() const override { return &io_; }

 private:
  // The engine's I/O tensors (by name, TensorRT 10's API) must be the runtime file's, as the Python runner checks.
  void check_io(const std::string& path) const {
    std::set<std::string> engine_names, expected;
    for (int32_t i = 0; i < engine_->getNbIOTensors(); ++i) engine_names.insert(engine_->getIOTensorName(i));
    for (const auto& t : io_.inputs) expected.insert(t.name);
    for (const auto& t : io_.outputs) expected.insert(t.name);
    if (engine_names != expected) throw Error(path + ": the engine's I/O tensors differ from its runtime file's");
    std::string problems;  // its buffers are allocated and bound by the runtime file: another size is read past
    for (const auto* group : {&io_.inputs, &io_.outputs})
      for (const auto& t : *group) {
        const nvinfer1::Dims dims = engine_->getTensorShape(t.name.c_str());
        const std::vector<int64_t> shape(dims.d, dims.d + std::max(dims.nbDims, 0));
        if (shape != t.shape) problems += "; " + t.name + ": shape " + c10::str(at::IntArrayRef(shape));
        if (torch_type(engine_->getTensorDataType(t.name.c_str())) != t.dtype) problems += "; " + t.name + ": dtype";
      }
    if (!problems.empty())
      throw Error(path + ": its I/O differs from its runtime file's (" + problems.substr(2) +
                  "); rebuild it with `wan-trt build`");
  }

  static at::ScalarType torch_type(nvinfer1::DataType type) {
    switch (type) {
      case nvinfer1::DataType::kFLOAT: return at::kFloat;
      case nvinfer1::DataType::kHALF: return at::kHalf;
      case nvinfer1::DataType::kBF16: return at::kBFloat16;
      case nvinfer1::DataType::kINT32: return at::kInt;
      case nvinfer1::DataType::kINT64: return at::kLong;
      case nvinfer1::DataType::kBOOL: return at::kBool;
      default: return at::ScalarType::Undefined;
    }
  }

  void bind(const std::string& name, void* address) {
    if (!context_->setTensorAddress(name.c_str(), address))
      throw Error("TensorRT refused the address of tensor " + name + " (see its log)");
  }

  Logger logger_;
  const GraphIO io_;
  at::Device device_;
  std::unique_ptr<nvinfer1::IRuntime> runtime_;
  std::unique_ptr<nvinfer1::ICudaEngine> engine_;
  std::unique_ptr<nvinfer1::IExecutionContext> context_;
  std::map<std::string, at::Tensor> outputs_;
};

}  // namespace

std::unique_ptr<Runner> make_tensorrt_runner(const std::string& engine, const GraphIO& io) {
  check_built_for(io, engine, at::kCUDA);
  const FileIdentity verified = verify_engine(engine, io);
  if (is_aoti_package(engine))
    throw Error("engine " + engine + " is an AOTInductor package, not a TensorRT plan: run it with AotiRunner "
                "(wan_stream without --tensorrt)");
  auto runner = std::make_unique<TensorRTRunner>(engine, io);
  check_unchanged(engine, verified);  // the runner read the path again
  return runner;
}

}  // namespace wan_trt
