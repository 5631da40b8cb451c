"""The weight error of an int4 model: for every MatMul of a float model whose weight the quantized
model stores as int4, sum((W - dequantized W)^2). Reads both int4 forms: qforge's blocked
DequantizeLinear (int4 [K, N], fp16 scales [K / block, N], axis 0, maybe behind a Cast) and
com.microsoft MatMulNBits (uint4 blobs [N, blocks, block / 2], zero point 8 unless given, as
ONNX Runtime's MatMulNBitsQuantizer writes). MatMuls are matched by their output name, which
both tools keep.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper


def _initializers(graph) -> dict[str, onnx.TensorProto]:
    return {t.name: t for t in graph.initializer}


def _unpack_nibbles(raw: bytes, count: int, signed: bool) -> np.ndarray:
    b = np.frombuffer(raw, dtype=np.uint8)
    nibbles = np.empty(b.size * 2, dtype=np.int16)
    nibbles[0::2] = b & 0x0F
    nibbles[1::2] = b >> 4
    nibbles = nibbles[:count]
    return np.where(nibbles >= 8, nibbles - 16, nibbles) if signed else nibbles


def _blocked_dequantize(node, inits) -> np.ndarray:
    q_t = inits[node.input[0]]
    shape = tuple(q_t.dims)
    q = _unpack_nibbles(q_t.raw_data, int(np.prod(shape)), signed=True).reshape(shape)
    scale = numpy_helper.to_array(inits[node.input[1]]).astype(np.float32)
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    axis, block = attrs.get("axis", 1), attrs["block_size"]
    scale = np.repeat(scale, block, axis=axis)[:shape[0], :shape[1]]
    return q.astype(np.float32) * scale


def _matmulnbits_dequantize(node, inits) -> np.ndarray:
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    k, n, block = attrs["K"], attrs["N"], attrs["block_size"]
    blocks = (k + block - 1) // block
    b = inits[node.input[1]]
    q = _unpack_nibbles(numpy_helper.to_array(b).tobytes(), n * blocks * block, signed=False)
    q = q.reshape(n, blocks * block).astype(np.float32)
    zero = 8.0
    if len(node.input) > 3 and node.input[3]:
        raise ValueError(f"{node.name}: explicit zero points are not read here")
    scales = numpy_helper.to_array(inits[node.input[2]]).astype(np.float32).reshape(n, blocks)
    w = (q - zero) * np.repeat(scales, block, axis=1)
    return w[:, :k].T  # [K, N]


def dequantized_weights(path: Path) -> dict[str, np.ndarray]:
    """MatMul output name -> the dequantized [K, N] weight, for every int4 MatMul weight."""
    graph = onnx.load(str(path)).graph
    inits = _initializers(graph)
    producers = {o: node for node in graph.node for o in node.output}
    out = {}
    for node in graph.node:
        if node.op_type == "MatMulNBits":
            out[node.output[0]] = _matmulnbits_dequantize(node, inits)
        elif node.op_type == "MatMul" and node.input[1] in producers:
            src = producers[node.input[1]]
            if src.op_type == "Cast":
                src = producers.get(src.input[0], src)
            if src.op_type == "DequantizeLinear" and src.input[0] in inits:
                out[node.output[0]] = _blocked_dequantize(src, inits)
    return out


def float_weights(path: Path) -> dict[str, np.ndarray]:
    """MatMul output name -> its constant [K, N] weight in the float model."""
    graph = onnx.load(str(path)).graph
    inits = _initializers(graph)
    return {n.output[0]: numpy_helper.to_array(inits[n.input[1]]).astype(np.float32)
            for n in graph.node if n.op_type == "MatMul" and n.input[1] in inits}


def total_weight_error(float_model: Path, quantized: Path) -> tuple[float, int]:
    """sum((W - dequantized W)^2) over the quantized MatMul weights, and how many there were."""
    reference = float_weights(float_model)
    total, count = 0.0, 0
    for name, w in dequantized_weights(quantized).items():
        d = reference[name].astype(np.float64) - w.astype(np.float64)
        total += float((d * d).sum())
        count += 1
    return total, count
