"""The real-vLLM tier (make test-vllm); the comparer and its unit tests run in make test too."""
