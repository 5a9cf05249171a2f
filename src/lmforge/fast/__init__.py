"""The one seam for speed: execution plans (unpadding, blocked local attention) and the optimize step
(which may swap in quant/'s fused int8 feed-forward); int8 itself lives in quant/."""
