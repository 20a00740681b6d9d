"""Parts that several decoders share."""
