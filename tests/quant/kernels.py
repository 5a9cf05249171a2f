"""Helpers the int8 kernels' tests share."""


def few_rows_only(layer, kernel: str) -> bool:
    """Whether `layer` offers `kernel` at decoding's and a text's row buckets (1, 64) and not at a
    batch's (512, "many"): the kernels that read their weight tiles again for every row."""
    return (all(kernel in layer.candidates(b) for b in (1, 64))
            and not any(kernel in layer.candidates(b) for b in (512, "many")))
