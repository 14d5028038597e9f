"""Engines and the runtimes that stream blocks through them.

    backends/   the registry (``__init__``) and one module per backend: its build and its runner
    runtime/    the runner interface, the streaming session, CUDA graphs, the runtime file, the C++ driver
    artifact    engine metadata: what an engine was built from, so a stale one is never reused
    build       ``wan-trt build`` / ``wan-trt inspect``      bench   ``wan-trt bench``
    stream      ``wan-trt stream``

Every backend is a :class:`~wan_trt.engines.runtime.runner.Runner` over the same
:class:`~wan_trt.spec.PassSpec`; :class:`~wan_trt.engines.runtime.session.StreamingSession`
runs the per-block schedule on any of them.
"""
