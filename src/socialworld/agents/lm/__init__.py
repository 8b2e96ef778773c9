"""Language-model policies: backends (local Hugging Face, OpenAI-compatible), grammar-constrained decoding, the server."""
