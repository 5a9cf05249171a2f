"""Jobs built on the model, tokenizer and generation: embeddings, fill-mask, inspect, the demo."""
