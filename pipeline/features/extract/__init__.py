"""Feature extraction: images -> a store of features, by a registered extractor kind.

The kinds live in ``kinds/`` (one file each, registered in ``EXTRACTORS``);
``job.py`` runs any kind's extraction into a shared store, ``runner.py`` feeds it
batches, ``region_extraction.py`` runs ``extract-regions`` with a region kind and
``rebuild.py`` makes a store's extractor again for ``capstack caption``.
"""
