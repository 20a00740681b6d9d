"""Features other toolkits made, in and out of capstack's stores.

``formats/`` reads (and, for some, writes) each outside layout; ``importer``
turns any of them into a capstack store; ``exporter`` writes a store in an
outside layout; ``safe_pickle`` reads the pickles some layouts hold without
running them; ``ids`` maps a source's names for images to the dataset's ids.
"""
