"""What is loaded: ``lru`` (``ModelManager``, the LRU cache of loaded workers with a count limit and a memory
budget) and ``eviction`` (which models to evict, a pure decision). Its public names are ``manager``'s."""
