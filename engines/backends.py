"""The backend names ``wan-trt bench`` knows (no heavy imports: the CLI reads them for its help).

    reference-eager        wan-trt's reference pipeline with upstream's rolling-cache semantics, eager
    torch-eager            the static-cache session over the PyTorch model
    torch-compile          the same under torch.compile
    torch-compile-plugins  torch.compile of the model with the fused wan_trt kernels (CUDA)
    onnxruntime            the exported graph (CUDA provider on a GPU, CPU provider otherwise)
    aoti(+cudagraph)       the AOTInductor package (``--aoti-engine``), optionally as CUDA graphs
    aoti-plugins(+cudagraph)  the package built with --ops plugins (``--aoti-plugins-engine``)
    tensorrt               the TensorRT engine (``--trt-engine``)
"""
ALL_BACKENDS = ("reference-eager", "torch-eager", "torch-compile", "torch-compile-plugins", "onnxruntime", "aoti",
                "aoti+cudagraph", "aoti-plugins", "aoti-plugins+cudagraph", "tensorrt")
