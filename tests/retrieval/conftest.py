"""What the retrieval tests share: a tiny BERT folder with a tokenizer trained on the built-in passages."""
import torch

import lmforge
from lmforge.retrieval.dpr import passage_text
from lmforge.retrieval.passages import load_passages
from lmforge.tokenizer.train import train_tokenizer
from tests.tasks.core import no_loss_plot  # noqa: F401  (an autouse fixture: no loss.png drawn)


def tiny_bert(path):
    """A one-layer BERT of 64 positions and its WordPiece tokenizer (300 ids) saved in `path`, seeded."""
    tok = train_tokenizer([passage_text(p) for p in load_passages(None)], "wordpiece", 300)
    torch.manual_seed(0)
    lmforge.build("bert-base", n_layers=1, d_model=32, n_heads=2, d_ff=64, vocab_size=tok.vocab_size,
                  max_seq_len=64).save(path)
    tok.save(path)
    return path
