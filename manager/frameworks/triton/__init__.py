"""Models served by a Triton Inference Server: the worker (``worker``), its HTTP plumbing (``client``) and its
tensors (``io``)."""
