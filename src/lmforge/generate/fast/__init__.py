"""Generation's own speed paths: lean cached steps sharing the block's body, the screened argmax."""
