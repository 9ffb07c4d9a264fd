"""A real vLLM (CPU) on demand: its own venv, a tiny local model, a launcher (docs/real-vllm.md)."""
