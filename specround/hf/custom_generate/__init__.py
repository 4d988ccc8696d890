"""The directory transformers' ``custom_generate`` loads; a package so that a wheel ships it."""
