"""The bi-encoder: two Hugging Face towers (or one shared), pooling, loading and saving."""
