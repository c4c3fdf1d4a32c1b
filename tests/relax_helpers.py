"""What the Relax tests (tests/test_relax*.py) share: a one-output ONNX model built from nodes.

A plain module, not a test file: tests/ is on sys.path under pytest; the test files import it after
``pytest.importorskip("onnx")``."""
from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper, numpy_helper


def _graph(nodes, inputs, output_shape, inits=(), opset=17):
    """A one-output ONNX model over float32 inputs {name: shape} (opset 23 and above: IR version 10)."""
    ins = [helper.make_tensor_value_info(n, TensorProto.FLOAT, list(s)) for n, s in inputs.items()]
    out = helper.make_tensor_value_info("y", TensorProto.FLOAT, list(output_shape))
    inits = [numpy_helper.from_array(np.asarray(a, np.float32), n) for n, a in inits]
    model = helper.make_model(helper.make_graph(nodes, "g", ins, [out], initializer=inits),
                              opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 10 if opset >= 23 else 8
    return model
