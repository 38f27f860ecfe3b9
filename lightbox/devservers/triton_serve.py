"""Serve an ONNX segmentation model from Triton Inference Server (PyPI ``nvidia-pytriton``).

Run with the interpreter of Triton's own environment, not lightbox's (the backend stub
needs Debian's /usr/bin/python3.11; other 3.11 builds, such as pyenv's 3.11.7, fail at model
load)::

    /usr/bin/python3.11 -m venv ~/.cache/lightbox/tritonenv
    ~/.cache/lightbox/tritonenv/bin/pip install nvidia-pytriton onnxruntime numpy
    ~/.cache/lightbox/tritonenv/bin/python lightbox/devservers/triton_serve.py MODEL.onnx --http-port 8000

pytriton's bundled ``tritonserver`` has only the Python backend, so the model runs in an ONNX
Runtime session inside the bound Python function; Triton's dynamic batcher (``--max-batch``,
``--queue-delay-us``) stacks concurrent requests into one call. The model's input is the
prepared batch (``N x 3 x H x W`` float32, as lightbox's pre-processing makes it) and its one
output is graph output ``--output-index``: the client does pre- and post-processing.

Imports only pytriton, onnxruntime and numpy (lightbox is not installed in Triton's env).
Prints ``TRITON READY`` on stdout once the model is loaded; stops on SIGTERM/SIGINT.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

import numpy as np


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", help="ONNX file with a symbolic batch dimension")
    parser.add_argument("--model-name", default="u2netp")
    parser.add_argument("--output-index", type=int, default=0)
    parser.add_argument("--height", type=int, default=320)
    parser.add_argument("--width", type=int, default=320)
    parser.add_argument("--max-batch", type=int, default=16)
    parser.add_argument("--queue-delay-us", type=int, default=5000, help="dynamic batcher's max queue delay")
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)), help="ONNX Runtime threads")
    parser.add_argument("--address", default="127.0.0.1", help="address the servers bind to (0.0.0.0: every interface)")
    parser.add_argument("--http-port", type=int, default=8000)
    parser.add_argument("--grpc-port", type=int, default=8001)
    parser.add_argument("--metrics-port", type=int, default=8002)
    args = parser.parse_args(argv)

    import onnxruntime as ort
    from pytriton.decorators import batch
    from pytriton.model_config import DynamicBatcher, ModelConfig, Tensor
    from pytriton.triton import Triton, TritonConfig

    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    opts.intra_op_num_threads = args.threads
    opts.inter_op_num_threads = 1
    opts.enable_mem_pattern = False  # this and the line below as lightbox's cpu_session_options
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    session = ort.InferenceSession(args.model, opts, providers=["CPUExecutionProvider"])
    input_name = session.get_inputs()[0].name
    output_name = session.get_outputs()[args.output_index].name

    @batch  # type: ignore[untyped-decorator]
    def infer(image: np.ndarray) -> dict[str, Any]:
        out = session.run([output_name], {input_name: np.ascontiguousarray(image, dtype=np.float32)})[0]
        return {"mask": np.asarray(out, dtype=np.float32)}

    config = TritonConfig(http_address=args.address, http_port=args.http_port, grpc_address=args.address,
                          grpc_port=args.grpc_port, metrics_address=args.address, metrics_port=args.metrics_port)
    with Triton(config=config) as triton:
        triton.bind(
            model_name=args.model_name,
            infer_func=infer,
            inputs=[Tensor(name="image", dtype=np.float32, shape=(3, args.height, args.width))],
            outputs=[Tensor(name="mask", dtype=np.float32, shape=(-1, -1, -1))],
            config=ModelConfig(max_batch_size=args.max_batch,
                               batcher=DynamicBatcher(max_queue_delay_microseconds=args.queue_delay_us)),
            strict=False,
        )
        print("TRITON READY", flush=True)
        triton.serve()


if __name__ == "__main__":
    main()
