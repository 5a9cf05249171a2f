"""The one seam for speed: execution plans (unpadding, blocked local attention) and CPU accelerations."""
