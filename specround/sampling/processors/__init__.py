"""Declared, ordered, hashed logit processors and the chain that turns logits into processed rows."""
