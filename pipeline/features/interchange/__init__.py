"""Features other toolkits made, in and out of capstack's stores.

``formats/`` reads (and, for some, writes) each outside layout; ``importer``
turns any of them into a capstack store; ``exporter`` writes a store in an
outside layout (the pickles some layouts hold are read by
``pipeline.core.safe_pickle``, never run); ``ids`` maps a source's names for
images to the dataset's ids.
"""
