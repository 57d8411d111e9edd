"""adder: SUM = INPUT0 + INPUT1 and DIFF = INPUT0 - INPUT1, element-wise, INT32."""

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            a = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            b = pb_utils.get_input_tensor_by_name(request, "INPUT1").as_numpy()
            outputs = [
                pb_utils.Tensor("SUM", (a + b).astype(np.int32)),
                pb_utils.Tensor("DIFF", (a - b).astype(np.int32)),
            ]
            responses.append(pb_utils.InferenceResponse(output_tensors=outputs))
        return responses
