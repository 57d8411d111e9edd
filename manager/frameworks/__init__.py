"""How models are built and run: the ``ModelWorker`` contract and its registry (``worker``), the factory
(``engine``), the input checks every framework and the gateway share (``inputs``, ``images``, ``image_files``), and
one module per framework (``transformers_worker``, ``torchvision_worker``, ``triton/``), imported on demand: torch is
heavy. Its public names are ``manager``'s."""
