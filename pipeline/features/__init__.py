"""Features: extraction from images (extract/) into self-describing stores (stores/),
fingerprints that name shared stores, and the catalog of the shared root."""
