"""densenet_like: deterministic "classifier" for the Triton tests.

Scores are a fixed linear map of the input (weights drawn from a seeded generator), so the same image always
gets the same logits and different images get different ones. One execution per request: the server's
statistics then count the requests a client sent.
"""

import numpy as np
import triton_python_backend_utils as pb_utils

N_CLASSES = 10
N_FEATURES = 3 * 32 * 32


class TritonPythonModel:
    def initialize(self, args):
        rng = np.random.default_rng(1234)
        self.weights = rng.standard_normal((N_FEATURES, N_CLASSES)).astype(np.float32) / np.sqrt(N_FEATURES)
        self.bias = np.linspace(-0.5, 0.5, N_CLASSES, dtype=np.float32)

    def execute(self, requests):
        responses = []
        for request in requests:
            data = pb_utils.get_input_tensor_by_name(request, "data_0").as_numpy()
            logits = data.reshape(data.shape[0], -1) @ self.weights + self.bias
            out = pb_utils.Tensor("fc6_1", logits.astype(np.float32))
            responses.append(pb_utils.InferenceResponse(output_tensors=[out]))
        return responses
