"""flash_attn.layers."""
