"""The last step of decoding, the projection onto the vocabulary, by faster routes with the same result:
an input-major copy of the output layer, and greedy decoding's screened argmax."""
