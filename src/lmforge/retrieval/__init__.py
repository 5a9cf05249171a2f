"""Retrieval: passages, question sets, BM25, the exact inner-product index, the dense retriever (DPR)
and RAG marginalisation."""
