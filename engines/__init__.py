"""Engines and the runtimes that stream blocks through them.

Every backend is a :class:`~wan_trt.engines.runtime.runner.Runner` over the same
:class:`~wan_trt.spec.PassSpec`; :class:`~wan_trt.engines.runtime.session.StreamingSession`
runs the per-block schedule on any of them.
"""
