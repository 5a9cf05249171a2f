"""New mathematics chosen by a config field: Linformer, XL relative attention, Longformer global, XLNet
two-stream."""
